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
