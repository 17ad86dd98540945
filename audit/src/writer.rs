//! The JSON Lines writer (SPEC §6): one object per line, appended and
//! flushed per event, to a file opened without following links. Sinks
//! (learn mode, the OTLP exporter) see every record as it is written.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use crate::safe_file::{self, Mode, SafeFileError};
use crate::schema::{End, Event, Protected, Record, Run};

/// Something else that wants every record: it must not block (the proxy
/// writes from its connection tasks).
pub trait Sink: Send + Sync {
    fn record(&self, record: &Record);
}

pub struct AuditLog {
    file: Option<Mutex<File>>,
    sinks: Vec<Arc<dyn Sink>>,
    run: String,
}

#[derive(Debug, thiserror::Error)]
#[error("cannot open the audit log: {0}")]
pub struct AuditError(#[from] SafeFileError);

/// The time stamp every line carries: RFC 3339, UTC, milliseconds.
pub fn now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

impl AuditLog {
    /// Open for appending, without following a link planted at `path`
    /// (SPEC §3.5); call before the sandbox starts.
    pub fn open(path: &Path, run: &str) -> Result<AuditLog, AuditError> {
        let file = safe_file::open(path, Mode::Append, 0o600)?;
        Ok(AuditLog {
            file: Some(Mutex::new(file)),
            sinks: vec![],
            run: run.to_string(),
        })
    }

    /// No file, only sinks (learn mode or OTLP without `--audit-log`).
    pub fn sinks_only(run: &str) -> AuditLog {
        AuditLog {
            file: None,
            sinks: vec![],
            run: run.to_string(),
        }
    }

    pub fn with_sink(mut self, sink: Arc<dyn Sink>) -> AuditLog {
        self.sinks.push(sink);
        self
    }

    pub fn run_id(&self) -> &str {
        &self.run
    }

    /// The `run` event, the first line of a run.
    pub fn begin(&self, run: Run) {
        self.write(0, Event::Run(run));
    }

    /// The `end` event, the last line of a run.
    pub fn end(&self, exit_code: i32, duration_ms: u64) {
        self.write(
            0,
            Event::End(End {
                exit_code,
                duration_ms,
            }),
        );
    }

    /// A `protected` event: `change` is created|modified|removed, `action`
    /// quarantined|restored|reported, `dest` where a quarantined copy went.
    pub fn protected(&self, path: &str, change: &str, action: &str, dest: Option<&str>) {
        self.write(
            0,
            Event::Protected(Protected {
                path: path.into(),
                change: change.into(),
                action: action.into(),
                dest: dest.map(Into::into),
            }),
        );
    }

    /// Write one event with the common fields.
    pub fn write(&self, conn: u64, event: Event) {
        let record = Record {
            ts: now(),
            conn,
            run: self.run.clone(),
            event,
        };
        if let Some(file) = &self.file {
            match serde_json::to_string(&record) {
                Ok(mut line) => {
                    line.push('\n');
                    // One write per event on an O_APPEND file: lines from
                    // concurrent connections never interleave.
                    let mut f = file.lock().unwrap_or_else(|p| p.into_inner());
                    if let Err(e) = f.write_all(line.as_bytes()) {
                        tracing::error!("audit log write failed: {e}");
                    }
                }
                Err(e) => tracing::error!("audit event not serialisable: {e}"),
            }
        }
        for s in &self.sinks {
            s.record(&record);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Count(Mutex<Vec<String>>);
    impl Sink for Count {
        fn record(&self, r: &Record) {
            self.0.lock().unwrap().push(r.event.kind().into());
        }
    }

    #[test]
    fn lines_are_appended_and_sinks_see_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        std::fs::write(&path, "{\"old\":1}\n").unwrap();
        let sink = Arc::new(Count(Mutex::new(vec![])));
        let log = AuditLog::open(&path, "r").unwrap().with_sink(sink.clone());
        log.end(0, 5);
        log.protected("/w/.git/config", "modified", "restored", None);
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<_> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        let v: serde_json::Value = serde_json::from_str(lines[2]).unwrap();
        assert_eq!(v["event"], "protected");
        assert_eq!(v["action"], "restored");
        assert_eq!(*sink.0.lock().unwrap(), vec!["end", "protected"]);
    }
}
