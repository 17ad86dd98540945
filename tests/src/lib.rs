//! Helpers for airlock's end-to-end tests: they run the real binary
//! against origin servers on 127.0.0.1 and never reach another address.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The airlock binary under test: `$AIRLOCK_BIN`, or the one cargo built
/// next to this test executable (`cargo build --workspace` first).
pub fn airlock_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("AIRLOCK_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> or target/<profile>/<bench> -> target/<profile>/airlock
    let dir = exe.parent().expect("target directory");
    let bin = [
        dir.join("airlock"),
        dir.parent().map(|d| d.join("airlock")).unwrap_or_default(),
    ]
    .into_iter()
    .find(|p| p.exists())
    .unwrap_or_else(|| dir.join("airlock"));
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --workspace` before the tests",
        bin.display()
    );
    bin
}

/// A command for the airlock binary with a clean, predictable policy
/// environment: no user policy, and no managed policy unless a test sets one.
pub fn airlock(home: &Path) -> Command {
    let mut c = Command::new(airlock_bin());
    c.env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("XDG_DATA_HOME", home.join(".local/share"))
        .env(
            "AIRLOCK_MANAGED_POLICY",
            home.join("no-managed-policy.toml"),
        )
        .env_remove("AIRLOCK_LOG")
        .current_dir(home);
    c
}

pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

pub fn run(cmd: &mut Command) -> Out {
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().expect("spawn");
    Out {
        code: status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    }
}

/// Start `cmd` with its output piped, for [`output_of`].
pub fn spawn_piped(cmd: &mut Command) -> std::process::Child {
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn")
}

/// What a child started by [`spawn_piped`] printed, once it has exited.
pub fn output_of(child: std::process::Child) -> Out {
    let o = child.wait_with_output().expect("wait");
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// Wait up to 20 s for `p` to exist (a marker a sandboxed script writes).
pub fn wait_for_file(p: &Path) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !p.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "{} never appeared",
            p.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A home directory for one test, with an empty managed policy so the
/// host's /etc/airlock never leaks in.
pub struct Home {
    pub dir: tempfile::TempDir,
}

impl Home {
    pub fn new() -> Home {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("no-managed-policy.toml"), "").expect("write");
        Home { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(&p, text).expect("write");
        p
    }
}

impl Default for Home {
    fn default() -> Self {
        Home::new()
    }
}

/// `airlock proxy` on a free loopback port, killed on drop.
pub struct Proxy {
    pub child: Child,
    pub addr: SocketAddr,
    pub stderr: Arc<Mutex<String>>,
}

impl Proxy {
    pub fn start(home: &Home, args: &[&str]) -> Proxy {
        Proxy::start_with(airlock(home.path()), args)
    }

    pub fn start_with(mut cmd: Command, args: &[&str]) -> Proxy {
        let mut child = cmd
            .args(["-v", "proxy", "--listen", "127.0.0.1:0"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn airlock proxy");
        let mut lines = BufReader::new(child.stderr.take().expect("stderr"));
        let mut first = String::new();
        lines.read_line(&mut first).expect("read proxy stderr");
        let addr = first
            .trim()
            .strip_prefix("airlock proxy listening on ")
            .unwrap_or_else(|| panic!("unexpected proxy output: {first:?}"))
            .parse()
            .expect("listen address");
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = stderr.clone();
        std::thread::spawn(move || {
            for line in lines.lines().map_while(Result::ok) {
                let mut s = sink.lock().unwrap_or_else(|p| p.into_inner());
                s.push_str(&line);
                s.push('\n');
            }
        });
        Proxy {
            child,
            addr,
            stderr,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP origin on 127.0.0.1 that answers `<name> <METHOD> <path> host=<Host>`
/// and counts the connections it accepted.
pub struct Origin {
    pub addr: SocketAddr,
    pub hits: Arc<AtomicUsize>,
}

impl Origin {
    pub fn start(name: &'static str) -> Origin {
        Origin::start_on("127.0.0.1:0", name)
    }

    pub fn start_on(bind: &str, name: &'static str) -> Origin {
        let listener = TcpListener::bind(bind).expect("bind origin");
        let addr = listener.local_addr().expect("origin addr");
        let hits = Arc::new(AtomicUsize::new(0));
        let counter = hits.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().map_while(Result::ok) {
                counter.fetch_add(1, Ordering::SeqCst);
                std::thread::spawn(move || answer(stream, name));
            }
        });
        Origin { addr, hits }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

fn answer(mut stream: TcpStream, name: &str) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    serve_http(&mut stream, name);
}

/// Answer HTTP/1.1 requests on any stream until it closes: the body names
/// the origin, method, path, Host, Authorization and any request body.
pub fn serve_http<S: Read + Write>(stream: &mut S, name: &str) {
    loop {
        let Some(head) = read_head(stream) else {
            return;
        };
        let request = head.lines().next().unwrap_or("");
        let mut parts = request.split(' ');
        let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let field = |name: &str| {
            head.lines().skip(1).find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
            })
        };
        let host = field("host").unwrap_or_default();
        let auth = field("authorization")
            .map(|a| format!(" auth={a}"))
            .unwrap_or_default();
        let len: usize = field("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut received = vec![0u8; len.min(1 << 20)];
        if stream.read_exact(&mut received).is_err() {
            return;
        }
        let mut body = format!("{name} {method} {path} host={host}{auth}");
        if !received.is_empty() {
            body.push_str(&format!(" body={}", String::from_utf8_lossy(&received)));
        }
        let resp = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nContent-Type: text/plain\r\n\r\n{body}",
            body.len()
        );
        if stream.write_all(resp.as_bytes()).is_err() {
            return;
        }
    }
}

/// Read an HTTP head (through the blank line); `None` at EOF.
pub fn read_head<S: Read>(stream: &mut S) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return None,
        }
        if head.len() > 1 << 20 {
            return None;
        }
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}

/// A TCP listener that records the first bytes of each connection and
/// keeps connections open until told otherwise.
pub struct RawOrigin {
    pub addr: SocketAddr,
    pub received: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl RawOrigin {
    pub fn start() -> RawOrigin {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let received = Arc::new(Mutex::new(Vec::new()));
        let sink = received.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().map_while(Result::ok) {
                let sink = sink.clone();
                std::thread::spawn(move || {
                    let mut stream = stream;
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                    let mut buf = vec![0u8; 65536];
                    let n = stream.read(&mut buf).unwrap_or(0);
                    sink.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(buf[..n].to_vec());
                    // Hold the connection until the peer closes it.
                    let _ = stream.set_read_timeout(None);
                    while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
                });
            }
        });
        RawOrigin { addr, received }
    }

    pub fn received(&self) -> Vec<Vec<u8>> {
        self.received
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// curl through a proxy; returns (exit code, status code, headers+body).
pub fn curl(args: &[&str]) -> Out {
    run(Command::new("curl")
        .args(["-sS", "--max-time", "20", "--noproxy", "", "-i"])
        .args(args)
        .env_remove("http_proxy")
        .env_remove("https_proxy")
        .env_remove("HTTP_PROXY")
        .env_remove("HTTPS_PROXY")
        .env_remove("ALL_PROXY")
        .env_remove("all_proxy"))
}

/// The last status code in curl's `-i` output (CONNECT responses come first).
pub fn status_of(out: &Out) -> u16 {
    out.stdout
        .lines()
        .filter(|l| l.starts_with("HTTP/"))
        .filter_map(|l| l.split(' ').nth(1)?.parse().ok())
        .next_back()
        .unwrap_or(0)
}

pub fn header<'a>(out: &'a Out, name: &str) -> Option<&'a str> {
    out.stdout.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// Send raw bytes to the proxy and return what it answers before closing
/// (or within the timeout).
pub fn raw_exchange(proxy: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(proxy).expect("connect to proxy");
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = s.write_all(bytes);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    out
}

/// Status code of the first response line in raw bytes.
pub fn raw_status(bytes: &[u8]) -> u16 {
    String::from_utf8_lossy(bytes)
        .lines()
        .next()
        .and_then(|l| l.split(' ').nth(1)?.parse().ok())
        .unwrap_or(0)
}

/// Read the JSON Lines audit log.
pub fn audit_events(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Route a non-loopback address into a blackhole, so that a broken build
/// can never send it a packet. Returns false when that is not possible
/// (not root, no `ip`): the caller must then skip its test.
pub fn blackhole(addr: &str) -> bool {
    if !is_root() {
        return false;
    }
    let out = Command::new("ip")
        .args(["route", "replace", "blackhole", addr])
        .output();
    matches!(out, Ok(o) if o.status.success())
}

/// Raise this process's open-file limit to its hard limit (children inherit it).
pub fn raise_fd_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscalls on a valid, owned struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
    lim.rlim_cur
}

pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// A binary built next to the airlock binary (e.g. `airlock-probe`).
pub fn sibling_bin(name: &str) -> PathBuf {
    let bin = airlock_bin().with_file_name(name);
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --workspace`",
        bin.display()
    );
    bin
}

/// A sandbox test fixture: a fake HOME outside /tmp (so the private /tmp
/// can't be what hides it) and a workspace, each its own directory.
pub struct Fixture {
    pub home: PathBuf,
    pub ws: PathBuf,
    _dirs: Vec<tempfile::TempDir>,
}

impl Fixture {
    /// Both directories under `base` (the cargo target tmp dir, or /tmp).
    pub fn new_in(base: &Path) -> Fixture {
        std::fs::create_dir_all(base).expect("base dir");
        let home = tempfile::Builder::new()
            .prefix("home-")
            .tempdir_in(base)
            .expect("home");
        let ws = tempfile::Builder::new()
            .prefix("ws-")
            .tempdir_in(base)
            .expect("ws");
        std::fs::write(home.path().join("no-managed-policy.toml"), "").expect("managed");
        Fixture {
            home: home.path().to_path_buf(),
            ws: ws.path().to_path_buf(),
            _dirs: vec![home, ws],
        }
    }

    pub fn write(&self, rel: &str, text: &str) -> PathBuf {
        let p = if let Some(r) = rel.strip_prefix("~/") {
            self.home.join(r)
        } else {
            self.ws.join(rel)
        };
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(&p, text).expect("write");
        p
    }

    /// `airlock run [args] -- sh -c script`, in the workspace.
    pub fn command(&self, args: &[&str], script: &str) -> Command {
        self.command_argv(args, &["sh", "-c", script])
    }

    /// `airlock run [args] -- argv...`, in the workspace.
    pub fn command_argv(&self, args: &[&str], argv: &[&str]) -> Command {
        let mut c = Command::new(airlock_bin());
        c.env_clear()
            .env(
                "PATH",
                std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()),
            )
            .env("HOME", &self.home)
            .env("XDG_CONFIG_HOME", self.home.join(".config"))
            .env("XDG_DATA_HOME", self.home.join(".local/share"))
            .env(
                "AIRLOCK_MANAGED_POLICY",
                self.home.join("no-managed-policy.toml"),
            )
            .current_dir(&self.ws)
            .arg("run")
            .args(args)
            .arg("--")
            .args(argv)
            .stdin(Stdio::null());
        c
    }

    pub fn run(&self, args: &[&str], script: &str) -> Out {
        run(&mut self.command(args, script))
    }
}

pub mod githttp;
pub mod pty;
pub mod registry;
pub mod repos;
pub mod review;
pub mod squid;
pub mod tiers;
pub mod tls;
pub mod who;

/// `airlock-probe`, copied into `base` (outside /tmp) once per test
/// process, so the sandbox can run it even when the build directory is
/// under the sandbox's private /tmp.
pub fn probe_in(base: &Path) -> String {
    static COPY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    COPY.get_or_init(|| {
        let dir = base.join(format!("bin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("probe dir");
        let dest = dir.join("airlock-probe");
        std::fs::copy(sibling_bin("airlock-probe"), &dest).expect("copy probe");
        let _ = Command::new("chmod")
            .args(["-R", "a+rx"])
            .arg(base)
            .status();
        dest
    })
    .display()
    .to_string()
}

/// Whether any process on the machine has `text` in its command line.
pub fn process_running(text: &str) -> bool {
    std::fs::read_dir("/proc").is_ok_and(|dir| {
        dir.flatten().any(|e| {
            std::fs::read(e.path().join("cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(text))
        })
    })
}

/// The one project cache directory under a fixture's HOME
/// (`~/.cache/airlock/projects/<key>`): presets give each project its own
/// (SPEC §3.4), and a fresh HOME that ran one project has exactly one.
pub fn project_cache(home: &Path) -> PathBuf {
    let dir = home.join(".cache/airlock/projects");
    let found: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert_eq!(
        found.len(),
        1,
        "one project's caches in {}: {found:?}",
        dir.display()
    );
    found.into_iter().next().expect("one")
}
