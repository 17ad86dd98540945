//! The question cannot be answered or disguised by the sandbox (SPEC §5.2),
//! tried as the sandbox would, on a real pty, as root and as an ordinary
//! user: a `setsid` background process that keeps drawing, the terminal
//! made to type a reply, escape sequences in argv, type-ahead, a stale
//! question, and the sandbox answering on the approval socket itself. No
//! attempt gets a host allowed or persisted.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use airlock_tests::pty::{on_pty, Screen};
use airlock_tests::*;

fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-approval-attacks"))
}

const PROMPT: &str = "Allow? [o]nce";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Who {
    Root,
    User,
}

struct Setup {
    f: Fixture,
    origin: Origin,
    who: Who,
}

fn setup(who: Who) -> Setup {
    let f = Fixture::new_in(&base());
    if who == Who::User {
        for d in [&f.home, &f.ws] {
            let _ = Command::new("chown")
                .args(["-R", "65534:65534"])
                .arg(d)
                .status();
        }
        let _ = Command::new("chmod").arg("o+rx").arg(base()).status();
    }
    Setup {
        f,
        origin: Origin::start("origin"),
        who,
    }
}

/// `cmd` as uid 65534 when the test is for an ordinary user.
fn as_who(who: Who, cmd: Command) -> Command {
    if who == Who::Root {
        return cmd;
    }
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(cmd.get_program())
        .args(cmd.get_args());
    c.env_clear();
    for (k, v) in cmd.get_envs() {
        if let Some(v) = v {
            c.env(k, v);
        }
    }
    if let Some(d) = cmd.get_current_dir() {
        c.current_dir(d);
    }
    c
}

impl Setup {
    fn curl(&self, host: &str) -> String {
        format!(
            "curl -s -o /dev/null -w '%{{http_code}} %header{{x-airlock-reason}}\\n' http://{host}:{}/",
            self.origin.port()
        )
    }

    fn tty(&self, extra: &[&str], script: &str) -> (std::process::Child, std::fs::File, Screen) {
        let mut args = vec![
            "--resolve",
            "unlisted.test=127.0.0.1",
            "--resolve",
            "other.test=127.0.0.1",
            "--allow-private",
            "127.0.0.0/8",
            "--ask",
            "tty",
        ];
        args.extend_from_slice(extra);
        let mut cmd = self.f.command(&args, script);
        if extra.contains(&"--allow-degraded") {
            cmd.env("AIRLOCK_FORCE_TIER", "degraded");
        }
        on_pty(as_who(self.who, cmd))
    }

    fn user_policy(&self) -> PathBuf {
        self.f.home.join(".config/airlock/policy.toml")
    }

    fn nothing_persisted(&self) {
        let text = std::fs::read_to_string(self.user_policy()).unwrap_or_default();
        assert!(!text.contains("unlisted.test"), "{text}");
        assert_eq!(self.origin.hits(), 0, "the origin was reached");
    }
}

fn finish(mut child: std::process::Child, screen: &Screen) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if child.try_wait().ok().flatten().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    panic!("airlock did not finish:\n{}", screen.text());
}

fn background_process_is_stopped(who: Who, extra: &[&str]) {
    let s = setup(who);
    // A setsid process, out of the foreground job and its session, that
    // keeps redrawing the line; each redraw is counted on the screen.
    let script = format!(
        "setsid sh -c 'while :; do printf \"\\033[2K\\rFAKE npm wants registry.test \"; sleep 0.05; done' </dev/null & \
         sleep 0.5; {c}; sleep 0.5",
        c = s.curl("unlisted.test")
    );
    let (child, mut keys, screen) = s.tty(extra, &script);
    assert!(screen.wait_for(PROMPT), "no prompt:\n{}", screen.text());
    std::thread::sleep(Duration::from_millis(200));
    let (at_prompt, drawn) = (screen.count("FAKE"), screen.bytes().len());
    assert!(
        at_prompt > 0,
        "the background process never ran:\n{}",
        screen.text()
    );
    std::thread::sleep(Duration::from_millis(1200));
    let after = screen.bytes()[drawn..].to_vec();
    assert_eq!(
        screen.count("FAKE"),
        at_prompt,
        "the background process drew over the question: {:?}",
        String::from_utf8_lossy(&after)
    );
    keys.write_all(b"d").unwrap();
    assert!(screen.wait_for("403 approval-denied"), "{}", screen.text());
    // It was stopped, not killed: it draws again after the answer.
    assert!(
        screen.wait_for_n("FAKE", at_prompt + 1),
        "the background process was not resumed"
    );
    finish(child, &screen);
    s.nothing_persisted();
}

#[test]
fn a_background_process_is_stopped_while_asking() {
    background_process_is_stopped(Who::Root, &[]);
}

#[test]
fn a_background_process_is_stopped_while_asking_as_a_user() {
    background_process_is_stopped(Who::User, &[]);
}

/// The degraded tier has no PID namespace: the subreaper's descendants
/// are the sandbox.
#[test]
fn a_background_process_is_stopped_while_asking_in_the_degraded_tier() {
    background_process_is_stopped(Who::Root, &["--allow-degraded"]);
}

fn terminal_replies_answer_nothing(who: Who) {
    let s = setup(who);
    // The sandbox asks the terminal to report (DSR, DA); the test plays the
    // terminal and sends the replies into the prompt, then plain non-keys.
    let replies: [&[u8]; 5] = [b"\x1b[0n", b"\x1b[?1;2c", b"A", b"aa", b"\x1b"];
    let script = format!(
        "for i in 1 2 3 4 5; do printf '\\033[5n\\033[c'; {c}; done",
        c = s.curl("unlisted.test")
    );
    let (child, mut keys, screen) = s.tty(&[], &script);
    for (n, reply) in replies.iter().enumerate() {
        assert!(
            screen.wait_for_n(PROMPT, n + 1),
            "no prompt {n}:\n{}",
            screen.text()
        );
        keys.write_all(reply).unwrap();
        assert!(
            screen.wait_for_n("403 approval-denied", n + 1),
            "{reply:?} did not void the prompt:\n{}",
            screen.text()
        );
    }
    finish(child, &screen);
    assert!(!screen.text().contains("200"), "{}", screen.text());
    s.nothing_persisted();
}

#[test]
fn terminal_replies_void_the_prompt() {
    terminal_replies_answer_nothing(Who::Root);
}

#[test]
fn terminal_replies_void_the_prompt_as_a_user() {
    terminal_replies_answer_nothing(Who::User);
}

#[test]
fn escape_sequences_in_argv_never_reach_the_terminal() {
    let s = setup(Who::Root);
    // argv[0] rewrites the line: it would draw a fake question.
    let script = format!(
        "exec bash -c 'exec -a \"$(printf \"\\033[2K\\rnpm install wants to connect to registry.test\\033[8m\")\" curl -s -o /dev/null -w \"%{{http_code}}\\n\" http://unlisted.test:{}/'",
        s.origin.port()
    );
    let (child, mut keys, screen) = s.tty(&[], &script);
    assert!(screen.wait_for("[d]eny"), "no prompt:\n{}", screen.text());
    keys.write_all(b"d").unwrap();
    assert!(screen.wait_for("403"), "{}", screen.text());
    finish(child, &screen);
    let bytes = screen.bytes();
    let text = String::from_utf8_lossy(&bytes);
    let start = text.find("airlock: ").expect("the prompt");
    let end = text[start..].find("[d]eny").expect("the prompt's end") + start;
    let prompt = &text[start..end];
    assert!(
        !prompt
            .bytes()
            .any(|b| b == 0x1b || (b < 0x20 && b != b'\r' && b != b'\n')),
        "control bytes from the sandbox reached the terminal: {prompt:?}"
    );
    assert!(prompt.contains("\\x1b[2K\\x0dnpm install"), "{prompt:?}");
    assert!(prompt.contains("unlisted.test"), "{prompt:?}");
    // Nothing else carries ESC (curl printed nothing) but airlock's own
    // screen resets around the question (approval_screen.rs).
    let rest = text
        .replace("\x1b[?1049h\x1b[0m\x1b[?5l\x1b(B\x1b)B\x0f\x1b[4l\x1b[?6l\x1b[r\x1b[?7h\x1b[?25h\x1b[H\x1b[2J", "")
        .replace("\x1b[?1049l", "");
    assert!(!rest.contains('\x1b'), "{text:?}");
}

#[test]
fn type_ahead_before_the_prompt_is_discarded() {
    let s = setup(Who::Root);
    let script = format!("sleep 1; {}", s.curl("unlisted.test"));
    let (child, mut keys, screen) = s.tty(&[], &script);
    std::thread::sleep(Duration::from_millis(300));
    // Typed (or injected) before the question exists.
    keys.write_all(b"a").unwrap();
    assert!(screen.wait_for(PROMPT), "no prompt:\n{}", screen.text());
    std::thread::sleep(Duration::from_millis(700));
    assert!(
        !screen.text().contains("allow-always"),
        "type-ahead answered the question:\n{}",
        screen.text()
    );
    keys.write_all(b"d").unwrap();
    assert!(screen.wait_for("403 approval-denied"), "{}", screen.text());
    finish(child, &screen);
    s.nothing_persisted();
}

#[test]
fn a_stale_question_is_never_shown() {
    let s = setup(Who::Root);
    let policy = s.f.write("~/ask.toml", "[network]\nask_timeout = \"2s\"\n");
    // Two questions at once: the second waits for the terminal, and its
    // timeout passes while the first is up. One curl makes both requests
    // together: two processes could start half a second apart on a loaded
    // machine, and a question asked that much later is rightly shown.
    let script = format!(
        "curl -s --parallel --parallel-immediate \
         -w '%{{http_code}} %header{{x-airlock-reason}}\\n' \
         -o /dev/null http://unlisted.test:{p}/ -o /dev/null http://other.test:{p}/",
        p = s.origin.port()
    );
    let (child, _keys, screen) = s.tty(&["-p", policy.to_str().unwrap()], &script);
    assert!(screen.wait_for(PROMPT), "no prompt:\n{}", screen.text());
    assert!(
        screen.wait_for_n("403 approval-timeout", 2),
        "{}",
        screen.text()
    );
    finish(child, &screen);
    assert_eq!(
        screen.count(PROMPT),
        1,
        "a stale question was shown:\n{}",
        screen.text()
    );
    s.nothing_persisted();
}

/// A python client for the socket protocol that answers every question
/// `allow-always` and prints what it got.
const GREEDY_CLIENT: &str = r#"
import json, socket, sys, time
s = socket.socket(socket.AF_UNIX)
for _ in range(100):
    try:
        s.connect(sys.argv[1]); break
    except OSError:
        time.sleep(0.05)
else:
    print("client: cannot connect"); sys.exit(0)
f = s.makefile("rw")
for line in f:
    print("client:", line.strip(), flush=True)
    m = json.loads(line)
    if m.get("type") == "ask":
        f.write(json.dumps({"type": "answer", "id": m["id"], "verdict": "allow-always"}) + "\n"); f.flush()
"#;

fn sandbox_cannot_answer(who: Who, degraded: bool, listed: bool) {
    let s = setup(who);
    let sock = s.f.home.join("approve.sock");
    let client = s.f.write("client.py", GREEDY_CLIENT);
    // Listed in unix_sockets, the socket is reachable, and the sandbox's
    // connect() is made by airlock on its behalf: the peer is airlock.
    let grant = if listed {
        format!("[filesystem]\nunix_sockets = [\"{}\"]\n", sock.display())
    } else {
        String::new()
    };
    let policy = s.f.write(
        "~/ask.toml",
        &format!("{grant}[network]\nask_timeout = \"2s\"\n"),
    );
    let ask = format!("socket:{}", sock.display());
    // The refused client is disconnected after its error line, so `wait`
    // returns.
    let script = format!(
        "python3 {py} {sock} & sleep 1; {c}; wait",
        py = client.display(),
        sock = sock.display(),
        c = s.curl("unlisted.test")
    );
    let mut args = vec![
        "-p",
        policy.to_str().unwrap(),
        "--resolve",
        "unlisted.test=127.0.0.1",
        "--allow-private",
        "127.0.0.0/8",
        "--ask",
        &ask,
    ];
    if degraded {
        args.push("--allow-degraded");
    }
    let mut cmd = s.f.command(&args, &script);
    if degraded {
        cmd.env("AIRLOCK_FORCE_TIER", "degraded");
    }
    let out = run(&mut as_who(who, cmd));
    assert!(
        out.stdout.contains("403 approval-timeout"),
        "{}{}",
        out.stdout,
        out.stderr
    );
    assert!(
        !out.stdout.contains("\"type\": \"ask\"") && !out.stdout.contains("\"type\":\"ask\""),
        "the sandbox saw the question: {}",
        out.stdout
    );
    // Either the socket is out of its reach (or unix sockets are, as the
    // degraded tier's seccomp filter has it), or the kernel's word on the
    // peer got it refused.
    assert!(
        out.stdout.contains("client: cannot connect")
            || out.stdout.contains("refused")
            || out.stderr.contains("PermissionError"),
        "{}{}",
        out.stdout,
        out.stderr
    );
    s.nothing_persisted();
}

#[test]
fn the_sandbox_cannot_answer_on_the_approval_socket() {
    sandbox_cannot_answer(Who::Root, false, false);
}

#[test]
fn the_sandbox_cannot_answer_on_the_approval_socket_even_when_listed() {
    sandbox_cannot_answer(Who::Root, false, true);
    sandbox_cannot_answer(Who::User, false, true);
}

#[test]
fn the_sandbox_cannot_answer_on_the_approval_socket_as_a_user() {
    sandbox_cannot_answer(Who::User, false, false);
}

/// No PID namespace there: the check falls to the sandbox's process set.
#[test]
fn the_sandbox_cannot_answer_on_the_approval_socket_in_the_degraded_tier() {
    sandbox_cannot_answer(Who::Root, true, false);
}

/// The peer-credential check on its own: `airlock proxy --ask socket`
/// (no sandbox at all) refuses a client in another PID namespace and a
/// client of another uid, and serves a plain one.
#[test]
fn the_approval_socket_checks_peer_credentials() {
    let home = Home::new();
    let sock = home.path().join("approve.sock");
    let client = home.write("client.py", GREEDY_CLIENT);
    let _ = Command::new("chmod").arg("a+rx").arg(home.path()).status();
    let ask = format!("socket:{}", sock.display());
    let proxy = Proxy::start(&home, &["--ask", &ask]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !sock.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let first_line = |cmd: &mut Command| -> String {
        let out = run(cmd
            .arg("/usr/bin/python3")
            .arg(&client)
            .arg(&sock)
            .env("PYTHONUNBUFFERED", "1"));
        // The refused client gets one error line and the connection ends.
        out.stdout.lines().next().unwrap_or_default().to_string() + &out.stderr
    };
    // Another PID namespace (as a sandbox has): refused.
    let mut unshare = Command::new("unshare");
    if is_root() {
        unshare.args(["-p", "-f", "--"]);
    } else {
        unshare.args(["-U", "-r", "-p", "-f", "--"]);
    }
    let other_ns = first_line(&mut unshare);
    assert!(
        other_ns.contains("refused") && other_ns.contains("PID namespace"),
        "{other_ns}"
    );
    // Another uid, even with the file's mode opened up: refused.
    if is_root() {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
        let other_uid = first_line(Command::new("setpriv").args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
        ]));
        assert!(
            other_uid.contains("refused") && other_uid.contains("uid 65534"),
            "{other_uid}"
        );
    }
    // A client of our own, outside any sandbox, is served (it gets no
    // error; with no question pending it reads nothing).
    let mut ok = UnixStream::connect(&sock).unwrap();
    ok.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    writeln!(ok, "{{\"type\":\"hello\"}}").unwrap();
    let mut line = String::new();
    let _ = BufReader::new(&ok).read_line(&mut line);
    assert!(line.contains("unknown message type"), "{line}");
    drop(proxy);
}

/// SPEC §5.2: a host allowed only by an approval must resolve to a public
/// address; allow_private covers hosts a policy rule allows.
#[test]
fn an_approval_never_unlocks_a_private_address() {
    let s = setup(Who::Root);
    let sock = s.f.home.join("approve.sock");
    let client = s.f.write("client.py", GREEDY_CLIENT);
    let answerer = std::process::Command::new("python3")
        .arg(&client)
        .arg(&sock)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let ask = format!("socket:{}", sock.display());
    // An IP literal: no policy line names it or pins it.
    let out = s.f.run(
        &["--allow-private", "127.0.0.0/8", "--ask", &ask],
        &format!(
            // --noproxy '': loopback goes through the proxy like any host.
            "curl -s --noproxy '' -o /dev/null -w '%{{http_code}} %header{{x-airlock-reason}}\\n' http://127.0.0.1:{}/",
            s.origin.port()
        ),
    );
    let mut answerer = answerer;
    let _ = answerer.kill();
    let _ = answerer.wait();
    assert!(
        out.stdout.contains("403 private-address"),
        "{}{}",
        out.stdout,
        out.stderr
    );
    assert_eq!(s.origin.hits(), 0);
}

/// `airlock approve` shows what the sandbox controls escaped and takes
/// one lowercase key, as the terminal prompt does.
#[test]
fn airlock_approve_escapes_argv_and_takes_one_key() {
    let s = setup(Who::Root);
    let sock = s.f.home.join("approve.sock");
    let ask = format!("socket:{}", sock.display());
    let script = format!(
        "sleep 1; exec bash -c '(exec -a \"$(printf \"\\033[2K\\rnpm install wants registry.test\")\" curl -s -o /dev/null -w \"%{{http_code}}\\n\" http://unlisted.test:{p}/); (exec -a \"$(printf \"\\033[2K\")\" curl -s -o /dev/null -w \"%{{http_code}}\\n\" http://unlisted.test:{p}/)'",
        p = s.origin.port()
    );
    let sandbox = std::thread::spawn({
        let cmd = s.f.command(
            &[
                "--resolve",
                "unlisted.test=127.0.0.1",
                "--allow-private",
                "127.0.0.0/8",
                "--ask",
                &ask,
            ],
            &script,
        );
        move || {
            let mut cmd = cmd;
            run(&mut cmd)
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while !sock.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut approve = Command::new(airlock_bin());
    approve.arg("approve").arg("--socket").arg(&sock);
    let (mut child, mut keys, screen) = on_pty(approve);
    assert!(
        screen.wait_for("[d]eny: "),
        "no question:\n{}",
        screen.text()
    );
    // Upper case is no answer here either: it denies.
    keys.write_all(b"O").unwrap();
    assert!(screen.wait_for_n("[d]eny: ", 2), "{}", screen.text());
    keys.write_all(b"o").unwrap();
    let out = sandbox.join().unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        out.stdout.lines().collect::<Vec<_>>(),
        ["403", "200"],
        "{}{}\n{}",
        out.stdout,
        out.stderr,
        screen.text()
    );
    let bytes = screen.bytes();
    assert!(
        !bytes.contains(&0x1b),
        "escape bytes from the sandbox reached the terminal: {:?}",
        screen.text()
    );
    assert!(
        screen.text().contains("\\x1b[2K\\x0dnpm install"),
        "{}",
        screen.text()
    );
}

/// A question withdrawn while `airlock approve` shows it (its timeout
/// passed) is dropped there: a late key answers nothing.
#[test]
fn airlock_approve_drops_a_stale_question() {
    let s = setup(Who::Root);
    let sock = s.f.home.join("approve.sock");
    let ask = format!("socket:{}", sock.display());
    let policy = s.f.write("~/ask.toml", "[network]\nask_timeout = \"1s\"\n");
    let script = format!("sleep 1; {c}; sleep 1.5", c = s.curl("unlisted.test"));
    let sandbox = std::thread::spawn({
        let cmd = s.f.command(
            &[
                "-p",
                policy.to_str().unwrap(),
                "--resolve",
                "unlisted.test=127.0.0.1",
                "--allow-private",
                "127.0.0.0/8",
                "--ask",
                &ask,
            ],
            &script,
        );
        move || {
            let mut cmd = cmd;
            run(&mut cmd)
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while !sock.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut approve = Command::new(airlock_bin());
    approve.arg("approve").arg("--socket").arg(&sock);
    let (mut child, mut keys, screen) = on_pty(approve);
    assert!(
        screen.wait_for("[d]eny: "),
        "no question:\n{}",
        screen.text()
    );
    assert!(screen.wait_for("settled: timeout"), "{}", screen.text());
    keys.write_all(b"a").unwrap();
    let out = sandbox.join().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        out.stdout.contains("403 approval-timeout"),
        "{}{}",
        out.stdout,
        out.stderr
    );
    let text = screen.text();
    assert!(
        !text.contains("allow-always") && !text.contains("no open question"),
        "{text}"
    );
    s.nothing_persisted();
}

/// The approval socket lies in the workspace, and a session's command
/// replaces it with a listener of its own: the user's `airlock approve`
/// refuses that listener (it runs inside a sandbox) rather than show its
/// questions and send it the user's answers (red team round 13).
#[test]
fn an_approval_socket_a_sandbox_replaced_is_refused_by_the_approver() {
    for who in [Who::Root, Who::User] {
        approval_socket_replaced(who);
    }
}

fn approval_socket_replaced(who: Who) {
    let Setup { f, .. } = setup(who);
    let sock = f.ws.join("ask.sock");
    let ask = format!("socket:{}", sock.display());
    let name = format!("asksock{}{who:?}", std::process::id());
    let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into());
    let airlock = |args: &[&str]| {
        let mut c = Command::new(airlock_bin());
        c.args(args)
            .current_dir(&f.ws)
            .env("HOME", &f.home)
            .env("PATH", &path);
        as_who(who, c)
    };
    let start = run(&mut airlock(&[
        "session", "start", "--name", &name, "--ask", &ask,
    ]));
    assert_eq!(start.code, 0, "{who:?}: {}", start.stderr);
    let fake = r#"
import socket, os, sys
p = sys.argv[1]
os.unlink(p)
s = socket.socket(socket.AF_UNIX); s.bind(p); s.listen(4)
if os.fork() > 0:
    print("replaced", flush=True); os._exit(0)
os.setsid()
null = os.open("/dev/null", os.O_RDWR)
for fd in (0, 1, 2): os.dup2(null, fd)
c, _ = s.accept()
c.send(b'{"type":"ask","id":"1","host":"forged.test","port":443,"command":"x"}\n')
open(sys.argv[2], "wb").write(c.recv(4096))
"#;
    let seen = f.ws.join("seen");
    let out = run(&mut airlock(&[
        "run",
        "--session",
        &name,
        "--",
        "python3",
        "-c",
        fake,
        sock.to_str().unwrap(),
        seen.to_str().unwrap(),
    ]));
    assert!(
        out.stdout.contains("replaced"),
        "{who:?}: code {} {} {}",
        out.code,
        out.stdout,
        out.stderr
    );
    let mut child = airlock(&["approve", "--socket", sock.to_str().unwrap()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let _ = child.stdin.take().unwrap().write_all(b"a\n");
    let done = child.wait_with_output().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // (It records what it received: nothing, the approver having closed.)
    let got = std::fs::read(&seen).unwrap_or_default();
    // Ended before any assertion, so that a failure leaves no session.
    let _ = run(&mut airlock(&["session", "end", &name]));
    let err = String::from_utf8_lossy(&done.stderr);
    assert!(!done.status.success(), "{who:?}: {err}");
    assert!(
        err.contains("refusing the approval socket"),
        "{who:?}: {err}"
    );
    assert!(!err.contains("forged.test"), "{who:?}: {err}");
    assert!(
        got.is_empty(),
        "{who:?}: the sandbox's listener got an answer: {}",
        String::from_utf8_lossy(&got)
    );
}
