//! The sandbox stage's side of a preset's probe: the tool runs in a
//! network-less sandbox that can write nothing (`output`), or with a
//! proxy listener here that writes down each destination and refuses it
//! (`observe`). Nothing leaves the machine.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
#[cfg(target_os = "linux")]
use std::time::Duration;

use crate::plan::{Net, Plan};
use crate::policy::machine::Sandboxed;

/// The probe runner every policy build is given.
pub struct Runner;

impl Sandboxed for Runner {
    fn output(&self, argv: &[&str], env: BTreeMap<String, String>) -> Option<String> {
        tracing::debug!(?argv, "preset probe runs in a network-less sandbox");
        let plan = probe_plan(argv, env);
        match run_sandboxed(&plan) {
            Ok(out) => out,
            Err(e) => {
                tracing::warn!("preset probe {argv:?} could not run sandboxed: {e:#}");
                None
            }
        }
    }

    fn observe(&self, argv: &[&str], mut env: BTreeMap<String, String>) -> Vec<String> {
        tracing::debug!(?argv, "preset probe observes where a tool connects");
        crate::env::add_proxy(&mut env, crate::plan::SANDBOX_PROXY_PORT);
        let mut plan = probe_plan(argv, env);
        plan.net = Net::Proxy;
        match observe_sandboxed(&plan) {
            Ok(seen) => seen,
            Err(e) => {
                tracing::warn!("preset probe {argv:?} could not run sandboxed: {e:#}");
                vec![]
            }
        }
    }
}

/// The boundary a probe runs in: read-only everything (secrets hidden), no
/// network, no writable root, the private /tmp as its working directory.
fn probe_plan(argv: &[&str], env: BTreeMap<String, String>) -> Plan {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/".into());
    let mut deny_read: Vec<PathBuf> = airlock_policy::fragment::default_deny_read()
        .iter()
        .filter_map(|p| crate::paths::resolve_path(p, &home, Path::new("/")))
        .collect();
    deny_read.extend(airlock_ca::default_dir());
    Plan {
        argv: argv.iter().map(|a| a.to_string()).collect(),
        env,
        withheld_env: vec![],
        env_rule: None,
        env_warnings: vec![],
        cwd: PathBuf::from("/tmp"),
        net: Net::None,
        read: vec![PathBuf::from("/")],
        write: vec![],
        tmp_binds: vec![],
        tmp_read_binds: vec![],
        publish: vec![],
        deny_read,
        deny_write: vec![],
        pin: vec![],
        own_outputs: vec![],
        protected: vec![],
        deny_read_globs: vec![],
        deny_read_names: vec![],
        deny_read_env: vec![],
        deny_read_env_truncated: false,
        project_configs: vec![],
        deny_read_env_in_git: vec![],
        deny_read_masks: vec![],
        sanitised: vec![],
        unsupported: vec![],
        allow_degraded: false,
        degraded: None,
        macos: Default::default(),
        unix_sockets: vec![],
        limits: Default::default(),
        log: String::new(),
        start_note: None,
        no_write_notes: false,
        session: false,
        review: vec![],
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
        .take_stdout()
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

/// Run the probe with its proxy listener answered here: every request's
/// destination (CONNECT or absolute-form) is recorded and refused with
/// 403. Returns the destinations, in order, without repeats.
#[cfg(target_os = "linux")]
fn observe_sandboxed(plan: &Plan) -> anyhow::Result<Vec<String>> {
    use std::io::{BufRead, BufReader, Write};
    use std::process::Stdio;
    use std::time::Instant;
    let sandbox =
        crate::linux::Sandbox::start_with(plan, [Stdio::null(), Stdio::null(), Stdio::null()])?;
    let (mut child, fd, _) = sandbox.into_parts();
    let listener = std::net::TcpListener::from(
        fd.ok_or_else(|| anyhow::anyhow!("the probe sandbox has no proxy listener"))?,
    );
    listener.set_nonblocking(true)?;
    let deadline = Instant::now() + PROBE_TIMEOUT;
    let mut seen: Vec<String> = vec![];
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                let _ = stream.set_nonblocking(false);
                let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
                let mut line = String::new();
                let mut reader = BufReader::new(&stream);
                if reader.read_line(&mut line).is_ok() {
                    if let Some(t) = destination(&line) {
                        if !seen.contains(&t) {
                            seen.push(t);
                        }
                    }
                }
                let _ = (&stream).write_all(
                    b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                );
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if child.try_wait()?.is_some() {
                    break;
                }
                if Instant::now() > deadline {
                    // SAFETY: kill(2) on our own, unreaped child.
                    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGKILL) };
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(seen)
}

#[cfg(not(target_os = "linux"))]
fn observe_sandboxed(_: &Plan) -> anyhow::Result<Vec<String>> {
    anyhow::bail!("sandboxed probes are built for Linux only; configure the registry explicitly")
}

/// `host:port` from a request line: `CONNECT host:port HTTP/1.1`, or an
/// absolute-form `GET http://host[:port]/path HTTP/1.1` (port 80 then).
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn destination(line: &str) -> Option<String> {
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next()?, parts.next()?);
    let t = if method == "CONNECT" {
        target.to_string()
    } else {
        let u = url::Url::parse(target).ok()?;
        format!("{}:{}", u.host_str()?, u.port_or_known_default()?)
    };
    // Only what a host pattern can say: a plain name or address and a port.
    let ok = t
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']'));
    (ok && t.contains(':')).then_some(t)
}

#[cfg(test)]
mod tests {
    #[test]
    fn destinations_from_request_lines() {
        use super::destination;
        assert_eq!(
            destination("CONNECT idx.test:443 HTTP/1.1\r\n").as_deref(),
            Some("idx.test:443")
        );
        assert_eq!(
            destination("GET http://plain.test/x HTTP/1.1\r\n").as_deref(),
            Some("plain.test:80")
        );
        assert_eq!(destination("CONNECT a b\x1b[2J:1 HTTP/1.1"), None);
        assert_eq!(destination("GET /relative HTTP/1.1"), None);
    }
}
