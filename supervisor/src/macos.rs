//! The only macOS-specific code: starting the command under
//! `/usr/bin/sandbox-exec` with the generated profile. Never a
//! `sandbox-exec` found through PATH.

use std::process::{Child, Command};

use anyhow::{Context, Result};

use crate::plan::Plan;
use crate::seatbelt::Profile;

pub const SANDBOX_EXEC: &str = "/usr/bin/sandbox-exec";

pub fn spawn(plan: &Plan, profile: &Profile) -> Result<Child> {
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
    cmd.spawn()
        .with_context(|| format!("starting {SANDBOX_EXEC}"))
}
