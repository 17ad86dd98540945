//! What the sandbox stopped on the filesystem, as the report states it:
//! produced by the sandbox backend (Linux's `fsrefusals`), read by the
//! report. Below both, so neither imports the other's stage.

use serde::Serialize;

/// A write the command tried where the boundary refuses it: the path, the
/// operation, the rule, how often, and how to allow it or why it cannot be.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FsRefusal {
    pub path: String,
    /// write | create | mkdir | rename | link | chmod | read
    pub op: &'static str,
    /// outside-writable-roots | protected | deny_read
    pub rule: &'static str,
    pub count: u64,
    pub how_to_allow: String,
}
