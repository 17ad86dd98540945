//! `[[network.request]]` (SPEC §5.3) for every request the proxy can read:
//! inspected HTTP/1.1 and HTTP/2, and plain-HTTP absolute-form requests.

use airlock_policy::request::normalize_path;
use airlock_policy::{PatternMatch, Reason, Target};

use crate::engine::Engine;
use crate::refusal::Refusal;

/// Check a request against the rules for its target. `Ok(None)`: no rule
/// names this host, forward the path as it came. `Ok(Some(path))`: a rule
/// allows it; forward `path`, the normalised form that was matched, so the
/// origin gets exactly what the rule saw. `Err`: refuse with `request-rule`.
pub fn check(
    engine: &Engine,
    target: &Target,
    method: &str,
    path_and_query: &str,
    headers: &http::HeaderMap,
) -> Result<Option<String>, Box<Refusal>> {
    let policy = engine.policy();
    let rules: Vec<_> = policy
        .request_rules
        .iter()
        .filter(|r| r.host.matches(target) == PatternMatch::Yes)
        .collect();
    let Some(first) = rules.first() else {
        return Ok(None);
    };
    let shown = crate::escape::line(path_and_query, 200);
    if let Some(how) = method_override(headers, path_and_query) {
        return Err(Box::new(Refusal::new(
            Reason::RequestRule,
            target,
            format!(
                "{method} {shown} carries {how}: the origin may apply another method than the request rules for {} saw",
                first.host.text
            ),
        )));
    }
    let path = normalize_path(path_and_query).map_err(|why| {
        Box::new(Refusal::new(
            Reason::RequestRule,
            target,
            format!(
                "{method} {shown}: {why}; the request rules for {} cannot be applied to it",
                first.host.text
            ),
        ))
    })?;
    if rules
        .iter()
        .any(|r| r.allow.iter().any(|a| a.matches(method, &path)))
    {
        return Ok(Some(path));
    }
    Err(Box::new(Refusal::new(
        Reason::RequestRule,
        target,
        format!(
            "{method} {shown} matches none of the request rules for {} ({})",
            first.host.text, first.origin.origin
        ),
    )))
}

/// Headers with which frameworks let a request stand for another method.
const METHOD_OVERRIDE: [&str; 3] = [
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
];

/// How a request asks the origin to take it as another method than its
/// own: one of the override headers, or a `_method` query parameter (read
/// by Rails, Laravel, Symfony and others). A rule that allows `POST` must
/// not let through what the origin runs as `DELETE`.
pub(crate) fn method_override(headers: &http::HeaderMap, path_and_query: &str) -> Option<String> {
    // CGI, Rack and WSGI servers read `X_HTTP_METHOD_OVERRIDE` as the
    // same header: `_` is taken for `-` (red team round 7).
    for name in headers.keys() {
        let n = name.as_str().replace('_', "-");
        if let Some(h) = METHOD_OVERRIDE.iter().find(|h| **h == n) {
            return Some(format!("a {h} header"));
        }
    }
    let query = path_and_query.split_once('?')?.1;
    // Each key as frameworks read it: `&` or `;` between pairs (Rack), `+`
    // a space, percent-decoded, and PHP's names, where `.` and a space
    // become `_`. (A `_method` in a form body is not read: see docs/src/inspection.md.)
    query
        .split(['&', ';'])
        .map(|kv| kv.split('=').next().unwrap_or_default().replace('+', " "))
        .any(|k| {
            let k = percent_encoding::percent_decode_str(&k).decode_utf8_lossy();
            let as_php = |k: &str| -> String {
                k.chars()
                    .map(|c| match c {
                        '.' | ' ' => '_',
                        c => c.to_ascii_lowercase(),
                    })
                    .collect()
            };
            // PHP drops leading spaces from a name before it turns the
            // others into `_` (red team round 8: `?+_method=DELETE`); both
            // readings count.
            [as_php(&k), as_php(k.trim_start_matches(' '))]
                .iter()
                .any(|k| k == "_method" || k.starts_with("_method["))
        })
        .then(|| "a _method query parameter".to_string())
}

/// Whether any `[[network.request]]` or `[[network.hold]]` rule names this target (a port-less
/// rule names every port).
pub fn has_rules(engine: &Engine, target: &Target) -> bool {
    let policy = engine.policy();
    policy
        .request_rules
        .iter()
        .any(|r| r.host.matches(target) == PatternMatch::Yes)
        // A hold rule's host too: its requests must be read to be held.
        || policy
            .hold_rules
            .iter()
            .any(|r| r.host.matches(target) == PatternMatch::Yes)
}

/// Hosts whose requests carry policy weight: request rules or a credential.
/// Their requests are framed strictly (`check_framing`) and never share an
/// upstream HTTP/1.1 connection with a request that had a body.
pub fn governed(engine: &Engine, target: &Target) -> bool {
    has_rules(engine, target)
        || engine
            .policy()
            .credentials
            .iter()
            .any(|c| c.host.matches(target) == PatternMatch::Yes)
}

/// Methods whose requests have no defined body (RFC 9110 §9.3): an origin
/// may ignore the body and read it as the next request, one no rule saw
/// and that would carry the credential meant for the next one.
const NO_BODY: [&str; 5] = ["GET", "HEAD", "OPTIONS", "DELETE", "TRACE"];

/// For governed hosts: no body on a bodiless method, and no protocol
/// switch but WebSocket (an `h2c` upgrade turns the connection into one
/// whose later requests the proxy would not read).
pub fn check_framing(
    engine: &Engine,
    target: &Target,
    method: &str,
    has_body: bool,
    upgrade: Option<&str>,
) -> Result<(), Box<Refusal>> {
    if !governed(engine, target) {
        return Ok(());
    }
    if has_body && NO_BODY.contains(&method) {
        return Err(Box::new(Refusal::new(
            Reason::RequestRule,
            target,
            format!("a {method} request with a body is refused for a host with request rules or credentials: the origin may read the body as another request"),
        )));
    }
    if let Some(up) = upgrade {
        if !up.trim().eq_ignore_ascii_case("websocket") {
            return Err(Box::new(Refusal::new(
                Reason::RequestRule,
                target,
                format!(
                    "Upgrade: {} is refused for a host with request rules or credentials: later requests on it could not be checked (only websocket is let through)",
                    crate::escape::line(up, 60)
                ),
            )));
        }
    }
    Ok(())
}

/// Whether a request body has anything in it, as far as its framing says.
pub fn has_body<B: http_body::Body>(body: &B) -> bool {
    !body.is_end_stream() && body.size_hint().exact() != Some(0)
}

#[cfg(test)]
mod tests {
    use super::method_override;

    #[test]
    fn method_overrides_are_seen() {
        let mut h = http::HeaderMap::new();
        assert!(method_override(&h, "/repos/acme/x/pulls?page=2").is_none());
        assert!(method_override(&h, "/a?x=1&_method=DELETE").is_some());
        assert!(method_override(&h, "/a?%5Fmethod=DELETE").is_some());
        assert!(method_override(&h, "/a?not_method=1").is_none());
        for q in [
            "/a?+_method=DELETE",
            "/a?%20_method=DELETE",
            "/a?%20%20_method=X",
        ] {
            assert!(method_override(&h, q).is_some(), "{q}");
        }
        for q in [
            "/a?x=1;_method=DELETE",
            "/a?_%6Dethod=DELETE",
            "/a?.method=DELETE",
            "/a?+method=x",
            "/a?_METHOD=x",
        ] {
            assert!(method_override(&h, q).is_some(), "{q}");
        }
        h.insert(
            "X-HTTP-Method-Override",
            http::HeaderValue::from_static("DELETE"),
        );
        assert!(method_override(&h, "/a").is_some());
        let mut u = http::HeaderMap::new();
        u.insert("x_http_method_override", "DELETE".parse().unwrap());
        assert!(method_override(&u, "/a").is_some());
    }
}
