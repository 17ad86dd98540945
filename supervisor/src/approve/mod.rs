//! Approval front ends (SPEC §5.2): the terminal, a unix socket for IDEs
//! and harnesses, or none. The proxy engine shares one question among
//! concurrent askers and applies the timeout; these only ask.

pub mod client;
pub mod persist;
#[cfg(target_os = "linux")]
pub mod sandbox;
#[cfg(not(target_os = "linux"))]
#[path = "sandbox_other.rs"]
pub mod sandbox;
pub mod socket;
pub mod tty;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Where a question nobody can hear yet is said while the command waits
/// (harness round 12: twenty seconds of silence): the supervisor's stderr
/// (a one-shot run's is the caller's), unless a session sets where its
/// running commands' stderr is.
type Notifier = Box<dyn Fn(&str) + Send + Sync>;
static NOTIFIER: std::sync::OnceLock<Notifier> = std::sync::OnceLock::new();

/// Questions announced at most in a minute; the rest are said once (a
/// sandbox asking about 300 hosts made 300 lines: red team round 15).
const NOTIFY_CAP: u64 = 10;
static NOTIFIED: std::sync::Mutex<Option<(u64, std::time::Instant)>> = std::sync::Mutex::new(None);

/// Say `line` to whoever waits on a question now.
pub fn notify(line: &str) {
    let n = {
        let mut g = NOTIFIED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = std::time::Instant::now();
        let (count, since) = g.get_or_insert((0, now));
        if now.duration_since(*since) > Duration::from_secs(60) {
            (*count, *since) = (0, now);
        }
        *count += 1;
        *count - 1
    };
    let line = match n {
        n if n < NOTIFY_CAP => line.to_string(),
        NOTIFY_CAP => format!(
            "airlock: more questions wait for an answer; past {NOTIFY_CAP}, they are not announced here (the report lists what was refused)"
        ),
        _ => return,
    };
    match NOTIFIER.get() {
        Some(f) => f(&line),
        None => eprintln!("{line}"),
    }
}

/// Where [`notify`] says it (a session's commands), once a process.
pub fn set_notifier(f: Notifier) {
    let _ = NOTIFIER.set(f);
}

use airlock_policy::Target;
use airlock_proxy::{Answer, Approver, DenyApprover};
use anyhow::{bail, Result};

/// Where `allow-always` answers are written: the user policy's directory,
/// opened before the sandbox starts.
#[derive(Clone)]
pub struct Persist {
    pub user_policy: Option<Arc<persist::PolicyFile>>,
}

impl Persist {
    pub fn new(path: Option<PathBuf>) -> Persist {
        let user_policy = path.and_then(|p| match persist::PolicyFile::open(&p) {
            Ok(f) => Some(Arc::new(f)),
            Err(e) => {
                eprintln!("airlock: allow-always answers cannot be saved: {e:#}");
                None
            }
        });
        Persist { user_policy }
    }

    pub fn apply(&self, target: &Target, answer: Answer, by: &str) {
        if answer != Answer::AllowAlways {
            return;
        }
        match &self.user_policy {
            Some(file) => match persist::allow_always_in(file, target) {
                Ok(()) => tracing::info!(
                    "{by} allowed {target} always: added to {}",
                    file.path().display()
                ),
                Err(e) => eprintln!("airlock: could not save the allow-always answer: {e:#}"),
            },
            None => eprintln!(
                "airlock: no usable user policy file; {target} is allowed for this session only"
            ),
        }
    }
}

/// `approver_for` inside `runtime` (the socket approver binds a listener there).
pub fn approver_in(
    runtime: &tokio::runtime::Runtime,
    ask: Option<&str>,
    policy: &airlock_policy::Policy,
) -> Result<Arc<dyn Approver>> {
    let _in_runtime = runtime.enter();
    approver_for(ask, policy.asks(), policy.ask_timeout)
}

/// The approver for `--ask MODE`; the default is the terminal when stdin is
/// one, otherwise deny. Must be called inside the tokio runtime.
pub fn approver_for(
    ask: Option<&str>,
    policy_asks: bool,
    timeout: Duration,
) -> Result<Arc<dyn Approver>> {
    if !policy_asks {
        // unknown = "deny" (or the managed policy turned asking off).
        return Ok(Arc::new(DenyApprover));
    }
    let default = if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        "tty"
    } else {
        "deny"
    };
    let persist = || Persist::new(crate::places::user_policy_path());
    match ask.unwrap_or(default) {
        "deny" => Ok(Arc::new(DenyApprover)),
        "tty" => match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/tty")
        {
            Ok(_) => Ok(Arc::new(tty::TtyApprover::new(timeout, persist()))),
            Err(e) => {
                // Said plainly, not only at -v: nobody will be asked.
                eprintln!("airlock: --ask tty: no terminal to ask on ({e}); unknown hosts are refused (not-allowlisted)");
                Ok(Arc::new(DenyApprover))
            }
        },
        s if s.starts_with("socket:") => {
            let path = PathBuf::from(&s["socket:".len()..]);
            Ok(socket::SocketApprover::bind(&path, persist())?)
        }
        other => bail!("--ask {other}: expected tty, deny or socket:PATH"),
    }
}
