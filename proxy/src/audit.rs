//! The audit log (SPEC §6): JSON Lines, appended and flushed per event.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::time::SystemTime;

use serde_json::{json, Map, Value};

use crate::safe_file::{self, Mode, SafeFileError};

pub struct AuditLog {
    file: Mutex<File>,
    run: String,
}

#[derive(Debug, thiserror::Error)]
#[error("cannot open the audit log: {0}")]
pub struct AuditError(#[from] SafeFileError);

/// A protected path the sandbox created or changed (SPEC §4.5, §7).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ProtectedChange {
    pub path: String,
    /// `created`, `modified` or `removed`.
    pub change: String,
    /// `quarantined`, `restored` or `reported`.
    pub action: String,
    /// Where a quarantined copy went.
    pub dest: Option<String>,
}

impl AuditLog {
    /// Open for appending, without following a link planted at `path`
    /// (SPEC §3.5); call before the sandbox starts.
    pub fn open(path: &Path, run: &str) -> Result<AuditLog, AuditError> {
        let file = safe_file::open(path, Mode::Append, 0o600)?;
        Ok(AuditLog {
            file: Mutex::new(file),
            run: run.to_string(),
        })
    }

    /// The `run` event, the first line of a run (SPEC §6): `fields` holds
    /// the version, command, cwd, user, tier and policy files.
    pub fn begin(&self, fields: Value) {
        self.event("run", 0, fields);
    }

    /// The `end` event, the last line of a run.
    pub fn end(&self, exit_code: i32, duration_ms: u64) {
        self.event(
            "end",
            0,
            json!({"exit_code": exit_code, "duration_ms": duration_ms}),
        );
    }

    /// A `protected` event: `change` is created|modified|removed, `action`
    /// quarantined|restored|reported, `dest` where a quarantined copy went.
    pub fn protected(&self, path: &str, change: &str, action: &str, dest: Option<&str>) {
        self.event(
            "protected",
            0,
            json!({"path": path, "change": change, "action": action, "dest": dest}),
        );
    }

    /// Write one event. `fields` must be a JSON object; the common fields
    /// are added here.
    pub fn event(&self, event: &str, conn: u64, fields: Value) {
        let mut obj = Map::new();
        obj.insert(
            "ts".into(),
            json!(humantime::format_rfc3339_millis(SystemTime::now()).to_string()),
        );
        obj.insert("event".into(), json!(event));
        obj.insert("conn".into(), json!(conn));
        obj.insert("run".into(), json!(self.run));
        if let Value::Object(extra) = fields {
            obj.extend(extra);
        }
        let mut line = Value::Object(obj).to_string();
        line.push('\n');
        // One write per event on an O_APPEND file: lines from concurrent
        // connections never interleave.
        let mut f = match self.file.lock() {
            Ok(f) => f,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Err(e) = f.write_all(line.as_bytes()) {
            tracing::error!("audit log write failed: {e}");
        }
    }
}
