//! How text from outside reaches a terminal or a report: control and
//! invisible formatting characters escaped, so a name a sandbox chose
//! cannot rewrite what the user reads.

use std::path::Path;

/// A path for a message: control characters escaped, so a name the sandbox
/// chose cannot rewrite the terminal.
pub fn shown(p: &Path) -> String {
    escape(&p.display().to_string())
}

/// Escape control characters and the invisible formatting ones that can
/// reorder or hide text (one rule everywhere: the proxy's).
pub fn escape(s: &str) -> String {
    airlock_proxy::escape::line(s, 4096)
}
