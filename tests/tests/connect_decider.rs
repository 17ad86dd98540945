//! The full tier's connect() decider (SPEC §4.6; supervisor/src/linux/
//! unixconnect.rs) keeps its workers between calls: a connect() that
//! blocks (a unix listener whose backlog is full) must not hold up the
//! others, and a worker that served the sandbox's own sockets many times
//! still refuses a host socket. Real commands under `airlock run`, as the
//! current user and (when the tests run as root) as uid 65534.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::process::Command;

use airlock_tests::tiers::*;
use airlock_tests::*;

fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-connect-decider"))
}

const SCRIPT: &str = r#"
import os, socket, sys, threading, time
tmp = os.environ.get("TMPDIR", "/tmp")
def listener(name, backlog):
    s = socket.socket(socket.AF_UNIX)
    s.bind(os.path.join(tmp, name))
    s.listen(backlog)
    return s
full = listener("full", 0)
first = socket.socket(socket.AF_UNIX)
first.connect(os.path.join(tmp, "full"))
def blocked():
    c = socket.socket(socket.AF_UNIX)
    c.connect(os.path.join(tmp, "full"))
for _ in range(3):
    threading.Thread(target=blocked, daemon=True).start()
time.sleep(0.5)
other = listener("other", 512)
t = time.time()
for _ in range(100):
    c = socket.socket(socket.AF_UNIX)
    c.connect(os.path.join(tmp, "other"))
    c.close()
    c = socket.socket(socket.AF_INET)
    try:
        c.connect(("127.0.0.1", 9))
    except ConnectionRefusedError:
        pass
    c.close()
print("others-connected %.2f" % (time.time() - t))
try:
    socket.socket(socket.AF_UNIX).connect(sys.argv[1])
    print("host-socket-reached")
except OSError as e:
    print("host-socket-refused")
sys.stdout.flush()
os._exit(0)
"#;

#[test]
fn a_blocked_connect_holds_up_no_other_and_reused_workers_still_refuse() {
    if !std::path::Path::new("/usr/bin/python3").exists() {
        eprintln!("skipped: python3 is not installed");
        return;
    }
    for user in users() {
        let f = Fixture::new_in(&base());
        let _ = Command::new("chmod").arg("o+rx").arg(base()).status();
        let dir = tempfile::tempdir_in(base()).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let sock = dir.path().join("host.sock");
        let _host = UnixListener::bind(&sock).unwrap();
        std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o777)).unwrap();
        f.write("bench.py", SCRIPT);
        let mut cmd = command(
            &f,
            Tier::Full,
            user,
            &["--network", "none", "--timeout", "60s"],
            "",
        );
        // `command` runs `sh -c SCRIPT`; this one wants python and an argument.
        let args: Vec<String> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let cut = args.iter().rposition(|a| a == "--").unwrap();
        let program = cmd.get_program().to_owned();
        let envs: Vec<_> = cmd
            .get_envs()
            .filter_map(|(k, v)| Some((k.to_owned(), v?.to_owned())))
            .collect();
        let mut c = Command::new(program);
        c.args(&args[..=cut])
            .args(["python3", "bench.py"])
            .arg(&sock)
            .env_clear()
            .envs(envs)
            .current_dir(&f.ws)
            .stdin(std::process::Stdio::null());
        cmd = c;
        let out = run(&mut cmd);
        let ctx = format!("as_user={user}\n{}", show(&out));
        let took: f64 = out
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("others-connected "))
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or_else(|| panic!("the other connects did not finish\n{ctx}"));
        assert!(took < 20.0, "{took}s\n{ctx}");
        assert!(has_line(&out, "host-socket-refused"), "{ctx}");
        assert!(!out.stdout.contains("host-socket-reached"), "{ctx}");
    }
}
