//! Helpers for airlock's end-to-end tests: they run the real binary.

use std::path::PathBuf;
use std::process::{Command, Output};

/// The airlock binary under test: `$AIRLOCK_BIN`, or the one cargo built
/// next to this test executable (`cargo build --workspace` first).
pub fn airlock_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("AIRLOCK_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/airlock
    let bin = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|dir| dir.join("airlock"))
        .expect("target directory");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --workspace` before the tests",
        bin.display()
    );
    bin
}

/// A command for the airlock binary with a clean, predictable policy
/// environment: no user policy, and no managed policy unless a test sets one.
pub fn airlock(home: &std::path::Path) -> Command {
    let mut c = Command::new(airlock_bin());
    c.env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("XDG_DATA_HOME", home.join(".local/share"))
        .env(
            "AIRLOCK_MANAGED_POLICY",
            home.join("no-managed-policy.toml"),
        )
        .env_remove("AIRLOCK_LOG")
        .current_dir(home);
    c
}

pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

pub fn run(cmd: &mut Command) -> Out {
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().expect("spawn airlock");
    Out {
        code: status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    }
}
