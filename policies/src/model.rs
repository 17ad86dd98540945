//! The policy file as written (SPEC §3.1). Every list entry keeps its span
//! so that a decision can name the file and line that made it.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

pub type Text = Spanned<String>;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyFile {
    pub version: Option<Spanned<i64>>,
    #[serde(default)]
    pub presets: Vec<Text>,
    /// Managed policy: refuse `--network host`.
    pub require_sandbox: Option<Spanned<bool>>,
    #[serde(default)]
    pub filesystem: FilesystemSection,
    #[serde(default)]
    pub network: NetworkSection,
    #[serde(default)]
    pub env: EnvSection,
    #[serde(default)]
    pub limits: LimitsSection,
    #[serde(default)]
    pub audit: AuditSection,
    #[serde(default)]
    pub macos: MacosSection,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilesystemSection {
    pub write: Option<Vec<Text>>,
    pub read: Option<Vec<Text>>,
    pub deny_read: Option<Vec<Text>>,
    pub deny_write: Option<Vec<Text>>,
    /// Host pathname sockets the sandbox may connect to (SPEC §4.6).
    pub unix_sockets: Option<Vec<Text>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    Proxy,
    None,
    Host,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Unknown {
    Ask,
    Deny,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkSection {
    pub mode: Option<Spanned<NetworkMode>>,
    #[serde(default)]
    pub allow: Vec<Text>,
    #[serde(default)]
    pub deny: Vec<Text>,
    pub unknown: Option<Spanned<Unknown>>,
    pub ask_timeout: Option<Text>,
    /// Managed policy: `false` makes only the managed allow list count.
    pub user_allow: Option<Spanned<bool>>,
    #[serde(default)]
    pub allow_private: Vec<Text>,
    #[serde(default)]
    pub inspect: Vec<Text>,
    #[serde(default)]
    pub resolve: BTreeMap<String, Text>,
    #[serde(default)]
    pub upstream_ca: Vec<Text>,
    pub connect_timeout: Option<Text>,
    pub idle_timeout: Option<Text>,
    pub max_tunnels: Option<Spanned<i64>>,
    #[serde(default)]
    pub request: Vec<RequestSection>,
    #[serde(default)]
    pub credential: Vec<CredentialSection>,
    /// Requests a review run holds instead of sending (SPEC §4.8).
    #[serde(default)]
    pub hold: Vec<HoldSection>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HoldSection {
    pub host: Text,
    /// `METHOD /path/glob`, as in request rules.
    #[serde(default)]
    pub requests: Vec<Text>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestSection {
    pub host: Text,
    #[serde(default)]
    pub allow: Vec<Text>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialSection {
    pub host: Text,
    pub header: Text,
    pub value: Text,
    /// What it is lent to beyond reads (`PUT`, `*`, `POST /path/**`).
    #[serde(default)]
    pub methods: Vec<Text>,
}

/// `[env] inherit` (SPEC §4.3): the host environment less what looks like
/// a secret, or only the strict pass list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EnvInherit {
    All,
    None,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvSection {
    pub inherit: Option<Spanned<EnvInherit>>,
    #[serde(default)]
    pub pass: Vec<Text>,
    #[serde(default)]
    pub set: BTreeMap<String, Text>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    pub timeout: Option<Text>,
    pub memory: Option<Text>,
    pub pids: Option<Spanned<i64>>,
    /// Size cap of the private /tmp and /dev/shm.
    pub tmp: Option<Text>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditSection {
    pub log: Option<Text>,
    /// An OTLP/HTTP endpoint that receives every audit event as a log.
    pub otlp: Option<Text>,
}

/// Grants only the macOS Seatbelt profile knows; both off by default
/// because each is a way around the sandbox (the keychain's secrets, DNS
/// that the proxy never sees).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MacosSection {
    pub keychain: Option<Spanned<bool>>,
    pub dnssd: Option<Spanned<bool>>,
}
