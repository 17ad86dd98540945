//! The session's supervisor while it serves (SPEC §4.7): it accepts
//! commands on the session's socket from this user's processes outside
//! every sandbox, hands each to the sandbox's PID 1 with stdio that ends
//! with the command (`relay.rs`), and answers with its exit status, what
//! the proxy refused for it and what the check found when it ended.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;

use airlock_proxy::{Blocked, Engine, UpstreamFailure};
use anyhow::{Context, Result};
use serde_json::{json, Value};

use crate::plan::Plan;
use crate::seqpacket::Seq;

/// Set on the re-executed `session start`: the descriptor on which it says
/// it serves (or closes without a word when it could not start).
pub const SERVE_ENV: &str = "AIRLOCK_SESSION_SERVE";

/// The session's socket, bound before the sandbox is built (a name in use
/// is refused before anything starts).
pub struct Listening {
    fd: OwnedFd,
    name: String,
    socket: PathBuf,
    meta: PathBuf,
    ready: Option<std::fs::File>,
}

impl Drop for Listening {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.socket);
        let _ = std::fs::remove_file(&self.meta);
        // Why it is gone, for the next command sent to it: "no session
        // named" read as a misspelt name to a harness whose session had
        // stopped (red team round 17).
        let why = lock(&END_REASON)
            .clone()
            .unwrap_or_else(|| match LOG.get() {
                Some(l) => format!(
                    "its sandbox was stopped (why is in its log, {})",
                    crate::text::shown(l)
                ),
                None => "its sandbox was stopped".into(),
            });
        let _ = std::fs::write(self.socket.with_extension("ended"), why);
    }
}

/// Why the session ends, when a client asked it to.
static END_REASON: Mutex<Option<String>> = Mutex::new(None);

/// Bind session `name`'s socket (replacing a stale one nobody serves).
pub fn bind(name: &str) -> Result<Listening> {
    use nix::sys::socket::{bind, listen, socket, AddressFamily, Backlog, SockFlag, SockType};
    super::check_name(name)?;
    let dir = super::dir()?;
    let path = super::socket_path(&dir, name);
    if super::connect(name).is_ok() {
        anyhow::bail!("a session named {name:?} is already running");
    }
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(path.with_extension("ended"));
    let fd = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .context("socket")?;
    let addr = nix::sys::socket::UnixAddr::new(&path).context("the session's socket path")?;
    bind(fd.as_raw_fd(), &addr).with_context(|| format!("binding {}", path.display()))?;
    listen(&fd, Backlog::new(64).unwrap_or(Backlog::MAXCONN)).context("listen")?;
    let ready = std::env::var(SERVE_ENV)
        .ok()
        .and_then(|f| f.parse::<i32>().ok())
        .filter(|f| *f > 2)
        // SAFETY: `session start` passed us this descriptor for this.
        .map(|f| unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(f) });
    Ok(Listening {
        fd,
        name: name.to_string(),
        socket: path,
        meta: super::meta_path(&dir, name),
        ready,
    })
}

/// What each command's environment is built from (SPEC §4.3): the
/// caller's, filtered by the session's policy, then what airlock sets.
pub struct EnvRecipe {
    /// The session's filter (`None`: nothing passes but what airlock sets).
    pub rule: Option<crate::env::Rule>,
    /// What the sandbox's environment holds that no caller's does: the
    /// proxy and CA variables, the presets' settings.
    pub overlay: BTreeMap<String, String>,
    /// The last caller's environment and what the filter made of it: a
    /// harness sends the same one with every command, and filtering it
    /// (a glob per name and pattern) was a good part of a command's cost.
    pub last: Mutex<Option<FilteredEnv>>,
}

/// The caller's environment, and what the filter made of it: the
/// command's variables, the warnings, the names withheld.
type FilteredEnv = (
    Vec<(String, String)>,
    (BTreeMap<String, String>, Vec<String>, Vec<String>),
);

impl EnvRecipe {
    /// The command's environment, the warnings the filter had, and the
    /// names it withheld (for the command's report, SPEC §7).
    fn for_command(
        &self,
        caller: Vec<(String, String)>,
        cwd: &Path,
    ) -> (BTreeMap<String, String>, Vec<String>, Vec<String>) {
        let mut last = lock(&self.last);
        let (mut env, warnings, withheld) = match last.as_ref() {
            Some((seen, filtered)) if *seen == caller => filtered.clone(),
            _ => {
                let filtered = match &self.rule {
                    Some(r) => {
                        let s = r.apply(caller.clone());
                        (s.env, s.warnings, s.withheld)
                    }
                    None => (BTreeMap::new(), vec![], vec![]),
                };
                *last = Some((caller, filtered.clone()));
                filtered
            }
        };
        drop(last);
        env.extend(self.overlay.clone());
        env.insert("PWD".into(), cwd.display().to_string());
        (env, warnings, withheld)
    }
}

/// What the serving threads share.
pub struct Setup<'a> {
    /// Readable when something changed in the writable roots: between
    /// commands, what a process left running plants is judged then, not
    /// only when the next command ends.
    pub activity: Option<std::os::fd::RawFd>,
    pub engine: &'a Engine,
    pub plan: &'a Plan,
    pub env: EnvRecipe,
    pub workspace: &'a Path,
    pub tier: &'static str,
    pub run: &'a str,
    /// Whether anything in the roots may have changed since the last
    /// check: when not, a command that changed nothing costs no check.
    pub changed: &'a (dyn Fn() -> bool + Sync),
    /// The post-run check of one command: what it planted, judged when it
    /// ends (SPEC §4.7), with the sandbox held still meanwhile.
    /// With the roots it could not fully search (the command then fails:
    /// what lies there was not judged).
    pub check: &'a (dyn Fn() -> (Vec<crate::integrity::Outcome>, Vec<String>) + Sync),
    /// The changeset every command's file changes are held in
    /// (`session start --review`), released once the session has ended.
    pub review: Option<String>,
}

/// The request that ended the session: its stderr, where the end's
/// findings go, the report file, and the socket to answer on once done.
pub struct Ended {
    pub stderr: Option<OwnedFd>,
    pub report: Option<OwnedFd>,
    pub reply: Option<Seq>,
}

enum Event {
    Init(Value),
    Client(Value),
    ClientGone,
}

/// Where PID 1's words about a command go: its channel, and a pipe that
/// wakes the thread serving it (which also waits on its client's socket).
struct Route {
    tx: mpsc::Sender<Event>,
    wake: Option<Arc<OwnedFd>>,
}

type Routes = Mutex<HashMap<u64, Route>>;

/// Serve until a client asks the session to end (or PID 1 goes away).
/// The session's log, where its supervisor says why it stopped the
/// sandbox (a hidden file replaced on the host, a setup error): a command
/// cut short is pointed there.
static LOG: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// The last caller environment's logins the session does not hide.
type Unhidden = (Vec<(String, String)>, Vec<String>);
static UNHIDDEN_LAST: Mutex<Option<Unhidden>> = Mutex::new(None);

/// The filesystem refusals counted when the last command ended: what
/// grew while no command ran is the between-commands share.
static FS_SEEN: Mutex<Vec<crate::refusal::FsRefusal>> = Mutex::new(Vec::new());

/// Whether a command of this session was told which hidden directories
/// exist (`Summary::hidden_dirs`): once a session.
static HIDDEN_SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether the session's first command was told what `session start` said
/// of the `.env` search (its stderr is the session's log by then).
static START_NOTES_SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Commands running now, and started so far: whether one ran beside
/// another.
static RUNNING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static STARTED: AtomicU64 = AtomicU64::new(0);

/// The running commands' callers' stderr, for what they are told while
/// they run (`approve::notify`).
static STDERRS: Mutex<BTreeMap<u64, OwnedFd>> = Mutex::new(BTreeMap::new());

/// A command's entry in [`STDERRS`], removed when dropped.
struct Told(u64);

impl Drop for Told {
    fn drop(&mut self) {
        lock(&STDERRS).remove(&self.0);
    }
}

/// One command counted in [`RUNNING`] until dropped.
struct Running;

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.fetch_sub(1, Ordering::SeqCst);
    }
}

pub fn serve(listening: Listening, init: Seq, setup: &Setup) -> Result<Ended> {
    let mut listening = listening;
    // A question nobody can hear yet is said to every running command,
    // while it waits (each may be the one asking).
    crate::approve::set_notifier(Box::new(|line| {
        let fds: Vec<OwnedFd> = lock(&STDERRS)
            .values()
            .filter_map(|fd| fd.try_clone().ok())
            .collect();
        let line = line.to_string();
        // Off the proxy's thread: a caller that reads nothing must not
        // hold it up.
        let _ = std::thread::Builder::new()
            .name("notify".into())
            .spawn(move || {
                for fd in fds {
                    let end = match nix::unistd::isatty(&fd).unwrap_or(false) {
                        true => "\r\n",
                        false => "\n",
                    };
                    let _ = nix::unistd::write(&fd, format!("{line}{end}").as_bytes());
                }
            });
    }));
    let _ = LOG.set(listening.socket.with_extension("log"));
    let mut info = json!({
        "name": listening.name,
        "socket": listening.socket,
        "pid": std::process::id(),
    });
    if let Some(id) = &setup.review {
        info["review"] = json!(id);
    }
    let _ = crate::integrity::journal::make_dir();
    std::fs::write(
        &listening.meta,
        json!({"name": listening.name, "socket": listening.socket, "pid": std::process::id(),
               "workspace": setup.workspace, "run": setup.run})
        .to_string(),
    )
    .with_context(|| format!("writing {}", listening.meta.display()))?;
    if let Some(mut ready) = listening.ready.take() {
        use std::io::Write;
        let _ = ready.write_all(format!("{info}\n").as_bytes());
    }
    let routes: Routes = Mutex::new(HashMap::new());
    let ended: Mutex<Option<Ended>> = Mutex::new(None);
    let ids = AtomicU64::new(0);
    let checking = Mutex::new(());
    // Commands between their start and their check.
    let inflight = std::sync::atomic::AtomicUsize::new(0);
    // What checks between commands found, for the next command to say.
    let between: Mutex<Between> = Mutex::new(Between::default());
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (wake_r, wake_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("pipe")?;
    let init = Arc::new(init);
    let (work_tx, work_rx) = mpsc::channel::<OwnedFd>();
    let work_rx = Mutex::new(work_rx);
    let idle = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        // PID 1's words, each to the command it is about.
        {
            let (init, routes, wake_w) = (init.clone(), &routes, &wake_w);
            scope.spawn(move || {
                while let Ok(Some((msg, _))) = init.recv_json() {
                    let id = msg.get("id").and_then(Value::as_u64);
                    let route = id.and_then(|id| {
                        lock(routes)
                            .get(&id)
                            .map(|r| (r.tx.clone(), r.wake.clone()))
                    });
                    if let Some((tx, wake)) = route {
                        let _ = tx.send(Event::Init(msg));
                        if let Some(w) = wake {
                            let _ = nix::unistd::write(&*w, b"w");
                        }
                    }
                }
                // PID 1 is gone: nothing more can run.
                let _ = nix::unistd::write(wake_w, b"x");
            });
        }
        // Between commands: a change in the roots is judged at once (a
        // host IDE runs git all the time), with the sandbox held still.
        if let Some(fd) = setup.activity {
            let (init, routes, checking, inflight, between, stop) =
                (&init, &routes, &checking, &inflight, &between, &stop);
            scope.spawn(move || {
                // A check that cannot finish is said once until what it
                // says changes, and tried again only after a pause: it
                // stops the whole sandbox each time (red team round 6).
                let mut last_failed: Vec<String> = vec![];
                while !stop.load(Ordering::Relaxed) {
                    // A running command's own check judges what it does,
                    // and its events wait in the queue: polling it now
                    // returned at once, over and over, and took a whole
                    // core from the command (a `git status` in a session
                    // ran beside a busy loop).
                    if inflight.load(Ordering::SeqCst) > 0 {
                        std::thread::sleep(std::time::Duration::from_millis(20));
                        continue;
                    }
                    let mut p = libc::pollfd {
                        fd,
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    // SAFETY: poll on a descriptor the watch keeps open.
                    let event = unsafe { libc::poll(&mut p, 1, 200) } > 0;
                    if inflight.load(Ordering::SeqCst) > 0 {
                        continue;
                    }
                    // No event: the known repositories are still looked at
                    // (a write through a shared mapping raises none).
                    if !event && !(setup.changed)() {
                        continue;
                    }
                    // A burst of writes settles first.
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    let _one_at_a_time = lock(checking);
                    if inflight.load(Ordering::SeqCst) > 0 || stop.load(Ordering::Relaxed) {
                        continue;
                    }
                    let (found, failed) = held_still(init, routes, setup);
                    if failed != last_failed {
                        for f in &failed {
                            let line = format!("airlock: error: between commands: {f}; inspect them before running git there");
                            eprintln!("{line}");
                            let mut b = lock(between);
                            b.lines.push(line);
                            b.failed.push(f.clone());
                        }
                    }
                    if !failed.is_empty() {
                        std::thread::sleep(std::time::Duration::from_secs(2));
                    }
                    last_failed = failed;
                    for o in &found {
                        if let Some(log) = setup.engine.audit() {
                            log.protected(&o.path, o.change, &o.action, o.dest.as_deref());
                        }
                    }
                    for line in crate::integrity::quarantine::lines(&found) {
                        // Said by a process left running, after its command.
                        let line = match line.strip_prefix("airlock: ") {
                            Some(rest) => format!("airlock: between commands: {rest}"),
                            None => line,
                        };
                        eprintln!("{line}");
                        lock(between).lines.push(line);
                    }
                    lock(between).changes.extend(found);
                }
            });
        }
        loop {
            let mut fds = [
                libc::pollfd {
                    fd: listening.fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: wake_r.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: poll on descriptors we own.
            if unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) } < 0 {
                continue;
            }
            if fds[1].revents != 0 {
                break;
            }
            let Ok(conn) = nix::sys::socket::accept4(
                listening.fd.as_raw_fd(),
                nix::sys::socket::SockFlag::SOCK_CLOEXEC,
            ) else {
                continue;
            };
            // SAFETY: accept4 returned a new descriptor that we own.
            let conn: OwnedFd = unsafe { std::os::fd::FromRawFd::from_raw_fd(conn) };
            // A waiting worker takes it; when none waits, one more starts
            // (a thread started for every command was a good part of its
            // cost, and commands may run at once).
            // A worker is reserved for it here, not when it takes it: two
            // connections in a row must never wait for one worker.
            let reserved = idle
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if !reserved {
                let (init, routes, ended, ids, checking, wake_w, info, inflight, between) = (
                    &init, &routes, &ended, &ids, &checking, &wake_w, &info, &inflight, &between,
                );
                let (work, idle) = (&work_rx, &idle);
                scope.spawn(move || loop {
                    let next = lock(work).recv();
                    let Ok(conn) = next else { return };
                    serve_one(
                        conn, init, routes, ended, ids, checking, wake_w, info, inflight, between,
                        setup,
                    );
                    idle.fetch_add(1, Ordering::SeqCst);
                });
            }
            if work_tx.send(conn).is_err() {
                break;
            }
        }
        // Stop every command: PID 1 kills the whole sandbox; the commands
        // still waiting hear that the session ended; the idle workers go.
        drop(work_tx);
        stop.store(true, Ordering::Relaxed);
        let _ = init.send_json(&json!({"op": "end"}), &[]);
        lock(&routes).clear();
    });
    let ended = ended.into_inner().ok().flatten().unwrap_or(Ended {
        stderr: None,
        report: None,
        reply: None,
    });
    Ok(ended)
}

/// One client's request, on a worker.
#[allow(clippy::too_many_arguments)]
fn serve_one(
    conn: OwnedFd,
    init: &Arc<Seq>,
    routes: &Routes,
    ended: &Mutex<Option<Ended>>,
    ids: &AtomicU64,
    checking: &Mutex<()>,
    wake_w: &OwnedFd,
    info: &Value,
    inflight: &std::sync::atomic::AtomicUsize,
    between: &Mutex<Between>,
    setup: &Setup,
) {
    // Only this user's processes outside every sandbox.
    if let Err(e) = super::peer_outside(&conn) {
        tracing::warn!("refused a session client: {e:#}");
        return;
    }
    let conn = Arc::new(Seq(conn));
    let Ok(Some((req, fds))) = conn.recv_json() else {
        return;
    };
    match req.get("op").and_then(Value::as_str) {
        Some("info") => {
            let mut v = info.clone();
            v["workspace"] = json!(setup.workspace);
            v["commands"] = json!(ids.load(Ordering::Relaxed));
            let _ = conn.send_json(&v, &[]);
        }
        Some("run") => {
            let id = ids.fetch_add(1, Ordering::Relaxed) + 1;
            // What the sandbox refused while no command ran: a process an
            // earlier one left running (told with the plants, below).
            let idle = inflight.fetch_add(1, Ordering::SeqCst) == 0;
            let now = crate::linux::fsrefusals::refusals().0;
            let refused_between = match idle {
                true => grew(
                    &lock(&FS_SEEN),
                    &now,
                    |f| (f.path.clone(), f.op),
                    |f| f.count,
                    |f, n| crate::refusal::FsRefusal {
                        count: n,
                        ..f.clone()
                    },
                ),
                false => vec![],
            };
            let mut reply = run_command(id, &req, fds, &conn, init, routes, checking, setup);
            *lock(&FS_SEEN) = crate::linux::fsrefusals::refusals().0;
            inflight.fetch_sub(1, Ordering::SeqCst);
            let mut earlier = std::mem::take(&mut *lock(between));
            if let Some(line) = crate::report::filesystem_line(&refused_between, 0) {
                let line = for_session(&line);
                earlier.lines.push(match line.strip_prefix("airlock: ") {
                    Some(rest) => format!("airlock: between commands: {rest}"),
                    None => line,
                });
            }
            if !earlier.lines.is_empty() {
                if let Some(notes) = reply.get_mut("notes").and_then(Value::as_array_mut) {
                    for (i, l) in earlier.lines.into_iter().enumerate() {
                        notes.insert(i, json!(l));
                    }
                }
            }
            // In the report too, apart from this command's own: a process
            // an earlier command left running did it.
            if !earlier.changes.is_empty()
                || !earlier.failed.is_empty()
                || !refused_between.is_empty()
            {
                if let Some(r) = reply.get_mut("report").and_then(Value::as_object_mut) {
                    r.insert(
                        "between_commands".into(),
                        json!({
                            "protected_changes": earlier.changes,
                            "check_failed": earlier.failed,
                            "filesystem_refusals": refused_between,
                        }),
                    );
                }
            }
            let _ = conn.send_json(&reply, &[]);
            let _ =
                nix::sys::socket::shutdown(conn.0.as_raw_fd(), nix::sys::socket::Shutdown::Both);
        }
        Some("end") => {
            let mut fds = fds.into_iter();
            let stderr = fds.next();
            let report = match req.get("report").and_then(Value::as_bool) {
                Some(true) => fds.next(),
                _ => None,
            };
            *lock(&END_REASON) = Some("it was ended with `airlock session end`".into());
            if let Ok(mut e) = ended.lock() {
                if e.is_none() {
                    let reply = Arc::try_unwrap(conn).ok();
                    *e = Some(Ended {
                        stderr,
                        report,
                        reply,
                    });
                }
            }
            let _ = nix::unistd::write(wake_w, b"e");
        }
        _ => {
            let _ = conn.send_json(&json!({"type": "error", "message": "unknown request"}), &[]);
        }
    }
}

/// Advice as it applies inside a session: a flag that shapes the sandbox
/// is given to `airlock session start` (a new session), never to `run
/// --session`, which refuses it.
fn for_session(advice: &str) -> String {
    const FLAGS: [&str; 7] = [
        "--allow ",
        "--write ",
        "--read ",
        "--publish ",
        "--allow-private ",
        "--pass-env ",
        "--preset ",
    ];
    const WITH: &str = "start a session with ";
    const PASS: &str = "--pass-env NAME passes one";
    const PASS_SESSION: &str = "a session started with --pass-env NAME passes one";
    let advice = match advice.contains(PASS_SESSION) {
        true => advice.to_string(),
        false => advice.replace(PASS, PASS_SESSION),
    };
    let advice = advice.replace("a run with --preset ", "a session started with --preset ");
    let mut out = String::with_capacity(advice.len() + 64);
    let mut rest = advice.as_str();
    // Every flag that starts a word (at the start of the advice too: a
    // report's `how_to_allow` begins with one), once.
    while !rest.is_empty() {
        let word_start = out.is_empty() || out.ends_with([' ', '(', '"', '`', '\n']);
        if word_start && !out.ends_with(" with ") && FLAGS.iter().any(|f| rest.starts_with(f)) {
            out.push_str(WITH);
        }
        let Some(c) = rest.chars().next() else { break };
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What the checks between commands found (what a process left running
/// did), for the next command to say and report.
#[derive(Default)]
struct Between {
    lines: Vec<String>,
    changes: Vec<crate::integrity::Outcome>,
    failed: Vec<String>,
}

/// What a `run` request asks for.
#[derive(serde::Deserialize)]
struct RunRequest {
    argv: Vec<String>,
    cwd: PathBuf,
    env: Vec<(String, String)>,
}

/// One command, from request to answer.
#[allow(clippy::too_many_arguments)]
fn run_command(
    id: u64,
    req: &Value,
    stdio: Vec<OwnedFd>,
    conn: &Arc<Seq>,
    init: &Seq,
    routes: &Routes,
    checking: &Mutex<()>,
    setup: &Setup,
) -> Value {
    let started = Instant::now();
    let Ok(req) = serde_json::from_value::<RunRequest>(req.clone()) else {
        return json!({"type": "error", "code": 125, "message": "a malformed request"});
    };
    if req.argv.is_empty() || stdio.len() != 3 {
        return json!({"type": "error", "code": 125, "message": "a command and its stdin, stdout and stderr are needed"});
    }
    for (fd, name) in stdio.iter().zip(["stdin", "stdout", "stderr"]) {
        if let Some(why) = crate::paths::refused_stdio(fd.as_fd()) {
            return json!({"type": "error", "code": 125, "message": format!("the command's {name} is {why}; refused")});
        }
    }
    let mut notes = vec![];
    let cwd = match setup.plan.start_dir(&req.cwd) {
        Ok(dir) => dir,
        Err(why) => {
            return json!({"type": "error", "code": 125,
                "message": why.said(&setup.plan.cwd, "start a session with")});
        }
    };
    // Logins this command's environment moves (KUBECONFIG, ...) were hidden
    // where the session's starting environment put them, not here: said,
    // since the sandbox can read them (red team round 9).
    // Worked out once per caller environment (a harness sends the same one
    // with every command; the XDG variables alone name hundreds of paths).
    let unhidden: Vec<String> = {
        let mut last = lock(&UNHIDDEN_LAST);
        match last.as_ref() {
            Some((env, found)) if *env == req.env => found.clone(),
            _ => {
                let denied = crate::paths::Prefixes::new(&setup.plan.deny_read);
                let found: Vec<String> = airlock_policy::fragment::relocated_logins(&|k| {
                    req.env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
                })
                .into_iter()
                .filter(|p| !denied.covers(Path::new(p)))
                .filter(|p| Path::new(p).exists())
                .collect();
                *last = Some((req.env.clone(), found.clone()));
                found
            }
        }
    };
    if !unhidden.is_empty() {
        notes.push(format!(
            "airlock: warning: this command's environment names logins the session does not hide, and the sandbox can read them: {}; start the session with that environment to hide them",
            unhidden.join(", ")
        ));
    }
    let (env, warnings, withheld) = setup.env.for_command(req.env, &cwd);
    notes.extend(warnings.into_iter().map(|w| format!("airlock: {w}")));
    // Whether another command runs beside this one: what the proxy and the
    // filesystem refused meanwhile is counted for both (harness round 12:
    // the innocent one was told of the other's refusal as its own).
    let beside_at_start = RUNNING.fetch_add(1, Ordering::SeqCst) > 0;
    let running = Running;
    let started_before = STARTED.fetch_add(1, Ordering::SeqCst) + 1;
    let before = (
        setup.engine.blocked(),
        setup.engine.upstream_failures(),
        crate::linux::fsrefusals::refusals().0,
    );
    let (tx, rx) = mpsc::channel();
    let Ok((wake_r, wake_w)) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) else {
        return json!({"type": "error", "code": 125, "message": "out of descriptors"});
    };
    let wake_w = Arc::new(wake_w);
    // Keys typed at the caller's terminal that interrupt the command come
    // back as the caller's own signals would.
    let signaller: super::relay::Signaller = {
        let (tx, wake) = (Mutex::new(tx.clone()), Arc::clone(&wake_w));
        Box::new(move |sig| {
            let _ = lock(&tx).send(Event::Client(json!({"op": "signal", "sig": sig})));
            let _ = nix::unistd::write(&*wake, b"s");
        })
    };
    if let Ok(err) = stdio[2].try_clone() {
        lock(&STDERRS).insert(id, err);
    }
    let told = Told(id);
    let mut relay = match super::relay::Relay::new(stdio, id, LOG.get().cloned(), signaller) {
        Ok(r) => r,
        Err(e) => {
            return json!({"type": "error", "code": 125, "message": format!("the command's stdio could not be set up: {e}")});
        }
    };
    lock(routes).insert(
        id,
        Route {
            tx,
            wake: Some(wake_w),
        },
    );
    // PID 1's words come on `rx` (with a byte on `wake_r`); the caller's
    // later words (a signal to pass on, a kill on its timeout, or its
    // going away) on its socket: both are waited for here.
    let mut client_gone = false;
    let mut next_event = || -> Option<Event> {
        loop {
            if let Ok(e) = rx.try_recv() {
                return Some(e);
            }
            let mut fds = [
                libc::pollfd {
                    fd: wake_r.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: if client_gone { -1 } else { conn.0.as_raw_fd() },
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: poll on descriptors we own, in an array we own.
            if unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) } < 0 {
                continue;
            }
            if fds[0].revents != 0 {
                let mut buf = [0u8; 64];
                let _ = nix::unistd::read(&wake_r, &mut buf);
            }
            if fds[1].revents != 0 {
                match conn.recv_json() {
                    Ok(Some((v, _))) => return Some(Event::Client(v)),
                    _ => {
                        client_gone = true;
                        return Some(Event::ClientGone);
                    }
                }
            }
            if let Ok(e) = rx.try_recv() {
                return Some(e);
            }
            if fds[0].revents & (libc::POLLHUP | libc::POLLERR) != 0 {
                // The route is gone (the session ends): nothing more comes.
                return None;
            }
        }
    };
    let stdio = relay.take_command();
    let raw: Vec<i32> = stdio.iter().map(AsRawFd::as_raw_fd).collect();
    // No command starts while a check holds the sandbox still: it would
    // run unseen by it.
    let mut starting = Some(lock(checking));
    let spawn = json!({"op": "spawn", "id": id, "argv": req.argv, "env": env, "cwd": cwd});
    if let Err(e) = init.send_json(&spawn, &raw) {
        lock(routes).remove(&id);
        return json!({"type": "error", "code": 125, "message": format!("the session's sandbox is gone: {e}")});
    }
    drop(stdio);
    tracing::debug!(id, elapsed = ?started.elapsed(), "command sent to PID 1");
    let mut killed = false;
    let answer = loop {
        match next_event().ok_or(()) {
            Err(_) => {
                let why = LOG.get().map_or(String::new(), |l| {
                    format!("; why is in its log, {}", crate::text::shown(l))
                });
                break json!({"type": "error", "code": 125, "message": format!("the session's sandbox was stopped before the command ended{why}")});
            }
            Ok(Event::Init(msg)) => match msg.get("op").and_then(Value::as_str) {
                Some("started") => starting = None,
                Some("exec-error") => {
                    let m = msg.get("message").and_then(Value::as_str).unwrap_or("");
                    break json!({"type": "error", "code": 127,
                        "message": airlock_proxy::escape::line(m, 1000)});
                }
                Some("exit") => {
                    tracing::debug!(id, elapsed = ?started.elapsed(), "command exited");
                    let code = msg.get("code").and_then(Value::as_i64).unwrap_or(125);
                    break json!({"type": "exit", "code": code});
                }
                _ => {}
            },
            Ok(Event::Client(v)) => {
                let op = v.get("op").and_then(Value::as_str);
                if op == Some("kill") {
                    killed = true;
                    let _ = init.send_json(&json!({"op": "kill", "id": id}), &[]);
                } else if op == Some("signal") {
                    if v.get("sig").and_then(Value::as_i64) == Some(i64::from(libc::SIGWINCH)) {
                        relay.resize();
                    }
                    let _ = init
                        .send_json(&json!({"op": "signal", "id": id, "sig": v.get("sig")}), &[]);
                }
            }
            Ok(Event::ClientGone) => {
                // Nobody waits for it any more: it does not run on alone.
                let _ = init.send_json(&json!({"op": "kill", "id": id}), &[]);
            }
        }
    };
    drop(starting);
    lock(routes).remove(&id);
    let beside = beside_at_start || STARTED.load(Ordering::SeqCst) != started_before;
    drop(running);
    drop(told);
    let output_held = relay.finish();
    if output_held {
        notes.push(format!(
            "airlock: processes command {id} left running still hold its output; what they write from now on goes to the session's log{}",
            LOG.get().map_or(String::new(), |l| format!(", {}", crate::text::shown(l)))
        ));
    }
    // What this command planted, judged now that it ended (SPEC §4.7).
    let (changes, failed) = {
        let _one_at_a_time = lock(checking);
        held_still(init, routes, setup)
    };
    notes.extend(crate::integrity::quarantine::lines(&changes));
    // Fail closed, as a one-shot run does: the caller must not take this
    // command as clean while something it may have planted was not judged.
    for f in &failed {
        notes.push(format!(
            "airlock: error: {f}; inspect them before running git there"
        ));
    }
    for o in &changes {
        if let Some(log) = setup.engine.audit() {
            log.protected(&o.path, o.change, &o.action, o.dest.as_deref());
        }
    }
    tracing::debug!(id, elapsed = ?started.elapsed(), "command checked");
    let mut code = answer.get("code").and_then(Value::as_i64).unwrap_or(125);
    if !failed.is_empty() {
        code = 125;
    }
    // What the proxy refused, or could not reach, while it ran (with
    // commands running at once, theirs too: the proxy cannot tell them
    // apart by more than the process).
    let mut summary = crate::report::Summary::new(
        grew(
            &before.0,
            &setup.engine.blocked(),
            |b| (b.host.clone(), b.port, b.reason.clone()),
            |b| b.count,
            |b, n| Blocked {
                count: n,
                ..b.clone()
            },
        ),
        0,
        grew(
            &before.1,
            &setup.engine.upstream_failures(),
            |u| (u.host.clone(), u.port, u.reason.clone()),
            |u| u.count,
            |u, n| UpstreamFailure {
                count: n,
                ..u.clone()
            },
        ),
        0,
    );
    summary.filesystem = grew(
        &before.2,
        &crate::linux::fsrefusals::refusals().0,
        |f| (f.path.clone(), f.op),
        |f| f.count,
        |f, n| crate::refusal::FsRefusal {
            count: n,
            ..f.clone()
        },
    );
    // The names withheld from this command, as a one-shot run says them
    // (SPEC §4.3): a failing command may fail for want of one.
    summary.withheld_env = withheld.clone();
    summary.withheld_once = Some(setup.workspace.to_path_buf());
    summary.inherit_none =
        setup.engine.policy().env_inherit.value == airlock_policy::EnvInherit::None;
    // Said to the first failing command of the session (a new session is
    // a new model's context), not once an hour per workspace.
    if code != 0 {
        summary.hidden_named = setup.plan.hidden_named(&req.argv, &cwd);
    }
    if code != 0
        && summary.hidden_named.is_empty()
        && !HIDDEN_SAID.swap(true, std::sync::atomic::Ordering::Relaxed)
    {
        summary.hidden_dirs = setup.plan.hidden_dirs();
    }
    // The session was built when it started: advice that names a flag
    // says where it goes (`run --session` refuses what shapes the sandbox).
    for b in &mut summary.blocked {
        b.how_to_allow = for_session(&b.how_to_allow);
    }
    for f in &mut summary.filesystem {
        f.how_to_allow = for_session(&f.how_to_allow);
    }
    if let Some(block) = summary.stderr_block(code != 0) {
        notes.push(for_session(&block));
        let refused = !summary.blocked.is_empty()
            || !summary.filesystem.is_empty()
            || !summary.upstream.is_empty();
        if beside && refused {
            notes.push(
                "airlock: note: another command of this session ran at the same time: what is refused above may be its (each is counted for every command running then)"
                    .into(),
            );
        }
    }
    // What the session's start found about hidden `.env` files, said to
    // its first command: `session start` said it to a log nobody reads
    // (harness round 11: a `.env` past the search's bounds was read in
    // silence).
    if !START_NOTES_SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        if setup.plan.deny_read_env_truncated {
            notes.push(format!(
                "airlock: warning: .env files were looked for in the first {} directories of the writable roots when the \
                 session started (and where earlier runs found one); one further down that no run has found yet is \
                 readable: a person can name its directory in a policy's [filesystem] deny_read",
                crate::dotenv::MAX_DIRS
            ));
        }
        for f in &setup.plan.deny_read_env_in_git {
            notes.push(format!(
                "airlock: note: {} is hidden (it differs from what git holds), and git inside sees it emptied: \
                 a `git commit -a` would commit it empty; stage other files by name",
                crate::text::shown(f)
            ));
        }
    }
    // A question still open when the command ended (an approver that has
    // not answered, or nobody connected to the socket): said now, to the
    // command that asked; its refusal, when the answer or the timeout
    // comes, is counted after it (harness round 11: the command hung in
    // silence and the next one was told).
    let (asking, why) = setup.engine.asking();
    let waiting: Vec<String> = asking.iter().map(ToString::to_string).collect();
    if !waiting.is_empty() {
        let allow: Vec<String> = asking
            .iter()
            .map(|t| format!("--allow {}", t.host))
            .collect();
        notes.push(format!(
            "airlock: still waiting for an answer about {} ({}); the command ended first: run it again once it is answered, or start a session with {} to let it through without asking",
            waiting.join(", "),
            why.unwrap_or_else(|| "the approver has not answered yet".into()),
            allow.join(" "),
        ));
    }
    let blocked = &summary.blocked;
    let upstream = &summary.upstream;
    let report = json!({
        "run": setup.run,
        "command": id,
        "exit_code": code,
        "tier": setup.tier,
        "cwd": cwd,
        "duration_ms": started.elapsed().as_millis() as u64,
        "blocked": blocked,
        "upstream_failures": upstream,
        "filesystem_refusals": summary.filesystem,
        "protected_changes": changes,
        "check_failed": failed,
        "withheld_env": withheld,
        "killed": killed,
        "waiting_for_approval": waiting,
        "hidden_named": summary.hidden_named,
        "beside_another": beside,
        "output_left_running": output_held,
    });
    let mut answer = answer;
    if !failed.is_empty() {
        answer["code"] = json!(code);
    }
    answer["notes"] = json!(notes);
    answer["report"] = report;
    answer
}

/// The check, with every process of the sandbox stopped by its PID 1
/// meanwhile, and let go after. Call holding the check lock.
fn held_still(
    init: &Seq,
    routes: &Routes,
    setup: &Setup,
) -> (Vec<crate::integrity::Outcome>, Vec<String>) {
    // Nothing the sandbox can write changed: the protected set outside the
    // roots is read-only inside, and the roots are watched whole.
    if !(setup.changed)() {
        return (vec![], vec![]);
    }
    let (tx, rx) = mpsc::channel();
    lock(routes).insert(0, Route { tx, wake: None });
    let asked = init.send_json(&json!({"op": "freeze"}), &[]).is_ok();
    let frozen = asked
        && matches!(
            rx.recv_timeout(std::time::Duration::from_secs(5)),
            Ok(Event::Init(ref m)) if m.get("complete").and_then(Value::as_bool) == Some(true)
        );
    lock(routes).remove(&0);
    let t = Instant::now();
    if !frozen {
        tracing::warn!("the sandbox could not be held still for the check; checking anyway");
    }
    let changes = (setup.check)();
    tracing::debug!(took = ?t.elapsed(), "checked, held still");
    let _ = init.send_json(&json!({"op": "thaw"}), &[]);
    changes
}

/// What was counted since `before`: entries whose count grew, by the
/// amount.
fn grew<T, K: std::hash::Hash + Eq>(
    before: &[T],
    after: &[T],
    key: impl Fn(&T) -> K,
    count: impl Fn(&T) -> u64,
    with: impl Fn(&T, u64) -> T,
) -> Vec<T> {
    let old: HashMap<K, u64> = before.iter().map(|b| (key(b), count(b))).collect();
    after
        .iter()
        .filter_map(|b| {
            let n = count(b) - old.get(&key(b)).copied().unwrap_or(0).min(count(b));
            (n > 0).then(|| with(b, n))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::for_session;

    #[test]
    fn advice_names_where_a_sessions_flag_goes() {
        assert_eq!(
            for_session("--allow a.test or add \"a.test\" to [network].allow"),
            "start a session with --allow a.test or add \"a.test\" to [network].allow"
        );
        assert_eq!(
            for_session("outside: mkdir -p /x, then --write /x (or --read /y)"),
            "outside: mkdir -p /x, then start a session with --write /x (or start a session with --read /y)"
        );
        assert_eq!(
            for_session("withheld 1: K; --pass-env NAME passes one."),
            "withheld 1: K; a session started with --pass-env NAME passes one."
        );
        // Said once, not again on a second pass; a longer flag is not cut.
        let once = for_session("--allow-private or --allow x");
        assert_eq!(
            once,
            "start a session with --allow-private or start a session with --allow x"
        );
        assert_eq!(for_session(&once), once);
        assert_eq!(
            for_session("x is npm's own cache; a run with --preset npm gives npm one"),
            "x is npm's own cache; a session started with --preset npm gives npm one"
        );
        let pass = for_session("K; --pass-env NAME passes one.");
        assert_eq!(for_session(&pass), pass);
        assert_eq!(for_session("--allowance"), "--allowance");
    }
}
