//! The real machine, as the policy crate's presets see it: its
//! environment, its files (checked against the trust store where a sandbox
//! could have written them) and the tool's own answers, which a
//! [`Sandboxed`] runner from the sandbox stage gets in a network-less
//! sandbox (SPEC §3.5). The policy stage only asks; it imports nothing of
//! the plan or the sandbox.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use airlock_policy::Probe;

use super::trust::Trust;

/// Runs a tool for a preset's probe without letting it reach anything:
/// implemented by the sandbox stage (its `probe::Runner`).
pub trait Sandboxed {
    /// The tool's standard output, if it ran and succeeded.
    fn output(&self, argv: &[&str], env: BTreeMap<String, String>) -> Option<String>;
    /// The destinations the tool tried to reach, each refused.
    fn observe(&self, argv: &[&str], env: BTreeMap<String, String>) -> Vec<String>;
}

pub struct SystemProbe<'a> {
    pub workspace: PathBuf,
    /// `policy::project_root` of the workspace: whose caches the run gets.
    pub project: PathBuf,
    /// Files below a writable root are checked against the trust store.
    pub trust: &'a Trust,
    pub sandboxed: &'a dyn Sandboxed,
}

impl Probe for SystemProbe<'_> {
    fn env(&self, name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|v| !v.is_empty())
    }

    fn env_vars(&self) -> Vec<(String, String)> {
        std::env::vars().collect()
    }

    fn read(&self, path: &Path) -> Option<String> {
        let bytes = if self.trust.needs_trust(path) {
            let b = crate::paths::read_no_follow(path).ok()?;
            // Applied even when untrusted, so the refusal can say what it
            // would change; `run` and `proxy` then refuse to start.
            self.trust.check(path, &b);
            b
        } else {
            std::fs::read(path).ok()?
        };
        String::from_utf8(bytes).ok()
    }

    fn list_dir(&self, path: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(path)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        if !names.is_empty() && self.trust.needs_trust(path) {
            // A listing a sandbox could have shaped is trusted like a file.
            self.trust.check(path, names.join("\n").as_bytes());
        }
        names
    }

    /// Probes never run workspace code (SPEC §3.5): the tool runs inside a
    /// network-less sandbox that can write nothing, in an empty private
    /// directory, with a scrubbed environment and a PATH without any
    /// directory a sandbox could have written.
    fn output(&self, argv: &[&str]) -> Option<String> {
        self.sandboxed.output(argv, self.probe_env())
    }

    fn home(&self) -> Option<PathBuf> {
        std::env::var_os("HOME").map(PathBuf::from)
    }

    /// Like `output`, but the sandbox's network is the proxy listener, and
    /// the proxy here only writes down each destination and refuses it:
    /// nothing leaves the machine.
    fn observe(&self, argv: &[&str], extra: &[(&str, &str)]) -> Vec<String> {
        let mut env = self.probe_env();
        for (k, v) in extra {
            env.insert(k.to_string(), v.to_string());
        }
        self.sandboxed.observe(argv, env)
    }

    fn workspace(&self) -> PathBuf {
        self.workspace.clone()
    }

    fn real_path(&self, path: &Path) -> Option<PathBuf> {
        std::fs::canonicalize(path).ok()
    }

    fn project(&self) -> Option<PathBuf> {
        Some(self.project.clone())
    }
}

impl SystemProbe<'_> {
    /// A scrubbed environment whose PATH holds no directory a sandbox
    /// could have written.
    fn probe_env(&self) -> BTreeMap<String, String> {
        let path: Vec<String> = std::env::var("PATH")
            .unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into())
            .split(':')
            .filter(|d| d.starts_with('/') && !self.trust.needs_trust(Path::new(d)))
            .map(str::to_string)
            .collect();
        // The strict pass list, as before runs inherited: a probe asks the
        // tool about its own configuration and needs nothing else.
        let mut env = crate::env::scrub(
            std::env::vars(),
            airlock_policy::EnvInherit::None,
            &[],
            &Default::default(),
            &[],
            true,
        )
        .env;
        env.insert("PATH".into(), path.join(":"));
        env
    }
}
