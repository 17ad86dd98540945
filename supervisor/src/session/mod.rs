//! Sessions (SPEC §4.7): one sandbox for an agent's whole task. `session
//! start` builds the sandbox once and serves it from a supervisor process
//! of its own (the one-shot run path, with PID 1 starting commands sent on
//! a socket rather than one argv); `run --session NAME` sends a command
//! with the caller's argv, directory, environment and stdio, and exits
//! with its status. This module owns the session's names, its socket and
//! who may use it; `server` and `client` are the two ends.

pub mod client;
mod relay;
pub mod server;

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};

/// Where sessions live: `sessions` in [`crate::places::runtime_dir`]
/// (which every sandbox has read-only or hidden). Made 0700 and checked to
/// be ours, not a link.
pub fn dir() -> Result<PathBuf> {
    let base = crate::places::runtime_dir().context("HOME is not set")?;
    let dir = base.join("sessions");
    crate::paths::own_private_dir(&dir)?;
    Ok(dir)
}

/// A session name: letters, digits, `.`, `_` and `-`, not starting with
/// `.`, at most 64 bytes (it becomes a file name).
pub fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if !ok {
        bail!(
            "session name {:?}: use 1 to 64 letters, digits, '.', '_' or '-' (not starting with '.')",
            crate::text::escape(name)
        );
    }
    Ok(())
}

pub fn socket_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.sock"))
}

pub fn meta_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.json"))
}

pub fn log_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.log"))
}

/// The peer of a connected unix socket: its pid, once it is known to be
/// this user's and to live outside every sandbox (in our own user
/// namespace: every sandbox of the full tier has one of its own). Both
/// ends check: the server that its client is no sandboxed process, the
/// client that the socket it found is no sandbox's listener (a file in a
/// directory the sandbox could write would be the first place to plant
/// one, and the client sends its environment).
pub fn peer_outside(fd: &OwnedFd) -> Result<u32> {
    crate::procfs::peer_outside(fd).map_err(anyhow::Error::msg)
}

/// Connect to session `name`'s socket and check who serves it.
pub fn connect(name: &str) -> Result<crate::seqpacket::Seq> {
    check_name(name)?;
    let dir = dir()?;
    let path = socket_path(&dir, name);
    let fd = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Unix,
        nix::sys::socket::SockType::SeqPacket,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )
    .context("socket")?;
    let addr = nix::sys::socket::UnixAddr::new(&path).context("the session's socket path")?;
    nix::sys::socket::connect(fd.as_raw_fd(), &addr).map_err(|e| match e {
        // Its socket and record are left, and nobody serves them: the
        // session's airlock died without ending it. Not a misspelt name.
        nix::errno::Errno::ECONNREFUSED if meta_path(&dir, name).exists() => anyhow::anyhow!(
            "session {name:?} is no longer running: its airlock exited without ending it (killed?), and its processes, servers and approvals went with it; what its commands planted is judged by the next airlock run; start it again with `airlock session start --name {name}`"
        ),
        // Ended or stopped, said why (within a day: a name is reused).
        nix::errno::Errno::ENOENT
            if std::fs::metadata(path.with_extension("ended")).is_ok_and(|m| {
                m.modified()
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age < std::time::Duration::from_secs(86_400))
            }) =>
        {
            let why = std::fs::read_to_string(path.with_extension("ended")).unwrap_or_default();
            anyhow::anyhow!(
                "session {name:?} is no longer running: {}; start it again with `airlock session start --name {name}`",
                crate::text::escape(why.trim())
            )
        }
        nix::errno::Errno::ENOENT | nix::errno::Errno::ECONNREFUSED => {
            // The running ones, by name: a misspelt name is most often
            // one of them (harness round 13).
            let others = socket_names(&dir_of(&path));
            let running = match others.is_empty() {
                true => "none is running".to_string(),
                false => format!("running: {}", others.join(", ")),
            };
            anyhow::anyhow!(
                "no session named {name:?} is running ({running}; start one with `airlock session start --name {name}`)"
            )
        }
        e => anyhow::anyhow!("connecting to session {name:?} at {}: {e}", path.display()),
    })?;
    peer_outside(&fd).with_context(|| format!("refusing the socket {}", path.display()))?;
    Ok(crate::seqpacket::Seq(fd))
}

/// `airlock session end NAME [--report FILE]`: the session stops every
/// process, runs the whole post-run check and writes its report; its
/// findings come on our stderr, which it writes to until it is done.
pub fn end(name: &str, report: Option<&Path>) -> Result<ExitCode> {
    let seq = connect(name)?;
    // Opened here, without following links, as a one-shot run opens it.
    let report = report
        .map(|p| {
            crate::policy::trust::output_path(p, "--report")?;
            airlock_proxy::safe_file::open(p, airlock_proxy::safe_file::Mode::Replace, 0o644)
                .with_context(|| format!("--report {}", p.display()))
        })
        .transpose()?;
    let mut fds = vec![2];
    if let Some(r) = &report {
        fds.push(r.as_raw_fd());
    }
    seq.send_json(
        &serde_json::json!({"op": "end", "report": report.is_some()}),
        &fds,
    )
    .context("asking the session to end")?;
    drop(report);
    match seq.recv_json() {
        Ok(Some((v, _))) => {
            let code = v.get("code").and_then(|c| c.as_i64()).unwrap_or(125);
            Ok(ExitCode::from(code.clamp(0, 255) as u8))
        }
        _ => bail!("the session {name:?} went away before it finished its check"),
    }
}

/// `airlock session list [--json]`: the sessions whose supervisor answers.
pub fn list(json: bool) -> Result<ExitCode> {
    let dir = dir()?;
    let mut found = vec![];
    let names = socket_files(&dir);
    for name in names {
        let Ok(seq) = connect(&name) else {
            continue;
        };
        if seq
            .send_json(&serde_json::json!({"op": "info"}), &[])
            .is_err()
        {
            continue;
        }
        if let Ok(Some((v, _))) = seq.recv_json() {
            found.push(v);
        }
    }
    if json {
        say!("{}", serde_json::Value::Array(found));
        return Ok(ExitCode::SUCCESS);
    }
    if found.is_empty() {
        say!("no session is running");
    }
    for v in found {
        let s = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or("").to_string();
        let review = match v.get("review").and_then(|r| r.as_str()) {
            Some(id) => format!("  held for review as {id}"),
            None => String::new(),
        };
        say!(
            "{}  pid {}  workspace {}  commands {}{review}",
            s("name"),
            v.get("pid").and_then(|p| p.as_u64()).unwrap_or(0),
            crate::text::escape(&s("workspace")),
            v.get("commands").and_then(|p| p.as_u64()).unwrap_or(0)
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The changeset session `name` holds its commands' changes in, if it
/// was started with `--review`; an error when no such session answers.
pub fn review_of(name: &str) -> Result<Option<String>> {
    let seq = connect(name)?;
    seq.send_json(&serde_json::json!({"op": "info"}), &[])
        .context("asking the session")?;
    match seq.recv_json() {
        Ok(Some((v, _))) => Ok(v.get("review").and_then(|r| r.as_str()).map(String::from)),
        _ => bail!("the session {name:?} did not answer"),
    }
}

/// The directory a session socket lies in.
fn dir_of(socket: &Path) -> PathBuf {
    socket.parent().map(Path::to_path_buf).unwrap_or_default()
}

/// The names of the sessions whose sockets are in `dir` and answer.
fn socket_names(dir: &Path) -> Vec<String> {
    socket_files(dir)
        .into_iter()
        .filter(|n| check_name(n).is_ok())
        .filter(|n| {
            let p = socket_path(dir, n);
            nix::sys::socket::socket(
                nix::sys::socket::AddressFamily::Unix,
                nix::sys::socket::SockType::SeqPacket,
                nix::sys::socket::SockFlag::SOCK_CLOEXEC,
                None,
            )
            .ok()
            .zip(nix::sys::socket::UnixAddr::new(&p).ok())
            .is_some_and(|(fd, addr)| nix::sys::socket::connect(fd.as_raw_fd(), &addr).is_ok())
        })
        .collect()
}

/// The names of the session sockets in `dir`, sorted.
fn socket_files(dir: &Path) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return vec![];
    };
    let mut names: Vec<String> = rd
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_suffix(".sock")
                .map(str::to_string)
        })
        .collect();
    names.sort();
    names
}

/// Whether session `name` is running (its supervisor answers).
pub fn running(name: &str) -> bool {
    check_name(name).is_ok() && connect(name).is_ok()
}

/// A name for a session started without one.
pub fn generated_name() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("s{}-{:05x}", std::process::id(), nanos & 0xfffff)
}

/// `airlock session start`: start the session's supervisor, detached (its
/// own process session, stdio on /dev/null and its log), and wait until
/// it serves, or print why it could not start.
pub fn start(name: Option<&str>) -> Result<ExitCode> {
    use std::os::unix::process::CommandExt;
    let name = match name {
        Some(n) => n.to_string(),
        None => generated_name(),
    };
    check_name(&name)?;
    let dir = dir()?;
    if connect(&name).is_ok() {
        bail!("a session named {name:?} is already running (`airlock session end {name}` ends it)");
    }
    let log = log_path(&dir, &name);
    let log_file =
        airlock_proxy::safe_file::open(&log, airlock_proxy::safe_file::Mode::Replace, 0o600)
            .with_context(|| format!("the session's log {}", log.display()))?;
    let (ready_r, ready_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("pipe")?;
    let ready_fd = ready_w.as_raw_fd();
    let exe = std::env::current_exe().context("finding the airlock binary")?;
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if !args
        .iter()
        .any(|a| a == "--name" || a.to_string_lossy().starts_with("--name="))
    {
        // After `start`, before anything that could be a value.
        let at = args
            .iter()
            .position(|a| a == "start")
            .map_or(args.len(), |i| i + 1);
        args.splice(at..at, ["--name".into(), name.clone().into()]);
    }
    let mut cmd = std::process::Command::new(exe);
    cmd.args(&args)
        .env(server::SERVE_ENV, ready_fd.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::from(log_file));
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The ready pipe crosses this exec (and no other).
            let flags = libc::fcntl(ready_fd, libc::F_GETFD);
            libc::fcntl(ready_fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC);
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("starting the session's supervisor")?;
    drop(ready_w);
    let mut said = String::new();
    let _ = std::io::Read::read_to_string(&mut std::fs::File::from(ready_r), &mut said);
    if said.starts_with('{') {
        say!("{}", said.trim_end());
        return Ok(ExitCode::SUCCESS);
    }
    // It stopped before serving: what it said is in its log.
    let status = child.wait().ok().and_then(|s| s.code()).unwrap_or(125);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    eprint!("{text}");
    let _ = std::fs::remove_file(&log);
    Ok(ExitCode::from(status.clamp(1, 255) as u8))
}
