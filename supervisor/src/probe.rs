//! The real machine, as the policy crate's presets see it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
#[cfg(target_os = "linux")]
use std::time::Duration;

use airlock_policy::Probe;

use crate::plan::{Net, Plan};

pub struct SystemProbe<'a> {
    pub workspace: PathBuf,
    /// Files below a writable root are checked against the trust store.
    pub trust: &'a crate::trust::Trust,
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
            let b = crate::trust::read_no_follow(path).ok()?;
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
        tracing::debug!(?argv, "preset probe runs in a network-less sandbox");
        let path: Vec<String> = std::env::var("PATH")
            .unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into())
            .split(':')
            .filter(|d| d.starts_with('/') && !self.trust.needs_trust(Path::new(d)))
            .map(str::to_string)
            .collect();
        let mut env = crate::env::scrub(std::env::vars(), &[], &Default::default());
        env.insert("PATH".into(), path.join(":"));
        let plan = probe_plan(argv, env);
        match run_sandboxed(&plan) {
            Ok(out) => out,
            Err(e) => {
                tracing::warn!("preset probe {argv:?} could not run sandboxed: {e:#}");
                None
            }
        }
    }

    fn home(&self) -> Option<PathBuf> {
        std::env::var_os("HOME").map(PathBuf::from)
    }

    fn workspace(&self) -> PathBuf {
        self.workspace.clone()
    }
}

/// The boundary a probe runs in: read-only everything (secrets hidden), no
/// network, no writable root, the private /tmp as its working directory.
fn probe_plan(argv: &[&str], env: BTreeMap<String, String>) -> Plan {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/".into());
    let mut deny_read: Vec<PathBuf> = airlock_policy::fragment::DEFAULT_DENY_READ
        .iter()
        .filter_map(|p| crate::plan::resolve_path(p, &home, Path::new("/")))
        .collect();
    deny_read.extend(airlock_ca::default_dir());
    Plan {
        argv: argv.iter().map(|a| a.to_string()).collect(),
        env,
        cwd: PathBuf::from("/tmp"),
        net: Net::None,
        read: vec![PathBuf::from("/")],
        write: vec![],
        tmp_binds: vec![],
        deny_read,
        deny_write: vec![],
        pin: vec![],
        own_outputs: vec![],
        protected: vec![],
        deny_read_globs: vec![],
        unsupported: vec![],
        allow_degraded: false,
        degraded: None,
        macos: Default::default(),
        unix_sockets: vec![],
        limits: Default::default(),
    }
}

/// How long a probe may take before it is killed.
#[cfg(target_os = "linux")]
const PROBE_TIMEOUT: Duration = Duration::from_secs(20);

#[cfg(target_os = "linux")]
fn run_sandboxed(plan: &Plan) -> anyhow::Result<Option<String>> {
    use std::io::Read;
    use std::process::Stdio;
    let sandbox =
        crate::linux::Sandbox::start_with(plan, [Stdio::null(), Stdio::piped(), Stdio::null()])?;
    let (mut child, _, _) = sandbox.into_parts();
    let mut stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow::anyhow!("no probe output"))?;
    let pid = child.id() as libc::pid_t;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = vec![];
        let _ = stdout.read_to_end(&mut buf);
        let _ = tx.send(buf);
    });
    let out = rx.recv_timeout(PROBE_TIMEOUT);
    if out.is_err() {
        // SAFETY: kill(2) on our own, unreaped child.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let status = child.wait()?;
    let out = out.map_err(|_| anyhow::anyhow!("timed out after {PROBE_TIMEOUT:?}"))?;
    Ok(status
        .success()
        .then(|| String::from_utf8_lossy(&out).into_owned()))
}

#[cfg(not(target_os = "linux"))]
fn run_sandboxed(_: &Plan) -> anyhow::Result<Option<String>> {
    anyhow::bail!("sandboxed probes are built for Linux only; configure the registry explicitly")
}
