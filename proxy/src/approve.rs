//! The approval seam (SPEC §5.2): when no rule covers a target and
//! `unknown = "ask"`, the engine asks an `Approver`.

use std::future::Future;
use std::pin::Pin;

use airlock_policy::Target;

#[derive(Debug, Clone)]
pub struct Question {
    pub target: Target,
    /// The sandboxed command that asked, when known.
    pub command: Option<String>,
    /// Set when the question is not about the host (already allowed) but
    /// about lending a credential to a request beyond reads (SPEC §3.4).
    pub write: Option<CredentialWrite>,
}

/// A request that would carry a credential it is not lent to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CredentialWrite {
    pub method: String,
    pub url: String,
    /// Which credential: its header and where it came from, never its value.
    pub credential: String,
}

impl std::fmt::Display for CredentialWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} with the credential {}",
            self.method, self.url, self.credential
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    AllowOnce,
    AllowSession,
    AllowAlways,
    Deny,
    Timeout,
}

impl Answer {
    pub fn allows(self) -> bool {
        matches!(
            self,
            Answer::AllowOnce | Answer::AllowSession | Answer::AllowAlways
        )
    }

    /// `allow-always` read as `allow-session`: for what is never written
    /// into a policy (lending a credential to a write).
    pub fn session_at_most(self) -> Answer {
        match self {
            Answer::AllowAlways => Answer::AllowSession,
            a => a,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Answer::AllowOnce => "allow-once",
            Answer::AllowSession => "allow-session",
            Answer::AllowAlways => "allow-always",
            Answer::Deny => "deny",
            Answer::Timeout => "timeout",
        }
    }
}

pub type AnswerFuture<'a> = Pin<Box<dyn Future<Output = (Answer, String)> + Send + 'a>>;

pub trait Approver: Send + Sync {
    /// Ask about a target; returns the answer and who gave it.
    fn ask(&self, question: Question) -> AnswerFuture<'_>;

    /// False for an approver that never asks anyone: the engine then
    /// refuses unknown targets as `not-allowlisted` (SPEC §5.2).
    fn asks(&self) -> bool {
        true
    }

    /// The run is over: release what outlives it otherwise (a socket
    /// file). Called once nothing is asked any more, before the exit,
    /// which does not wait for the tasks that would drop it.
    fn close(&self) {}

    /// Why a question may go unanswered now (nobody is connected to an
    /// approval socket), for the command that asked; `None` when someone
    /// could answer.
    fn unheard(&self) -> Option<String> {
        None
    }

    /// Another request waits on a question already asked about `target`
    /// (the same host from a second command): said where the approver
    /// says what it asks, so that this command is not left in silence.
    fn also_waiting(&self, _target: &Target) {}
}

/// `--ask deny`, and what "ask" means when no approver is available.
pub struct DenyApprover;

impl Approver for DenyApprover {
    fn ask(&self, _: Question) -> AnswerFuture<'_> {
        Box::pin(async { (Answer::Deny, "no approver (--ask deny)".to_string()) })
    }

    fn asks(&self) -> bool {
        false
    }
}
