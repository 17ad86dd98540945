//! The only macOS-specific code: starting the command under
//! `/usr/bin/sandbox-exec` with the generated profile (never a
//! `sandbox-exec` found through PATH), and making sure nothing it started
//! is left running when `run` goes on to its post-run checks (SPEC §4.5).
//!
//! Written and type-checked on Linux (`scripts/check-targets.sh`); what
//! only a Mac can confirm is listed in docs/src/macos.md, "Verify on a Mac".

use std::ffi::{c_char, c_int, CStr, CString};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};

use crate::plan::Plan;

pub const SANDBOX_EXEC: &str = "/usr/bin/sandbox-exec";

use crate::seatbelt::RUN_MARKER as MARKER;

extern "C" {
    /// libsystem_sandbox: 0 when `pid`'s sandbox allows `operation` on the
    /// filter's argument, 1 when it denies it; with `SANDBOX_FILTER_NONE`
    /// and a null operation, 1 when `pid` is sandboxed at all.
    fn sandbox_check(pid: libc::pid_t, operation: *const c_char, kind: c_int, ...) -> c_int;
}
const SANDBOX_FILTER_NONE: c_int = 0;
const SANDBOX_FILTER_PATH: c_int = 1;

/// The running sandbox, and what `finish` needs to end it.
pub struct Running {
    pub child: Child,
    tmpdir: PathBuf,
    pgid: libc::pid_t,
}

/// Prepare the run's private TMPDIR and terminal, generate the profile and
/// start the command.
pub fn start(plan: &Plan, proxy_port: Option<u16>) -> Result<Running> {
    let mut plan = plan.clone();
    let tmpdir = private_tmpdir()?;
    plan.env
        .insert("TMPDIR".into(), format!("{}/", tmpdir.display()));
    plan.macos.tmpdir = Some(tmpdir.clone());
    plan.macos.terminal = controlling_terminal();
    for s in &plan.macos.switches {
        eprintln!("airlock: warning: {s}: this opens a way around the sandbox");
    }
    let profile = crate::seatbelt::profile(&plan, proxy_port);
    let mut cmd = Command::new(SANDBOX_EXEC);
    cmd.arg("-p").arg(&profile.text);
    for (k, v) in &profile.params {
        cmd.arg("-D").arg(format!("{k}={v}"));
    }
    cmd.arg("--")
        .args(&plan.argv)
        .env_clear()
        .envs(&plan.env)
        .current_dir(&plan.cwd);
    // SAFETY: async-signal-safe calls only, between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            // Its own process group, in the foreground of the terminal
            // (interactive programs keep working; `finish` kills the group).
            libc::setpgid(0, 0);
            if libc::isatty(0) == 1 {
                libc::signal(libc::SIGTTOU, libc::SIG_IGN);
                libc::tcsetpgrp(0, libc::getpid());
            }
            // airlock ignores terminal stops (main.rs); the command does not.
            libc::signal(libc::SIGTTOU, libc::SIG_DFL);
            libc::signal(libc::SIGTTIN, libc::SIG_DFL);
            // SPEC §4.6: only 0, 1 and 2 cross. Close-on-exec rather than
            // close, so the standard library's own exec-error pipe keeps
            // working; exec closes them all.
            for fd in 3..libc::getdtablesize() {
                libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
            }
            Ok(())
        });
    }
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmpdir);
            return Err(e).with_context(|| format!("starting {SANDBOX_EXEC}"));
        }
    };
    let pgid = child.id() as libc::pid_t;
    Ok(Running {
        child,
        tmpdir,
        pgid,
    })
}

impl Running {
    /// After the command has exited (or been killed): kill every process
    /// the run started, including those that left its process group or
    /// session and were reparented to launchd, and wait until none is
    /// left; then remove the private TMPDIR. Runs before any post-run
    /// check, so the check sees a host no sandboxed process can still
    /// change.
    pub fn finish(tmpdir: &Path, pgid: libc::pid_t) {
        // SAFETY: kill(2) of the process group this run created.
        unsafe { libc::killpg(pgid, libc::SIGKILL) };
        let probe = CString::new(tmpdir.join("probe").as_os_str().as_encoded_bytes());
        let marker = CString::new(tmpdir.join(MARKER).as_os_str().as_encoded_bytes());
        let (Ok(probe), Ok(marker)) = (probe, marker) else {
            return;
        };
        let mut left = vec![];
        for _ in 0..100 {
            left = all_pids()
                .into_iter()
                .filter(|&p| ours(p, &probe, &marker))
                .collect();
            if left.is_empty() {
                break;
            }
            for &p in &left {
                // SAFETY: kill(2) of a process this run's sandbox holds.
                unsafe { libc::kill(p, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if !left.is_empty() {
            eprintln!(
                "airlock: warning: {} sandboxed process(es) survived SIGKILL: {left:?}",
                left.len()
            );
        }
        if let Err(e) = std::fs::remove_dir_all(tmpdir) {
            tracing::warn!("cannot remove {}: {e}", tmpdir.display());
        }
    }

    /// The pieces `finish` needs, for a caller that has handed the child on.
    pub fn finisher(&self) -> impl FnOnce() + Send + 'static {
        let (tmpdir, pgid) = (self.tmpdir.clone(), self.pgid);
        move || Running::finish(&tmpdir, pgid)
    }
}

/// Whether `pid` runs under this run's profile: sandboxed, allowed to
/// create files in this run's TMPDIR (no other sandbox is) and denied the
/// marker there (an unsandboxed or permissive process is not).
fn ours(pid: libc::pid_t, probe: &CStr, marker: &CStr) -> bool {
    if pid <= 1 || pid == std::process::id() as libc::pid_t {
        return false;
    }
    let create = c"file-write-create";
    let read = c"file-read-data";
    // SAFETY: sandbox_check only reads its arguments, all NUL-terminated.
    unsafe {
        sandbox_check(pid, std::ptr::null(), SANDBOX_FILTER_NONE) == 1
            && sandbox_check(pid, create.as_ptr(), SANDBOX_FILTER_PATH, probe.as_ptr()) == 0
            && sandbox_check(pid, read.as_ptr(), SANDBOX_FILTER_PATH, marker.as_ptr()) == 1
    }
}

fn all_pids() -> Vec<libc::pid_t> {
    // SAFETY: a null buffer asks for the count; the second call fills a
    // buffer of that size (plus room for processes started meanwhile).
    unsafe {
        let n = libc::proc_listallpids(std::ptr::null_mut(), 0);
        if n <= 0 {
            return vec![];
        }
        let mut pids = vec![0 as libc::pid_t; n as usize + 64];
        let bytes = (pids.len() * std::mem::size_of::<libc::pid_t>()) as c_int;
        let got = libc::proc_listallpids(pids.as_mut_ptr().cast(), bytes);
        pids.truncate(got.max(0) as usize);
        pids
    }
}

/// A new directory, mode 0700, under the supervisor's own temporary
/// directory, resolved (`/var` is `/private/var`, and Seatbelt matches
/// resolved paths).
fn private_tmpdir() -> Result<PathBuf> {
    let base =
        std::fs::canonicalize(std::env::temp_dir()).context("resolving the temporary directory")?;
    for attempt in 0..16u32 {
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(attempt);
        let dir = base.join(format!(
            "airlock-{}-{:08x}{attempt}",
            std::process::id(),
            nanos
        ));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("creating {}", dir.display())),
        }
    }
    bail!(
        "cannot create a private temporary directory in {}",
        base.display()
    )
}

/// The terminal on stdin, stdout or stderr, if any: the one tty the
/// profile lets the command open again.
fn controlling_terminal() -> Option<PathBuf> {
    (0..3).find_map(|fd| {
        let mut buf = [0 as c_char; 256];
        // SAFETY: ttyname_r writes at most buf.len() bytes, NUL-terminated.
        let ok = unsafe {
            libc::isatty(fd) == 1 && libc::ttyname_r(fd, buf.as_mut_ptr(), buf.len()) == 0
        };
        if !ok {
            return None;
        }
        // SAFETY: ttyname_r succeeded, so buf holds a C string.
        let name = unsafe { CStr::from_ptr(buf.as_ptr()) };
        name.to_str().ok().map(PathBuf::from)
    })
}
