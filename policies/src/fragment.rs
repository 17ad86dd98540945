//! A validated piece of policy from one place: a file, the command line,
//! a preset or the built-in defaults. Merging fragments gives a `Policy`.

use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;

use crate::host::Host;
use crate::model::{EnvInherit, NetworkMode, Unknown};
use crate::pattern::{Pattern, PatternList};
use crate::request::{Credential, HoldRule, RequestRule};
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
    pub hold_rules: Vec<HoldRule>,
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
            hold_rules: vec![],
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
        f.deny_read = default_deny_read().iter().map(|s| l(s)).collect();
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
    // Git's XDG credential store, registries and clouds (SPEC §3.3).
    "~/.config/git/credentials",
    "~/.pypirc",
    "~/.gem/credentials",
    "~/.local/share/gem/credentials",
    "~/.m2/settings.xml",
    "~/.m2/settings-security.xml",
    "~/.gradle/gradle.properties",
    "~/.config/composer/auth.json",
    "~/.composer/auth.json",
    "~/.nuget/NuGet/NuGet.Config",
    "~/.config/NuGet/NuGet.Config",
    "~/.terraform.d/credentials.tfrc.json",
    "~/.terraformrc",
    "~/.vault-token",
    "~/.config/containers/auth.json",
    "~/.config/doctl",
    "~/.oci",
    "~/.fly",
    // Coding agents' logins (OAuth tokens, API keys): an agent run on the
    // host keeps its own; a command inside has no use for them.
    "~/.claude/.credentials.json",
    "~/.codex/auth.json",
    "~/.gemini/oauth_creds.json",
    "~/.config/github-copilot",
    // Data and ML platforms.
    "~/.cache/huggingface/token",
    "~/.cache/huggingface/stored_tokens",
    "~/.huggingface/token",
    "~/.huggingface_token",
    "~/.kaggle/kaggle.json",
    "~/.config/kaggle/kaggle.json",
    "~/.databrickscfg",
    // Their configurations (with passwords), not the directories: SnowSQL
    // installs its own binaries beside its configuration.
    "~/.snowsql/config",
    "~/.snowflake/connections.toml",
    "~/.snowflake/config.toml",
    // Artifact stores, deploy and hosting CLIs (firebase-tools and other
    // Node CLIs keep their logins in configstore).
    "~/.jfrog",
    "~/.config/configstore",
    "~/.netlify/config.json",
    "~/.config/netlify/config.json",
    "~/.vercel/auth.json",
    "~/.now/auth.json",
    "~/.local/share/com.vercel.cli/auth.json",
    "~/Library/Application Support/com.vercel.cli/auth.json",
    "~/.wrangler",
    "~/.config/.wrangler",
    "~/Library/Preferences/.wrangler",
    "~/.pulumi/credentials.json",
    "~/.sentryclirc",
    "~/.config/stripe/config.toml",
    "~/.supabase/access-token",
    "~/.railway/config.json",
    "~/.config/hcloud/cli.toml",
    "~/.config/linode-cli",
    // Helm's repository passwords and OCI registry logins.
    "~/.config/helm/repositories.yaml",
    "~/.config/helm/registry/config.json",
    "~/Library/Preferences/helm/repositories.yaml",
    "~/Library/Preferences/helm/registry/config.json",
    // Ansible Vault password files by their usual names (one named in
    // `ANSIBLE_VAULT_PASSWORD_FILE` is added by `default_deny_read`).
    "~/.vault_pass",
    "~/.vault_pass.txt",
    "~/.vault_password",
    "~/.ansible-vault-pass",
    "~/.ansible_vault_pass",
    "~/.ansible/vault_pass",
    "~/.ansible/vault_pass.txt",
    "~/.ansible/vault-password",
    // Database clients.
    "~/.pgpass",
    "~/.pg_service.conf",
    "~/.my.cnf",
    "~/.mylogin.cnf",
    // S3 tools and rclone.
    "~/.s3cfg",
    "~/.passwd-s3fs",
    "~/.boto",
    "~/.mc",
    "~/.config/rclone",
    // hub and glab.
    "~/.config/hub",
    "~/.config/glab-cli",
    // Password-manager CLIs.
    "~/.config/op",
    "~/.op",
    "~/.config/Bitwarden CLI",
    "~/.password-store",
    "~/.config/gopass",
    "~/.local/share/gopass",
    "~/.config/lpass",
    "~/.local/share/lpass",
    // Desktop keyrings and editors' secret storage.
    "~/.local/share/keyrings",
    "~/.local/share/kwalletd",
    "~/Library/Keychains",
    "~/.config/Code/User/globalStorage/state.vscdb",
    "~/.config/Code - OSS/User/globalStorage/state.vscdb",
    "~/.config/VSCodium/User/globalStorage/state.vscdb",
    "~/.config/Cursor/User/globalStorage/state.vscdb",
    // Histories of shells, database clients and REPLs.
    "~/.sh_history",
    "~/.histfile",
    "~/.sqlite_history",
    "~/.duckdb_history",
    "~/.rediscli_history",
    "~/.dbshell",
    "~/.mongodb/mongosh",
    "~/.mycli-history",
    "~/.config/pgcli/history",
    "~/.config/litecli/history",
    "~/.usql_history",
    "~/.clickhouse-client-history",
    "~/.cassandra/cqlsh_history",
    "~/.influx_history",
    "~/.irb_history",
    "~/.pry_history",
    "~/.php_history",
    "~/.scala_history",
    "~/.ghc/ghci_history",
    "~/.julia/logs/repl_history.jl",
    "~/.ipython/profile_default/history.sqlite",
    "~/.mozilla",
    "~/.config/google-chrome",
    "~/.config/chromium",
    "~/.config/BraveSoftware",
    "~/.config/microsoft-edge",
    "~/snap/firefox",
    "~/Library/Application Support/Google/Chrome",
    "~/Library/Application Support/Firefox",
    "~/Library/Safari",
    // Red team round 7: more registries' and tools' logins (not the
    // configurations the tools need to work: `.condarc`, cabal's config
    // and `~/.gitconfig` stay readable; see docs/src/security.md).
    "~/.bunfig.toml",
    "~/.config/pypoetry/auth.toml",
    "~/Library/Application Support/pypoetry/auth.toml",
    "~/.local/share/uv/credentials",
    "~/.sbt/.credentials",
    "~/.ivy2/.credentials",
    "~/.hex/hex.config",
    "~/.config/dart/pub-tokens.json",
    "~/.pub-cache/credentials.json",
    "~/.dockercfg",
    "~/.cloudflared",
    "~/.config/ngrok",
    "~/.ngrok2",
    "~/Library/Application Support/ngrok",
    "~/.dbt/profiles.yml",
    "~/.config/sops",
    "~/.age",
    "~/.config/age",
    "~/.zhistory",
    "~/.local/share/atuin",
    "~/.config/nushell/history.txt",
    "~/.config/nushell/history.sqlite3",
    "~/.pki/nssdb",
    "~/.config/Slack",
    "~/.config/discord",
    "~/.thunderbird",
    "~/.config/filezilla",
    "~/.local/share/remmina",
    "~/.config/remmina",
    "~/.sbt/credentials",
    "~/.mix/hex.config",
    "~/.config/rebar3/hex.config",
    "~/.config/dart/pub-credentials.json",
    "~/.config/heroku/config.json",
    "~/.config/openai/auth.json",
    "~/.config/tea/config.yml",
    "~/.config/atuin/key",
    "~/.aider.conf.yml",
    "~/.irssi/config",
    "~/.config/hexchat/servlist.conf",
    "~/.env",
];

/// [`DEFAULT_DENY_READ`] and what only this machine's environment names:
/// podman's per-login credential store under `$XDG_RUNTIME_DIR`, the
/// Ansible Vault password file `ANSIBLE_VAULT_PASSWORD_FILE` names, and the
/// password databases of JetBrains IDEs (one directory per product and
/// version, so listed, not globbed: mounts cannot take a glob).
/// Where the tools' own variables move the logins the list names under
/// HOME (red team round 8: `KUBECONFIG`, `DOCKER_CONFIG`, `XDG_CONFIG_HOME`
/// and the like put them where the fixed list did not look). Absolute
/// paths only, and none with a glob character.
pub fn relocated_logins(var: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
    let usable = |v: &str| v.starts_with('/') && !v.contains(['*', '?', '[', '\n']);
    let mut out = vec![];
    // Files, or `:`-separated lists of them.
    for (name, list) in [
        ("KUBECONFIG", true),
        ("AWS_SHARED_CREDENTIALS_FILE", false),
        ("AWS_CONFIG_FILE", false),
        ("GOOGLE_APPLICATION_CREDENTIALS", false),
        ("NETRC", false),
        ("TF_CLI_CONFIG_FILE", false),
        ("HF_TOKEN_PATH", false),
        // Red team round 9: more of the default list's files, where their
        // tools' own variables move them.
        ("PGPASSFILE", false),
        ("RCLONE_CONFIG", false),
        ("REGISTRY_AUTH_FILE", false),
        ("HELM_REGISTRY_CONFIG", false),
        ("DATABRICKS_CONFIG_FILE", false),
        ("HISTFILE", false),
        ("PSQL_HISTORY", false),
        ("MYSQL_HISTFILE", false),
        ("NODE_REPL_HISTORY", false),
        ("SQLITE_HISTORY", false),
        ("PYTHON_HISTORY", false),
    ] {
        if let Some(v) = var(name) {
            let parts: Vec<String> = if list {
                // kubectl reads a relative entry from where it runs: the
                // current directory, airlock's too (red team round 9).
                let cwd = std::env::current_dir().ok();
                v.split(':')
                    .filter(|p| !p.is_empty())
                    .filter_map(|p| match p.starts_with('/') {
                        true => Some(p.to_string()),
                        false => cwd.as_ref().map(|c| c.join(p).display().to_string()),
                    })
                    .collect()
            } else {
                vec![v]
            };
            out.extend(parts.into_iter().filter(|p| usable(p)));
        }
    }
    // Directories, whole or by the file in them that holds the login.
    for (name, inside) in [
        ("DOCKER_CONFIG", "config.json"),
        ("GH_CONFIG_DIR", ""),
        ("GNUPGHOME", ""),
        ("PASSWORD_STORE_DIR", ""),
        ("AZURE_CONFIG_DIR", ""),
        ("CLOUDSDK_CONFIG", ""),
        ("HF_HOME", "token"),
        ("HF_HOME", "stored_tokens"),
        // The coding agents' own logins, where a harness moves them.
        ("CLAUDE_CONFIG_DIR", ".credentials.json"),
        ("CODEX_HOME", "auth.json"),
        ("GRADLE_USER_HOME", "gradle.properties"),
        ("COMPOSER_HOME", "auth.json"),
        ("KAGGLE_CONFIG_DIR", "kaggle.json"),
        ("PULUMI_HOME", "credentials.json"),
    ] {
        if let Some(v) = var(name).filter(|v| usable(v)) {
            let p = std::path::Path::new(&v).join(inside);
            out.push(p.display().to_string());
        }
    }
    // The list's entries under `~/.config` and `~/.local/share`, where
    // XDG_CONFIG_HOME and XDG_DATA_HOME move them.
    for (name, under) in [
        ("XDG_CONFIG_HOME", "~/.config/"),
        ("XDG_DATA_HOME", "~/.local/share/"),
        ("XDG_CACHE_HOME", "~/.cache/"),
        ("XDG_STATE_HOME", "~/.local/state/"),
    ] {
        if let Some(v) = var(name).filter(|v| usable(v)) {
            for entry in DEFAULT_DENY_READ {
                if let Some(rest) = entry.strip_prefix(under) {
                    out.push(std::path::Path::new(&v).join(rest).display().to_string());
                }
            }
        }
    }
    out
}

pub fn default_deny_read() -> Vec<String> {
    let mut out: Vec<String> = DEFAULT_DENY_READ.iter().map(|s| s.to_string()).collect();
    // An absolute path, or one from home: a relative one is read from
    // wherever ansible runs, which is no fixed file to hide.
    if let Some(vault) = std::env::var("ANSIBLE_VAULT_PASSWORD_FILE")
        .ok()
        .filter(|v| (v.starts_with('/') || v.starts_with("~/")) && !v.contains('*'))
    {
        out.push(vault);
    }
    if let Some(run) = std::env::var_os("XDG_RUNTIME_DIR")
        .map(std::path::PathBuf::from)
        .filter(|p| p.is_absolute())
    {
        out.push(run.join("containers/auth.json").display().to_string());
    }
    out.extend(relocated_logins(&|k| std::env::var(k).ok()));
    if let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        let jetbrains = std::path::Path::new(&home).join(".config/JetBrains");
        if let Ok(dir) = std::fs::read_dir(&jetbrains) {
            for e in dir.flatten() {
                if let Some(name) = e.file_name().to_str().filter(|n| !n.contains('*')) {
                    for f in ["c.kdbx", "c.pwd"] {
                        out.push(format!("~/.config/JetBrains/{name}/{f}"));
                    }
                }
            }
        }
    }
    out
}

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

#[cfg(test)]
mod tests {
    #[test]
    fn logins_moved_by_their_variables_are_hidden_where_they_are() {
        let vars = |k: &str| match k {
            "KUBECONFIG" => Some("/k/one:/k/two:relative".to_string()),
            "DOCKER_CONFIG" => Some("/d".to_string()),
            "XDG_CONFIG_HOME" => Some("/x".to_string()),
            "NETRC" => Some("/n/*".to_string()),
            _ => None,
        };
        let got = super::relocated_logins(&vars);
        for want in ["/k/one", "/k/two", "/d/config.json", "/x/gh", "/x/rclone"] {
            assert!(got.iter().any(|g| g == want), "{want}: {got:?}");
        }
        assert!(
            !got.iter().any(|g| g == "relative" || g.contains('*')),
            "{got:?}"
        );
    }
}
