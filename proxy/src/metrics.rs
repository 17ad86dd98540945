//! Prometheus metrics (`airlock proxy --metrics ADDR`) on the official
//! `prometheus-client`: decisions by reason, open tunnels, bytes, the time
//! people took to answer approvals, and the audit export's health.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;

pub use airlock_audit::otlp::ExportStats;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tokio::sync::Semaphore;

type Labels = Vec<(String, String)>;

pub struct Metrics {
    registry: Mutex<Registry>,
    decisions: Family<Labels, Counter>,
    bytes: Family<Labels, Counter>,
    approval_wait: Histogram,
}

/// Open tunnels, read from the tunnel semaphore at scrape time: exact,
/// and nothing to keep in step.
#[derive(Debug)]
struct Tunnels {
    sem: Arc<Semaphore>,
    max: usize,
}

impl Collector for Tunnels {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let open = self.max.saturating_sub(self.sem.available_permits()) as i64;
        let g = ConstGauge::new(open);
        let e = encoder.encode_descriptor(
            "airlock_open_tunnels",
            "CONNECT and SOCKS5 tunnels open now",
            None,
            g.metric_type(),
        )?;
        g.encode(e)
    }
}

#[derive(Debug)]
struct Export(Arc<ExportStats>);

impl Collector for Export {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for (name, help, v) in [
            (
                "airlock_audit_export_sent",
                "audit records the OTLP collector accepted",
                &self.0.sent,
            ),
            (
                "airlock_audit_export_dropped",
                "audit records dropped because the export queue was full",
                &self.0.dropped,
            ),
            (
                "airlock_audit_export_failed",
                "audit records in batches the OTLP collector did not accept",
                &self.0.failed,
            ),
        ] {
            let c = ConstCounter::new(v.load(Ordering::Relaxed));
            let e = encoder.encode_descriptor(name, help, None, c.metric_type())?;
            c.encode(e)?;
        }
        Ok(())
    }
}

impl Metrics {
    pub fn new(tunnels: Arc<Semaphore>, max_tunnels: usize) -> Metrics {
        let mut registry = Registry::default();
        let decisions = Family::<Labels, Counter>::default();
        registry.register(
            "airlock_decisions",
            "proxy decisions by verdict and reason",
            decisions.clone(),
        );
        let bytes = Family::<Labels, Counter>::default();
        registry.register(
            "airlock_bytes",
            "bytes relayed, by direction (up: to the origin)",
            bytes.clone(),
        );
        let approval_wait = Histogram::new(exponential_buckets(0.01, 2.0, 16));
        registry.register(
            "airlock_approval_wait_seconds",
            "how long an approval question waited for its answer",
            approval_wait.clone(),
        );
        registry.register_collector(Box::new(Tunnels {
            sem: tunnels,
            max: max_tunnels,
        }));
        Metrics {
            registry: Mutex::new(registry),
            decisions,
            bytes,
            approval_wait,
        }
    }

    pub fn decision(&self, verdict: &str, reason: &str) {
        self.decisions
            .get_or_create(&vec![
                ("decision".into(), verdict.into()),
                ("reason".into(), reason.into()),
            ])
            .inc();
    }

    pub fn bytes(&self, up: u64, down: u64) {
        self.bytes
            .get_or_create(&vec![("direction".into(), "up".into())])
            .inc_by(up);
        self.bytes
            .get_or_create(&vec![("direction".into(), "down".into())])
            .inc_by(down);
    }

    pub fn approval_wait(&self, seconds: f64) {
        self.approval_wait.observe(seconds);
    }

    /// Report an exporter's counts with the rest.
    pub fn watch_export(&self, stats: Arc<ExportStats>) {
        self.registry
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .register_collector(Box::new(Export(stats)));
    }

    /// The Prometheus text exposition.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &registry) {
            tracing::error!("metrics encoding failed: {e}");
        }
        out
    }
}

/// Serve `GET /metrics` on `listener` until the task is dropped.
pub async fn serve(
    metrics: Arc<dyn Fn() -> String + Send + Sync>,
    listener: tokio::net::TcpListener,
) {
    loop {
        let (stream, peer): (_, SocketAddr) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("metrics listener: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let metrics = metrics.clone();
                async move {
                    let resp = if req.uri().path() == "/metrics" {
                        Response::builder()
                            .header(
                                "content-type",
                                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                            )
                            .body(Full::new(Bytes::from(metrics())))
                    } else {
                        Response::builder()
                            .status(404)
                            .body(Full::new(Bytes::from_static(b"try /metrics\n")))
                    };
                    resp
                }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .await
            {
                tracing::debug!(%peer, "metrics connection: {e}");
            }
        });
    }
}
