//! Approval front ends (SPEC §5.2): the terminal, a unix socket for IDEs
//! and harnesses, or none. The proxy engine shares one question among
//! concurrent askers and applies the timeout; these only ask.

pub mod client;
pub mod persist;
pub mod socket;
pub mod tty;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use airlock_policy::Target;
use airlock_proxy::{Answer, Approver, DenyApprover};
use anyhow::{bail, Result};

/// Where `allow-always` answers are written.
#[derive(Clone)]
pub struct Persist {
    pub user_policy: Option<PathBuf>,
}

impl Persist {
    pub fn apply(&self, target: &Target, answer: Answer, by: &str) {
        if answer != Answer::AllowAlways {
            return;
        }
        match &self.user_policy {
            Some(path) => match persist::allow_always(path, target) {
                Ok(()) => tracing::info!("{by} allowed {target} always: added to {}", path.display()),
                Err(e) => eprintln!("airlock: could not save the allow-always answer: {e:#}"),
            },
            None => eprintln!("airlock: no user policy path (HOME unset); {target} is allowed for this session only"),
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
    let persist = Persist {
        user_policy: crate::sources::user_policy_path(),
    };
    if !policy_asks {
        // unknown = "deny" (or the managed policy turned asking off).
        return Ok(Arc::new(DenyApprover));
    }
    let default = if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        "tty"
    } else {
        "deny"
    };
    match ask.unwrap_or(default) {
        "deny" => Ok(Arc::new(DenyApprover)),
        "tty" => Ok(Arc::new(tty::TtyApprover::new(timeout, persist))),
        s if s.starts_with("socket:") => {
            let path = PathBuf::from(&s["socket:".len()..]);
            Ok(socket::SocketApprover::bind(&path, persist)?)
        }
        other => bail!("--ask {other}: expected tty, deny or socket:PATH"),
    }
}
