//! airlock's egress proxy (SPEC §5): CONNECT and absolute-form HTTP/1.1 on
//! hyper, SOCKS5 on the same port, a policy decision and address check
//! before every dial, and the audit log. It takes an already-bound
//! listener and knows nothing of namespaces.

pub mod approve;
mod count;
pub mod dns;
pub mod engine;
pub mod escape;
pub mod hold;
pub mod http;
pub mod identity;
pub mod inspect;
pub mod lend;
pub mod metrics;
pub mod parent;
pub mod refusal;
mod resolve;
pub mod rules;
pub mod serve;
pub mod sni;
pub mod socks;
#[cfg(target_os = "linux")]
mod splice;
#[cfg(target_os = "linux")]
pub mod transparent;
pub mod tunnel;

/// The audit log moved to `airlock-audit`; these keep the old paths.
pub use airlock_audit::{safe_file, AuditLog};
pub use approve::{Answer, AnswerFuture, Approver, CredentialWrite, DenyApprover, Question};
pub use engine::{
    Approval, Blocked, Engine, EngineConfig, Lend, Protocol, UpstreamFailure, TALLY_CAP,
};
pub use hold::{HeldRequest, Holder, Receipt, Replayed};
pub use identity::{Client, ClientIdentity, SourceAddressOnly};
pub use lend::LendTo;
pub use parent::UpstreamProxy;
pub use serve::serve;
