//! Running one scenario as root and as an ordinary user (SPEC §8): the
//! fixture is handed to uid 65534 and every command, inside the sandbox or
//! on the host, runs under `setpriv` as that user.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::{is_root, Fixture};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Who {
    /// Whoever runs the tests (root in CI).
    Me,
    /// uid/gid 65534, only when the tests run as root.
    Nobody,
}

impl Who {
    /// Both when we can switch users; the current user otherwise.
    pub fn all() -> Vec<Who> {
        if is_root() {
            vec![Who::Me, Who::Nobody]
        } else {
            vec![Who::Me]
        }
    }

    /// Give the fixture's directories (and their parents' search right) to this user.
    pub fn prepare(self, f: &Fixture) {
        if self == Who::Nobody {
            for d in [&f.home, &f.ws] {
                chown(d);
            }
            for d in [f.home.parent(), f.ws.parent()].into_iter().flatten() {
                let _ = Command::new("chmod").arg("o+rx").arg(d).status();
            }
        }
    }

    /// `cmd`, run as this user with the same environment.
    pub fn wrap(self, cmd: Command) -> Command {
        if self == Who::Me {
            return cmd;
        }
        let mut w = Command::new("setpriv");
        w.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(cmd.get_program())
            .args(cmd.get_args());
        w.env_clear();
        for (k, v) in cmd.get_envs() {
            if let Some(v) = v {
                w.env(k, v);
            }
        }
        if let Some(d) = cmd.get_current_dir() {
            w.current_dir(d);
        }
        w.stdin(Stdio::null());
        w
    }

    /// A host-side program (not sandboxed) as this user, with the fixture's HOME.
    pub fn host(self, f: &Fixture, dir: &Path, program: &str, args: &[&str]) -> Command {
        let mut c = Command::new(program);
        c.args(args)
            .env_clear()
            .env(
                "PATH",
                std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()),
            )
            .env("HOME", &f.home)
            .env("XDG_CONFIG_HOME", f.home.join(".config"))
            .env("XDG_DATA_HOME", f.home.join(".local/share"))
            .env(
                "AIRLOCK_MANAGED_POLICY",
                f.home.join("no-managed-policy.toml"),
            )
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .current_dir(dir)
            .stdin(Stdio::null());
        self.wrap(c)
    }
}

pub fn chown(p: &Path) {
    let _ = Command::new("chown")
        .args(["-R", "65534:65534"])
        .arg(p)
        .status();
}
