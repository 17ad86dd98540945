//! The managed policy cannot be replaced from the environment (SPEC §3.3):
//! `AIRLOCK_MANAGED_POLICY` names a managed file only on a machine without
//! `/etc/airlock/managed.toml`; where anything stands there, the variable is
//! an error. Every case runs as root and as an ordinary user.
//!
//! The machine's own `/etc` is never touched: each command runs in a private
//! mount namespace whose `/etc` is an overlay holding the managed file, so
//! no other test or process on the machine sees it, and nothing is left
//! behind however the test ends (the namespace dies with the command). That
//! needs root, so these tests are skipped otherwise.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use airlock_tests::who::Who;
use airlock_tests::*;

fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-managed"))
}

/// What stands at /etc/airlock/managed.toml for one command.
#[derive(Debug, Clone, Copy)]
enum Managed {
    /// A readable file that requires the sandbox.
    File,
    /// The same file, mode 000 (unreadable to the ordinary user).
    Unreadable,
    /// A link to nowhere.
    Dangling,
    /// A directory.
    Directory,
}

impl Managed {
    fn setup(self) -> &'static str {
        match self {
            Managed::File => "printf 'require_sandbox = true\\n' > /etc/airlock/managed.toml",
            Managed::Unreadable => {
                "printf 'require_sandbox = true\\n' > /etc/airlock/managed.toml && chmod 000 /etc/airlock/managed.toml"
            }
            Managed::Dangling => "ln -s /nonexistent/managed.toml /etc/airlock/managed.toml",
            Managed::Directory => "mkdir /etc/airlock/managed.toml",
        }
    }
}

/// `cmd` (already wrapped for its user) run where /etc/airlock/managed.toml
/// is `managed`, in a private mount namespace over an overlay of /etc
/// whose upper layer lives in `scratch`.
fn with_managed(cmd: Command, managed: Managed, scratch: &Path) -> Command {
    let script = format!(
        "set -e; d=\"$1\"; shift
         mount -t tmpfs airlock-test \"$d\"; mkdir \"$d/u\" \"$d/w\"
         mount -t overlay airlock-test -o lowerdir=/etc,upperdir=\"$d/u\",workdir=\"$d/w\" /etc
         mkdir -p /etc/airlock; {}
         exec \"$@\"",
        managed.setup()
    );
    let mut w = Command::new("unshare");
    w.args([
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        &script,
        "sh",
    ])
    .arg(scratch)
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

/// An airlock command (`args`) for this user, with AIRLOCK_MANAGED_POLICY
/// set to `var` or unset.
fn airlock_cmd(f: &Fixture, who: Who, args: &[&str], var: Option<&Path>) -> Command {
    let mut c = Command::new(airlock_bin());
    c.args(args)
        .env_clear()
        .env(
            "PATH",
            std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()),
        )
        .env("HOME", &f.home)
        .env("XDG_CONFIG_HOME", f.home.join(".config"))
        .env("XDG_DATA_HOME", f.home.join(".local/share"))
        .current_dir(&f.ws);
    if let Some(v) = var {
        c.env("AIRLOCK_MANAGED_POLICY", v);
    }
    who.wrap(c)
}

fn show(o: &Out) -> String {
    format!(
        "code {}\nstdout: {}\nstderr: {}",
        o.code, o.stdout, o.stderr
    )
}

fn fixture(who: Who) -> (Fixture, tempfile::TempDir) {
    let f = Fixture::new_in(&base());
    who.prepare(&f);
    let scratch = tempfile::tempdir_in(base()).expect("scratch");
    (f, scratch)
}

/// The harmful outcome: an unsandboxed command ran. It would leave RAN.
const ESCAPE: &[&str] = &["run", "--network", "host", "--", "sh", "-c", "touch RAN"];

#[test]
fn the_environment_cannot_replace_an_existing_managed_policy() {
    if !is_root() {
        eprintln!("skipped: needs root for a private /etc");
        return;
    }
    for who in Who::all() {
        let (f, scratch) = fixture(who);
        let empty = f.write("~/empty.toml", "");
        for managed in [
            Managed::File,
            Managed::Unreadable,
            Managed::Dangling,
            Managed::Directory,
        ] {
            let ctx = format!("{who:?} {managed:?}");
            // The variable is refused, before anything runs.
            let out = run(&mut with_managed(
                airlock_cmd(&f, who, ESCAPE, Some(&empty)),
                managed,
                scratch.path(),
            ));
            assert_eq!(out.code, 125, "{ctx}: {}", show(&out));
            assert!(!f.ws.join("RAN").exists(), "{ctx}: {}", show(&out));
            assert!(
                out.stderr.contains("AIRLOCK_MANAGED_POLICY")
                    && out.stderr.contains("/etc/airlock/managed.toml"),
                "{ctx}: {}",
                show(&out)
            );
            // Without it, what stands there decides: the file applies, and
            // anything unreadable there fails closed rather than counting
            // as no managed policy.
            let out = run(&mut with_managed(
                airlock_cmd(&f, who, ESCAPE, None),
                managed,
                scratch.path(),
            ));
            assert_eq!(out.code, 125, "{ctx} (no variable): {}", show(&out));
            assert!(
                !f.ws.join("RAN").exists(),
                "{ctx} (no variable): {}",
                show(&out)
            );
            // The other commands that read the managed policy refuse it too.
            let policy = f.write("team.toml", "");
            let policy = policy.to_str().unwrap();
            for args in [
                vec!["policy", "check", "--managed", policy],
                vec!["policy", "check", policy],
                vec!["policy", "explain", "example.test"],
                vec!["doctor"],
            ] {
                let out = run(&mut with_managed(
                    airlock_cmd(&f, who, &args, Some(&empty)),
                    managed,
                    scratch.path(),
                ));
                assert_eq!(out.code, 125, "{ctx} {args:?}: {}", show(&out));
                assert!(
                    out.stderr.contains("AIRLOCK_MANAGED_POLICY"),
                    "{ctx} {args:?}: {}",
                    show(&out)
                );
            }
        }
    }
}

#[test]
fn the_managed_file_still_applies_and_sandboxed_runs_still_work() {
    if !is_root() {
        eprintln!("skipped: needs root for a private /etc");
        return;
    }
    let etc = Path::new("/etc/airlock/managed.toml");
    for who in Who::all() {
        let (f, scratch) = fixture(who);
        // No variable, or one naming that very file: the managed policy is
        // the one that applies (it refuses the host network)...
        for var in [None, Some(etc)] {
            let ctx = format!("{who:?} {var:?}");
            let out = run(&mut with_managed(
                airlock_cmd(&f, who, ESCAPE, var),
                Managed::File,
                scratch.path(),
            ));
            assert_eq!(out.code, 125, "{ctx}: {}", show(&out));
            assert!(
                out.stderr.contains("requires the sandbox"),
                "{ctx}: {}",
                show(&out)
            );
            assert!(!f.ws.join("RAN").exists(), "{ctx}: {}", show(&out));
            // ...and a sandboxed run goes ahead.
            let out = run(&mut with_managed(
                airlock_cmd(
                    &f,
                    who,
                    &[
                        "run",
                        "--network",
                        "none",
                        "--",
                        "sh",
                        "-c",
                        "echo inside-ok",
                    ],
                    var,
                ),
                Managed::File,
                scratch.path(),
            ));
            assert_eq!(out.code, 0, "{ctx}: {}", show(&out));
            assert!(out.stdout.contains("inside-ok"), "{ctx}: {}", show(&out));
        }
    }
    // On a machine without the file the variable still names one (tests use
    // it): here it requires the sandbox and is obeyed.
    if std::fs::symlink_metadata(etc).is_ok() {
        eprintln!("this machine has a managed policy: the variable's own case is not tried");
        return;
    }
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        who.prepare(&f);
        let managed = f.write("~/managed.toml", "require_sandbox = true\n");
        if who == Who::Nobody {
            airlock_tests::who::chown(&managed);
        }
        let out = run(&mut airlock_cmd(&f, who, ESCAPE, Some(&managed)));
        assert_eq!(out.code, 125, "{who:?}: {}", show(&out));
        assert!(
            out.stderr.contains("requires the sandbox"),
            "{who:?}: {}",
            show(&out)
        );
        assert!(!f.ws.join("RAN").exists(), "{who:?}");
    }
}
