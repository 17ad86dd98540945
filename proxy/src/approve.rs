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
