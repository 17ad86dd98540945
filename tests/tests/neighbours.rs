//! What the sandbox shares with the host besides files and the network
//! (SPEC §4.4, §4.6; red team round 19): the host's other processes of the
//! same user, which the degraded tier (no PID namespace) can name; the
//! host's System V IPC and message queues (no IPC namespace there); and
//! the terminal, whose job control the kernel applies past every sandbox.
//! Each case runs a real command under `airlock run`, as the test user and
//! (as root) as uid 65534, checks the host is unchanged, and that what the
//! command may do to itself still works.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use airlock_tests::tiers::*;
use airlock_tests::*;

fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-neighbours"))
}

fn fixture() -> Fixture {
    let f = Fixture::new_in(&base());
    let _ = Command::new("chmod").arg("o+rx").arg(base()).status();
    f
}

/// A host program, as the test user or as uid 65534.
fn host_as(as_user: bool, argv: &[&str]) -> Command {
    let mut c = if as_user {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"]);
        c.args(argv);
        c
    } else {
        let mut c = Command::new(argv[0]);
        c.args(&argv[1..]);
        c
    };
    c.stdin(Stdio::null());
    c
}

/// A field of /proc/<pid>/limits or the nice value of /proc/<pid>/stat.
fn limits_and_nice(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap_or_default();
    let files = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap_or_default()
        .to_string();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let nice = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(16))
        .unwrap_or_default()
        .to_string();
    (files, nice)
}

/// Each attempt on another process prints `<what>: <errno name or ok>`;
/// then what the command may do to itself.
const NEIGHBOUR: &str = r#"
import errno, os, resource, sys
def attempt(what, f):
    try:
        f(); print(what + ": ok")
    except OSError as e:
        print(what + ": " + errno.errorcode.get(e.errno, str(e.errno)))
for name, pid in (("sentinel", int(sys.argv[1])), ("parent", os.getppid())):
    attempt(name + " prlimit", lambda: resource.prlimit(pid, resource.RLIMIT_NOFILE, (0, 0)))
    attempt(name + " cpu", lambda: resource.prlimit(pid, resource.RLIMIT_CPU, (1, 1)))
    attempt(name + " renice", lambda: os.setpriority(os.PRIO_PROCESS, pid, 19))
    attempt(name + " affinity", lambda: os.sched_setaffinity(pid, {0}))
    attempt(name + " idle", lambda: os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0)))
attempt("user renice", lambda: os.setpriority(os.PRIO_USER, 0, 19))
attempt("group renice", lambda: os.setpriority(os.PRIO_PGRP, 0, 19))
attempt("read limits", lambda: resource.prlimit(int(sys.argv[1]), resource.RLIMIT_NOFILE))
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
attempt("own limit", lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (min(64, hard), hard)))
attempt("own nice", lambda: os.nice(1))
"#;

/// In the degraded tier the host's processes of the same user, airlock's
/// init and watcher among them, are there to name: no limit, priority or
/// scheduling of theirs can be changed from inside. (In the full tier only
/// the sandbox's own PID namespace can be named.)
#[test]
fn the_users_other_processes_cannot_be_limited_or_reniced() {
    for user in users() {
        let f = fixture();
        f.write("neighbour.py", NEIGHBOUR);
        let mut sentinel = host_as(user, &["sleep", "60"]).spawn().expect("sentinel");
        let before = limits_and_nice(sentinel.id());
        let out = run(&mut command(
            &f,
            Tier::Degraded,
            user,
            &["--network", "none"],
            &format!("python3 neighbour.py {}", sentinel.id()),
        ));
        let after = limits_and_nice(sentinel.id());
        let _ = sentinel.kill();
        let _ = sentinel.wait();
        let ctx = format!("as_user={user}\n{}", show(&out));
        assert_eq!(out.code, 0, "{ctx}");
        assert_eq!(before, after, "the sentinel was changed from inside: {ctx}");
        for target in ["sentinel", "parent"] {
            for what in ["prlimit", "cpu", "renice", "affinity", "idle"] {
                assert!(
                    has_line(&out, &format!("{target} {what}: EPERM")),
                    "{target} {what} was not refused: {ctx}"
                );
            }
        }
        for what in ["user renice", "group renice"] {
            assert!(has_line(&out, &format!("{what}: EPERM")), "{what}: {ctx}");
        }
        for what in ["read limits", "own limit", "own nice"] {
            assert!(has_line(&out, &format!("{what}: ok")), "{what}: {ctx}");
        }
    }
}

/// The host user's System V shared memory segment, and a POSIX message
/// queue: neither readable, writable nor creatable from the degraded tier.
const HOST_IPC: &str = r#"
import ctypes, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
key = int(sys.argv[1])
shm = libc.shmget(key, 4096, 0o1600)
assert shm >= 0, ctypes.get_errno()
addr = libc.shmat(shm, None, 0)
ctypes.memmove(addr, b"HOST-SHM-SECRET\0", 16)
print("ready", flush=True)
sys.stdin.read()
print(ctypes.string_at(addr).decode(), flush=True)
libc.shmctl(shm, 0, None)
"#;

const SANDBOX_IPC: &str = r#"
import ctypes, errno, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
def name():
    return errno.errorcode.get(ctypes.get_errno(), "?")
shm = libc.shmget(int(sys.argv[1]), 0, 0)
print("shmget:", "ok" if shm >= 0 else name())
if shm >= 0:
    addr = libc.shmat(shm, None, 0)
    print("read:", ctypes.string_at(addr))
    ctypes.memmove(addr, b"OVERWRITTEN\0", 12)
mine = libc.shmget(0x1eaced, 4096, 0o1600)
print("create:", "ok" if mine >= 0 else name())
mq = libc.mq_open(b"/airlock-left-behind", 0o100 | 2, 0o600, None)
print("mq_open:", "ok" if mq >= 0 else name())
"#;

#[test]
fn the_hosts_ipc_is_out_of_reach_of_the_degraded_tier() {
    for user in users() {
        let f = fixture();
        let key = 0x5a1d_0000 + (std::process::id() % 0xffff) as i32 + i32::from(user);
        let script = base().join(format!("host_ipc-{}-{user}.py", std::process::id()));
        write_public(&script, HOST_IPC);
        f.write("sandbox_ipc.py", SANDBOX_IPC);
        // The system's python: another user may not reach one in root's HOME.
        let python = ["/usr/bin/python3", "python3"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists() || !p.starts_with('/'))
            .unwrap_or("python3");
        let mut holder = host_as(user, &[python, script.to_str().unwrap(), &key.to_string()]);
        let mut holder = holder
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("host ipc");
        let mut ready = [0u8; 6];
        let _ = holder.stdout.as_mut().unwrap().read_exact(&mut ready);
        let out = run(&mut command(
            &f,
            Tier::Degraded,
            user,
            &["--network", "none"],
            &format!("python3 sandbox_ipc.py {key}"),
        ));
        drop(holder.stdin.take());
        let mut seen = String::new();
        let _ = holder.stdout.as_mut().unwrap().read_to_string(&mut seen);
        let _ = holder.wait();
        let _ = std::fs::remove_file(&script);
        let ctx = format!("as_user={user}\n{}", show(&out));
        assert_eq!(out.code, 0, "{ctx}");
        assert!(!out.stdout.contains("HOST-SHM-SECRET"), "{ctx}");
        assert!(
            seen.contains("HOST-SHM-SECRET"),
            "the segment changed: {seen}\n{ctx}"
        );
        for what in ["shmget", "create", "mq_open"] {
            assert!(has_line(&out, &format!("{what}: EPERM")), "{what}: {ctx}");
        }
        assert!(
            !std::path::Path::new("/dev/mqueue/airlock-left-behind").exists(),
            "{ctx}"
        );
    }
}

/// `cmd` on a terminal of its own, for 20 s at most: its exit status, or
/// None when it had not ended by then (it is woken and killed), and what
/// the terminal showed.
fn on_a_terminal(cmd: Command) -> (Option<std::process::ExitStatus>, airlock_tests::pty::Screen) {
    let started = Instant::now();
    let (mut child, _master, screen) = airlock_tests::pty::on_pty(cmd);
    while started.elapsed() < Duration::from_secs(20) {
        if let Ok(Some(s)) = child.try_wait() {
            return (Some(s), screen);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // Stopped or hung: wake and end it; the caller fails.
    let _ = Command::new("kill")
        .args(["-CONT", &child.id().to_string()])
        .status();
    let _ = child.kill();
    let _ = child.wait();
    (None, screen)
}

/// Reading the terminal from a background process group: the kernel stops
/// that whole group with SIGTTIN, past every sandbox. The command shares
/// airlock's group (its stdin is no terminal, so it is not given one of
/// its own), hands the terminal to a child's group, and reads it. airlock,
/// a job of an interactive shell (so its group is not orphaned, where the
/// kernel would answer EIO instead), must not stop with it: the run ends
/// at its timeout.
const STOP_AIRLOCK: &str = r#"
import os, time
tty = os.open("/dev/tty", os.O_RDWR)
child = os.fork()
if child == 0:
    os.setpgid(0, 0)
    time.sleep(30)
    os._exit(0)
os.setpgid(child, child)
os.tcsetpgrp(tty, child)
print("reading from the background", flush=True)
os.read(tty, 1)
"#;

#[test]
fn the_terminal_cannot_stop_airlock() {
    for tier in TIERS {
        for user in users() {
            let f = fixture();
            f.write("stop_airlock.py", STOP_AIRLOCK);
            let inner = command(
                &f,
                tier,
                user,
                &["--network", "none", "--timeout", "3s"],
                "python3 stop_airlock.py",
            );
            // On a terminal of its own, with stdin elsewhere.
            let mut argv = vec![inner.get_program().to_owned()];
            argv.extend(inner.get_args().map(|a| a.to_owned()));
            let mut cmd = Command::new("bash");
            cmd.args(["--norc", "-m", "-c"])
                .arg("\"$@\" </dev/null; rc=$?; [ $rc -gt 128 ] && kill -KILL %1; echo \"rc=$rc\"")
                .arg("bash")
                .args(&argv)
                .current_dir(&f.ws)
                .env_clear();
            for (k, v) in inner.get_envs() {
                if let Some(v) = v {
                    cmd.env(k, v);
                }
            }
            let (status, screen) = on_a_terminal(cmd);
            let ctx = format!("tier={tier:?} as_user={user}\n{}", screen.text());
            let status = status.unwrap_or_else(|| panic!("airlock was stopped: {ctx}"));
            assert!(
                screen.text().contains("reading from the background"),
                "{ctx}"
            );
            assert!(status.success(), "{ctx}");
            assert!(
                screen.text().contains("rc=124"),
                "airlock was stopped: {ctx}"
            );
        }
    }
}

/// Stopping the terminal's output (`tcflow(TCOOFF)`, with IXON off so no
/// key restarts it) would leave airlock's own writes blocked for ever:
/// its timeout message, its report. Refused; the run ends at its timeout.
const STOP_OUTPUT: &str = r#"
import os, termios, time
fd = os.open("/dev/tty", os.O_RDWR)
a = termios.tcgetattr(fd); a[0] &= ~termios.IXON
termios.tcsetattr(fd, termios.TCSANOW, a)
try:
    termios.tcflow(fd, termios.TCOOFF); print("output stopped", flush=True)
except (OSError, termios.error) as e:
    print("tcflow refused:", e.args[0], flush=True)
time.sleep(30)
"#;

#[test]
fn the_terminals_output_cannot_be_stopped() {
    for tier in TIERS {
        for user in users() {
            let f = fixture();
            f.write("stop_output.py", STOP_OUTPUT);
            let cmd = command(
                &f,
                tier,
                user,
                &["--network", "none", "--timeout", "3s"],
                "python3 stop_output.py",
            );
            let (status, screen) = on_a_terminal(cmd);
            let ctx = format!("tier={tier:?} as_user={user}\n{}", screen.text());
            let status = status.unwrap_or_else(|| panic!("airlock hung: {ctx}"));
            assert!(screen.text().contains("tcflow refused: 1"), "{ctx}");
            assert_eq!(status.code(), Some(124), "{ctx}");
        }
    }
}
