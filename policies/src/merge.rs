//! Merging fragments by precedence (SPEC §3.3): lists accumulate, scalars
//! are taken from the highest layer that sets them, and the managed policy
//! can pin what nothing below it may loosen.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;

use crate::fragment::{Fragment, Rule};
use crate::host::Host;
use crate::model::{EnvInherit, NetworkMode, Unknown};
use crate::preset::{self, Probe, Resolved};
use crate::request::{Credential, HoldRule, RequestRule};
use crate::source::{Layer, Located, Origin};

pub const DEFAULT_ASK_TIMEOUT: Duration = Duration::from_secs(60);
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
pub const DEFAULT_MAX_TUNNELS: u32 = 1024;

/// The merged policy a run enforces.
#[derive(Debug, Clone)]
pub struct Policy {
    pub read: Vec<Located<String>>,
    pub write: Vec<Located<String>>,
    pub deny_read: Vec<Located<String>>,
    pub deny_write: Vec<Located<String>>,
    pub unix_sockets: Vec<Located<String>>,
    pub mode: Located<NetworkMode>,
    pub require_sandbox: Option<Located<bool>>,
    pub allow: Vec<Rule>,
    pub deny: Vec<Rule>,
    pub inspect: Vec<Rule>,
    pub unknown: Located<Unknown>,
    /// False when the managed policy says only its own allow list counts.
    pub user_allow: bool,
    pub ask_timeout: Duration,
    pub connect_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_tunnels: u32,
    pub allow_private: Vec<Located<IpNet>>,
    pub resolve: BTreeMap<Host, Located<IpAddr>>,
    pub upstream_ca: Vec<Located<String>>,
    pub request_rules: Vec<RequestRule>,
    /// `[[network.hold]]`: what a review run holds (SPEC §4.8).
    pub hold_rules: Vec<HoldRule>,
    pub credentials: Vec<Credential>,
    /// `[env] inherit`: "none" at any layer wins, so no file (a project's
    /// `airlock.toml` included) can widen what another narrowed.
    pub env_inherit: Located<EnvInherit>,
    pub env_pass: Vec<Located<String>>,
    pub env_set: BTreeMap<String, Located<String>>,
    pub timeout: Option<Located<Duration>>,
    pub memory: Option<Located<u64>>,
    pub pids: Option<Located<u32>>,
    pub tmp: Option<Located<u64>>,
    pub audit_log: Option<Located<String>>,
    /// `[audit] otlp`: where audit events are exported as OTLP logs.
    pub audit_otlp: Option<Located<String>>,
    /// `[macos] keychain` and `dnssd`: opt-in Seatbelt grants, with where
    /// they were turned on.
    pub macos_keychain: Option<Located<bool>>,
    pub macos_dnssd: Option<Located<bool>>,
    /// What each requested preset resolved to on this machine.
    pub presets: Vec<Resolved>,
    /// Registry secrets of tools whose preset is off: hidden, with copies
    /// of their configuration to write before the run.
    pub secrets: Resolved,
    /// Lower layers that tried to loosen the managed policy.
    pub conflicts: Vec<Conflict>,
}

/// A lower file's setting that the managed policy overrides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    pub origin: Origin,
    pub message: String,
    pub managed: Origin,
}

impl std::fmt::Display for Conflict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // A setting only the managed policy may make has no managed rule to
        // point at when the managed policy is silent: name where it belongs.
        if self.managed == Origin::BuiltIn {
            write!(
                f,
                "{}: {} (it belongs in the managed policy, /etc/airlock/managed.toml)",
                self.origin, self.message
            )
        } else {
            write!(
                f,
                "{}: {} (the managed rule at {} wins)",
                self.origin, self.message, self.managed
            )
        }
    }
}

fn last<T: Clone>(
    frags: &[Fragment],
    get: impl Fn(&Fragment) -> &Option<Located<T>>,
) -> Option<Located<T>> {
    frags.iter().rev().find_map(|f| get(f).clone())
}

impl Policy {
    /// Merge fragments (any order; they are sorted by layer, stably) and
    /// resolve the presets they name through `probe`.
    pub fn build(mut frags: Vec<Fragment>, probe: &dyn Probe) -> Policy {
        frags.sort_by_key(|f| f.layer);
        // Presets become allow rules at the layer that asked for them.
        let mut presets = vec![];
        let mut preset_frags = vec![];
        for f in &frags {
            for name in &f.presets {
                if presets.iter().any(|r: &Resolved| r.name == name.value) {
                    continue;
                }
                if let Some(p) = preset::find(&name.value) {
                    let resolved = p.resolve(probe);
                    let mut pf = Fragment::empty(f.layer, format!("preset {}", name.value));
                    pf.allow = resolved.rules(f.layer);
                    pf.write = resolved.write_entries(f.layer);
                    pf.deny_read = resolved.deny_read_entries(f.layer);
                    pf.env_set = resolved.env_entries(f.layer);
                    pf.credentials = resolved.credential_entries(f.layer);
                    pf.preset = true;
                    preset_frags.push(pf);
                    presets.push(resolved);
                }
            }
        }
        // Registry secrets of tools without their preset stay outside too.
        let secrets = preset::secrets_outside(probe, &presets);
        if !secrets.hide.is_empty() {
            let mut sf = Fragment::empty(Layer::BuiltIn, "registry secrets".to_string());
            sf.deny_read = secrets.deny_read_entries(Layer::BuiltIn);
            sf.env_set = secrets.env_entries(Layer::BuiltIn);
            sf.preset = true;
            preset_frags.push(sf);
        }
        frags.extend(preset_frags);
        frags.sort_by_key(|f| f.layer);

        let managed: Vec<&Fragment> = frags.iter().filter(|f| f.layer == Layer::Managed).collect();
        let lower = || {
            frags
                .iter()
                .filter(|f| f.layer != Layer::Managed && f.layer != Layer::BuiltIn)
        };
        let managed_set =
            |get: &dyn Fn(&Fragment) -> Option<Origin>| managed.iter().rev().find_map(|f| get(f));

        let mut conflicts = vec![];
        let user_allow_off = managed
            .iter()
            .rev()
            .find_map(|f| f.user_allow.clone())
            .filter(|u| !u.value);
        let unknown_deny = managed
            .iter()
            .rev()
            .find_map(|f| f.unknown.clone())
            .filter(|u| u.value == Unknown::Deny);
        let require_sandbox = managed.iter().rev().find_map(|f| f.require_sandbox.clone());
        let managed_inherit_none = managed
            .iter()
            .rev()
            .find_map(|f| f.env_inherit.clone())
            .filter(|i| i.value == EnvInherit::None);

        for f in lower() {
            if let Some(u) = &f.user_allow {
                conflicts.push(Conflict {
                    origin: u.origin.clone(),
                    message: "only the managed policy can set network.user_allow".into(),
                    managed: managed_set(&|m| m.user_allow.as_ref().map(|x| x.origin.clone()))
                        .unwrap_or(Origin::BuiltIn),
                });
            }
            if let Some(r) = &f.require_sandbox {
                conflicts.push(Conflict {
                    origin: r.origin.clone(),
                    message: "only the managed policy can set require_sandbox".into(),
                    managed: require_sandbox
                        .as_ref()
                        .map_or(Origin::BuiltIn, |m| m.origin.clone()),
                });
            }
            if let (Some(m), Some(u)) = (&unknown_deny, &f.unknown) {
                if u.value == Unknown::Ask {
                    conflicts.push(Conflict {
                        origin: u.origin.clone(),
                        message: "network.unknown = \"ask\" is overridden: the managed policy turns approvals off".into(),
                        managed: m.origin.clone(),
                    });
                }
            }
            if let (Some(m), Some(i)) = (&managed_inherit_none, &f.env_inherit) {
                if i.value == EnvInherit::All {
                    conflicts.push(Conflict {
                        origin: i.origin.clone(),
                        message: "env.inherit = \"all\" is overridden: the managed policy passes only the strict list".into(),
                        managed: m.origin.clone(),
                    });
                }
            }
            if let (Some(m), Some(mode)) = (require_sandbox.as_ref().filter(|r| r.value), &f.mode) {
                if mode.value == NetworkMode::Host {
                    conflicts.push(Conflict {
                        origin: mode.origin.clone(),
                        message: "network.mode = \"host\" is refused: the managed policy requires the sandbox".into(),
                        managed: m.origin.clone(),
                    });
                }
            }
            for a in &f.allow {
                if matches!(a.origin, Origin::Preset { .. }) && user_allow_off.is_none() {
                    continue;
                }
                if let Some(m) = &user_allow_off {
                    conflicts.push(Conflict {
                        origin: a.origin.clone(),
                        message: format!(
                            "allow {:?} is ignored: only the managed allow list counts",
                            a.value.text
                        ),
                        managed: m.origin.clone(),
                    });
                    continue;
                }
                for m in managed.iter().flat_map(|m| m.deny.iter()) {
                    if m.value.overlaps(&a.value) {
                        conflicts.push(Conflict {
                            origin: a.origin.clone(),
                            message: format!(
                                "allow {:?} is overridden by managed deny {:?}",
                                a.value.text, m.value.text
                            ),
                            managed: m.origin.clone(),
                        });
                    }
                }
            }
        }

        let all = |get: fn(&Fragment) -> &Vec<Located<String>>| -> Vec<Located<String>> {
            frags.iter().flat_map(|f| get(f).iter().cloned()).collect()
        };
        let allow = frags
            .iter()
            .filter(|f| f.layer == Layer::Managed || user_allow_off.is_none())
            .flat_map(|f| f.allow.iter().cloned())
            .collect();
        let rules = |get: fn(&Fragment) -> &Vec<Rule>| -> Vec<Rule> {
            frags.iter().flat_map(|f| get(f).iter().cloned()).collect()
        };
        let mut resolve = BTreeMap::new();
        for f in &frags {
            for (h, ip) in &f.resolve {
                // With `user_allow = false` a lower layer's pin would send
                // a name only the managed policy allows to any address
                // (red team round 13): only the managed layer's count.
                if let (Some(m), false) = (&user_allow_off, f.layer == Layer::Managed) {
                    conflicts.push(Conflict {
                        origin: ip.origin.clone(),
                        message: format!(
                            "resolve {:?} is ignored: with network.user_allow = false only the managed policy's resolve counts",
                            h.to_string()
                        ),
                        managed: m.origin.clone(),
                    });
                    continue;
                }
                resolve.insert(h.clone(), ip.clone());
            }
        }
        let mut env_set = BTreeMap::new();
        // What a preset sets yields to an explicit `[env] set` at any layer.
        let (from_presets, explicit): (Vec<&Fragment>, Vec<&Fragment>) =
            frags.iter().partition(|f| f.preset);
        for f in from_presets.into_iter().chain(explicit) {
            for (k, v) in &f.env_set {
                env_set.insert(k.clone(), v.clone());
            }
        }
        let mode = last(&frags, |f| &f.mode).unwrap_or(Located::built_in(NetworkMode::Proxy));
        // Only the managed allow list counting means nobody may approve
        // anything else either: asking is off.
        let unknown = unknown_deny
            .clone()
            .or_else(|| {
                user_allow_off
                    .as_ref()
                    .map(|u| Located::new(Unknown::Deny, u.layer, u.origin.clone()))
            })
            .or_else(|| last(&frags, |f| &f.unknown))
            .unwrap_or(Located::built_in(Unknown::Ask));

        Policy {
            // `read` narrows, so the highest layer that sets it replaces it.
            read: frags
                .iter()
                .rev()
                .find_map(|f| f.read.clone())
                .unwrap_or_else(|| vec![Located::built_in("/".into())]),
            write: all(|f| &f.write),
            deny_read: all(|f| &f.deny_read),
            deny_write: all(|f| &f.deny_write),
            unix_sockets: all(|f| &f.unix_sockets),
            mode,
            require_sandbox,
            allow,
            deny: rules(|f| &f.deny),
            inspect: rules(|f| &f.inspect),
            unknown,
            user_allow: user_allow_off.is_none(),
            ask_timeout: last(&frags, |f| &f.ask_timeout).map_or(DEFAULT_ASK_TIMEOUT, |d| d.value),
            connect_timeout: last(&frags, |f| &f.connect_timeout)
                .map_or(DEFAULT_CONNECT_TIMEOUT, |d| d.value),
            idle_timeout: last(&frags, |f| &f.idle_timeout)
                .map_or(DEFAULT_IDLE_TIMEOUT, |d| d.value),
            max_tunnels: last(&frags, |f| &f.max_tunnels).map_or(DEFAULT_MAX_TUNNELS, |d| d.value),
            allow_private: frags
                .iter()
                .flat_map(|f| f.allow_private.iter().cloned())
                .collect(),
            resolve,
            upstream_ca: all(|f| &f.upstream_ca),
            request_rules: frags
                .iter()
                .flat_map(|f| f.request_rules.iter().cloned())
                .collect(),
            hold_rules: frags
                .iter()
                .flat_map(|f| f.hold_rules.iter().cloned())
                .collect(),
            credentials: frags
                .iter()
                .flat_map(|f| f.credentials.iter().cloned())
                .collect(),
            env_inherit: frags
                .iter()
                .rev()
                .find_map(|f| {
                    f.env_inherit
                        .clone()
                        .filter(|i| i.value == EnvInherit::None)
                })
                .or_else(|| last(&frags, |f| &f.env_inherit))
                .unwrap_or(Located::built_in(EnvInherit::All)),
            env_pass: all(|f| &f.env_pass),
            env_set,
            timeout: last(&frags, |f| &f.timeout),
            memory: last(&frags, |f| &f.memory),
            pids: last(&frags, |f| &f.pids),
            tmp: last(&frags, |f| &f.tmp),
            audit_log: last(&frags, |f| &f.audit_log),
            audit_otlp: last(&frags, |f| &f.audit_otlp),
            macos_keychain: last(&frags, |f| &f.macos_keychain),
            macos_dnssd: last(&frags, |f| &f.macos_dnssd),
            presets,
            secrets,
            conflicts,
        }
    }

    /// Whether approvals can happen at all.
    pub fn asks(&self) -> bool {
        self.unknown.value == Unknown::Ask
    }

    pub fn sandbox_required(&self) -> bool {
        self.require_sandbox.as_ref().is_some_and(|r| r.value)
    }
}
