//! The HTTP server of `--http ADDR` (docs/monitoring.md): Prometheus metrics at
//! `/metrics`, the queries as JSON at `/api/queries`, and the live dashboard at `/`.
//!
//! The one home of axum and of the Prometheus exposition: the recorder is installed here,
//! once per process, and the engine and the wire record through the `metrics` facade. The
//! dashboard's page and its chart library (uPlot, MIT, `assets/`) are compiled into the
//! binary; nothing is built with Node.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::engine::Engine;
use crate::engine::progress::{Progress, QueryStatus, format_ts};

const DASHBOARD: &str = include_str!("dashboard.html");
const UPLOT_JS: &str = include_str!("assets/uplot.min.js");
const UPLOT_CSS: &str = include_str!("assets/uplot.min.css");

/// Histogram buckets, seconds: batch phases from a millisecond to a minute.
const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

static RECORDER: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the process's Prometheus recorder (once; later calls return the same handle)
/// and keeps its histograms trimmed. The wire's metrics are described by the caller
/// (`server::describe_metrics`), after this.
pub fn recorder() -> PrometheusHandle {
    RECORDER
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets(BUCKETS)
                .expect("the buckets are not empty");
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("a metrics recorder was already installed; /metrics stays empty");
            }
            crate::engine::metrics::describe();
            let upkeep = handle.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    upkeep.run_upkeep();
                }
            });
            handle
        })
        .clone()
}

#[derive(Clone)]
struct AppState {
    engine: Arc<Engine>,
    metrics: PrometheusHandle,
}

/// The routes, over `engine`.
pub fn router(engine: Arc<Engine>) -> Router {
    let state = AppState {
        engine,
        metrics: recorder(),
    };
    Router::new()
        .route("/", get(dashboard))
        .route(
            "/assets/uplot.min.js",
            get(|| asset(UPLOT_JS, "text/javascript")),
        )
        .route(
            "/assets/uplot.min.css",
            get(|| asset(UPLOT_CSS, "text/css")),
        )
        .route("/metrics", get(metrics))
        .route("/api/queries", get(queries))
        .route("/api/queries/{name}", get(query))
        .with_state(state)
}

/// Serves until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    engine: Arc<Engine>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(engine))
        .with_graceful_shutdown(shutdown)
        .await
}

/// Binds `addr` for [`serve`].
pub async fn bind(addr: &str) -> std::io::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    Ok((listener, local))
}

async fn dashboard() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        DASHBOARD,
    )
        .into_response()
}

async fn asset(body: &'static str, content_type: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "max-age=3600"),
        ],
        body,
    )
        .into_response()
}

async fn metrics(State(state): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response()
}

async fn queries(State(state): State<AppState>) -> Response {
    let registry = state.engine.registry();
    let list: Vec<Value> = registry
        .all()
        .iter()
        .map(|s| {
            query_json(
                s,
                &registry.recent_progress(&s.name),
                registry.last_progress(&s.name),
            )
        })
        .collect();
    axum::Json(json!({
        "server": {"version": crate::config::PG_VERSION, "tidemark": env!("CARGO_PKG_VERSION"),
                   "time": format_ts(chrono::Utc::now())},
        "queries": list,
    }))
    .into_response()
}

async fn query(State(state): State<AppState>, Path(name): Path<String>) -> Response {
    let registry = state.engine.registry();
    match registry.get(&name) {
        Some(s) => axum::Json(query_json(
            &s,
            &registry.recent_progress(&name),
            registry.last_progress(&name),
        ))
        .into_response(),
        None => (
            StatusCode::NOT_FOUND,
            axum::Json(json!({"error": format!("query \"{name}\" does not exist")})),
        )
            .into_response(),
    }
}

/// A query for `/api/queries`: its status, plan and checkpoint, its last report whole
/// (Spark's `lastProgress`, idle or not) and its batches' figures, oldest first, for charts.
fn query_json(s: &QueryStatus, reports: &[Progress], last: Option<Progress>) -> Value {
    let batches: Vec<Value> = reports.iter().map(batch_figures).collect();
    json!({
        "name": s.name,
        "id": s.id,
        "runId": s.run_id,
        "status": s.status.as_str(),
        "engine": s.engine,
        "error": s.error,
        "startedAt": s.started_at.map(format_ts),
        "lastBatchId": s.last_batch_id.map(|b| b.get()),
        "lastProgressAt": s.last_progress_at.map(format_ts),
        "checkpoint": s.checkpoint,
        "plan": s.plan,
        "lastProgress": last,
        "batches": batches,
    })
}

/// What the dashboard charts of one batch.
fn batch_figures(p: &Progress) -> Value {
    let sum = |f: fn(&crate::engine::progress::StateOperatorProgress) -> u64| -> Option<u64> {
        (!p.state_operators.is_empty()).then(|| p.state_operators.iter().map(f).sum())
    };
    json!({
        "batchId": p.batch_id.get(),
        "timestamp": format_ts(p.timestamp),
        "numInputRows": p.num_input_rows,
        "numOutputRows": p.sink.num_output_rows,
        "inputRowsPerSecond": p.input_rows_per_second,
        "processedRowsPerSecond": p.processed_rows_per_second,
        "batchDuration": p.batch_duration,
        "durationMs": p.duration_ms,
        "watermark": p.event_time.as_ref().map(|e| format_ts(e.watermark)),
        "watermarkLagMs": p.watermark_lag_ms,
        "stateRows": sum(|o| o.num_rows_total),
        "stateBytes": sum(|o| o.memory_used_bytes),
        "droppedByWatermark": sum(|o| o.num_rows_dropped_by_watermark),
        "latencyMs": p.end_to_end_latency_ms,
        "backlogFiles": p.source_metric_sum("numFilesOutstanding"),
        "backlogBytes": p.source_metric_sum("numBytesOutstanding"),
        "backlogRows": p.source_metric_sum("numRowsOutstanding"),
    })
}
