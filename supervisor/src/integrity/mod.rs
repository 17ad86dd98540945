//! The host is unchanged where it matters (SPEC §4.5): the protected set,
//! its snapshot before a run, and the post-run check that quarantines or
//! restores whatever the sandbox created or changed in it.

pub mod nested;
pub mod quarantine;
pub mod set;
pub mod snapshot;
#[cfg(target_os = "linux")]
pub mod watch;

pub use quarantine::Outcome;
pub use set::Protected;
