//! `deny_read` against what the HOST moves, links or makes a link to
//! during the run (SPEC §4.5 last bullet; linux/denywatch.rs). Landlock's
//! read grant is split around an absent `deny_read` name, so the inodes
//! next to it carry rules of their own: renamed, hard-linked or reached
//! through a new symlink at the denied name, they would be readable. The
//! helper watches those names and stops the sandbox (exit 125, a message
//! naming the path) before the command reads them; a fresh file renamed
//! over a denied name (how shells save their history) stops nothing.
//! Both tiers, as the test's user and (as root) as uid 65534.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use airlock_tests::tiers::*;
use airlock_tests::*;

fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-deny-moves"))
}

fn fixture() -> Fixture {
    let f = Fixture::new_in(&base());
    let _ = Command::new("chmod").arg("o+rx").arg(base()).status();
    f
}

/// Run a command that waits for the file `go`, then reads `~/<read>` and
/// `~/notes.txt`; meanwhile, once it has started, the host runs `host` in
/// HOME.
fn read_after_host(f: &Fixture, tier: Tier, user: bool, read: &str, host: &str) -> Out {
    let script = format!(
        ": > started; while [ ! -e go ]; do sleep 0.05; done; cat ~/{read}; echo; cat ~/notes.txt; echo; echo ran-on"
    );
    let cmd = command(f, tier, user, &["--network", "none"], &script);
    let home = f.home.clone();
    while_it_runs(
        f,
        cmd,
        || sh(&format!("cd {} && {host}", home.display())),
        Duration::from_millis(300),
    )
}

fn sh(script: &str) {
    let ok = Command::new("sh").arg("-c").arg(script).status().unwrap();
    assert!(ok.success(), "{script}");
}

/// One case: what exists before the run (`before`, in HOME), the policy's
/// extra `deny_read`, what the host does during it (`host`, in HOME), and
/// the path the command then reads.
struct Case {
    name: &'static str,
    before: &'static str,
    deny: &'static str,
    host: &'static str,
    read: &'static str,
}

const SECRET: &str = "MOVED-IN-SECRET";

const CASES: [Case; 10] = [
    Case {
        name: "a backup renamed over ~/.netrc",
        before: "echo MOVED-IN-SECRET > .netrc.bak",
        deny: "",
        host: "mv .netrc.bak .netrc",
        read: ".netrc",
    },
    Case {
        name: "an old file renamed over ~/.docker/config.json",
        before: "mkdir -p .docker && echo MOVED-IN-SECRET > .docker/cfg.old",
        deny: "",
        host: "mv .docker/cfg.old .docker/config.json",
        read: ".docker/config.json",
    },
    Case {
        name: "a hard link at ~/.git-credentials",
        before: "echo MOVED-IN-SECRET > plainfile",
        deny: "",
        host: "ln plainfile .git-credentials",
        read: ".git-credentials",
    },
    Case {
        name: "a new symlink ~/.aws to a granted directory",
        before: "mkdir -p dotfiles/aws && echo MOVED-IN-SECRET > dotfiles/aws/credentials",
        deny: "",
        host: "ln -s $PWD/dotfiles/aws .aws",
        read: ".aws/credentials",
    },
    Case {
        name: "a new symlink on the way to a configured path",
        before: "mkdir -p x/realdir/sub && echo MOVED-IN-SECRET > x/realdir/sub/key",
        deny: "~/x/lnk/sub/key",
        host: "ln -s $PWD/x/realdir x/lnk",
        read: "x/lnk/sub/key",
    },
    Case {
        name: "a symlink on the way re-pointed",
        before: "mkdir -p dot/a1 dot/a2 && echo MOVED-IN-SECRET > dot/a2/key && ln -s dot/a1 tok",
        deny: "~/tok/key",
        host: "ln -sfn dot/a2 tok",
        read: "tok/key",
    },
    Case {
        name: "a directory moved to ~/.ssh",
        before: "mkdir -p staging && echo MOVED-IN-SECRET > staging/id_rsa",
        deny: "",
        host: "mv staging .ssh",
        read: ".ssh/id_rsa",
    },
    Case {
        name: "a hard link in a fresh ~/.aws",
        before: "echo MOVED-IN-SECRET > plainfile",
        deny: "",
        host: "mkdir .aws && ln plainfile .aws/credentials",
        read: ".aws/credentials",
    },
    Case {
        name: "a symlink in a fresh ~/.aws",
        before: "mkdir -p dotfiles && echo MOVED-IN-SECRET > dotfiles/creds",
        deny: "",
        host: "mkdir .aws && ln -s $PWD/dotfiles/creds .aws/credentials",
        read: ".aws/credentials",
    },
    Case {
        name: "a fresh directory holding a hard link moved to ~/.ssh",
        before: "echo MOVED-IN-SECRET > plainfile",
        deny: "",
        host: "mkdir st && ln plainfile st/id_rsa && mv st .ssh",
        read: ".ssh/id_rsa",
    },
];

fn case_run(c: &Case, tier: Tier, user: bool) -> Result<(), String> {
    let f = fixture();
    f.write("~/notes.txt", "home-notes");
    sh(&format!(
        "cd {} && {} && chmod -R a+rX .",
        f.home.display(),
        c.before
    ));
    if !c.deny.is_empty() {
        f.write(
            "~/.config/airlock/policy.toml",
            &format!("[filesystem]\ndeny_read = [\"{}\"]\n", c.deny),
        );
    }
    let out = read_after_host(&f, tier, user, c.read, c.host);
    let stopped = out.code == 125
        && out
            .stderr
            .contains("(deny_read) appeared during the run as")
        && out.stderr.contains("the sandbox was stopped")
        && !has_line(&out, "ran-on");
    if out.stdout.contains(SECRET) || !stopped {
        return Err(format!(
            "{} {tier:?} as_user={user}: read={} stopped={stopped}\n{}",
            c.name,
            out.stdout.contains(SECRET),
            show(&out)
        ));
    }
    Ok(())
}

/// Every variant: the secret is not printed and the run is stopped with
/// the message.
#[test]
fn granted_inodes_moved_or_linked_into_a_denied_name_stop_the_run() {
    let mut fails = vec![];
    for tier in TIERS {
        for user in users() {
            for c in &CASES {
                if let Err(e) = case_run(c, tier, user) {
                    fails.push(e);
                }
            }
        }
    }
    assert!(fails.is_empty(), "{}", fails.join("\n\n"));
}

/// The allowed case: the host's shell saves its history the way zsh does
/// (write `~/.zsh_history.new`, rename it over `~/.zsh_history`), several
/// times during the run. The run goes on, the new history is not readable,
/// the rest of HOME still is.
#[test]
fn a_fresh_file_renamed_over_a_denied_name_does_not_stop_the_run() {
    for (tier, user) in TIERS
        .into_iter()
        .flat_map(|t| users().into_iter().map(move |u| (t, u)))
    {
        let f = fixture();
        f.write("~/notes.txt", "home-notes");
        f.write("~/.zsh_history", "OLD-HISTORY");
        let script = ": > started; while [ ! -e go ]; do sleep 0.05; done; \
             cat ~/.zsh_history; echo; cat ~/notes.txt; echo; echo ran-on";
        let cmd = command(&f, tier, user, &["--network", "none"], script);
        let home = f.home.clone();
        let out = while_it_runs(
            &f,
            cmd,
            || {
                for i in 0..3 {
                    let new = home.join(".zsh_history.new");
                    write_public(&new, &format!("NEW-HISTORY-{i}"));
                    std::fs::rename(&new, home.join(".zsh_history")).unwrap();
                    std::thread::sleep(Duration::from_millis(30));
                }
                // A fresh directory on the way, or at a denied name with a
                // fresh file in it, is watched, not refused.
                mkdir_public(&home.join(".docker"));
                mkdir_public(&home.join(".aws"));
                write_public(&home.join(".aws/credentials"), "NEW-HISTORY-aws");
            },
            Duration::from_millis(300),
        );
        let ctx = format!("{tier:?} as_user={user}\n{}", show(&out));
        assert_eq!(out.code, 0, "{ctx}");
        assert!(!out.stderr.contains("appeared during the run"), "{ctx}");
        assert!(!out.stdout.contains("HISTORY"), "{ctx}");
        for l in ["home-notes", "ran-on"] {
            assert!(has_line(&out, l), "{l}\n{ctx}");
        }
    }
}

/// Inside the workspace the watch runs too, and cannot tell the sandbox
/// from the host: the command's own new file at a denied name, made the
/// moment it starts, is fresh and stops nothing (its birth time is after
/// the ruleset's, the coarse clock notwithstanding).
#[test]
fn the_commands_own_new_file_at_a_denied_name_does_not_stop_the_run() {
    for (tier, user) in TIERS
        .into_iter()
        .flat_map(|t| users().into_iter().map(move |u| (t, u)))
    {
        for _ in 0..3 {
            let f = fixture();
            f.write(
                "~/.config/airlock/policy.toml",
                "[filesystem]\ndeny_read = [\".env\"]\n",
            );
            let out = run(&mut command(
                &f,
                tier,
                user,
                &["--network", "none"],
                ": > .env; echo x > .env.tmp && mv .env.tmp .env; echo ran-on",
            ));
            let ctx = format!("{tier:?} as_user={user}\n{}", show(&out));
            assert!(!out.stderr.contains("appeared during the run"), "{ctx}");
            assert!(has_line(&out, "ran-on"), "{ctx}");
        }
    }
}

/// The command can make names in its workspace as fast as it likes, and
/// so fill the watch's queue there until the kernel drops events (red team
/// round 13). The host's directories are watched in a queue of their own:
/// a backup the host renames over a denied name in HOME, and away again
/// 300 ms later, still stops the run while the workspace is flooded.
#[test]
fn a_flood_of_the_workspace_hides_nothing_the_host_does() {
    let probe = probe_in(&base());
    for (tier, user) in TIERS
        .into_iter()
        .flat_map(|t| users().into_iter().map(move |u| (t, u)))
    {
        for host in [true, false] {
            let f = fixture();
            f.write(
                "~/.config/airlock/policy.toml",
                "[filesystem]\ndeny_read = [\".env\", \"~/.netrc\"]\n",
            );
            sh(&format!(
                "cd {} && echo MOVED-IN-SECRET > .netrc.off && chmod 644 .netrc.off",
                f.home.display()
            ));
            let script = format!(
                "{probe} flood 16 2.5 .env & : > started; while [ ! -e go ]; do sleep 0.05; done; wait; echo ran-on"
            );
            let cmd = command(&f, tier, user, &["--network", "none"], &script);
            let home = f.home.clone();
            let out = while_it_runs(
                &f,
                cmd,
                || {
                    if host {
                        sh(&format!(
                            "cd {} && mv .netrc.off .netrc && sleep 0.3 && mv .netrc .netrc.off",
                            home.display()
                        ))
                    }
                },
                Duration::from_millis(300),
            );
            let ctx = format!("{tier:?} as_user={user} host={host}\n{}", show(&out));
            if host {
                assert_eq!(out.code, 125, "{ctx}");
                assert!(out.stderr.contains(".netrc"), "{ctx}");
                assert!(out.stderr.contains("appeared during the run"), "{ctx}");
            } else {
                assert_eq!(out.code, 0, "{ctx}");
                assert!(has_line(&out, "ran-on"), "{ctx}");
            }
        }
    }
}

/// A command can keep the watch off the CPU for hundreds of milliseconds
/// (thousands of busy threads; red team round 14). The host's rename onto
/// a denied name, undone before the watch looks, then leaves nothing to
/// look at; the watch's helper is stopped (SIGSTOP) here to make that
/// certain. The name gone, or the next event's inode already seen, stops
/// the run; a rename the watch sees in time of a fresh file stops nothing.
#[test]
fn a_host_change_undone_before_the_watch_looks_stops_the_run() {
    for (tier, user) in TIERS
        .into_iter()
        .flat_map(|t| users().into_iter().map(move |u| (t, u)))
    {
        for host in [
            // Moved in and away again.
            "mv .netrc.off .netrc && mv .netrc .netrc.off",
            // Moved in, then a fresh file renamed over it.
            "mv .netrc.off .netrc && echo fresh > n.tmp && mv n.tmp .netrc",
        ] {
            let f = fixture();
            f.write(
                "~/.config/airlock/policy.toml",
                "[filesystem]\ndeny_read = [\"~/.netrc\"]\n",
            );
            sh(&format!(
                "cd {} && echo MOVED-IN-SECRET > .netrc.off && chmod 644 .netrc.off",
                f.home.display()
            ));
            let script = ": > started; while [ ! -e go ]; do sleep 0.05; done; echo ran-on";
            let cmd = command(&f, tier, user, &["--network", "none"], script);
            let home = f.home.clone();
            let out = while_it_runs_pid(
                &f,
                cmd,
                |airlock| {
                    let helper = String::from_utf8_lossy(
                        &Command::new("pgrep")
                            .arg("-P")
                            .arg(airlock.to_string())
                            .output()
                            .expect("pgrep")
                            .stdout,
                    )
                    .split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok())
                    .find(|&p| p > 1)
                    .expect("the helper");
                    // SAFETY: signals to the helper this test started.
                    unsafe { libc::kill(helper, libc::SIGSTOP) };
                    sh(&format!("cd {} && {host}", home.display()));
                    unsafe { libc::kill(helper, libc::SIGCONT) };
                },
                Duration::from_millis(300),
            );
            let ctx = format!("{tier:?} as_user={user} host={host}\n{}", show(&out));
            assert_eq!(out.code, 125, "{ctx}");
            assert!(out.stderr.contains(".netrc"), "{ctx}");
            assert!(out.stderr.contains("before the watch could look"), "{ctx}");
        }
    }
}

/// On overlayfs (HOME in a container image) a lower-layer file or
/// directory that the host renames is copied up with a new birth time, yet
/// stays the inode Landlock's rule is on: birth times tell nothing there,
/// so any name that appears at a denied path stops the run (fail closed).
#[test]
fn on_overlayfs_a_moved_lower_file_or_directory_still_stops_the_run() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: mounting overlayfs needs root");
        return;
    }
    let cases = [
        ("mv netrc-template .netrc", ".netrc"),
        ("mv aws-template .aws", ".aws/credentials"),
    ];
    let mut fails = vec![];
    for tier in TIERS {
        for user in users() {
            for (host, read) in cases {
                let f = fixture();
                let layers = tempfile::tempdir_in(base()).unwrap();
                let l = layers.path();
                for d in ["lower", "upper", "work"] {
                    mkdir_public(&l.join(d));
                }
                // The lower layer: HOME as the fixture made it, plus the
                // old files the host will move.
                sh(&format!(
                    "cp -a {home}/. {l}/lower/ && cd {l}/lower && echo MOVED-IN-SECRET > netrc-template \
                     && mkdir aws-template && echo MOVED-IN-SECRET > aws-template/credentials \
                     && echo home-notes > notes.txt && chmod -R a+rX .",
                    home = f.home.display(),
                    l = l.display()
                ));
                let mounted = Command::new("mount")
                    .args(["-t", "overlay", "overlay", "-o"])
                    .arg(format!(
                        "lowerdir={l}/lower,upperdir={l}/upper,workdir={l}/work,redirect_dir=on",
                        l = l.display()
                    ))
                    .arg(&f.home)
                    .status()
                    .is_ok_and(|s| s.success());
                if !mounted {
                    eprintln!("skipped: overlayfs cannot be mounted here");
                    return;
                }
                let out = read_after_host(&f, tier, user, read, host);
                let _ = Command::new("umount").arg("-l").arg(&f.home).status();
                let stopped = out.code == 125
                    && out
                        .stderr
                        .contains("(deny_read) appeared during the run as")
                    && !has_line(&out, "ran-on");
                if out.stdout.contains(SECRET) || !stopped {
                    fails.push(format!("{host} {tier:?} as_user={user}\n{}", show(&out)));
                }
            }
        }
    }
    assert!(fails.is_empty(), "{}", fails.join("\n\n"));
}

/// A link on the way to a `deny_read` path that the host re-points after
/// airlock made its plan but before the watch started (a dotfile manager
/// running while airlock starts): the new target is as unreadable as the
/// old. The start is held open with a FIFO on `--upstream-ca`, read after
/// the plan is made.
#[test]
fn a_link_repointed_while_airlock_starts_is_not_readable() {
    for tier in TIERS {
        for user in users() {
            let f = fixture();
            sh(&format!(
                "cd {} && mkdir -p dotfiles/aws-old dotfiles/aws-new && echo old > dotfiles/aws-old/credentials \
                 && echo {SECRET} > dotfiles/aws-new/credentials && ln -s dotfiles/aws-old .aws && chmod -R a+rX .",
                f.home.display()
            ));
            let pki = airlock_tests::tls::TestPki::new(&f.home, &["origin.test"]);
            let fifo = f.home.join("ca.fifo");
            sh(&format!("mkfifo -m 0644 {}", fifo.display()));
            let mut cmd = command(
                &f,
                tier,
                user,
                &[
                    "--network",
                    "none",
                    "--inspect",
                    "origin.test",
                    "--upstream-ca",
                    fifo.to_str().unwrap(),
                ],
                "cat ~/.aws/credentials; echo; echo ran-on",
            );
            let child = cmd
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            // airlock has made its plan and waits on the FIFO.
            std::thread::sleep(Duration::from_millis(1500));
            sh(&format!(
                "cd {} && ln -sfn dotfiles/aws-new .aws",
                f.home.display()
            ));
            std::fs::write(&fifo, std::fs::read(&pki.ca_pem).unwrap()).unwrap();
            let out = child.wait_with_output().unwrap();
            let (stdout, stderr) = (
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
            );
            let ctx = format!("{tier:?} as_user={user}\n--- stdout\n{stdout}--- stderr\n{stderr}");
            assert!(
                !stdout.contains(SECRET),
                "read through the re-pointed link: {ctx}"
            );
            assert!(stdout.lines().any(|l| l == "ran-on"), "{ctx}");
        }
    }
}

/// The Landlock grant is decided from a directory's listing and bound when
/// the entry is opened: a link swapped into a split directory in between
/// (by another sandbox that may write there, exchanging names in a loop)
/// must not carry the grant to a denied directory. Here the workspace is
/// read-only and split around `.env`, and `x` and `y -> ~/.ssh` swap places
/// all along.
#[test]
fn a_link_swapped_into_a_split_directory_carries_no_grant() {
    let f = fixture();
    sh(&format!(
        "mkdir -p {h}/.ssh {w}/x && echo {SECRET} > {h}/.ssh/id_rsa && echo dotenv > {w}/.env \
         && ln -s {h}/.ssh {w}/y && chmod -R a+rX {h} {w}",
        h = f.home.display(),
        w = f.ws.display()
    ));
    let policy = f.home.join("swap.toml");
    std::fs::write(
        &policy,
        "version = 1\n[filesystem]\ndeny_read = [\".env\"]\n",
    )
    .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let swapper = {
        let stop = stop.clone();
        let x = std::ffi::CString::new(f.ws.join("x").to_str().unwrap()).unwrap();
        let y = std::ffi::CString::new(f.ws.join("y").to_str().unwrap()).unwrap();
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // SAFETY: renameat2 on two NUL-terminated paths this test owns.
                unsafe {
                    libc::syscall(
                        libc::SYS_renameat2,
                        libc::AT_FDCWD,
                        x.as_ptr(),
                        libc::AT_FDCWD,
                        y.as_ptr(),
                        libc::RENAME_EXCHANGE,
                    )
                };
            }
        })
    };
    let mut leaks = vec![];
    for tier in TIERS {
        for user in users() {
            for _ in 0..12 {
                let mut cmd = command(
                    &f,
                    tier,
                    user,
                    &["--read-only", "-p", policy.to_str().unwrap()],
                    &format!("cat {}/.ssh/id_rsa; echo ran-on", f.home.display()),
                );
                let out = run(&mut cmd);
                if out.stdout.contains(SECRET) {
                    leaks.push(format!("{tier:?} as_user={user}\n{}", show(&out)));
                }
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    swapper.join().unwrap();
    assert!(
        leaks.is_empty(),
        "read through a swapped-in link:\n{}",
        leaks.join("\n")
    );
}
