//! `projector run`'s endpoint: `/metrics` (Prometheus text, rendered by
//! `metrics-exporter-prometheus`), `/health` (200 or 503, with the problems as JSON) and
//! `/status` (the last status snapshot, the JSON of `projector status --json`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;
use projector_ops::monitor::Assessment;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Batch latency buckets, in seconds: a batch commits in a few milliseconds when healthy,
/// and the attempt timeout ends one at about a minute.
const BATCH_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Installs the Prometheus recorder as the process's `metrics` recorder. A gauge not set for
/// `gauge_ttl` disappears, so a retired version's lag does not linger in the scrape.
pub fn install_recorder(gauge_ttl: Duration) -> anyhow::Result<PrometheusHandle> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("projector_batch_seconds".to_owned()),
            &BATCH_BUCKETS,
        )
        .context("histogram buckets")?
        .idle_timeout(MetricKindMask::GAUGE, Some(gauge_ttl))
        .install_recorder()
        .context(
            "cannot install the Prometheus recorder (another metrics recorder is installed); \
             pass --metrics-addr off",
        )?;
    projector_ops::describe_metrics();
    Ok(handle)
}

/// Binds the endpoint, or says in one line why it cannot.
pub async fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr).await.with_context(|| {
        format!("cannot serve metrics on {addr} (pass another --metrics-addr, or off)")
    })
}

/// What the endpoint serves from.
#[derive(Clone)]
pub struct Endpoint {
    /// The exporter's handle.
    pub metrics: PrometheusHandle,
    /// The monitor's last assessment.
    pub health: watch::Receiver<Assessment>,
    /// An assessment older than this is itself a failure (the monitor is stuck).
    pub max_age: Duration,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("max_age", &self.max_age)
            .finish_non_exhaustive()
    }
}

/// Serves until `shutdown`; each connection on a task of its own.
pub async fn serve(listener: TcpListener, endpoint: Endpoint, shutdown: CancellationToken) {
    let endpoint = Arc::new(endpoint);
    loop {
        let stream = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics endpoint: accept failed");
                    continue;
                }
            },
        };
        let endpoint = endpoint.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let endpoint = endpoint.clone();
                async move { Ok::<_, Infallible>(answer(&endpoint, &req)) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            tokio::select! {
                _ = connection => {}
                _ = shutdown.cancelled() => {}
            }
        });
    }
}

fn answer(endpoint: &Endpoint, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return respond(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET only\n".into(),
        );
    }
    match req.uri().path() {
        "/metrics" => {
            endpoint.metrics.run_upkeep();
            respond(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                endpoint.metrics.render(),
            )
        }
        "/health" => {
            let body = endpoint
                .health
                .borrow()
                .body(Instant::now(), endpoint.max_age);
            let code = if body.healthy {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            respond(code, "application/json", json(&body))
        }
        "/status" => {
            let status = endpoint.health.borrow().status.clone();
            match status {
                Some(status) => respond(StatusCode::OK, "application/json", json(&*status)),
                None => respond(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    "no status snapshot yet\n".into(),
                ),
            }
        }
        _ => respond(
            StatusCode::NOT_FOUND,
            "text/plain",
            "try /metrics, /health or /status\n".into(),
        ),
    }
}

fn json(value: &impl serde::Serialize) -> String {
    let mut text =
        serde_json::to_string(value).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"));
    text.push('\n');
    text
}

fn respond(code: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = code;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    response
}
