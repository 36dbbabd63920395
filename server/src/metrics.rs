//! `GET /metrics` in the Prometheus text format, through the `metrics` facade (every crate
//! records with `metrics::counter!` and friends) and its Prometheus exporter. The queue's
//! gauges live in Postgres and are read at scrape time (one vital-signs read, cached for a
//! second), so every process reports the same backlog. Never public by default: served on its
//! own address (`--metrics-bind`) or behind a bearer token (`--metrics-token`).

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use sqlx::PgPool;

/// The process's recorder, installed once (tests start many apps in one process).
fn handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let buckets = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0];
        // Acceptance to done can take hours (a paused queue, a backlog): its own buckets.
        let time_to_done = [1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0];
        let recorder = PrometheusBuilder::new()
            .set_buckets(&buckets)
            .and_then(|b| {
                b.set_buckets_for_metric(
                    metrics_exporter_prometheus::Matcher::Full("sluice_job_time_to_done_seconds".into()),
                    &time_to_done,
                )
            })
            .expect("bucket bounds")
            .build_recorder();
        let handle = recorder.handle();
        // Another recorder may be installed already (a test harness); ours still renders.
        let _ = metrics::set_global_recorder(recorder);
        handle
    })
}

/// Install the recorder (call once at startup, before anything records).
pub fn install() {
    let _ = handle();
}

/// What serves `/metrics`: the pool for the queue's gauges, the last read, and the token.
#[derive(Clone)]
pub struct MetricsState {
    pool: PgPool,
    token: Option<String>,
    last_read: Arc<Mutex<Option<Instant>>>,
}

impl MetricsState {
    pub fn new(pool: PgPool, token: Option<String>) -> MetricsState {
        install();
        MetricsState { pool, token, last_read: Arc::default() }
    }
}

/// How long one read of the queue's gauges serves every scrape.
const GAUGES_FOR: Duration = Duration::from_secs(1);

/// `GET /metrics`: 401 without the configured bearer token.
pub async fn scrape(State(state): State<MetricsState>, headers: HeaderMap) -> Response {
    if let Some(token) = &state.token {
        let given =
            headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
        if !given.is_some_and(|g| constant_time_eq(g.trim().as_bytes(), token.as_bytes())) {
            return (StatusCode::UNAUTHORIZED, "a bearer token is needed for /metrics").into_response();
        }
    }
    let due = {
        let mut last = state.last_read.lock().unwrap_or_else(|e| e.into_inner());
        let due = last.is_none_or(|at| at.elapsed() >= GAUGES_FOR);
        if due {
            *last = Some(Instant::now());
        }
        due
    };
    if due {
        if let Err(e) = record_queue_gauges(&state.pool).await {
            tracing::warn!(error = %e, "reading the queue's gauges for /metrics failed");
            metrics::gauge!("sluice_database_up").set(0.0);
        }
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], handle().render()).into_response()
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The gauges that live in Postgres: the same answer from every process.
async fn record_queue_gauges(pool: &PgPool) -> engine::error::Result<()> {
    let vitals = engine::queue::vitals::read(pool).await?;
    let settings = engine::queue::switches::read(pool).await?;
    let capacity = engine::queue::capacity::status(pool).await?;
    let store = engine::documents::store_space::read(pool).await?;
    metrics::gauge!("sluice_database_up").set(1.0);
    // The gate in force (lower while it grows back after 429s) and what the budget holds.
    metrics::gauge!("sluice_gate_effective").set(f64::from(capacity.effective_gate));
    for (dimension, left) in [
        ("requests", capacity.requests_left),
        ("input_tokens", capacity.input_tokens_left),
        ("output_tokens", capacity.output_tokens_left),
    ] {
        if let Some(left) = left {
            metrics::gauge!("sluice_provider_budget_left", "dimension" => dimension).set(left);
        }
    }
    metrics::gauge!("sluice_backlog_jobs").set(vitals.backlog as f64);
    metrics::gauge!("sluice_scheduled_retries_jobs").set(vitals.scheduled_retries as f64);
    metrics::gauge!("sluice_running_jobs").set(vitals.running as f64);
    metrics::gauge!("sluice_gate_size").set(f64::from(settings.gate_size));
    metrics::gauge!("sluice_processing_enabled").set(if settings.processing_enabled { 1.0 } else { 0.0 });
    metrics::gauge!("sluice_oldest_waiting_seconds").set(vitals.oldest_waiting_secs.unwrap_or(0.0));
    metrics::gauge!("sluice_dlq_depth_jobs").set(vitals.dlq_depth as f64);
    if let Some(free) = store.free_bytes {
        metrics::gauge!("sluice_document_store_free_bytes").set(free as f64);
    }
    metrics::gauge!("sluice_document_store_full").set(if store.full { 1.0 } else { 0.0 });
    metrics::gauge!("sluice_time_to_done_seconds", "quantile" => "0.5")
        .set(vitals.time_to_done_p50_secs.unwrap_or(0.0));
    metrics::gauge!("sluice_time_to_done_seconds", "quantile" => "0.95")
        .set(vitals.time_to_done_p95_secs.unwrap_or(0.0));
    Ok(())
}

/// Pure: a method as a metrics label, from a closed set (a stranger's invented methods would
/// each make a new time series).
pub fn method_label(method: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// Counts and times every request by route pattern (never the ids in a path), method and status.
pub async fn record_http(request: Request, next: Next) -> Response {
    let route =
        request.extensions().get::<MatchedPath>().map(|p| p.as_str().to_owned()).unwrap_or_else(|| "(other)".into());
    let method = method_label(request.method());
    let started = Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    metrics::counter!("sluice_http_requests_total", "route" => route.clone(), "method" => method, "status" => status)
        .increment(1);
    metrics::histogram!("sluice_http_request_duration_seconds", "route" => route)
        .record(started.elapsed().as_secs_f64());
    response
}

#[cfg(test)]
mod tests {
    use super::method_label;
    use axum::http::Method;

    #[test]
    fn invented_methods_share_one_label() {
        assert_eq!(method_label(&Method::POST), "POST");
        assert_eq!(method_label(&Method::from_bytes(b"XYZZY").unwrap()), "other");
        assert_eq!(method_label(&Method::from_bytes(b"FOO1").unwrap()), "other");
    }
}
