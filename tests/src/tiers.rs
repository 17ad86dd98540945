//! Running a sandboxed command in either tier (SPEC §4.1, §4.4), as the
//! test's own user or as uid 65534, for the suites that check what crosses
//! into the sandbox.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{is_root, Fixture, Out};

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Tier {
    Full,
    Degraded,
}

pub const TIERS: [Tier; 2] = [Tier::Full, Tier::Degraded];

/// Who runs airlock: the test's own user, and uid 65534 when that is root.
pub fn users() -> Vec<bool> {
    if is_root() {
        vec![false, true]
    } else {
        vec![false]
    }
}

pub fn show(out: &Out) -> String {
    format!(
        "--- code {}\n--- stdout\n{}--- stderr\n{}",
        out.code, out.stdout, out.stderr
    )
}

pub fn has_line(out: &Out, line: &str) -> bool {
    out.stdout.lines().any(|l| l == line)
}

/// `airlock run` in the fixture, in a tier, as the test user or uid 65534.
pub fn command(f: &Fixture, tier: Tier, as_user: bool, args: &[&str], script: &str) -> Command {
    let mut all: Vec<&str> = vec![];
    if tier == Tier::Degraded {
        all.push("--allow-degraded");
    }
    all.extend_from_slice(args);
    in_tier(f, tier, as_user, f.command(&all, script))
}

/// The same with the command's argv given as it is (no shell).
pub fn command_argv(
    f: &Fixture,
    tier: Tier,
    as_user: bool,
    args: &[&str],
    argv: &[&str],
) -> Command {
    let mut all: Vec<&str> = vec![];
    if tier == Tier::Degraded {
        all.push("--allow-degraded");
    }
    all.extend_from_slice(args);
    in_tier(f, tier, as_user, f.command_argv(&all, argv))
}

fn in_tier(f: &Fixture, tier: Tier, as_user: bool, mut cmd: Command) -> Command {
    if tier == Tier::Degraded {
        cmd.env("AIRLOCK_FORCE_TIER", "degraded");
    }
    if !as_user {
        return cmd;
    }
    for d in [&f.home, &f.ws] {
        let _ = Command::new("chown")
            .args(["-R", "65534:65534"])
            .arg(d)
            .status();
    }
    let mut wrapped = Command::new("setpriv");
    wrapped
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(cmd.get_program())
        .args(cmd.get_args());
    wrapped.env_clear();
    for (k, v) in cmd.get_envs() {
        if let Some(v) = v {
            wrapped.env(k, v);
        }
    }
    wrapped.current_dir(&f.ws).stdin(Stdio::null());
    wrapped
}

/// Start `cmd`, wait until the sandboxed script has written `started` in
/// the workspace, run `host` (the host acting during the run), wait
/// `settle`, then let the script go on (`go`) and collect its output.
pub fn while_it_runs(f: &Fixture, cmd: Command, host: impl FnOnce(), settle: Duration) -> Out {
    while_it_runs_pid(f, cmd, |_| host(), settle)
}

/// The same, `host` being told airlock's process id.
pub fn while_it_runs_pid(
    f: &Fixture,
    mut cmd: Command,
    host: impl FnOnce(u32),
    settle: Duration,
) -> Out {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !f.ws.join("started").exists() {
        if Instant::now() > deadline || child.try_wait().ok().flatten().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // What the host makes within one clock tick of the sandbox's start has
    // a birth time the deny_read watch cannot tell from "before the start"
    // and stops the run (fail closed, linux/denywatch.rs): the host here
    // acts later, as a person would.
    std::thread::sleep(Duration::from_millis(20));
    host(child.id());
    std::thread::sleep(settle);
    let _ = std::fs::write(f.ws.join("go"), "");
    let (mut stdout, mut stderr) = (String::new(), String::new());
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut stdout);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut stderr);
    }
    let status = child.wait().expect("wait");
    Out {
        code: status.code().unwrap_or(-1),
        stdout,
        stderr,
    }
}

/// A file the host writes where uid 65534 may read it too (parents made).
pub fn write_public(p: &std::path::Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(p.parent().expect("a parent")).expect("mkdir");
    std::fs::write(p, text).expect("write");
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o644)).expect("chmod");
}

/// A directory the host makes that uid 65534 may list too.
pub fn mkdir_public(p: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(p).expect("mkdir");
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}
