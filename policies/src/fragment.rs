//! A validated piece of policy from one place: a file, the command line,
//! a preset or the built-in defaults. Merging fragments gives a `Policy`.

use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;

use crate::host::Host;
use crate::model::{EnvInherit, NetworkMode, Unknown};
use crate::pattern::{Pattern, PatternList};
use crate::request::{Credential, RequestRule};
use crate::source::{Layer, Located, Origin};

pub type Rule = Located<Pattern>;

#[derive(Debug, Clone)]
pub struct Fragment {
    pub layer: Layer,
    /// Where this fragment came from as a whole (a path, or "command line").
    pub name: String,
    pub presets: Vec<Located<String>>,
    pub require_sandbox: Option<Located<bool>>,
    pub write: Vec<Located<String>>,
    pub read: Option<Vec<Located<String>>>,
    pub deny_read: Vec<Located<String>>,
    pub deny_write: Vec<Located<String>>,
    pub unix_sockets: Vec<Located<String>>,
    pub mode: Option<Located<NetworkMode>>,
    pub allow: Vec<Rule>,
    pub deny: Vec<Rule>,
    pub unknown: Option<Located<Unknown>>,
    pub user_allow: Option<Located<bool>>,
    pub ask_timeout: Option<Located<Duration>>,
    pub allow_private: Vec<Located<IpNet>>,
    pub inspect: Vec<Rule>,
    pub resolve: Vec<(Host, Located<IpAddr>)>,
    pub upstream_ca: Vec<Located<String>>,
    pub connect_timeout: Option<Located<Duration>>,
    pub idle_timeout: Option<Located<Duration>>,
    pub max_tunnels: Option<Located<u32>>,
    pub request_rules: Vec<RequestRule>,
    pub credentials: Vec<Credential>,
    pub env_inherit: Option<Located<EnvInherit>>,
    pub env_pass: Vec<Located<String>>,
    pub env_set: Vec<(String, Located<String>)>,
    pub timeout: Option<Located<Duration>>,
    pub memory: Option<Located<u64>>,
    pub pids: Option<Located<u32>>,
    pub tmp: Option<Located<u64>>,
    pub audit_log: Option<Located<String>>,
    pub audit_otlp: Option<Located<String>>,
    /// `[macos] keychain`: the login keychain inside the Seatbelt sandbox.
    pub macos_keychain: Option<Located<bool>>,
    /// `[macos] dnssd`: the system resolver inside the Seatbelt sandbox.
    pub macos_dnssd: Option<Located<bool>>,
    /// Made by a preset (its `[env] set` yields to explicit ones).
    pub preset: bool,
}

impl Fragment {
    pub fn empty(layer: Layer, name: impl Into<String>) -> Fragment {
        Fragment {
            layer,
            name: name.into(),
            presets: vec![],
            require_sandbox: None,
            write: vec![],
            read: None,
            deny_read: vec![],
            deny_write: vec![],
            unix_sockets: vec![],
            mode: None,
            allow: vec![],
            deny: vec![],
            unknown: None,
            user_allow: None,
            ask_timeout: None,
            allow_private: vec![],
            inspect: vec![],
            resolve: vec![],
            upstream_ca: vec![],
            connect_timeout: None,
            idle_timeout: None,
            max_tunnels: None,
            request_rules: vec![],
            credentials: vec![],
            env_inherit: None,
            env_pass: vec![],
            env_set: vec![],
            timeout: None,
            memory: None,
            pids: None,
            tmp: None,
            audit_log: None,
            audit_otlp: None,
            macos_keychain: None,
            macos_dnssd: None,
            preset: false,
        }
    }

    /// SPEC §3.3 (1): the built-in defaults.
    pub fn built_in() -> Fragment {
        let mut f = Fragment::empty(Layer::BuiltIn, "built-in defaults");
        let l = |s: &str| Located::built_in(s.to_string());
        f.read = Some(vec![l("/")]);
        f.write = vec![l(".")];
        f.deny_read = DEFAULT_DENY_READ.iter().map(|s| l(s)).collect();
        f.deny_write = DEFAULT_DENY_WRITE.iter().map(|s| l(s)).collect();
        f.unknown = Some(Located::built_in(Unknown::Ask));
        f.mode = Some(Located::built_in(NetworkMode::Proxy));
        f
    }
}

/// Secrets an agent has no business reading (SPEC §3.3).
pub const DEFAULT_DENY_READ: &[&str] = &[
    "~/.ssh",
    "~/.aws",
    "~/.gnupg",
    "~/.kube",
    "~/.docker/config.json",
    "~/.netrc",
    "~/.git-credentials",
    "~/.config/gh",
    "~/.config/gcloud",
    "~/.azure",
    "~/.bash_history",
    "~/.zsh_history",
    "~/.local/share/fish/fish_history",
    "~/.python_history",
    "~/.node_repl_history",
    "~/.psql_history",
    "~/.mysql_history",
    "~/.mozilla",
    "~/.config/google-chrome",
    "~/.config/chromium",
    "~/.config/BraveSoftware",
    "~/.config/microsoft-edge",
    "~/snap/firefox",
    "~/Library/Application Support/Google/Chrome",
    "~/Library/Application Support/Firefox",
    "~/Library/Safari",
];

/// Paths that would let a sandboxed command run code outside the sandbox
/// later (git hooks, editor tasks, shell start-up files, airlock's own
/// policy), write-protected even inside writable roots.
pub const DEFAULT_DENY_WRITE: &[&str] = &[
    ".git/hooks",
    ".git/config",
    ".gitmodules",
    ".vscode",
    ".idea",
    "airlock.toml",
    "~/.bashrc",
    "~/.bash_profile",
    "~/.bash_login",
    "~/.profile",
    "~/.zshrc",
    "~/.zshenv",
    "~/.zprofile",
    "~/.zlogin",
    "~/.config/fish/config.fish",
];

/// A pattern from the command line (`--allow`, `--deny`, `--inspect`).
pub fn flag_rule(flag: &str, text: &str, list: PatternList) -> Result<Rule, String> {
    Pattern::parse(text, list)
        .map(|p| {
            Located::new(
                p,
                Layer::CommandLine,
                Origin::Flag {
                    flag: format!("{flag} {text}"),
                },
            )
        })
        .map_err(|e| format!("{flag} {text}: {}", e.why))
}
