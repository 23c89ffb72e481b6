//! The streaming queries' figures in the `metrics` facade: each progress report recorded
//! as gauges, counters and histograms labelled by query. Whatever recorder the process
//! installs (the HTTP server's Prometheus exposition, `server::http`) sees them; without
//! one, recording costs nothing. docs/monitoring.md lists every metric.

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};

use super::progress::Progress;

/// Says what each query metric means, for the exposition's `# HELP` lines.
pub fn describe() {
    describe_gauge!(
        "tidemark_query_input_rows_per_second",
        "Rows per second arriving at the query's sources (the last report's inputRowsPerSecond)"
    );
    describe_gauge!(
        "tidemark_query_processed_rows_per_second",
        "Rows per second the query processed in its last batch (processedRowsPerSecond)"
    );
    describe_counter!(
        "tidemark_query_input_rows_total",
        "Rows the query has read from its sources"
    );
    describe_counter!(
        "tidemark_query_output_rows_total",
        "Rows the query has written to its sink"
    );
    describe_counter!(
        "tidemark_query_batches_total",
        "Micro-batches the query has committed"
    );
    describe_histogram!(
        "tidemark_query_batch_duration_seconds",
        metrics::Unit::Seconds,
        "Time of each phase of a micro-batch (durationMs), by phase"
    );
    describe_gauge!(
        "tidemark_query_batch_id",
        "The last batch id the query committed"
    );
    describe_gauge!(
        "tidemark_query_watermark_seconds",
        metrics::Unit::Seconds,
        "The query's event-time watermark, seconds since the epoch"
    );
    describe_gauge!(
        "tidemark_query_watermark_lag_seconds",
        metrics::Unit::Seconds,
        "Wall clock less the watermark"
    );
    describe_gauge!(
        "tidemark_query_state_rows",
        "Rows in the query's state stores (numRowsTotal, summed over operators)"
    );
    describe_gauge!(
        "tidemark_query_state_memory_bytes",
        metrics::Unit::Bytes,
        "Memory of the query's state stores (memoryUsedBytes, summed over operators)"
    );
    describe_counter!(
        "tidemark_query_rows_dropped_by_watermark_total",
        "Input rows the query's operators dropped as late"
    );
    describe_gauge!(
        "tidemark_query_backlog_files",
        "Files landed in the query's sources that no batch has read"
    );
    describe_gauge!(
        "tidemark_query_backlog_bytes",
        metrics::Unit::Bytes,
        "Bytes of those files"
    );
    describe_gauge!(
        "tidemark_query_backlog_rows",
        "Rows in the query's table streams that no batch has read"
    );
    describe_gauge!(
        "tidemark_query_end_to_end_latency_seconds",
        metrics::Unit::Seconds,
        "The last batch's latency from a row's arrival to the sink's commit, by quantile"
    );
    describe_counter!(
        "tidemark_query_failures_total",
        "Times the query stopped with an error"
    );
    describe_gauge!("tidemark_query_running", "1 while the query runs, else 0");
}

/// Records one progress report.
pub fn record(p: &Progress) {
    let q = p.name.clone();
    gauge!("tidemark_query_running", "query" => q.clone()).set(1.0);
    gauge!("tidemark_query_input_rows_per_second", "query" => q.clone())
        .set(p.input_rows_per_second);
    gauge!("tidemark_query_processed_rows_per_second", "query" => q.clone())
        .set(p.processed_rows_per_second);
    if let Some(e) = &p.event_time {
        gauge!("tidemark_query_watermark_seconds", "query" => q.clone())
            .set(e.watermark.timestamp_millis() as f64 / 1000.0);
    }
    if let Some(lag) = p.watermark_lag_ms {
        gauge!("tidemark_query_watermark_lag_seconds", "query" => q.clone())
            .set(lag as f64 / 1000.0);
    }
    if !p.state_operators.is_empty() {
        let rows: u64 = p.state_operators.iter().map(|o| o.num_rows_total).sum();
        let bytes: u64 = p.state_operators.iter().map(|o| o.memory_used_bytes).sum();
        gauge!("tidemark_query_state_rows", "query" => q.clone()).set(rows as f64);
        gauge!("tidemark_query_state_memory_bytes", "query" => q.clone()).set(bytes as f64);
    }
    for (metric, name) in [
        ("tidemark_query_backlog_files", "numFilesOutstanding"),
        ("tidemark_query_backlog_bytes", "numBytesOutstanding"),
        ("tidemark_query_backlog_rows", "numRowsOutstanding"),
    ] {
        if let Some(v) = p.source_metric_sum(name) {
            gauge!(metric, "query" => q.clone()).set(v as f64);
        }
    }
    if p.idle {
        return;
    }
    gauge!("tidemark_query_batch_id", "query" => q.clone()).set(p.batch_id.get() as f64);
    counter!("tidemark_query_batches_total", "query" => q.clone()).increment(1);
    counter!("tidemark_query_input_rows_total", "query" => q.clone()).increment(p.num_input_rows);
    counter!("tidemark_query_output_rows_total", "query" => q.clone())
        .increment(p.sink.num_output_rows.max(0) as u64);
    let dropped: u64 = p
        .state_operators
        .iter()
        .map(|o| o.num_rows_dropped_by_watermark)
        .sum();
    counter!("tidemark_query_rows_dropped_by_watermark_total", "query" => q.clone())
        .increment(dropped);
    for (phase, ms) in &p.duration_ms {
        histogram!("tidemark_query_batch_duration_seconds", "query" => q.clone(), "phase" => phase.clone())
            .record(*ms as f64 / 1000.0);
    }
    if let Some(l) = p.end_to_end_latency_ms {
        for (quantile, ms) in [
            ("0.5", l.p50),
            ("0.95", l.p95),
            ("0.99", l.p99),
            ("1", l.max),
        ] {
            gauge!("tidemark_query_end_to_end_latency_seconds", "query" => q.clone(), "quantile" => quantile)
                .set(ms as f64 / 1000.0);
        }
    }
}

/// A query's run ended, by an error when `failed`.
pub fn query_ended(name: &str, failed: bool) {
    gauge!("tidemark_query_running", "query" => name.to_string()).set(0.0);
    if failed {
        counter!("tidemark_query_failures_total", "query" => name.to_string()).increment(1);
    }
}
