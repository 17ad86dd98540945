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

/// Whether any `[[network.request]]` rule names this target (a port-less
/// rule names every port).
pub fn has_rules(engine: &Engine, target: &Target) -> bool {
    engine
        .policy()
        .request_rules
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
