//! The decision function (SPEC §3.2): one value that carries the verdict,
//! the reason and the rule that decided it.

use std::fmt;

use crate::fragment::Rule;
use crate::host::Target;
use crate::merge::Policy;
use crate::model::Unknown;
use crate::pattern::PatternMatch;
use crate::source::Layer;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    Deny,
    /// No rule covers the target and `unknown = "ask"`.
    Ask,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Deny => "deny",
            Verdict::Ask => "ask",
        }
    }
}

/// Why. The deny reasons are SPEC §5.1's names, used verbatim in the
/// `X-Airlock-Reason` header and the audit log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    Allowlisted,
    ManagedAllow,
    Approved,
    Unlisted,
    NotAllowlisted,
    Denylisted,
    ManagedDeny,
    PortNotAllowed,
    PrivateAddress,
    InvalidHost,
    ApprovalDenied,
    ApprovalTimeout,
    SniMismatch,
    HostMismatch,
    RequestRule,
    UpstreamUnreachable,
    UpstreamTimeout,
    /// The client refused the airlock certificate (it pins, or ignores the
    /// trust variables); recorded so the user can stop inspecting the host.
    InspectionRejected,
    /// A request that would carry a credential beyond reads (SPEC §3.4)
    /// was not approved.
    CredentialWrite,
    /// A standalone proxy's credential asked for by a client it cannot
    /// tell is its own user (SPEC §5.4).
    CredentialClient,
    /// A review run kept the request for `airlock changes apply` instead
    /// of sending it (SPEC §4.8).
    Held,
    /// A review run would have held the request but could not keep it
    /// (too large, or the changeset could not be written): refused, not sent.
    HoldRefused,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Allowlisted => "allowlisted",
            Reason::ManagedAllow => "managed-allow",
            Reason::Approved => "approved",
            Reason::Unlisted => "unlisted",
            Reason::NotAllowlisted => "not-allowlisted",
            Reason::Denylisted => "denylisted",
            Reason::ManagedDeny => "managed-deny",
            Reason::PortNotAllowed => "port-not-allowed",
            Reason::PrivateAddress => "private-address",
            Reason::InvalidHost => "invalid-host",
            Reason::ApprovalDenied => "approval-denied",
            Reason::ApprovalTimeout => "approval-timeout",
            Reason::SniMismatch => "sni-mismatch",
            Reason::HostMismatch => "host-mismatch",
            Reason::RequestRule => "request-rule",
            Reason::UpstreamUnreachable => "upstream-unreachable",
            Reason::UpstreamTimeout => "upstream-timeout",
            Reason::InspectionRejected => "inspection-rejected",
            Reason::CredentialWrite => "credential-write",
            Reason::CredentialClient => "credential-client",
            Reason::Held => "held",
            Reason::HoldRefused => "hold-refused",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone)]
pub struct Decision {
    pub verdict: Verdict,
    pub reason: Reason,
    /// The rule that decided, when a rule did.
    pub rule: Option<Rule>,
}

impl Decision {
    pub fn deny(reason: Reason) -> Decision {
        Decision {
            verdict: Verdict::Deny,
            reason,
            rule: None,
        }
    }

    pub fn is_allow(&self) -> bool {
        self.verdict == Verdict::Allow
    }

    /// `"deny (managed-deny) by *.evil.com at /etc/airlock/managed.toml:4"`.
    pub fn describe(&self) -> String {
        match &self.rule {
            Some(r) => format!(
                "{} ({}) by {:?} at {}",
                self.verdict.as_str(),
                self.reason,
                r.value.text,
                r.origin
            ),
            None => format!("{} ({})", self.verdict.as_str(), self.reason),
        }
    }
}

/// Session approvals (SPEC §3.2 step 5), kept by the proxy.
pub trait Approvals {
    fn approved(&self, target: &Target) -> bool;
}

pub struct NoApprovals;

impl Approvals for NoApprovals {
    fn approved(&self, _: &Target) -> bool {
        false
    }
}

pub fn decide(policy: &Policy, target: &Target) -> Decision {
    decide_with(policy, target, &NoApprovals)
}

fn first<'a>(
    rules: impl Iterator<Item = &'a Rule>,
    target: &Target,
    want: PatternMatch,
) -> Option<&'a Rule> {
    rules.into_iter().find(|r| r.value.matches(target) == want)
}

/// SPEC §3.2's order: managed deny, any deny, managed allow, any allow,
/// session approvals, then `unknown`.
pub fn decide_with(policy: &Policy, target: &Target, approvals: &dyn Approvals) -> Decision {
    let managed = |r: &&Rule| r.layer == Layer::Managed;
    let hit = |reason, verdict, rule: &Rule| Decision {
        verdict,
        reason,
        rule: Some(rule.clone()),
    };
    if let Some(r) = first(
        policy.deny.iter().filter(managed),
        target,
        PatternMatch::Yes,
    ) {
        return hit(Reason::ManagedDeny, Verdict::Deny, r);
    }
    if let Some(r) = first(policy.deny.iter(), target, PatternMatch::Yes) {
        return hit(Reason::Denylisted, Verdict::Deny, r);
    }
    if let Some(r) = first(
        policy.allow.iter().filter(managed),
        target,
        PatternMatch::Yes,
    ) {
        return hit(Reason::ManagedAllow, Verdict::Allow, r);
    }
    if let Some(r) = first(policy.allow.iter(), target, PatternMatch::Yes) {
        return hit(Reason::Allowlisted, Verdict::Allow, r);
    }
    if approvals.approved(target) {
        return Decision {
            verdict: Verdict::Allow,
            reason: Reason::Approved,
            rule: None,
        };
    }
    // A rule names the host but not this port: say so rather than ask,
    // since someone scoped that host on purpose.
    if let Some(r) = first(policy.allow.iter(), target, PatternMatch::HostOnly) {
        return hit(Reason::PortNotAllowed, Verdict::Deny, r);
    }
    match policy.unknown.value {
        Unknown::Ask => Decision {
            verdict: Verdict::Ask,
            reason: Reason::Unlisted,
            rule: None,
        },
        Unknown::Deny => Decision::deny(Reason::NotAllowlisted),
    }
}

/// Whether TLS to this target is to be inspected. A credential for a host
/// implies inspecting it: it can only be injected into decrypted traffic.
pub fn inspects(policy: &Policy, target: &Target) -> bool {
    policy
        .inspect
        .iter()
        .any(|r| r.value.matches(target) == PatternMatch::Yes)
        || policy
            .credentials
            .iter()
            .any(|c| c.host.matches(target) == PatternMatch::Yes)
        // A request rule implies inspection as a credential does: a tunnel
        // to its host that were not opened would carry requests no rule saw.
        || policy
            .request_rules
            .iter()
            .any(|r| r.host.matches(target) == PatternMatch::Yes)
        // So does a hold rule: its requests must be read to be held.
        || policy
            .hold_rules
            .iter()
            .any(|r| r.host.matches(target) == PatternMatch::Yes)
}

/// The one-line advice of SPEC §5.1 and §7, for a refusal whose address
/// and policy are not known (see `advice`).
pub fn how_to_allow(target: &Target, reason: Reason) -> String {
    advice(target, reason, None, true)
}

/// The advice that fits the reason (SPEC §7): a managed deny names the
/// administrator, a private address shows the address it resolved to, and
/// under `user_allow = false` nothing suggests `--allow`, which would not
/// count.
pub fn advice(
    target: &Target,
    reason: Reason,
    resolved: Option<std::net::IpAddr>,
    user_allow: bool,
) -> String {
    let pat = if target.port == 443 || target.port == 80 {
        target.host.to_string()
    } else {
        target.to_string()
    };
    let add = if user_allow {
        format!("--allow {pat} or add \"{pat}\" to [network].allow in airlock.toml")
    } else {
        format!("only the administrator can allow hosts here (the managed policy sets user_allow = false); ask them to add {pat} to the managed policy")
    };
    match reason {
        Reason::ManagedDeny => format!("the managed policy denies {pat}; only its administrator can change that"),
        Reason::Denylisted => format!("remove the deny rule that matches {pat}"),
        Reason::PrivateAddress => {
            let what = match resolved {
                Some(ip) if Some(ip) == target.host.ip() => format!("{ip} is a private address"),
                Some(ip) => format!("{} resolved to {ip}", target.host),
                None => format!("{} resolved to a private address", target.host),
            };
            format!("{what}; if that is intended, allow the host with a policy rule and its range with --allow-private CIDR or [network].allow_private (an approval alone never reaches a private address)")
        }
        Reason::InvalidHost => "fix the host name".into(),
        Reason::InspectionRejected => format!("the client does not accept the airlock CA for {pat}: remove it from --inspect / [network].inspect"),
        Reason::CredentialWrite => format!("the credential for {pat} is lent to reads only: approve the request when asked (--ask tty or --ask socket:PATH), or lend it yourself with a [[network.credential]] for {pat} that lists methods = [\"PUT\"] (the methods you mean)"),
        Reason::CredentialClient => format!("the credentials this proxy adds for {pat} are lent only to its own user's clients on this machine: run the client as that user, or start an airlock proxy of your own"),
        Reason::Held => "it is sent, with your credential, by `airlock changes apply ID` once you have reviewed it (`airlock changes diff ID`)".into(),
        Reason::HoldRefused => format!("a review run sends nothing to {pat} that it cannot keep for review: send a smaller request, or run without --review"),
        Reason::RequestRule => format!("add a matching \"METHOD /path\" to the [[network.request]] rule for {pat}"),
        Reason::HostMismatch => format!("send requests in this tunnel to {pat} only; open another tunnel for other hosts"),
        Reason::SniMismatch => format!("connect to the host the TLS ClientHello names; a tunnel to {pat} may only carry TLS for {pat}"),
        Reason::ApprovalDenied | Reason::ApprovalTimeout if user_allow => {
            format!("approve it when asked, or {add}")
        }
        _ => add,
    }
}

#[cfg(test)]
mod advice_tests {
    use super::*;

    #[test]
    fn advice_fits_the_reason() {
        let t = Target::parse("evil.example:443", None).unwrap();
        assert!(advice(&t, Reason::NotAllowlisted, None, true).starts_with("--allow evil.example"));
        let m = advice(&t, Reason::ManagedDeny, None, true);
        assert!(
            m.contains("administrator") && !m.contains("--allow "),
            "{m}"
        );
        let p = advice(
            &t,
            Reason::PrivateAddress,
            Some("10.1.2.3".parse().unwrap()),
            true,
        );
        assert!(p.contains("resolved to 10.1.2.3"), "{p}");
        for r in [
            Reason::NotAllowlisted,
            Reason::ApprovalDenied,
            Reason::PortNotAllowed,
        ] {
            let u = advice(&t, r, None, false);
            assert!(!u.contains("--allow"), "{u}");
            assert!(u.contains("administrator"), "{u}");
        }
    }
}
