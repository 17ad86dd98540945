//! The audit log (SPEC §6): JSON Lines, appended and flushed per event.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::time::SystemTime;

use serde_json::{json, Map, Value};

pub struct AuditLog {
    file: Mutex<File>,
    run: String,
}

#[derive(Debug, thiserror::Error)]
#[error("cannot open the audit log {path}: {source}")]
pub struct AuditError {
    path: String,
    source: std::io::Error,
}

impl AuditLog {
    pub fn open(path: &Path, run: &str) -> Result<AuditLog, AuditError> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|source| AuditError {
                path: path.display().to_string(),
                source,
            })?;
        Ok(AuditLog {
            file: Mutex::new(file),
            run: run.to_string(),
        })
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
