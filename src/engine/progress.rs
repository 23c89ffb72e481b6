//! Progress reports (spec §12) and the live status of every streaming query.
//!
//! The registry is the one place the trigger loops publish to and the system tables
//! (`tidemark.queries`, `tidemark.progress`), `SHOW QUERIES` and `FLUSH` read from.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, RwLock};

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio::sync::watch;
use uuid::Uuid;

use crate::types::BatchId;

/// How many progress reports are kept per query.
pub const RECENT_PROGRESS: usize = 100;

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
    /// The trigger number of the last trigger that found no new data.
    pub last_idle_trigger: u64,
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
            last_idle_trigger: 0,
        }
    }
}

/// One source's part of a progress report.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceProgress {
    pub description: String,
    pub start_offset: Option<serde_json::Value>,
    pub end_offset: Option<serde_json::Value>,
    pub latest_offset: Option<serde_json::Value>,
    pub num_input_rows: u64,
    pub input_rows_per_second: f64,
    pub processed_rows_per_second: f64,
    /// Spark's custom source metrics (strings): here `numMalformedRows` (records that did
    /// not parse: kept as NULL rows in PERMISSIVE mode, dropped in DROPMALFORMED) and
    /// `numMissingFiles` (files gone before they were read); the file source also reports
    /// `numFilesReadAhead` (files decoded while the previous batch ran).
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
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SinkProgress {
    pub description: String,
    /// Rows written by this batch. Spark reports -1 for Delta; Tidemark counts them.
    pub num_output_rows: i64,
}

/// `eventTime` of a progress report: the batch's event-time statistics (data batches only)
/// and the watermark in force during the batch, `WM(N)`.
#[derive(Debug, Clone, Serialize)]
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
#[derive(Debug, Clone, Serialize)]
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
    /// The operator's own counters (`numDroppedDuplicateRows`, ...), by name.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub custom_metrics: std::collections::BTreeMap<String, u64>,
}

/// A progress report, serialized in Spark's `StreamingQueryProgress` key order.
#[derive(Debug, Clone, Serialize)]
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
    pub num_input_rows: u64,
    pub input_rows_per_second: f64,
    pub processed_rows_per_second: f64,
    /// Phase durations, ms; keys sorted.
    pub duration_ms: BTreeMap<String, u64>,
    /// Present iff the query has a watermark.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_time: Option<EventTimeProgress>,
    pub state_operators: Vec<StateOperatorProgress>,
    pub sources: Vec<SourceProgress>,
    pub sink: SinkProgress,
}

impl Progress {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
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
    /// Bumped on every change; waiters (`FLUSH`, `tidemark run`) watch it.
    changed: watch::Sender<u64>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            statuses: RwLock::default(),
            progress: RwLock::default(),
            changed: watch::channel(0).0,
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

    /// Records a batch's report, keeping the last [`RECENT_PROGRESS`].
    pub fn push_progress(&self, p: Progress) {
        {
            let mut map = self.progress.write().unwrap_or_else(|e| e.into_inner());
            let q = map.entry(p.name.clone()).or_default();
            if q.len() >= RECENT_PROGRESS {
                q.pop_front();
            }
            q.push_back(p);
        }
        self.bump();
    }

    /// Every kept report, by query name then batch.
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
    fn rates_round_half_up_to_one_decimal() {
        assert_eq!(round_rate(1.5876), 1.6);
        assert_eq!(round_rate(0.05), 0.1);
        assert_eq!(round_rate(69230769.24), 69230769.2);
        assert_eq!(round_rate(f64::INFINITY), 0.0);
    }
}
