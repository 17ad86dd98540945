//! The sandbox's end (SPEC §4.1 step 7, §4.5): airlock's post-run check
//! runs only once every process of the sandbox is gone, whatever those
//! processes do while they are killed. The sandbox's PID 1 reports the
//! command's exit before its own exit; it must not do so while anything
//! else of the namespace still exists, and nothing inside may interrupt
//! its waits. Each case runs a real command under `airlock run`, as the
//! current user and (when the tests run as root) as uid 65534, and checks
//! the harmful outcome does not happen and the run still ends as it should.

use std::path::PathBuf;
use std::process::Command;

use airlock_tests::tiers::*;
use airlock_tests::*;

fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-aftermath"))
}

fn fixture() -> Fixture {
    let f = Fixture::new_in(&base());
    let _ = Command::new("chmod").arg("o+rx").arg(base()).status();
    f
}

/// Processes on this machine whose name (`comm`) is `name`.
fn named(name: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    std::fs::read_to_string(e.path().join("comm"))
                        .is_ok_and(|c| c.trim_end() == name)
                })
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn init_takes_no_signal_from_inside() {
    for user in users() {
        let f = fixture();
        let out = run(&mut command(
            &f,
            Tier::Full,
            user,
            &["--network", "none"],
            "grep '^SigCgt' /proc/1/status; kill -SEGV 1; kill -BUS 1; \
             sleep 0.1; echo still-running",
        ));
        let ctx = format!("as_user={user}\n{}", show(&out));
        // No handler: the kernel drops what the namespace sends its init.
        assert!(
            has_line(&out, "SigCgt:\t0000000000000000"),
            "PID 1 catches signals: {ctx}"
        );
        assert!(has_line(&out, "still-running"), "{ctx}");
        assert_eq!(out.code, 0, "{ctx}");
    }
}

/// A process that takes long to die (much memory to free), and two that
/// have the kernel signal PID 1 (SIGSEGV, SIGBUS: what Rust catches) when
/// their descriptors close, as they do when `kill(-1)` ends them, one
/// sooner than the other. None holds airlock's output open (the test
/// would then wait for them).
const SLOW_DEATH: &str = r#"
import ctypes, fcntl, os, signal, sys, time
F_SETSIG = 10
r, w = os.pipe()
def quiet():
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
if os.fork() == 0:
    quiet()
    ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0)
    held = b"\x01" * (int(sys.argv[2]) << 20)
    os.write(w, b"s")
    time.sleep(1000)
for sig, mb in ((signal.SIGSEGV, 32), (signal.SIGBUS, 160)):
    if os.fork() == 0:
        quiet()
        for fd in os.pipe():
            fcntl.fcntl(fd, fcntl.F_SETOWN, 1)
            fcntl.fcntl(fd, F_SETSIG, sig)
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_ASYNC)
        held = b"\x01" * (mb << 20)
        os.write(w, b"t")
        time.sleep(1000)
for _ in range(3):
    os.read(r, 1)
print("armed", flush=True)
sys.exit(7)
"#;

#[test]
fn nothing_of_the_sandbox_outlives_its_reported_end() {
    // Not in the degraded tier: there PID 1 is the host's.
    for user in users() {
        for round in 0..3 {
            let f = fixture();
            f.write("slow_death.py", SLOW_DEATH);
            let name = format!("al-slow-{}{round}", std::process::id() % 10000);
            let out = run(&mut command(
                &f,
                Tier::Full,
                user,
                &["--network", "none"],
                &format!("python3 slow_death.py {name} 640"),
            ));
            // Seen the moment airlock has returned: its check came after
            // the end it was told of.
            let left = named(&name);
            let ctx = format!("as_user={user} round={round}\n{}", show(&out));
            assert!(
                left.is_empty(),
                "a process of the sandbox outlived the run: {left:?}: {ctx}"
            );
            assert!(has_line(&out, "armed"), "{ctx}");
            assert_eq!(out.code, 7, "{ctx}");
        }
    }
}

/// The degraded tier has no PID namespace whose end kills everything at
/// once. A fork storm that replaces itself faster than /proc can be read
/// (at most 1000 members, each forking two successors and exiting; red team
/// round 10) kept the run going past `--timeout` and outlived the walk
/// that killed it. Where Landlock scopes signals (Linux 6.12+), init's one
/// `kill(-1)` ends it: the run ends with its timeout and nothing is left.
#[test]
fn a_fork_storm_ends_with_the_degraded_tier_timeout() {
    if !landlock_scopes_signals() {
        eprintln!("skipped: this kernel's Landlock cannot scope signals (ABI < 6)");
        return;
    }
    let probe = probe_in(&base());
    for user in users() {
        let f = fixture();
        let name = format!("al-storm-{}", std::process::id() % 10000);
        let started = std::time::Instant::now();
        let out = run(&mut command(
            &f,
            Tier::Degraded,
            user,
            &["--network", "none", "--timeout", "2s"],
            // Its members hold a file, not airlock's output pipe. The shell
            // then forks nothing (builtins, and `exec`): a fork of its own
            // competes with the storm for pids and CPU (CI saw `cat` not
            // run within the 2 s).
            &format!(
                "{probe} storm 1000 25 {name} >storm.out 2>&1; \
                 while read -r l; do echo \"$l\"; done <storm.out; exec sleep 60"
            ),
        ));
        let took = started.elapsed();
        let left = named(&name);
        let ctx = format!("as_user={user} took={took:?}\n{}", show(&out));
        assert!(has_line(&out, "storm: started"), "{ctx}");
        assert_eq!(out.code, 124, "{ctx}");
        assert!(
            took < std::time::Duration::from_secs(15),
            "the storm kept the run going past its timeout: {ctx}"
        );
        assert!(
            left.is_empty(),
            "{} members of the storm outlived the run: {ctx}",
            left.len()
        );
    }
}

/// Whether this kernel's Landlock has ABI 6 (signal scoping).
fn landlock_scopes_signals() -> bool {
    // SAFETY: the version query of landlock_create_ruleset takes no attribute.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    abi >= 6
}
