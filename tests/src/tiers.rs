//! Running a sandboxed command in either tier (SPEC §4.1, §4.4), as the
//! test's own user or as uid 65534, for the suites that check what crosses
//! into the sandbox.

use std::process::{Command, Stdio};

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
