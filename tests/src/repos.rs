//! Repositories for the persistence tests (SPEC §3.5, §4.5): a committed
//! workspace, host-side git as the user would run it, and the check that
//! it ran nothing the sandbox planted.

use std::path::Path;
use std::process::Command;

use crate::who::Who;
use crate::{run, Fixture, Out};

pub fn show(out: &Out) -> String {
    format!(
        "code {}\n--- stdout\n{}--- stderr\n{}",
        out.code, out.stdout, out.stderr
    )
}

/// `airlock run [args] -- sh -c script` as `who`.
pub fn sandboxed(f: &Fixture, who: Who, args: &[&str], script: &str) -> Out {
    run(&mut who.wrap(f.command(args, script)))
}

/// A program on the host (not sandboxed), as `who`, with the fixture's HOME.
pub fn host(f: &Fixture, who: Who, dir: &Path, program: &str, args: &[&str]) -> Out {
    run(&mut who.host(f, dir, program, args))
}

pub fn git_available() -> bool {
    Command::new("git").arg("--version").output().is_ok()
}

/// `git` arguments for an empty commit by a fixed identity.
pub fn empty_commit(message: &str) -> Vec<&str> {
    vec![
        "-c",
        "user.email=t@t",
        "-c",
        "user.name=t",
        "commit",
        "-q",
        "--allow-empty",
        "-m",
        message,
    ]
}

/// A fixture under `base` with a committed repository as the workspace.
pub fn repo(base: &Path, who: Who) -> Fixture {
    let f = Fixture::new_in(base);
    who.prepare(&f);
    let g = |args: &[&str]| {
        let out = host(&f, who, &f.ws, "git", args);
        assert_eq!(out.code, 0, "git {args:?}: {}", show(&out));
    };
    g(&["init", "-q", "."]);
    g(&empty_commit("init"));
    f
}

/// The user's next git commands in `dir`: status, commit, diff, log (each
/// may run a hook, fsmonitor or the pager); `marker` must not appear.
pub fn host_git_runs_nothing(f: &Fixture, who: Who, dir: &Path, marker: &Path) {
    for args in [
        &["status"][..],
        &empty_commit("host"),
        &["diff", "HEAD"],
        &["log", "--oneline", "-1"],
        &["-c", "pager.log=true", "log", "-1"],
        &["branch", "host-branch"],
    ] {
        let _ = host(f, who, dir, "git", args);
    }
    assert!(
        !marker.exists(),
        "git run on the host executed code the sandbox planted in {}",
        dir.display()
    );
}
