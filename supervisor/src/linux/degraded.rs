//! The degraded tier (SPEC §4.4), used only with `--allow-degraded` when
//! user namespaces are unavailable: no namespaces and no mounts, so
//! Landlock carries the whole boundary (denied paths carved out, TCP
//! connect to the proxy's host loopback port only), seccomp refuses UDP,
//! raw sockets and new unix sockets, and a subreaper kills leftovers.

use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use anyhow::{Context, Result};

use super::{caps, init, landlock, seccomp};
use crate::plan::Plan;

/// Device files the command may write (the host's /dev is not replaced here).
const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
    "/dev/shm",
];

pub fn run(plan: &Plan, channel: &mut UnixStream, proxy_port: Option<u16>) -> Result<i32> {
    // Without a PID namespace nothing tears the sandbox down for us: on
    // the supervisor's death we get SIGUSR1 and kill what we started.
    init::block_signals()?;
    // SAFETY: prctl with integer arguments.
    unsafe {
        if libc::prctl(
            libc::PR_SET_PDEATHSIG,
            init::TEARDOWN as libc::c_int,
            0,
            0,
            0,
        ) != 0
        {
            return Err(std::io::Error::last_os_error()).context("setting the parent-death signal");
        }
        if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error()).context("becoming a subreaper");
        }
    }
    caps::drop_all()?;
    caps::no_new_privs()?;
    let hidden: Vec<PathBuf> = plan
        .deny_read
        .iter()
        .chain(plan.deny_write.iter())
        .cloned()
        .collect();
    let (read, listable) = landlock::carve(&plan.read, &plan.deny_read);
    let mut write_roots = plan.write.clone();
    write_roots.push(PathBuf::from("/tmp"));
    write_roots.extend(DEVICES.iter().map(PathBuf::from));
    let (write, _) = landlock::carve(&write_roots, &hidden);
    landlock::restrict_degraded(&read, &listable, &write, proxy_port)?;
    seccomp::install(true)?;
    super::helper::close_on_exec(channel)?;
    init::run(plan, channel, init::Reap::Subreaper)
}
