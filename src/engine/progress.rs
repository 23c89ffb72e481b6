//! Progress reports (spec §12) and the live status of every streaming query.
//!
//! The registry is the one place the trigger loops publish to and the system tables
//! (`tidemark.queries`, `tidemark.progress`), `SHOW QUERIES` and `FLUSH` read from.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, RwLock};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, watch};
use uuid::Uuid;

use crate::types::BatchId;

/// Spark's `numRecentProgressUpdates`: after each report, the oldest go while this many
/// are kept, so at most 99 are (spec §12.3).
pub const RECENT_PROGRESS: usize = 100;

/// Spark's `noDataProgressEventInterval`: an idle trigger's report is kept only this long
/// after the last kept report (spec §12.3).
pub const IDLE_REPORT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

/// The largest payload Postgres's `NOTIFY` carries (its limit is 8000 bytes, less one).
pub const NOTIFY_PAYLOAD_LIMIT: usize = 7999;

/// Status of a query as `SHOW QUERIES` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Running,
    Finished,
    Stopped,
    Failed,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Running => "running",
            Status::Finished => "finished",
            Status::Stopped => "stopped",
            Status::Failed => "failed",
        }
    }

    pub fn is_terminal(self) -> bool {
        !matches!(self, Status::Running)
    }
}

/// The live state of one streaming query.
#[derive(Debug, Clone)]
pub struct QueryStatus {
    pub name: String,
    /// The query id, from the checkpoint; unknown until the checkpoint is opened.
    pub id: Option<Uuid>,
    /// A fresh id for every start.
    pub run_id: Option<Uuid>,
    pub status: Status,
    pub last_batch_id: Option<BatchId>,
    pub last_progress_at: Option<DateTime<Utc>>,
    pub error: Option<String>,
    /// Number of triggers started in this run.
    pub triggers: u64,
    /// The number of the last trigger that left nothing its sources held when it started:
    /// it found no new data, or committed a batch no read limit cut short. `FLUSH` waits
    /// for one that started after it was called.
    pub last_drained_trigger: u64,
    /// The running plan, as `EXPLAIN CREATE SINK` prints it; known once the run starts.
    pub plan: Vec<String>,
    /// The checkpoint directory.
    pub checkpoint: Option<String>,
    /// When this run started.
    pub started_at: Option<DateTime<Utc>>,
    /// Where the query runs: `tidemark` (this process) or `spark` (a Spark Connect
    /// server; `id` and `run_id` are then Spark's).
    pub engine: &'static str,
}

impl QueryStatus {
    pub fn new(name: &str, status: Status) -> QueryStatus {
        QueryStatus {
            name: name.to_string(),
            id: None,
            run_id: None,
            status,
            last_batch_id: None,
            last_progress_at: None,
            error: None,
            triggers: 0,
            last_drained_trigger: 0,
            plan: Vec::new(),
            checkpoint: None,
            started_at: None,
            engine: "tidemark",
        }
    }
}

/// One source's part of a progress report.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceProgress {
    pub description: String,
    pub start_offset: Option<serde_json::Value>,
    pub end_offset: Option<serde_json::Value>,
    pub latest_offset: Option<serde_json::Value>,
    pub num_input_rows: u64,
    #[serde(default)]
    pub input_rows_per_second: f64,
    #[serde(default)]
    pub processed_rows_per_second: f64,
    /// Spark's custom source metrics (strings): here `numMalformedRows` (records that did
    /// not parse: kept as NULL rows in PERMISSIVE mode, dropped in DROPMALFORMED) and
    /// `numMissingFiles` (files gone before they were read); the file source also reports
    /// `numFilesReadAhead` (files decoded while the previous batch ran).
    #[serde(default)]
    pub metrics: BTreeMap<String, String>,
}

impl SourceProgress {
    fn metric(&self, name: &str) -> i64 {
        self.metrics
            .get(name)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    pub fn malformed_rows(&self) -> i64 {
        self.metric("numMalformedRows")
    }

    pub fn missing_files(&self) -> i64 {
        self.metric("numMissingFiles")
    }
}

/// The sink's part of a progress report.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SinkProgress {
    pub description: String,
    /// Rows written by this batch. Spark reports -1 for Delta; Tidemark counts them.
    pub num_output_rows: i64,
}

/// `eventTime` of a progress report: the batch's event-time statistics (data batches only)
/// and the watermark in force during the batch, `WM(N)`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EventTimeProgress {
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "serialize_opt_ts"
    )]
    pub avg: Option<DateTime<Utc>>,
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "serialize_opt_ts"
    )]
    pub max: Option<DateTime<Utc>>,
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "serialize_opt_ts"
    )]
    pub min: Option<DateTime<Utc>>,
    #[serde(serialize_with = "serialize_ts")]
    pub watermark: DateTime<Utc>,
}

/// One entry of `stateOperators`, in Spark's key order.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StateOperatorProgress {
    pub operator_name: String,
    pub num_rows_total: u64,
    pub num_rows_updated: u64,
    pub all_updates_time_ms: u64,
    pub num_rows_removed: u64,
    pub all_removals_time_ms: u64,
    pub commit_time_ms: u64,
    pub memory_used_bytes: u64,
    /// Input rows dropped as late (Spark counts partially aggregated groups instead).
    pub num_rows_dropped_by_watermark: u64,
    pub num_shuffle_partitions: usize,
    pub num_state_store_instances: usize,
    /// The operator's own counters (`numDroppedDuplicateRows`, ...), by name. Signed: Spark
    /// reports -1 for some it does not know yet (`SnapshotLastUploaded.*`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub custom_metrics: std::collections::BTreeMap<String, i64>,
}

/// End-to-end latency of a batch's rows, ms: from each row's arrival in its source (its
/// file's modification time; its `INSERT` or `COPY` acknowledged) to the sink's commit.
/// Nearest-rank percentiles over rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatencyMs {
    pub p50: i64,
    pub p95: i64,
    pub p99: i64,
    pub max: i64,
}

/// The latency percentiles of rows that arrived at `arrivals` and were committed at
/// `committed_ms`; `None` without rows of known arrival.
pub fn latency_percentiles(
    arrivals: &[crate::source::Arrival],
    committed_ms: i64,
) -> Option<LatencyMs> {
    let mut by_latency: Vec<(i64, u64)> = arrivals
        .iter()
        .filter(|a| a.rows > 0)
        .map(|a| ((committed_ms - a.at_ms).max(0), a.rows))
        .collect();
    let total: u64 = by_latency.iter().map(|(_, n)| n).sum();
    if total == 0 {
        return None;
    }
    by_latency.sort_unstable();
    let rank = |q: f64| {
        // The smallest latency whose rows, with all shorter ones, reach q of the rows.
        let need = ((q * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for &(ms, n) in &by_latency {
            seen += n;
            if seen >= need {
                return ms;
            }
        }
        by_latency.last().map_or(0, |l| l.0)
    };
    Some(LatencyMs {
        p50: rank(0.50),
        p95: rank(0.95),
        p99: rank(0.99),
        max: rank(1.0),
    })
}

/// A progress report, serialized in Spark's `StreamingQueryProgress` key order.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Progress {
    pub id: Uuid,
    pub run_id: Uuid,
    pub name: String,
    /// Trigger start; serialized as `yyyy-MM-ddTHH:mm:ss.SSSZ`.
    #[serde(serialize_with = "serialize_ts")]
    pub timestamp: DateTime<Utc>,
    pub batch_id: BatchId,
    pub batch_duration: u64,
    /// Spark Connect's reports leave the totals out: they are the sources' sums.
    #[serde(default)]
    pub num_input_rows: u64,
    /// Spark leaves a rate that is not a number (no time elapsed) out of its JSON.
    #[serde(default)]
    pub input_rows_per_second: f64,
    #[serde(default)]
    pub processed_rows_per_second: f64,
    /// Phase durations, ms; keys sorted.
    pub duration_ms: BTreeMap<String, u64>,
    /// Present iff the query has a watermark.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_time: Option<EventTimeProgress>,
    pub state_operators: Vec<StateOperatorProgress>,
    pub sources: Vec<SourceProgress>,
    pub sink: SinkProgress,
    /// Beyond Spark: the batch's end-to-end latency; absent when no row's arrival is known
    /// (idle and no-data batches, generated sources).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_to_end_latency_ms: Option<LatencyMs>,
    /// Beyond Spark: the wall clock at the report less the watermark, ms; absent without a
    /// watermark or before the first one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub watermark_lag_ms: Option<i64>,
    /// The report of an idle trigger (spec §12.6), not of a batch.
    #[serde(skip)]
    pub idle: bool,
}

impl Progress {
    /// A report of a query that runs on Spark, from Spark's own JSON (the same keys:
    /// Tidemark's reports are Spark's). An idle trigger's report is the one without an
    /// `addBatch` phase (a no-data batch has one). The watermark lag is measured here, at
    /// `now`.
    pub fn from_spark_json(json: &str, now: DateTime<Utc>) -> serde_json::Result<Progress> {
        let mut v: serde_json::Value = serde_json::from_str(json)?;
        // A query without a watermark: Spark sends `"eventTime": {}`, Tidemark has none.
        if v["eventTime"].get("watermark").is_none()
            && let Some(o) = v.as_object_mut()
        {
            o.remove("eventTime");
        }
        let mut p: Progress = serde_json::from_value(v)?;
        // Spark Connect sends each source's offsets as JSON text; local reports hold the
        // JSON itself.
        for s in &mut p.sources {
            for o in [&mut s.start_offset, &mut s.end_offset, &mut s.latest_offset] {
                if let Some(serde_json::Value::String(text)) = o
                    && let Ok(v) = serde_json::from_str::<serde_json::Value>(text)
                {
                    *o = Some(v);
                }
            }
        }
        if p.num_input_rows == 0 {
            p.num_input_rows = p.sources.iter().map(|s| s.num_input_rows).sum();
        }
        if p.input_rows_per_second == 0.0 {
            p.input_rows_per_second = p.sources.iter().map(|s| s.input_rows_per_second).sum();
        }
        if p.processed_rows_per_second == 0.0 {
            p.processed_rows_per_second =
                p.sources.iter().map(|s| s.processed_rows_per_second).sum();
        }
        p.idle = !p.duration_ms.contains_key("addBatch");
        p.watermark_lag_ms = p
            .event_time
            .as_ref()
            .filter(|e| e.watermark.timestamp_millis() > 0)
            .map(|e| (now - e.watermark).num_milliseconds());
        Ok(p)
    }
}

impl Progress {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn to_pretty_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// The sum of a metric over the sources; `None` if no source reports it.
    pub fn source_metric_sum(&self, name: &str) -> Option<i64> {
        let values: Vec<i64> = self
            .sources
            .iter()
            .filter_map(|s| s.metrics.get(name)?.parse().ok())
            .collect();
        (!values.is_empty()).then(|| values.iter().sum())
    }
}

/// One of Spark's `StreamingQueryListener` events (spec §12.5).
#[derive(Debug, Clone)]
pub enum ListenerEvent {
    Started {
        id: Uuid,
        run_id: Uuid,
        name: String,
        timestamp: DateTime<Utc>,
    },
    Progress(Arc<Progress>),
    Idle {
        id: Uuid,
        run_id: Uuid,
        name: String,
        timestamp: DateTime<Utc>,
    },
    Terminated {
        id: Uuid,
        run_id: Uuid,
        name: String,
        exception: Option<String>,
    },
}

impl ListenerEvent {
    /// The query's name.
    pub fn name(&self) -> &str {
        match self {
            ListenerEvent::Started { name, .. }
            | ListenerEvent::Idle { name, .. }
            | ListenerEvent::Terminated { name, .. } => name,
            ListenerEvent::Progress(p) => &p.name,
        }
    }

    /// `started`, `progress`, `idle` or `terminated`.
    pub fn kind(&self) -> &'static str {
        match self {
            ListenerEvent::Started { .. } => "started",
            ListenerEvent::Progress(_) => "progress",
            ListenerEvent::Idle { .. } => "idle",
            ListenerEvent::Terminated { .. } => "terminated",
        }
    }

    /// The event as Spark's `event.json` has it, with its kind under `event` and the
    /// query's name added to every kind.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::json;
        match self {
            ListenerEvent::Started {
                id,
                run_id,
                name,
                timestamp,
            } => json!({"event": "started", "id": id, "runId": run_id, "name": name,
                        "timestamp": format_ts(*timestamp)}),
            ListenerEvent::Progress(p) => json!({"event": "progress", "progress": **p}),
            ListenerEvent::Idle {
                id,
                run_id,
                name,
                timestamp,
            } => json!({"event": "idle", "id": id, "runId": run_id, "name": name,
                        "timestamp": format_ts(*timestamp)}),
            ListenerEvent::Terminated {
                id,
                run_id,
                name,
                exception,
            } => json!({"event": "terminated", "id": id, "runId": run_id, "name": name,
                        "exception": exception, "errorClassOnException": null}),
        }
    }

    /// The `NOTIFY` payload: the JSON, or for a progress report longer than Postgres's
    /// limit a summary that says how to read the whole (`SHOW PROGRESS name`).
    pub fn payload(&self) -> String {
        let full = self.to_json().to_string();
        match self {
            ListenerEvent::Progress(p) if full.len() > NOTIFY_PAYLOAD_LIMIT => serde_json::json!({
                "event": "progress", "truncated": true,
                "id": p.id, "runId": p.run_id, "name": p.name,
                "batchId": p.batch_id, "timestamp": format_ts(p.timestamp),
                "numInputRows": p.num_input_rows,
                "batchDuration": p.batch_duration,
            })
            .to_string(),
            _ => full,
        }
    }
}

/// Rounds half-up to one decimal, as Spark 4.1+ writes rates.
pub fn round_rate(x: f64) -> f64 {
    if !x.is_finite() {
        return 0.0;
    }
    (x * 10.0 + 0.5).floor() / 10.0
}

/// Formats a time as Spark's progress does: UTC with milliseconds.
pub fn format_ts(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

fn serialize_ts<S: serde::Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format_ts(*t))
}

fn serialize_opt_ts<S: serde::Serializer>(
    t: &Option<DateTime<Utc>>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match t {
        Some(t) => serialize_ts(t, s),
        None => s.serialize_none(),
    }
}

/// Statuses and recent progress of every query, with a change signal.
pub struct Registry {
    statuses: RwLock<BTreeMap<String, QueryStatus>>,
    progress: RwLock<HashMap<String, VecDeque<Progress>>>,
    /// Each query's last idle report, if it came after its last batch's.
    idle: RwLock<HashMap<String, Progress>>,
    /// Bumped on every change; waiters (`FLUSH`, `tidemark run`) watch it.
    changed: watch::Sender<u64>,
    /// Listener events, to every subscriber (the wire's `LISTEN`, `tidemark run`).
    events: broadcast::Sender<ListenerEvent>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            statuses: RwLock::default(),
            progress: RwLock::default(),
            idle: RwLock::default(),
            changed: watch::channel(0).0,
            events: broadcast::channel(4096).0,
        }
    }
}

impl Registry {
    pub fn new() -> Arc<Registry> {
        Arc::new(Registry::default())
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v += 1);
    }

    /// Replaces or inserts a query's status.
    pub fn set(&self, status: QueryStatus) {
        self.statuses
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(status.name.clone(), status);
        self.bump();
    }

    /// Changes a query's status in place, if it is known.
    pub fn update(&self, name: &str, f: impl FnOnce(&mut QueryStatus)) {
        if let Some(s) = self
            .statuses
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(name)
        {
            f(s);
        }
        self.bump();
    }

    pub fn remove(&self, name: &str) {
        self.statuses
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        self.progress
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        self.idle
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        self.bump();
    }

    pub fn get(&self, name: &str) -> Option<QueryStatus> {
        self.statuses
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
    }

    pub fn all(&self) -> Vec<QueryStatus> {
        self.statuses
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Records a report. Batches' reports are kept as Spark's `recentProgress` keeps
    /// reports (the last 99); an idle trigger's replaces the query's last idle report
    /// instead, so that a query idle for long keeps its batches' reports (Spark's idle
    /// reports, one per 10 s, would push them all out in 17 minutes).
    pub fn push_progress(&self, p: Progress) {
        if p.idle {
            self.idle
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .insert(p.name.clone(), p);
        } else {
            self.idle
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&p.name);
            let mut map = self.progress.write().unwrap_or_else(|e| e.into_inner());
            let q = map.entry(p.name.clone()).or_default();
            q.push_back(p);
            while q.len() >= RECENT_PROGRESS {
                q.pop_front();
            }
        }
        self.bump();
    }

    /// A query's last report, of a batch or of an idle trigger (Spark's `lastProgress`).
    pub fn last_progress(&self, name: &str) -> Option<Progress> {
        if let Some(idle) = self
            .idle
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
        {
            return Some(idle.clone());
        }
        self.progress
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .and_then(|q| q.back().cloned())
    }

    /// A query's kept batch reports, oldest first.
    pub fn recent_progress(&self, name: &str) -> Vec<Progress> {
        self.progress
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .map(|q| q.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Posts a listener event to every subscriber.
    pub fn post(&self, event: ListenerEvent) {
        // No subscriber is no error.
        let _ = self.events.send(event);
    }

    /// A receiver of every listener event posted from now on.
    pub fn events(&self) -> broadcast::Receiver<ListenerEvent> {
        self.events.subscribe()
    }

    /// Every kept batch report, by query name then batch.
    pub fn all_progress(&self) -> Vec<Progress> {
        let map = self.progress.read().unwrap_or_else(|e| e.into_inner());
        let mut names: Vec<&String> = map.keys().collect();
        names.sort();
        names
            .into_iter()
            .flat_map(|n| map[n].iter().cloned())
            .collect()
    }

    /// A receiver that sees every change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_percentiles_are_nearest_rank_over_rows() {
        use crate::source::Arrival;
        let a = |at_ms, rows| Arrival { at_ms, rows };
        // 90 rows 100 ms old, 9 rows 1 s old, 1 row 5 s old.
        let l = latency_percentiles(&[a(900, 90), a(0, 9), a(-4000, 1)], 1000).unwrap();
        assert_eq!((l.p50, l.p95, l.p99, l.max), (100, 1000, 1000, 5000));
        // One row: every percentile is its latency; arrivals after the commit count as 0.
        let l = latency_percentiles(&[a(2000, 1)], 1000).unwrap();
        assert_eq!((l.p50, l.max), (0, 0));
        assert_eq!(latency_percentiles(&[a(0, 0)], 1000), None);
        assert_eq!(latency_percentiles(&[], 1000), None);
    }

    #[test]
    fn recent_progress_keeps_99_as_spark_does() {
        let r = Registry::default();
        for b in 0..150 {
            r.push_progress(Progress {
                id: Uuid::nil(),
                run_id: Uuid::nil(),
                name: "q".into(),
                timestamp: Utc::now(),
                batch_id: BatchId(b),
                batch_duration: 0,
                num_input_rows: 0,
                input_rows_per_second: 0.0,
                processed_rows_per_second: 0.0,
                duration_ms: BTreeMap::new(),
                event_time: None,
                state_operators: vec![],
                sources: vec![],
                sink: SinkProgress {
                    description: "s".into(),
                    num_output_rows: 0,
                },
                end_to_end_latency_ms: None,
                watermark_lag_ms: None,
                idle: false,
            });
        }
        let kept = r.recent_progress("q");
        assert_eq!(kept.len(), 99);
        assert_eq!(kept[0].batch_id, BatchId(51));
        assert_eq!(r.last_progress("q").unwrap().batch_id, BatchId(149));
        // An idle report is the last report until the next batch, and evicts nothing.
        let mut idle = kept[98].clone();
        idle.batch_id = BatchId(150);
        idle.idle = true;
        for _ in 0..200 {
            r.push_progress(idle.clone());
        }
        assert!(r.last_progress("q").unwrap().idle);
        assert_eq!(r.recent_progress("q").len(), 99);
        let mut next = kept[98].clone();
        next.batch_id = BatchId(150);
        r.push_progress(next);
        assert!(!r.last_progress("q").unwrap().idle);
    }

    #[test]
    fn rates_round_half_up_to_one_decimal() {
        assert_eq!(round_rate(1.5876), 1.6);
        assert_eq!(round_rate(0.05), 0.1);
        assert_eq!(round_rate(69230769.24), 69230769.2);
        assert_eq!(round_rate(f64::INFINITY), 0.0);
    }

    /// Spark 4.3.0's own reports of the seed pipeline run through Spark Connect (captured
    /// from the Connect server by `tidemark::engine::spark_query`'s trace log).
    #[test]
    fn spark_connect_reports_become_tidemark_reports() {
        let text = include_str!("../../sql/data/spark/progress-seed.jsonl");
        let now = DateTime::parse_from_rfc3339("2026-12-04T15:30:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let reports: Vec<Progress> = text
            .lines()
            .map(|l| Progress::from_spark_json(l, now).unwrap())
            .collect();
        let raw: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(reports.len(), 3);
        for (p, r) in reports.iter().zip(&raw) {
            assert_eq!(p.batch_id.get(), r["batchId"].as_u64().unwrap());
            assert_eq!(p.id.to_string(), r["id"].as_str().unwrap());
            // The totals Spark Connect leaves out are the sources' sums.
            let source_rows: u64 = r["sources"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["numInputRows"].as_u64().unwrap())
                .sum();
            assert_eq!(p.num_input_rows, source_rows);
            assert!(!p.idle, "every one ran addBatch");
            // Offsets arrive as JSON text and are kept as JSON.
            let end = r["sources"][0]["endOffset"].as_str().unwrap();
            assert_eq!(
                p.sources[0].end_offset,
                Some(serde_json::from_str::<serde_json::Value>(end).unwrap())
            );
            assert_eq!(
                format_ts(p.event_time.as_ref().unwrap().watermark),
                r["eventTime"]["watermark"].as_str().unwrap()
            );
            // Spark's -1 for a snapshot not uploaded yet survives.
            let op = &r["stateOperators"][0]["customMetrics"];
            for (k, v) in op.as_object().unwrap() {
                assert_eq!(
                    p.state_operators[0].custom_metrics.get(k).copied(),
                    v.as_i64()
                );
            }
        }
        // Before the first watermark there is no lag; after it, now less the watermark.
        assert_eq!(reports[0].watermark_lag_ms, None);
        let wm = reports[1].event_time.as_ref().unwrap().watermark;
        assert_eq!(
            reports[1].watermark_lag_ms,
            Some((now - wm).num_milliseconds())
        );
        // And they serialize back with Spark's keys.
        let back: serde_json::Value = serde_json::from_str(&reports[1].to_json()).unwrap();
        assert_eq!(back["batchId"], raw[1]["batchId"]);
        assert_eq!(
            back["stateOperators"][0]["numRowsTotal"],
            raw[1]["stateOperators"][0]["numRowsTotal"]
        );

        // A query without a watermark: Spark's `"eventTime": {}` is no event time.
        let text = include_str!("../../sql/data/spark/progress-no-watermark.json");
        let raw: serde_json::Value = serde_json::from_str(text).unwrap();
        assert_eq!(raw["eventTime"], serde_json::json!({}));
        let p = Progress::from_spark_json(text, now).unwrap();
        assert!(p.event_time.is_none() && p.watermark_lag_ms.is_none());
        assert_eq!(
            p.num_input_rows,
            raw["sources"][0]["numInputRows"].as_u64().unwrap()
        );
    }
}
