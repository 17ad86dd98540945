//! Sessions (SPEC §4.7) driven as an agent harness drives them: one
//! sandbox, many short commands from subdirectories of a repository, an
//! approval given once, a server left running by one command and reached
//! by the next, plants caught when the command that made them ends, and
//! the report at the end. As root and as an ordinary user.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use airlock_tests::who::Who;
use airlock_tests::*;

fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-sessions"))
}

/// `airlock ARGS` for the fixture, in `dir`, as `who`.
fn airlock_in(f: &Fixture, who: Who, dir: &Path, args: &[&str]) -> Command {
    let bin = airlock_bin();
    who.host(f, dir, bin.to_str().expect("a UTF-8 path"), args)
}

/// A running session, ended (or killed) on drop.
struct Session<'a> {
    f: &'a Fixture,
    who: Who,
    name: String,
    pid: u32,
}

impl<'a> Session<'a> {
    fn start(f: &'a Fixture, who: Who, name: &str, extra: &[&str]) -> Session<'a> {
        Session::start_in(f, who, &f.ws, name, extra)
    }

    fn start_in(f: &'a Fixture, who: Who, dir: &Path, name: &str, extra: &[&str]) -> Session<'a> {
        Session::start_limited(f, who, dir, name, extra, None)
    }

    /// With the open-files soft limit lowered to `open_files` first (as a
    /// user's shell often has it).
    fn start_limited(
        f: &'a Fixture,
        who: Who,
        dir: &Path,
        name: &str,
        extra: &[&str],
        open_files: Option<u32>,
    ) -> Session<'a> {
        let mut args = vec!["session", "start", "--name", name];
        args.extend_from_slice(extra);
        let out = match open_files {
            None => run(&mut airlock_in(f, who, dir, &args)),
            Some(n) => {
                let bin = airlock_bin();
                let limit = format!("ulimit -Sn {n} && exec \"$0\" \"$@\"");
                let mut all = vec!["-c", &limit, bin.to_str().expect("a UTF-8 path")];
                all.extend_from_slice(&args);
                run(&mut who.host(f, dir, "sh", &all))
            }
        };
        assert_eq!(out.code, 0, "{who:?}: session start: {}", out.stderr);
        let info: serde_json::Value =
            serde_json::from_str(out.stdout.trim()).expect("session start prints JSON");
        assert_eq!(info["name"], name, "{info}");
        assert!(info["socket"]
            .as_str()
            .is_some_and(|s| s.ends_with(".sock")));
        Session {
            f,
            who,
            name: name.to_string(),
            pid: info["pid"].as_u64().expect("pid") as u32,
        }
    }

    fn cmd(&self, dir: &Path, extra: &[&str], argv: &[&str]) -> Command {
        let mut args = vec!["run", "--session", &self.name];
        args.extend_from_slice(extra);
        args.push("--");
        args.extend_from_slice(argv);
        airlock_in(self.f, self.who, dir, &args)
    }

    fn sh(&self, dir: &Path, script: &str) -> Out {
        run(&mut self.cmd(dir, &[], &["sh", "-c", script]))
    }

    fn end(&mut self, extra: &[&str]) -> Out {
        let mut args = vec!["session", "end", &self.name];
        args.extend_from_slice(extra);
        let name = self.name.clone();
        let out = run(&mut airlock_in(self.f, self.who, &self.f.ws, &args));
        self.name = format!("{name}-ended");
        out
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        if !self.name.ends_with("-ended") {
            // SAFETY: kill(2) on the session's supervisor.
            unsafe { libc::kill(self.pid as i32, libc::SIGTERM) };
        }
    }
}

fn git(f: &Fixture, who: Who, dir: &Path, args: &[&str]) {
    let st = who.host(f, dir, "git", args).status().expect("git");
    assert!(st.success(), "git {args:?}");
}

#[test]
fn a_harness_runs_a_task_in_one_session() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        let deep = f.ws.join("src/deep");
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::write(f.ws.join("src/app.py"), "print('foo')\n").unwrap();
        who.prepare(&f);
        git(&f, who, &f.ws, &["init", "-q"]);
        let origin = Origin::start("origin");
        let sock = f.home.join("approve.sock");
        let ask = format!("socket:{}", sock.display());
        // The ready client, started before the socket exists (it waits),
        // as the session's user; one answer typed ahead: allow-session.
        let mut approve = airlock_in(
            &f,
            who,
            &f.ws,
            &["approve", "--socket", sock.to_str().unwrap()],
        );
        let mut approve = approve
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut typed = approve.stdin.take().unwrap();
        typed.write_all(b"s\n").unwrap();
        let mut s = Session::start(
            &f,
            who,
            "task",
            &[
                "--resolve",
                "unlisted.test=127.0.0.1",
                "--allow-private",
                "127.0.0.0/8",
                "--ask",
                &ask,
                "--deny",
                "denied.test",
            ],
        );

        // The command runs where the harness is, not at the workspace root.
        let out = s.sh(&deep, "pwd");
        assert_eq!(out.code, 0, "{who:?}: {}", out.stderr);
        assert_eq!(out.stdout.trim(), deep.display().to_string(), "{who:?}");
        // Edits from a subdirectory land in the host tree.
        let out = s.sh(&f.ws.join("src"), "sed -i s/foo/bar/ app.py");
        assert_eq!(out.code, 0, "{who:?}: {}", out.stderr);
        assert_eq!(
            std::fs::read_to_string(f.ws.join("src/app.py")).unwrap(),
            "print('bar')\n"
        );
        // Its own exit status, stdout and stderr.
        let out = s.sh(&f.ws, "echo out; echo err >&2; exit 7");
        assert_eq!(
            (out.code, out.stdout.as_str(), out.stderr.as_str()),
            (7, "out\n", "err\n"),
            "{who:?}"
        );

        // Each command brings its own environment, filtered as §4.3 says.
        let out = run(s
            .cmd(&f.ws, &[], &["sh", "-c", "echo CI=$CI KEY=$MY_API_KEY"])
            .env("CI", "1")
            .env("MY_API_KEY", "sekrit"));
        assert_eq!(out.stdout, "CI=1 KEY=\n", "{who:?}: {}", out.stderr);

        // One approval serves every later command of the session.
        let url = format!("http://unlisted.test:{}/", origin.port());
        for _ in 0..3 {
            let out = s.sh(
                &deep,
                &format!("curl -s -o /dev/null -w '%{{http_code}}' {url}"),
            );
            assert_eq!(out.stdout, "200", "{who:?}: {}", out.stderr);
        }

        assert_eq!(origin.hits(), 3);

        // A refusal is explained on the command's own stderr.
        let out = s.sh(&f.ws, "curl -s -o /dev/null http://denied.test/ || true");
        assert!(
            out.stderr
                .contains("airlock: blocked 1 connection: denied.test:80"),
            "{who:?}: {}",
            out.stderr
        );

        // So is a refused write, with how to allow it that works in a
        // session (a new one started with the flag), and never the
        // system's directories or HOME whole.
        let out = s.sh(&deep, "mkdir -p \"$HOME/.tool/logs\" 2>/dev/null; true");
        let tool = f.home.join(".tool");
        assert!(
            out.stderr.contains(&format!(
                "outside the writable roots: mkdir -p {t}, then start a session with --write {t} (or add",
                t = tool.display()
            )),
            "{who:?}: {}",
            out.stderr
        );
        let out = s.sh(&deep, "touch /etc/airlock-session-probe 2>/dev/null; true");
        assert!(
            out.stderr.contains(
                "airlock: the sandbox refused 1 write: /etc/airlock-session-probe (create; outside the writable roots: /etc/airlock-session-probe is the system's"
            ),
            "{who:?}: {}",
            out.stderr
        );

        // A server one command leaves running is there for the next.
        let port = 20000 + (std::process::id() % 20000) as u16 + who as u16;
        let out = s.sh(
            &f.ws,
            &format!("python3 -m http.server {port} --bind 127.0.0.1 >/dev/null 2>&1 &"),
        );
        assert_eq!(out.code, 0, "{who:?}: {}", out.stderr);
        let probe = format!(
            "for i in $(seq 50); do c=$(curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{port}/); [ \"$c\" = 200 ] && echo 200 && exit 0; sleep 0.1; done; exit 1"
        );
        let out = s.sh(&f.ws, &probe);
        assert_eq!(out.stdout, "200\n", "{who:?}: {} {}", out.code, out.stderr);

        // A command past its timeout is killed, alone.
        let t = Instant::now();
        let out = run(&mut s.cmd(
            &f.ws,
            &["--timeout", "1s"],
            &["sh", "-c", "trap '' TERM INT HUP; sleep 30"],
        ));
        assert_eq!(out.code, 124, "{who:?}: {}", out.stderr);
        assert!(t.elapsed() < Duration::from_secs(10));
        let out = s.sh(&f.ws, &probe);
        assert_eq!(
            out.stdout, "200\n",
            "{who:?}: the server outlives another command's timeout"
        );

        // A repository planted mid-session is caught when its command ends,
        // not only when the session does.
        let out = s.sh(
            &f.ws,
            "mkdir -p plant && cd plant && git init -q && printf '#!/bin/sh\\ntouch /tmp/PWNED\\n' > .git/hooks/post-checkout && chmod +x .git/hooks/post-checkout",
        );
        assert!(
            out.stderr.contains("changed a protected path") && out.stderr.contains("post-checkout"),
            "{who:?}: {}",
            out.stderr
        );
        assert!(
            !f.ws.join("plant/.git/hooks/post-checkout").exists(),
            "{who:?}"
        );
        // One a background process plants after its command ended, deep in
        // a directory that existed before, is caught at once.
        let out = s.sh(
            &deep,
            "(sleep 0.3; mkdir -p later && cd later && git init -q && printf '#!/bin/sh\\n' > .git/hooks/pre-commit && chmod +x .git/hooks/pre-commit) >/dev/null 2>&1 &",
        );
        assert_eq!(out.code, 0, "{who:?}: {}", out.stderr);
        std::thread::sleep(Duration::from_millis(1500));
        // Set aside between commands, before any next command (a host IDE
        // runs git all the time)...
        assert!(
            !deep.join("later/.git/hooks/pre-commit").exists(),
            "{who:?}"
        );
        // ...and said to the next command, in its report too.
        let next = f.home.join("next-report.json");
        let out = run(&mut s.cmd(&f.ws, &["--report", next.to_str().unwrap()], &["true"]));
        assert!(
            out.stderr.contains("airlock: between commands:")
                && out.stderr.contains("src/deep/later")
                && out.stderr.contains(".git/hooks/pre-commit"),
            "{who:?}: {}",
            out.stderr
        );
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&next).unwrap()).unwrap();
        assert!(
            r["between_commands"]["protected_changes"]
                .as_array()
                .is_some_and(|a| a.iter().any(|c| c["path"]
                    .as_str()
                    .is_some_and(|p| p.ends_with("later/.git/hooks/pre-commit")))),
            "{who:?}: {r}"
        );
        assert_eq!(
            r["protected_changes"],
            serde_json::json!([]),
            "{who:?}: {r}"
        );
        assert!(
            !deep.join("later/.git/hooks/pre-commit").exists(),
            "{who:?}"
        );

        // The end: everything stopped, the whole check, the report.
        let report = f.home.join("session-report.json");
        let out = s.end(&["--report", report.to_str().unwrap()]);
        assert_eq!(out.code, 0, "{who:?}: {}", out.stderr);
        let rep: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
        // The approver stayed for the whole session, and was asked once.
        drop(typed);
        let approved = output_of(approve);
        assert_eq!(
            approved.stderr.matches("connect to unlisted.test").count(),
            1,
            "{who:?}: {}",
            approved.stderr
        );
        assert!(
            approved.stderr.contains("waiting for"),
            "{}",
            approved.stderr
        );
        assert_eq!(rep["tier"], "linux-namespaces", "{rep}");
        // What the commands' checks quarantined is in the session's report.
        assert!(
            rep["protected_changes"]
                .as_array()
                .is_some_and(|a| a.iter().any(|c| c["path"]
                    .as_str()
                    .is_some_and(|p| p.ends_with("post-checkout")))),
            "{rep}"
        );
        assert!(
            rep["approvals"].as_array().is_some_and(|a| a.len() == 1),
            "{rep}"
        );
        // Nothing of the session is left running.
        let gone = format!("http://127.0.0.1:{port}/");
        let left = Command::new("curl")
            .args(["-s", "-o", "/dev/null", "--max-time", "2", &gone])
            .status()
            .unwrap();
        assert!(!left.success(), "{who:?}: the session's server outlived it");
        let list = run(&mut airlock_in(
            &f,
            who,
            &f.ws,
            &["session", "list", "--json"],
        ));
        assert_eq!(list.stdout.trim(), "[]", "{who:?}");
    }
}

#[test]
fn commands_run_at_once_and_a_dead_client_leaves_nothing_running() {
    let who = Who::Me;
    let f = Fixture::new_in(&base());
    let s = Session::start(&f, who, "pair", &[]);
    let slow = spawn_piped(&mut s.cmd(
        &f.ws,
        &[],
        &["sh", "-c", "touch slow-started; sleep 1; echo slow"],
    ));
    // Running before the fast one starts (else the two need not overlap).
    wait_for_file(&f.ws.join("slow-started"));
    let t = Instant::now();
    let fast = s.sh(&f.ws, "echo fast; touch /opt/beside 2>/dev/null; exit 0");
    assert_eq!(fast.stdout, "fast\n");
    assert!(
        t.elapsed() < Duration::from_millis(900),
        "the fast one waited"
    );
    let slow = output_of(slow);
    assert_eq!(slow.stdout, "slow\n");
    // The refusal is counted for both, and both are told why
    // (harness round 12).
    for out in [&fast, &slow] {
        assert!(
            out.stderr.contains("/opt/beside")
                && out
                    .stderr
                    .contains("another command of this session ran at the same time"),
            "{}",
            out.stderr
        );
    }
    let alone = s.sh(&f.ws, "touch /opt/alone 2>/dev/null; exit 0");
    assert!(
        alone.stderr.contains("/opt/alone") && !alone.stderr.contains("another command"),
        "{}",
        alone.stderr
    );
    // A client killed mid-command takes its command with it.
    let mut c = s.cmd(&f.ws, &[], &["sh", "-c", "sleep 30; touch ran-on"]);
    let mut child = c.spawn().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    child.kill().unwrap();
    let _ = child.wait();
    std::thread::sleep(Duration::from_millis(300));
    let out = s.sh(&f.ws, "ps -eo args | grep -c '[s]leep 30' || true");
    assert_eq!(out.stdout.trim(), "0", "{}", out.stderr);
}

#[test]
fn the_session_socket_serves_no_sandboxed_process() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        who.prepare(&f);
        let s = Session::start(&f, who, "guarded", &[]);
        let sock = f.home.join(".local/state/airlock/sessions/guarded.sock");
        assert!(sock.exists(), "{}", sock.display());
        // From inside the session: neither reachable nor, were it reached,
        // served (the server checks the peer's user namespace).
        let script = format!(
            "python3 -c \"import socket,sys\ns=socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\ntry:\n  s.connect('{}')\n  s.send(b'{{\\\"op\\\":\\\"info\\\"}}')\n  print('reply', s.recv(4096))\nexcept OSError as e:\n  print('refused', e)\n\"",
            sock.display()
        );
        let out = s.sh(&f.ws, &script);
        assert!(
            out.stdout.starts_with("refused") || out.stdout.contains("reply b''"),
            "{who:?}: {}{}",
            out.stdout,
            out.stderr
        );
        // Nor a nested `airlock run --session` inside it.
        let inner = format!("{} run --session guarded -- true", airlock_bin().display());
        let out = s.sh(&f.ws, &inner);
        assert_ne!(out.code, 0, "{who:?}: {}", out.stderr);
        // Garbage from outside breaks nothing.
        let fd = UnixStream::connect(&sock);
        drop(fd);
        let out = s.sh(&f.ws, "echo still");
        assert_eq!(out.stdout, "still\n", "{who:?}: {}", out.stderr);
    }
}

/// An agent's session runs for hours. Meanwhile the user works in other
/// repositories, and other runs and sessions check them: what the user did
/// there is theirs (no window of a sandbox that could not write there
/// speaks for it), and what one airlock quarantined is not taken for a
/// sandbox's plant by the next (red team: the user's hook and signing
/// config were stripped; two sessions quarantined each other's quarantine
/// without end).
#[test]
fn an_open_session_leaves_the_users_repositories_alone_and_checks_do_not_feed_each_other() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        who.prepare(&f);
        let other = f.home.join("other");
        let st = who
            .host(&f, &f.home, "mkdir", &["-p", other.to_str().unwrap()])
            .status()
            .unwrap();
        assert!(st.success());
        let mut elsewhere = Session::start_in(&f, who, &other, "elsewhere", &[]);
        // The user's own nested repository, made while that session runs:
        // signing on and a secret-scanning hook.
        git(&f, who, &f.ws, &["init", "-q", "."]);
        let sub = f.ws.join("sub");
        git(&f, who, &f.ws, &["init", "-q", "sub"]);
        git(&f, who, &sub, &["config", "commit.gpgsign", "true"]);
        let hook = sub.join(".git/hooks/pre-commit");
        let st = who
            .host(&f, &f.ws, "sh", &["-c", "printf '#!/bin/sh\\necho scan\\n' > sub/.git/hooks/pre-commit && chmod 755 sub/.git/hooks/pre-commit"])
            .status()
            .unwrap();
        assert!(st.success());
        std::thread::sleep(Duration::from_millis(50));
        let out = run(&mut airlock_in(&f, who, &f.ws, &["run", "--", "true"]));
        assert_eq!(out.code, 0, "{who:?}: {}", out.stderr);
        assert!(
            !out.stderr.contains("quarantine"),
            "{who:?}: {}",
            out.stderr
        );
        assert_eq!(
            std::fs::read_to_string(&hook).unwrap(),
            "#!/bin/sh\necho scan\n",
            "{who:?}"
        );
        let config = std::fs::read_to_string(sub.join(".git/config")).unwrap();
        assert!(config.contains("gpgsign = true"), "{who:?}: {config}");
        // Two sessions in this workspace: what one sets aside, the other
        // leaves alone, and neither goes on setting aside.
        let mut idle = Session::start(&f, who, "idle", &[]);
        let mut busy = Session::start(&f, who, "busy", &[]);
        let out = busy.sh(&f.ws, "git init -q planted");
        assert_eq!(out.code, 0, "{who:?}: {}", out.stderr);
        let _ = busy.sh(&f.ws, "true");
        std::thread::sleep(Duration::from_secs(3));
        let count = || {
            std::fs::read_dir(f.ws.join(".airlock/quarantine"))
                .map(|d| d.count())
                .unwrap_or(0)
        };
        // One plant: one quarantine, or two where both sessions' checks
        // ran at the same moment (each its own copy); never more.
        let first = count();
        assert!((1..=2).contains(&first), "{who:?}: {first} quarantines");
        std::thread::sleep(Duration::from_secs(2));
        assert_eq!(count(), first, "{who:?}: the checks went on");
        // The plant was caught, and the repository still works.
        let planted = std::fs::read_to_string(f.ws.join("planted/.git/config")).unwrap_or_default();
        assert!(!planted.contains("fsmonitor"), "{planted}");
        for s in [&mut busy, &mut idle, &mut elsewhere] {
            let out = s.end(&[]);
            assert_eq!(out.code, 0, "{who:?}: {}", out.stderr);
        }
        assert_eq!(
            std::fs::read_to_string(&hook).unwrap(),
            "#!/bin/sh\necho scan\n",
            "{who:?}"
        );
    }
}

/// A session started from a background job (which ignores SIGINT and
/// SIGQUIT) gives its commands the default dispositions, so the Ctrl-C a
/// client passes on reaches them (harness drive: it never did).
#[test]
fn a_session_started_in_the_background_still_passes_ctrl_c_on() {
    let who = Who::Me;
    let f = Fixture::new_in(&base());
    let bin = airlock_bin();
    let out = run(&mut who.host(
        &f,
        &f.ws,
        "sh",
        &[
            "-c",
            &format!(
                "trap '' INT QUIT; exec {} session start --name bg",
                bin.display()
            ),
        ],
    ));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let s = Session {
        f: &f,
        who,
        name: "bg".into(),
        pid: serde_json::from_str::<serde_json::Value>(out.stdout.trim()).unwrap()["pid"]
            .as_u64()
            .unwrap() as u32,
    };
    let out = s.sh(&f.ws, "grep SigIgn /proc/self/status");
    let ignored = out
        .stdout
        .trim()
        .strip_prefix("SigIgn:")
        .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
        .unwrap_or(u64::MAX);
    let bit = |sig: i32| 1u64 << (sig - 1);
    assert_eq!(
        ignored & (bit(libc::SIGINT) | bit(libc::SIGQUIT)),
        0,
        "{}{}",
        out.stdout,
        out.stderr
    );
}

/// A process a command leaves running rewrites a sandbox-made repository's
/// config through a shared mapping, which raises no inotify event: the
/// session still sees it between commands (the known repositories' config
/// and hooks are looked at by identity) and sets it aside before the
/// host's git runs there (red team round 1).
#[test]
fn a_config_rewritten_through_a_mapping_between_commands_runs_nothing() {
    if std::process::Command::new("python3")
        .arg("-V")
        .output()
        .is_err()
    {
        eprintln!("skipped: python3 is not installed");
        return;
    }
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        who.prepare(&f);
        git(&f, who, &f.ws, &["init", "-q", "."]);
        // The user's own nested repository, there before the session (red
        // team round 12: only those a check had found were looked at, and a
        // command that wrote nothing else had no check).
        std::fs::create_dir_all(f.ws.join("own")).expect("mkdir");
        if who == Who::Nobody {
            airlock_tests::who::chown(&f.ws);
        }
        git(&f, who, &f.ws.join("own"), &["init", "-q", "."]);
        let mut s = Session::start(&f, who, "mapped", &[]);
        let marker = f.home.join("PWNED");
        // The session's first command maps the user's config and writes
        // nothing else; a later one makes `sub` and maps its config. Each
        // is looked at before any other command runs.
        for repo in ["own", "sub"] {
            if repo == "sub" {
                let out = s.sh(&f.ws, "git init -q sub && echo made");
                assert!(out.stdout.contains("made"), "{who:?}: {}", out.stderr);
            }
            let script = format!(
                r#"nohup python3 -c '
import mmap, time
f = open("{repo}/.git/config", "r+b"); m = mmap.mmap(f.fileno(), 0); f.close()
time.sleep(1)
new = b"[core]\n\tfsmonitor = \"touch {m}; false\"\n#"
m[:len(new)] = new
time.sleep(60)
' >/dev/null 2>&1 &
echo left"#,
                m = marker.display()
            );
            let out = s.sh(&f.ws, &script);
            assert!(out.stdout.contains("left"), "{who:?}: {}", out.stderr);
            std::thread::sleep(Duration::from_secs(3));
            airlock_tests::repos::host_git_runs_nothing(&f, who, &f.ws.join(repo), &marker);
        }
        let out = s.end(&[]);
        assert_eq!(out.code, 0, "{who:?}: {}", out.stderr);
    }
}

/// The same for any file a host tool obeys, not only a repository's: a
/// process a command leaves running maps the user's own `pkg/.npmrc` and
/// rewrites it later; the session sees what it holds mapped and judges the
/// file between commands (red team round 12: it stayed until the end).
#[test]
fn a_tool_file_rewritten_through_a_mapping_between_commands_is_set_aside() {
    if std::process::Command::new("python3")
        .arg("-V")
        .output()
        .is_err()
    {
        eprintln!("skipped: python3 is not installed");
        return;
    }
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        f.write(
            "pkg/.npmrc",
            "registry=https://registry.example.invalid/\n# the user's own, padded to be rewritten in place\n",
        );
        f.write(
            "tools/.irbrc",
            "# the user's own irb settings, padded to be rewritten in place\n",
        );
        f.write(
            "lib/.pdbrc",
            "# the user's own pdb settings, padded to be rewritten in place\n",
        );
        who.prepare(&f);
        git(&f, who, &f.ws, &["init", "-q", "."]);
        let mut s = Session::start(&f, who, "mapped-npmrc", &[]);
        let out = s.sh(
            &f.ws,
            r#"nohup python3 -c '
import mmap, time
f = open("pkg/.npmrc", "r+b"); m = mmap.mmap(f.fileno(), 0); f.close()
time.sleep(1)
new = b"script-shell=/tmp/evil-shell\n#"
m[:len(new)] = new
time.sleep(60)
' >/dev/null 2>&1 &
echo left"#,
        );
        assert!(out.stdout.contains("left"), "{who:?}: {}", out.stderr);
        // Round 13: a descriptor kept open for writing, mapped only for a
        // moment, later.
        let out = s.sh(
            &f.ws,
            r#"nohup python3 -c '
import mmap, os, time
fd = os.open("tools/.irbrc", os.O_RDWR)
time.sleep(1)
m = mmap.mmap(fd, 0); new = b"system(1)\n#"; m[:len(new)] = new; m.close()
time.sleep(60)
' >/dev/null 2>&1 &
echo left"#,
        );
        assert!(out.stdout.contains("left"), "{who:?}: {}", out.stderr);
        // Round 14: mapped through a second name made for a moment, so
        // that the mapping names only a removed file.
        let out = s.sh(
            &f.ws,
            r#"nohup python3 -c '
import mmap, os, time
os.link("lib/.pdbrc", ".held"); fd = os.open(".held", os.O_RDWR); os.unlink(".held")
m = mmap.mmap(fd, 0); os.close(fd)
time.sleep(1)
new = b"!import os\n#"; m[:len(new)] = new
time.sleep(60)
' >/dev/null 2>&1 &
sleep 0.3; echo left"#,
        );
        assert!(out.stdout.contains("left"), "{who:?}: {}", out.stderr);
        std::thread::sleep(Duration::from_secs(3));
        let now = std::fs::read_to_string(f.ws.join("lib/.pdbrc")).unwrap_or_default();
        assert!(
            !now.contains("!import"),
            "{who:?}: the .pdbrc rewritten through a removed name is in place: {now}"
        );
        let now = std::fs::read_to_string(f.ws.join("pkg/.npmrc")).unwrap_or_default();
        assert!(
            !now.contains("script-shell"),
            "{who:?}: the rewritten .npmrc is still in place between commands: {now}"
        );
        let now = std::fs::read_to_string(f.ws.join("tools/.irbrc")).unwrap_or_default();
        assert!(
            !now.contains("system(1)"),
            "{who:?}: the rewritten .irbrc is still in place between commands: {now}"
        );
        let out = s.end(&[]);
        assert_eq!(out.code, 0, "{who:?}: {}", out.stderr);
    }
}

/// A command that ends while the question it raised is still open (the
/// session asks on a socket nobody is connected to) is told so on its own
/// stderr and report, with how to answer; it no longer waits in silence
/// with the refusal told to the next command (harness round 11).
#[test]
fn a_command_that_ends_before_its_question_is_answered_is_told() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        who.prepare(&f);
        let sock = f.home.join("approve.sock");
        let ask = format!("socket:{}", sock.display());
        let mut s = Session::start(&f, who, "unanswered", &["--ask", &ask]);
        let report = f.home.join("r.json");
        let out = run(&mut s.cmd(
            &f.ws,
            &["--report", report.to_str().unwrap()],
            &[
                "sh",
                "-c",
                "curl -s -m 2 -o /dev/null http://unanswered.test/; echo curl=$?",
            ],
        ));
        assert!(out.stdout.contains("curl="), "{who:?}: {}", out.stderr);
        // Said while it waits, too (harness round 12).
        assert!(
            out.stderr
                .contains("asking about unanswered.test:80 and waiting for an answer"),
            "{who:?}: {}",
            out.stderr
        );
        assert!(
            out.stderr
                .contains("still waiting for an answer about unanswered.test:80")
                && out
                    .stderr
                    .contains("nobody is connected to the approval socket")
                && out.stderr.contains("airlock approve"),
            "{who:?}: {}",
            out.stderr
        );
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
        assert_eq!(
            r["waiting_for_approval"],
            serde_json::json!(["unanswered.test:80"]),
            "{who:?}: {r}"
        );
        let out = s.end(&[]);
        assert_eq!(out.code, 0, "{who:?}: {}", out.stderr);
        // A one-shot run says the same, and its report has it.
        let out = run(&mut who.wrap(f.command(
            &["--ask", &ask, "--report", report.to_str().unwrap()],
            "curl -s -m 2 -o /dev/null http://unanswered.test/; echo curl=$?",
        )));
        assert!(
            out.stderr
                .contains("asking about unanswered.test:80 and waiting for an answer")
                && out.stderr.contains(
                    "the command ended while a question about unanswered.test:80 was still open"
                ),
            "{who:?}: {}",
            out.stderr
        );
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
        assert_eq!(
            r["waiting_for_approval"],
            serde_json::json!(["unanswered.test:80"]),
            "{who:?}: {r}"
        );
    }
}

/// The user's nested repository sends git outside its own tree (a hooks
/// path `../githooks`, an include `../../shared/git.inc`, neither there
/// yet): a command that makes them is judged when it ends, though the
/// change is not near the repository (red team round 13).
#[test]
fn a_nested_repositorys_targets_outside_it_are_judged_when_the_command_ends() {
    if !repos_git() {
        return;
    }
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        std::fs::create_dir_all(f.ws.join("sub")).unwrap();
        who.prepare(&f);
        git(&f, who, &f.ws, &["init", "-q", "."]);
        git(&f, who, &f.ws.join("sub"), &["init", "-q", "."]);
        git(
            &f,
            who,
            &f.ws.join("sub"),
            &["config", "core.hooksPath", "../githooks"],
        );
        git(
            &f,
            who,
            &f.ws.join("sub"),
            &["config", "include.path", "../../shared/git.inc"],
        );
        let mut s = Session::start(&f, who, "far-targets", &[]);
        let marker = f.home.join("PWNED");
        let out = s.sh(
            &f.ws,
            &format!(
                "mkdir -p githooks shared && printf '#!/bin/sh\\ntouch {m}\\n' > githooks/post-checkout && \
                 chmod +x githooks/post-checkout && printf '[core]\\n\\tfsmonitor = touch {m}; false\\n' > shared/git.inc && echo planted",
                m = marker.display()
            ),
        );
        assert!(out.stdout.contains("planted"), "{who:?}: {}", out.stderr);
        assert!(
            out.stderr.contains("quarantined"),
            "{who:?}: {}",
            out.stderr
        );
        airlock_tests::repos::host_git_runs_nothing(&f, who, &f.ws.join("sub"), &marker);
        let out = s.end(&[]);
        assert_eq!(out.code, 0, "{who:?}: {}", out.stderr);
    }
}

/// A session's check that cannot search everything fails the command, as
/// a one-shot run fails (red team round 5: it used to say nothing and
/// exit 0): here a directory of the user's own that they cannot list, with
/// a repository the sandbox plants below it. Root reads through the mode,
/// and the plant is set aside. A wide tree, renamed into place, with the
/// open-files limit low, is searched whole.
#[test]
fn a_check_that_cannot_search_everything_fails_the_command() {
    if !repos_git() {
        return;
    }
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        who.prepare(&f);
        git(&f, who, &f.ws, &["init", "-q", "."]);
        // The user's own: writable and searchable, not listable.
        let own = f.ws.join("u/x");
        std::fs::create_dir_all(&own).unwrap();
        if who == Who::Nobody {
            who::chown(&f.ws);
        }
        let st = who
            .host(&f, &f.ws, "chmod", &["311", "u"])
            .status()
            .expect("chmod");
        assert!(st.success());
        let marker = f.home.join("PWNED");
        let mut s =
            Session::start_limited(&f, who, &f.ws, "blind", &["--network", "none"], Some(256));
        let out = s.sh(
            &f.ws,
            &format!(
                "git init -q u/x/r && git -C u/x/r config core.fsmonitor 'touch {m}; false' && echo planted",
                m = marker.display()
            ),
        );
        assert!(out.stdout.contains("planted"), "{who:?}: {}", out.stderr);
        let reads_through = is_root() && who == Who::Me;
        if reads_through {
            assert_eq!(out.code, 0, "{who:?}: {}", out.stderr);
            assert!(
                out.stderr.contains("new git repository"),
                "{who:?}: {}",
                out.stderr
            );
        } else {
            assert_eq!(out.code, 125, "{who:?}: the command fails: {}", out.stderr);
            assert!(
                out.stderr.contains("could not finish"),
                "{who:?}: and says why: {}",
                out.stderr
            );
        }
        // A wide tree made elsewhere and renamed into place (more
        // directories than the supervisor's open-files limit): its
        // repository is found.
        let _ = who.host(&f, &f.ws, "chmod", &["755", "u"]).status();
        let out = s.sh(
            &f.ws,
            &format!(
                "mkdir stage && cd stage && seq 1 1200 | xargs mkdir && git init -q 600/sub && \
                 git -C 600/sub config core.fsmonitor 'touch {m}; false' && cd .. && mv stage w && echo planted",
                m = marker.display()
            ),
        );
        assert!(out.stdout.contains("planted"), "{who:?}: {}", out.stderr);
        assert_eq!(out.code, 0, "{who:?}: {}", out.stderr);
        assert!(
            out.stderr.contains("new git repository"),
            "{who:?}: {}",
            out.stderr
        );
        let _ = run(&mut who.host(&f, &f.ws.join("w/600/sub"), "git", &["status"]));
        assert!(!marker.exists(), "{who:?}: the user's git ran the plant");
        s.end(&[]);
    }
}

fn repos_git() -> bool {
    let ok = std::process::Command::new("git")
        .arg("--version")
        .output()
        .is_ok();
    if !ok {
        eprintln!("skipped: git is not installed");
    }
    ok
}

/// A session command's report names the variables of the caller's
/// environment the session withheld (SPEC §7: names only), and the
/// command does not see them; the rest of the caller's environment it
/// does.
#[test]
fn a_session_commands_report_names_what_was_withheld() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        who.prepare(&f);
        let mut s = Session::start(&f, who, "withheld", &["--network", "none"]);
        let report = f.home.join("cmd-report.json");
        let mut c = s.cmd(
            &f.ws,
            &["--report", report.to_str().unwrap()],
            &["sh", "-c", "env"],
        );
        c.env("MY_API_TOKEN", "s3cret-value")
            .env("MY_COLOR", "blue");
        let out = run(&mut c);
        assert_eq!(out.code, 0, "{who:?}: {}", out.stderr);
        assert!(
            !out.stdout.contains("s3cret-value"),
            "{who:?}: {}",
            out.stdout
        );
        assert!(
            out.stdout.contains("MY_COLOR=blue"),
            "{who:?}: {}",
            out.stdout
        );
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
        assert!(
            r["withheld_env"]
                .as_array()
                .is_some_and(|a| a.iter().any(|n| n == "MY_API_TOKEN")),
            "{who:?}: {r}"
        );
        assert!(!r.to_string().contains("s3cret-value"), "{who:?}: {r}");
        s.end(&[]);
    }
}

/// What a harness reads when a session's command fails for want of what
/// the session withheld, when it was given a file to write, and when the
/// session died under it: the withheld name on the failing command's
/// stderr, with where `--pass-env` goes; a file root written with the
/// command's own status at the end too; a dead session told apart from
/// a misspelt one.
#[test]
fn a_session_tells_a_failing_command_what_it_withheld_and_says_when_it_died() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        f.write("~/notes.txt", "first\n");
        who.prepare(&f);
        if who == Who::Nobody {
            airlock_tests::who::chown(&f.home);
        }
        let notes = f.home.join("notes.txt");
        let mut s = Session::start(
            &f,
            who,
            "told",
            &["--network", "none", "--write", notes.to_str().unwrap()],
        );
        let mut c = s.cmd(
            &f.ws,
            &[],
            &["sh", "-c", "test -n \"$MY_API_KEY\" || exit 3"],
        );
        c.env("MY_API_KEY", "s3cret-value");
        let out = run(&mut c);
        assert_eq!(out.code, 3, "{who:?}: {}", out.stderr);
        assert!(
            out.stderr
                .lines()
                .any(|l| l.starts_with("airlock: withheld")
                    && l.contains("MY_API_KEY")
                    && l.contains("a session started with --pass-env NAME passes one")),
            "{who:?}: {}",
            out.stderr
        );
        let out = s.sh(&f.ws, &format!("echo second >> {}", notes.display()));
        assert_eq!(out.code, 0, "{who:?}: {}", out.stderr);
        // A write a process left running tried between commands is told
        // to the next command, on stderr and in its report.
        let out = s.sh(
            &f.ws,
            "(sleep 0.3; echo x > /etc/airlock-between-probe) >/dev/null 2>&1 &",
        );
        assert_eq!(out.code, 0, "{who:?}: {}", out.stderr);
        std::thread::sleep(Duration::from_millis(1200));
        let next = f.home.join("next.json");
        let out = run(&mut s.cmd(&f.ws, &["--report", next.to_str().unwrap()], &["true"]));
        assert!(
            out.stderr
                .contains("airlock: between commands: the sandbox refused")
                && out.stderr.contains("/etc/airlock-between-probe"),
            "{who:?}: {}",
            out.stderr
        );
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&next).unwrap()).unwrap();
        assert!(
            r["between_commands"]["filesystem_refusals"]
                .as_array()
                .is_some_and(|a| a.iter().any(|x| x["path"] == "/etc/airlock-between-probe")),
            "{who:?}: {r}"
        );
        assert_eq!(
            r["filesystem_refusals"],
            serde_json::json!([]),
            "{who:?}: {r}"
        );
        let end = s.end(&[]);
        assert_eq!(end.code, 0, "{who:?}: {}", end.stderr);
        assert_eq!(
            std::fs::read_to_string(&notes).unwrap(),
            "first\nsecond\n",
            "{who:?}"
        );
        // A session whose airlock was killed is not "no session named".
        let s = Session::start(&f, who, "dies", &["--network", "none"]);
        // SAFETY: kill(2) on the session's supervisor.
        unsafe { libc::kill(s.pid as i32, libc::SIGKILL) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Path::new(&format!("/proc/{}", s.pid)).exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = s.sh(&f.ws, "true");
        assert_eq!(out.code, 125, "{who:?}: {}", out.stderr);
        assert!(
            out.stderr.contains("is no longer running"),
            "{who:?}: {}",
            out.stderr
        );
        // A misspelt name is told which ones run (harness round 13).
        let other = Session::start(&f, who, "the-real-one", &["--network", "none"]);
        let out = run(&mut airlock_in(
            &f,
            who,
            &f.ws,
            &["run", "--session", "never-was", "--", "true"],
        ));
        assert!(
            out.stderr.contains("no session named") && out.stderr.contains("running: the-real-one"),
            "{who:?}: {}",
            out.stderr
        );
        drop(other);
    }
}

/// A process a command leaves running keeps neither the caller's output
/// nor its terminal (red team round 13, N3): a harness reading the
/// command's output until its end is not kept waiting by a dev server,
/// what the process writes later goes to the session's log, and what the
/// person types at the next prompt reaches the host's shell, not the
/// sandbox. The process itself runs on. A command on a terminal still
/// has one, and its caller's terminal is given back as it was.
#[test]
fn a_process_left_running_keeps_neither_the_callers_output_nor_terminal() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        who.prepare(&f);
        let mut s = Session::start(&f, who, "let-go", &[]);

        // Output: a pipe, read to its end as a harness reads it.
        let t = Instant::now();
        let out = s.sh(
            &f.ws,
            "(sleep 2; echo late-output; touch survived; sleep 30) & echo started",
        );
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "{who:?}: the caller's output was held open"
        );
        assert_eq!(out.code, 0, "{who:?}: {}", out.stderr);
        assert_eq!(out.stdout, "started\n", "{who:?}: {}", out.stderr);
        let log = out
            .stderr
            .lines()
            .find_map(|l| l.split("goes to the session's log, ").nth(1))
            .unwrap_or_else(|| panic!("{who:?}: not told where: {}", out.stderr))
            .to_string();
        wait_for_file(&f.ws.join("survived"));
        // A caller that stops reading ends the command as a pipe would
        // (`yes | head -1`; red team round 16: it never returned).
        let mut yes = s
            .cmd(&f.ws, &[], &["yes"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        {
            use std::io::Read;
            let mut first = [0u8; 2];
            yes.stdout.take().unwrap().read_exact(&mut first).unwrap();
        }
        let t = Instant::now();
        while yes.try_wait().unwrap().is_none() {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "{who:?}: the command outlived its reader"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // A command that leaves nothing running is not told otherwise
        // (harness round 13: said after `echo`, its children closing).
        for _ in 0..20 {
            let out = s.sh(&f.ws, "seq 1 20000 | tail -1");
            assert_eq!(out.stdout, "20000\n", "{who:?}");
            assert!(
                !out.stderr.contains("left running"),
                "{who:?}: {}",
                out.stderr
            );
        }
        // One that writes on and on does not keep the caller either
        // (red team round 15: the final drain followed it).
        let t = Instant::now();
        let out = s.sh(&f.ws, "(timeout 20 yes AFTER >&1) & echo started");
        assert!(
            t.elapsed() < Duration::from_secs(12),
            "{who:?}: a writing survivor kept the caller"
        );
        assert!(
            out.stdout.starts_with("started\n") || out.stdout.contains("started"),
            "{who:?}"
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("late-output")
        {
            assert!(Instant::now() < deadline, "{who:?}: not in {log}");
            std::thread::sleep(Duration::from_millis(50));
        }

        // A terminal: the command has one of its own.
        let (master, slave) = pty();
        let with_tty = |c: &mut Command| {
            let fd = |_| Stdio::from(slave.try_clone().expect("dup"));
            c.stdin(fd(0)).stdout(fd(1)).stderr(fd(2));
        };
        let mut c = s.cmd(
            &f.ws,
            &[],
            &[
                "sh",
                "-c",
                "test -t 0 && test -t 1 && echo on-a-terminal; exec 3<&0; (sleep 1; read -r x <&3; echo \"$x\" > stolen) & exit 0",
            ],
        );
        with_tty(&mut c);
        let st = c.status().expect("run");
        assert!(st.success(), "{who:?}: {st:?}");
        let said = read_for(&master, Duration::from_millis(500));
        assert!(said.contains("on-a-terminal"), "{who:?}: {said}");
        let mut mode: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: tcgetattr into a termios we own, on our pty.
        unsafe { libc::tcgetattr(slave.as_raw_fd(), &mut mode) };
        assert_ne!(mode.c_lflag & libc::ICANON, 0, "{who:?}: left in raw mode");
        // The person types at the host's next prompt, after the command.
        std::thread::sleep(Duration::from_millis(1500));
        (&master).write_all(b"typed-later\n").unwrap();
        let host = read_for(&slave, Duration::from_secs(3));
        assert!(
            host.contains("typed-later"),
            "{who:?}: the host got {host:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
        let stolen = std::fs::read_to_string(f.ws.join("stolen")).unwrap_or_default();
        assert!(
            !stolen.contains("typed"),
            "{who:?}: the sandbox read {stolen:?}"
        );
        let out = s.end(&[]);
        assert_eq!(out.code, 0, "{who:?}: {}", out.stderr);
        // A command sent after the end is told the session ended, not
        // that no such session exists.
        let out = run(&mut airlock_in(
            &f,
            who,
            &f.ws,
            &["run", "--session", "let-go", "--", "true"],
        ));
        assert!(
            out.stderr
                .contains("no longer running: it was ended with `airlock session end`"),
            "{who:?}: {}",
            out.stderr
        );
    }
}

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// A pseudo-terminal: its master and its slave.
fn pty() -> (std::fs::File, std::fs::File) {
    let (mut m, mut s) = (0, 0);
    // SAFETY: openpty into two ints we own; no name, default settings.
    let rc = unsafe {
        libc::openpty(
            &mut m,
            &mut s,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty");
    // SAFETY: both are descriptors openpty just opened for us.
    unsafe {
        (
            std::fs::File::from(OwnedFd::from_raw_fd(m)),
            std::fs::File::from(OwnedFd::from_raw_fd(s)),
        )
    }
}

/// What `f` gives within `wait`.
fn read_for(f: &std::fs::File, wait: Duration) -> String {
    use std::io::Read;
    let mut got = vec![];
    let deadline = Instant::now() + wait;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut p = libc::pollfd {
            fd: f.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll on one descriptor we hold.
        let n = unsafe { libc::poll(&mut p, 1, left.as_millis() as i32) };
        if n <= 0 {
            break;
        }
        let mut buf = [0u8; 4096];
        match (&*f).read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(k) => got.extend_from_slice(&buf[..k]),
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// A command asked to start in a directory the sandbox cannot use (one
/// under the host's private /tmp) is refused, in a session and in a
/// one-shot run with a named workspace: never run in the workspace root
/// instead, where `rm` meant for a scratch directory would delete the
/// project's files (harness round 12).
#[test]
fn a_command_from_a_directory_the_sandbox_cannot_use_is_refused_not_moved() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        f.write("keep.txt", "mine\n");
        who.prepare(&f);
        let scratch = tempfile::Builder::new()
            .prefix("airlock-scratch")
            .tempdir_in("/tmp")
            .unwrap();
        airlock_tests::who::chown(scratch.path());
        let s = Session::start(&f, who, "elsewhere", &[]);
        let ws = f.ws.to_str().unwrap();
        let report = f.home.join("refused.json");
        let rep = report.to_str().unwrap();
        for mut c in [
            s.cmd(
                scratch.path(),
                &["--report", rep],
                &["sh", "-c", "rm -f keep.txt; touch made"],
            ),
            airlock_in(
                &f,
                who,
                scratch.path(),
                &[
                    "run",
                    "--workspace",
                    ws,
                    "--report",
                    rep,
                    "--",
                    "sh",
                    "-c",
                    "rm -f keep.txt; touch made",
                ],
            ),
        ] {
            let out = run(&mut c);
            assert_eq!(out.code, 125, "{who:?}: {}", out.stderr);
            assert!(
                out.stderr.contains("refused: the command would start in")
                    && out.stderr.contains("--write "),
                "{who:?}: {}",
                out.stderr
            );
            assert!(f.ws.join("keep.txt").exists(), "{who:?}: deleted");
            assert!(!f.ws.join("made").exists(), "{who:?}");
            assert!(!scratch.path().join("made").exists(), "{who:?}");
            // The harness's report says so (not an empty file, not none).
            let r: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&report).unwrap_or_default())
                    .unwrap_or_else(|e| panic!("{who:?}: the report: {e}"));
            assert_eq!(r["exit_code"], 125, "{who:?}: {r}");
            assert!(
                r["error"].as_str().is_some_and(|e| e.contains("refused")),
                "{r}"
            );
            let _ = std::fs::remove_file(&report);
        }
        // From inside the workspace it runs, where it was asked to.
        let out = s.sh(&f.ws, "pwd");
        assert_eq!(out.stdout.trim(), ws, "{who:?}: {}", out.stderr);
    }
}

/// An approver whose input ends (`airlock approve --socket P < /dev/null`,
/// or a closed pipe) denies what it was asked rather than leaving the
/// command waiting until its question times out (harness round 12).
#[test]
fn an_approver_whose_input_ends_denies_what_it_was_asked() {
    let who = Who::Me;
    let f = Fixture::new_in(&base());
    who.prepare(&f);
    let sock = f.home.join("approve.sock");
    let ask = format!("socket:{}", sock.display());
    let s = Session::start(
        &f,
        who,
        "eof",
        &[
            "--resolve",
            "asked.test=127.0.0.1",
            "--allow-private",
            "127.0.0.0/8",
            "--ask",
            &ask,
        ],
    );
    let origin = Origin::start("asked");
    let t = Instant::now();
    let curl = spawn_piped(&mut s.cmd(
        &f.ws,
        &[],
        &[
            "sh",
            "-c",
            &format!(
                "curl -s -m 20 -o /dev/null -w '%{{http_code}}' http://asked.test:{}/",
                origin.port()
            ),
        ],
    ));
    std::thread::sleep(Duration::from_millis(500));
    let approve = run(airlock_in(
        &f,
        who,
        &f.ws,
        &["approve", "--socket", sock.to_str().unwrap()],
    )
    .stdin(Stdio::null()));
    let out = output_of(curl);
    assert_eq!(out.stdout, "403", "{}{}", out.stderr, approve.stderr);
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "the question was left open: {}",
        approve.stderr
    );
    assert!(
        approve.stderr.contains("end of input"),
        "{}",
        approve.stderr
    );
    assert_eq!(origin.hits(), 0);
}

/// A directory renamed into place in a session is judged whole where it
/// lands, now that a rename no longer makes the check search every root:
/// a tree assembled elsewhere and moved over a protected name, at the top
/// and at a nested repository's top, is set aside when the command ends;
/// an ordinary rename is kept.
#[test]
fn a_directory_renamed_into_place_is_judged_where_it_lands() {
    if !repos_git() {
        return;
    }
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        std::fs::create_dir_all(f.ws.join("sub")).unwrap();
        f.write("lib/a.txt", "a\n");
        who.prepare(&f);
        git(&f, who, &f.ws, &["init", "-q", "."]);
        git(&f, who, &f.ws.join("sub"), &["init", "-q", "."]);
        let mut s = Session::start(&f, who, "renames", &[]);
        let out = s.sh(
            &f.ws,
            "mkdir -p stage/.vscode stage2/.husky && \
             echo '{\"tasks\":[]}' > stage/.vscode/tasks.json && \
             printf 'touch /tmp/PWNED\\n' > stage2/.husky/pre-commit && \
             mv stage/.vscode .vscode && mv stage2/.husky sub/.husky && mv lib lib2 && echo moved",
        );
        assert!(out.stdout.contains("moved"), "{who:?}: {}", out.stderr);
        for rel in [".vscode/tasks.json", "sub/.husky/pre-commit"] {
            assert!(
                !f.ws.join(rel).exists(),
                "{who:?}: {rel} renamed into place was kept: {}",
                out.stderr
            );
        }
        assert!(f.ws.join("lib2/a.txt").exists(), "{who:?}: {}", out.stderr);
        let out = s.end(&[]);
        assert_eq!(out.code, 0, "{who:?}: {}", out.stderr);
    }
}
