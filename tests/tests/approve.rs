//! Approvals end to end (SPEC §5.2): real `airlock run`, a real socket
//! client answering, and a real pty for the terminal prompt.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use airlock_tests::pty::on_pty;
use airlock_tests::*;

fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-approve"))
}

/// A socket client that answers every question with `verdict` (after
/// `delay`), first sending `noise` lines, and records what it saw.
struct Client {
    seen: Arc<Mutex<Vec<serde_json::Value>>>,
}

impl Client {
    fn start(
        path: PathBuf,
        verdict: Option<&'static str>,
        delay: Duration,
        noise: Vec<String>,
    ) -> Client {
        let seen = Arc::new(Mutex::new(vec![]));
        let log = seen.clone();
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(10);
            let stream = loop {
                match UnixStream::connect(&path) {
                    Ok(s) => break s,
                    Err(_) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    Err(_) => return,
                }
            };
            let mut w = stream.try_clone().unwrap();
            for n in &noise {
                let _ = writeln!(w, "{n}");
            }
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                let msg: serde_json::Value = serde_json::from_str(&line).unwrap();
                log.lock().unwrap().push(msg.clone());
                if let (Some("ask"), Some(v)) = (msg["type"].as_str(), verdict) {
                    std::thread::sleep(delay);
                    let _ = writeln!(
                        w,
                        "{}",
                        serde_json::json!({"type": "answer", "id": msg["id"], "verdict": v})
                    );
                }
            }
        });
        Client { seen }
    }

    fn count(&self, kind: &str) -> usize {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|m| m["type"] == kind)
            .count()
    }

    fn errors(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|m| m["type"] == "error")
            .map(|m| m["message"].to_string())
            .collect()
    }
}

struct Setup {
    f: Fixture,
    origin: Origin,
    sock: PathBuf,
}

fn setup() -> Setup {
    let f = Fixture::new_in(&base());
    let sock = f.home.join("approve.sock");
    Setup {
        f,
        origin: Origin::start("origin"),
        sock,
    }
}

impl Setup {
    fn url(&self) -> String {
        format!("http://unlisted.test:{}/", self.origin.port())
    }

    fn run(&self, extra: &[&str], script: &str) -> Out {
        let ask = format!("socket:{}", self.sock.display());
        let mut args = vec![
            "--resolve",
            "unlisted.test=127.0.0.1",
            "--allow-private",
            "127.0.0.0/8",
            "--ask",
            &ask,
        ];
        args.extend_from_slice(extra);
        self.f.run(&args, script)
    }

    /// `airlock run --ask tty` for `script`, with unlisted.test on loopback.
    fn tty_command(&self, script: &str) -> std::process::Command {
        self.f.command(
            &[
                "--resolve",
                "unlisted.test=127.0.0.1",
                "--allow-private",
                "127.0.0.0/8",
                "--ask",
                "tty",
            ],
            script,
        )
    }

    fn curl(&self) -> String {
        format!(
            "curl -s -o /dev/null -w '%{{http_code}} %header{{x-airlock-reason}}\\n' {}",
            self.url()
        )
    }
}

fn codes(out: &Out) -> Vec<String> {
    out.stdout
        .lines()
        .filter_map(|l| l.split(' ').next())
        .map(str::to_string)
        .collect()
}

#[test]
fn allow_once_asks_every_time() {
    let s = setup();
    let c = Client::start(s.sock.clone(), Some("allow-once"), Duration::ZERO, vec![]);
    let out = s.run(&[], &format!("{c}; {c}", c = s.curl()));
    assert_eq!(codes(&out), ["200", "200"], "{}{}", out.stdout, out.stderr);
    assert_eq!(c.count("ask"), 2);
}

#[test]
fn allow_session_asks_once_per_run() {
    let s = setup();
    let c = Client::start(
        s.sock.clone(),
        Some("allow-session"),
        Duration::ZERO,
        vec![],
    );
    let report = s.f.home.join("report.json");
    let out = s.run(
        &["--report", report.to_str().unwrap()],
        &format!("{c}; {c}; {c}", c = s.curl()),
    );
    assert_eq!(
        codes(&out),
        ["200", "200", "200"],
        "{}{}",
        out.stdout,
        out.stderr
    );
    assert_eq!(c.count("ask"), 1);
    let rep: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(rep["approvals"][0]["answer"], "allow-session", "{rep}");
    assert_eq!(rep["approvals"][0]["host"], "unlisted.test");
    // Who answered: the socket client's uid and pid (SO_PEERCRED).
    let by = rep["approvals"][0]["by"].as_str().unwrap_or_default();
    assert!(
        by.starts_with(&format!("uid={} pid=", unsafe { libc::geteuid() })),
        "{rep}"
    );
}

#[test]
fn allow_always_persists_into_the_user_policy() {
    let s = setup();
    let policy = s.f.home.join(".config/airlock/policy.toml");
    std::fs::create_dir_all(policy.parent().unwrap()).unwrap();
    std::fs::write(
        &policy,
        "# my own notes\n[network]\nallow = []  # keep this comment\n",
    )
    .unwrap();
    let c = Client::start(s.sock.clone(), Some("allow-always"), Duration::ZERO, vec![]);
    let out = s.run(&[], &s.curl());
    assert_eq!(codes(&out), ["200"], "{}{}", out.stdout, out.stderr);
    assert_eq!(c.count("ask"), 1);
    let text = std::fs::read_to_string(&policy).unwrap();
    assert!(
        text.contains(&format!("\"unlisted.test:{}\"", s.origin.port())),
        "{text}"
    );
    assert!(
        text.contains("# my own notes") && text.contains("# keep this comment"),
        "{text}"
    );
    // A second run needs no question at all.
    let again = s.f.run(
        &[
            "--resolve",
            "unlisted.test=127.0.0.1",
            "--allow-private",
            "127.0.0.0/8",
            "--ask",
            "deny",
        ],
        &s.curl(),
    );
    assert_eq!(codes(&again), ["200"], "{}{}", again.stdout, again.stderr);
}

#[test]
fn deny_is_approval_denied() {
    let s = setup();
    let _c = Client::start(s.sock.clone(), Some("deny"), Duration::ZERO, vec![]);
    let out = s.run(&[], &s.curl());
    assert!(
        out.stdout.starts_with("403"),
        "{}{}",
        out.stdout,
        out.stderr
    );
    assert!(out.stdout.contains("approval-denied"), "{}", out.stdout);
    assert_eq!(s.origin.hits(), 0);
}

#[test]
fn no_answer_is_approval_timeout() {
    let s = setup();
    let policy =
        s.f.write("~/timeout.toml", "[network]\nask_timeout = \"1s\"\n");
    let c = Client::start(s.sock.clone(), None, Duration::ZERO, vec![]);
    let t = Instant::now();
    let out = s.run(&["-p", policy.to_str().unwrap()], &s.curl());
    assert!(
        out.stdout.starts_with("403") && out.stdout.contains("approval-timeout"),
        "{}{}",
        out.stdout,
        out.stderr
    );
    assert!(t.elapsed() < Duration::from_secs(8));
    assert_eq!(c.count("ask"), 1);
    assert_eq!(s.origin.hits(), 0);
}

#[test]
fn parallel_requests_share_one_question() {
    let s = setup();
    let c = Client::start(
        s.sock.clone(),
        Some("allow-once"),
        Duration::from_millis(700),
        vec![],
    );
    let out = s.run(&[], &format!("{c} & {c} & wait", c = s.curl()));
    assert_eq!(codes(&out), ["200", "200"], "{}{}", out.stdout, out.stderr);
    assert_eq!(
        c.count("ask"),
        1,
        "two parallel requests must cause one question"
    );
}

#[test]
fn a_malformed_client_breaks_nothing() {
    let s = setup();
    let noise = vec![
        "not json".to_string(),
        "{\"type\":\"answer\",\"id\":\"999\",\"verdict\":\"allow-once\"}".to_string(),
        "{\"type\":\"answer\",\"id\":\"1\",\"verdict\":\"maybe\"}".to_string(),
        "{\"type\":\"hello\"}".to_string(),
        "[1,2,3]".to_string(),
    ];
    let c = Client::start(
        s.sock.clone(),
        Some("allow-once"),
        Duration::from_millis(100),
        noise,
    );
    let out = s.run(&[], &format!("sleep 0.3; {}", s.curl()));
    assert_eq!(codes(&out), ["200"], "{}{}", out.stdout, out.stderr);
    assert!(c.errors().len() >= 4, "{:?}", c.errors());
}

#[test]
fn socket_is_private_and_removed_after_the_run() {
    let s = setup();
    let sock = s.sock.clone();
    let checker = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(m) = std::fs::metadata(&sock) {
                use std::os::unix::fs::PermissionsExt;
                return Some(m.permissions().mode() & 0o777);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    });
    let out = s.run(&[], "sleep 0.5");
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(checker.join().unwrap(), Some(0o600));
    assert!(!s.sock.exists());
}

#[test]
fn tty_prompt_takes_the_terminal_and_gives_it_back() {
    let s = setup();
    let script = format!(
        "code=$(curl -s -o /dev/null -w '%{{http_code}}' {url}); echo \"status=$code\"; printf 'name? '; read name; echo \"hello $name\"",
        url = s.url()
    );
    let (mut child, mut keys, screen) = on_pty(s.tty_command(&script));
    assert!(
        screen.wait_for("Allow? [o]nce [s]ession [a]lways [d]eny"),
        "no prompt:\n{}",
        screen.text()
    );
    keys.write_all(b"s").unwrap();
    assert!(
        screen.wait_for("status=200"),
        "not allowed:\n{}",
        screen.text()
    );
    assert!(screen.wait_for("name? "), "{}", screen.text());
    // The terminal is the sandboxed job's again: it reads this line.
    keys.write_all(b"world\n").unwrap();
    assert!(
        screen.wait_for("hello world"),
        "terminal not handed back:\n{}",
        screen.text()
    );
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{}", screen.text());
}

#[test]
fn tty_prompt_works_over_a_full_screen_program() {
    let s = setup();
    let page = s.f.write("page.txt", &"a line of the pager\n".repeat(200));
    // less owns the terminal (raw mode, alternate screen) when the question
    // comes; the answer must go to airlock, the next key back to less.
    let script = format!(
        "(sleep 0.5; curl -s -o /dev/null -w '%{{http_code}}' {url} > status.txt) & less {page}; wait; echo; echo after-less; cat status.txt",
        url = s.url(),
        page = page.display()
    );
    let (mut child, mut keys, screen) = on_pty(s.tty_command(&script));
    assert!(
        screen.wait_for("a line of the pager"),
        "less did not start:\n{}",
        screen.text()
    );
    assert!(
        screen.wait_for("Allow? [o]nce"),
        "no prompt over less:\n{}",
        screen.text()
    );
    keys.write_all(b"o").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // Back to less: `q` quits it.
    keys.write_all(b"q").unwrap();
    assert!(
        screen.wait_for("after-less"),
        "less did not get its key back:\n{}",
        screen.text()
    );
    assert!(
        screen.wait_for("200"),
        "the request was not allowed:\n{}",
        screen.text()
    );
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

#[test]
fn interactive_bash_works_on_a_terminal() {
    // `airlock run -- bash` on a real terminal: job control inside, ^C
    // reaches the sandboxed job and not airlock, and the exit code comes back.
    let s = setup();
    let (mut child, mut keys, screen) = on_pty(s.f.command_argv(
        &["--network", "none"],
        &["bash", "--norc", "--noprofile", "-i"],
    ));
    std::thread::sleep(Duration::from_millis(500));
    keys.write_all(b"echo answer-$((6*7))\n").unwrap();
    assert!(screen.wait_for("answer-42"), "{}", screen.text());
    keys.write_all(b"sleep 30\n").unwrap();
    std::thread::sleep(Duration::from_millis(400));
    keys.write_all(b"\x03").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    keys.write_all(b"echo still-$((1+1))\n").unwrap();
    assert!(
        screen.wait_for("still-2"),
        "^C took more than the job:\n{}",
        screen.text()
    );
    keys.write_all(b"exit 3\n").unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(3), "{}", screen.text());
}
