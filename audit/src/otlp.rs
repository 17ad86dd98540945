//! Audit events as OpenTelemetry logs over OTLP/HTTP (`--otlp ENDPOINT`,
//! `[audit] otlp`), so a Collector can route them to any SIEM. The proxy
//! only ever `try_send`s into a bounded queue: a slow or unreachable
//! collector costs dropped records (counted), never a stalled connection.
//! One thread of its own batches the records and hands them to the
//! official `opentelemetry-otlp` exporter (HTTP/JSON).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::{Duration, Instant, SystemTime};

use opentelemetry::logs::{AnyValue, LogRecord as _, Logger as _, LoggerProvider as _, Severity};
use opentelemetry::InstrumentationScope;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::logs::{LogBatch, LogExporter, SdkLogRecord, SdkLogger, SdkLoggerProvider};
use opentelemetry_sdk::Resource;

use crate::schema::{Event, Record};
use crate::writer::Sink;

/// Records waiting for the exporter thread; beyond this they are dropped.
pub const QUEUE: usize = 4096;
const BATCH: usize = 512;
/// The longest a record waits for others to share its request.
const WINDOW: Duration = Duration::from_millis(200);

/// What the exporter did, for the metrics endpoint.
#[derive(Debug, Default)]
pub struct ExportStats {
    /// Records the collector accepted.
    pub sent: AtomicU64,
    /// Dropped because the queue was full.
    pub dropped: AtomicU64,
    /// Records in batches the collector refused or never answered.
    pub failed: AtomicU64,
}

#[derive(Debug, thiserror::Error)]
pub enum OtlpError {
    #[error("--otlp {0}: expected an http:// URL of an OTLP/HTTP receiver")]
    Endpoint(String),
    #[error(
        "--otlp {0}: https endpoints are not supported by this build (its OTLP client has no \
         TLS); send to a local OpenTelemetry Collector over http and let it forward with TLS"
    )]
    NoTls(String),
    #[error("cannot build the OTLP exporter: {0}")]
    Build(String),
    #[error("cannot start the OTLP export thread: {0}")]
    Thread(std::io::Error),
}

pub struct Otlp {
    tx: Mutex<Option<SyncSender<SdkLogRecord>>>,
    logger: SdkLogger,
    stats: Arc<ExportStats>,
    done: Mutex<Option<Receiver<()>>>,
}

/// `http://host:4318` means its `/v1/logs`; a full path is kept.
pub fn logs_url(endpoint: &str) -> Result<String, OtlpError> {
    let e = endpoint.trim();
    if e.starts_with("https://") {
        return Err(OtlpError::NoTls(endpoint.into()));
    }
    if !e.starts_with("http://") {
        return Err(OtlpError::Endpoint(endpoint.into()));
    }
    let after_scheme = &e[e.find("://").map_or(0, |i| i + 3)..];
    if after_scheme.is_empty() || after_scheme.starts_with('/') {
        return Err(OtlpError::Endpoint(endpoint.into()));
    }
    Ok(match after_scheme.find('/') {
        Some(i) if after_scheme[i..].trim_end_matches('/').len() > 1 => e.to_string(),
        _ => format!("{}/v1/logs", e.trim_end_matches('/')),
    })
}

impl Otlp {
    /// Start the exporter thread for `endpoint`.
    pub fn start(endpoint: &str, queue: usize) -> Result<Arc<Otlp>, OtlpError> {
        let url = logs_url(endpoint)?;
        let mut exporter = opentelemetry_otlp::LogExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpJson)
            .with_endpoint(url)
            .with_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| OtlpError::Build(e.to_string()))?;
        let resource = Resource::builder_empty()
            .with_service_name("airlock")
            .with_attribute(opentelemetry::KeyValue::new(
                "service.version",
                env!("CARGO_PKG_VERSION"),
            ))
            .build();
        exporter.set_resource(&resource);
        // No processors: records are made here and exported by our thread.
        let provider = SdkLoggerProvider::builder().build();
        let scope = InstrumentationScope::builder("airlock")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        let logger = provider.logger_with_scope(scope.clone());
        let (tx, rx) = mpsc::sync_channel(queue.max(1));
        let (done_tx, done_rx) = mpsc::channel();
        let stats = Arc::new(ExportStats::default());
        let thread_stats = stats.clone();
        std::thread::Builder::new()
            .name("airlock-otlp".into())
            .spawn(move || {
                export_loop(exporter, scope, rx, &thread_stats);
                drop(provider);
                let _ = done_tx.send(());
            })
            .map_err(OtlpError::Thread)?;
        Ok(Arc::new(Otlp {
            tx: Mutex::new(Some(tx)),
            logger,
            stats,
            done: Mutex::new(Some(done_rx)),
        }))
    }

    pub fn stats(&self) -> Arc<ExportStats> {
        self.stats.clone()
    }

    /// Stop taking records and give the thread up to `wait` to send what
    /// is queued; an unreachable collector does not hold the exit longer.
    pub fn close(&self, wait: Duration) {
        drop(self.tx.lock().unwrap_or_else(|p| p.into_inner()).take());
        if let Some(done) = self.done.lock().unwrap_or_else(|p| p.into_inner()).take() {
            if done.recv_timeout(wait).is_err() {
                tracing::warn!("the OTLP collector did not take the last audit records in time");
            }
        }
    }

    fn to_log(&self, r: &Record) -> SdkLogRecord {
        let mut log = self.logger.create_log_record();
        let ts = humantime::parse_rfc3339(&r.ts).unwrap_or_else(|_| SystemTime::now());
        log.set_timestamp(ts);
        log.set_observed_timestamp(SystemTime::now());
        log.set_event_name(event_name(&r.event));
        let (number, text) = severity(&r.event);
        log.set_severity_number(number);
        log.set_severity_text(text);
        let value = serde_json::to_value(r).unwrap_or_default();
        log.set_body(AnyValue::String(value.to_string().into()));
        // The same stable field names as the JSON line (docs/src/audit.md, Schema),
        // so a collector can filter without parsing the body.
        if let serde_json::Value::Object(map) = value {
            for (k, v) in map {
                let v: AnyValue = match v {
                    serde_json::Value::Null => continue,
                    serde_json::Value::Bool(b) => b.into(),
                    serde_json::Value::Number(n) => match n.as_i64() {
                        Some(i) => i.into(),
                        None => n.as_f64().unwrap_or(0.0).into(),
                    },
                    serde_json::Value::String(s) => s.into(),
                    other => other.to_string().into(),
                };
                log.add_attribute(format!("airlock.{k}"), v);
            }
        }
        log
    }
}

fn event_name(e: &Event) -> &'static str {
    match e {
        Event::Run(_) => "airlock.run",
        Event::End(_) => "airlock.end",
        Event::Decision(_) => "airlock.decision",
        Event::Close(_) => "airlock.close",
        Event::Request(_) => "airlock.request",
        Event::Approval(_) => "airlock.approval",
        Event::Protected(_) => "airlock.protected",
        Event::Dns(_) => "airlock.dns",
    }
}

fn severity(e: &Event) -> (Severity, &'static str) {
    match e {
        Event::Decision(d) if d.decision != "allow" => (Severity::Warn, "WARN"),
        Event::Protected(_) => (Severity::Warn, "WARN"),
        Event::Dns(d) if d.outcome == "refused" => (Severity::Warn, "WARN"),
        Event::Approval(a) if a.answer == "deny" || a.answer == "timeout" => {
            (Severity::Warn, "WARN")
        }
        _ => (Severity::Info, "INFO"),
    }
}

impl Sink for Otlp {
    fn record(&self, r: &Record) {
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let Some(tx) = tx else {
            return;
        };
        match tx.try_send(self.to_log(r)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

fn export_loop(
    exporter: opentelemetry_otlp::LogExporter,
    scope: InstrumentationScope,
    rx: Receiver<SdkLogRecord>,
    stats: &ExportStats,
) {
    let mut batch: Vec<SdkLogRecord> = Vec::with_capacity(BATCH);
    let mut open = true;
    // When the batch's first record came: a batch waits at most WINDOW.
    let mut first = Instant::now();
    while open || !batch.is_empty() {
        if open {
            // Wait for a first record, then gather what comes within a
            // short window into one request.
            let wait = if batch.is_empty() {
                Duration::from_secs(3600)
            } else {
                WINDOW.saturating_sub(first.elapsed())
            };
            if batch.is_empty() {
                first = Instant::now();
            }
            match rx.recv_timeout(wait) {
                Ok(r) => {
                    batch.push(r);
                    while batch.len() < BATCH {
                        match rx.try_recv() {
                            Ok(r) => batch.push(r),
                            Err(_) => break,
                        }
                    }
                    if batch.len() < BATCH && first.elapsed() < WINDOW {
                        continue;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => open = false,
            }
        }
        if batch.is_empty() {
            continue;
        }
        let refs: Vec<(&SdkLogRecord, &InstrumentationScope)> =
            batch.iter().map(|r| (r, &scope)).collect();
        let n = refs.len() as u64;
        match block_on(exporter.export(LogBatch::new(&refs))) {
            Ok(()) => stats.sent.fetch_add(n, Ordering::Relaxed),
            Err(e) => {
                tracing::warn!("OTLP export of {n} audit records failed: {e}");
                stats.failed.fetch_add(n, Ordering::Relaxed)
            }
        };
        batch.clear();
    }
}

/// Drive one future on this thread (the exporter's HTTP client blocks in
/// its own runtime, so this mostly returns on the first poll).
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    struct Unpark(Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_get_the_logs_path_unless_they_name_one() {
        assert_eq!(
            logs_url("http://127.0.0.1:4318").unwrap(),
            "http://127.0.0.1:4318/v1/logs"
        );
        assert_eq!(logs_url("http://c:4318/").unwrap(), "http://c:4318/v1/logs");
        assert_eq!(
            logs_url("http://c/otlp/v1/logs").unwrap(),
            "http://c/otlp/v1/logs"
        );
        assert!(matches!(
            logs_url("https://c:4318"),
            Err(OtlpError::NoTls(_))
        ));
        assert!(logs_url("c:4318").is_err());
        assert!(logs_url("http://").is_err());
    }
}
