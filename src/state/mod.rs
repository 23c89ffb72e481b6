//! State stores: the durable state of stateful operators, versioned by batch.
//!
//! State is a set of Arrow rows whose first `key_columns` columns are a unique key (for the
//! window aggregate: window start, window end, the group keys; then the aggregates'
//! partial states). Batch `N` loads version `N` and commits version `N + 1`, as Spark does,
//! so a replayed batch recomputes its version from the one before (spec §1.5, §9.1).
//!
//! [`memory::MemoryStateStore`] is the default: everything in memory, made durable by one
//! delta file per batch and partition plus a snapshot every [`SNAPSHOT_INTERVAL`] versions
//! under `<checkpoint>/state/<operator>/<partition>/`. Keys are spread over a fixed number
//! of partitions (`state_partitions`), which a checkpoint fixes once it exists (§9.3).

pub mod memory;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;

use crate::error::Result;

/// A new snapshot every this many versions.
pub const SNAPSHOT_INTERVAL: u64 = 10;

/// The version of the on-disk state encoding.
pub const STATE_FORMAT_VERSION: u32 = 1;

/// What a commit changed, for progress reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StateMetrics {
    /// Keys in state after the commit.
    pub rows_total: u64,
    /// Keys written by this version.
    pub rows_updated: u64,
    /// Keys removed by this version.
    pub rows_removed: u64,
    /// Approximate memory held.
    pub memory_bytes: u64,
    /// Time to make the version durable.
    pub commit_ms: u64,
}

/// The state of one stateful operator.
pub trait StateStore: Send + Sync {
    /// The schema of state rows: key columns first.
    fn schema(&self) -> SchemaRef;

    /// Makes the state what it was at `version` (0 = empty).
    fn load(&mut self, version: u64) -> Result<()>;

    /// Every row of the current state.
    fn rows(&self) -> Result<Vec<RecordBatch>>;

    /// Upserts `rows` (by key) and removes the rows whose keys are in `removed` (a batch of
    /// key columns only). Visible to [`StateStore::rows`] at once; durable at commit.
    fn apply(&mut self, rows: &RecordBatch, removed: &RecordBatch) -> Result<()>;

    /// Makes the current state durable as `version`.
    fn commit(&mut self, version: u64) -> Result<StateMetrics>;
}
