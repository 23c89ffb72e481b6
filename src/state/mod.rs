//! State stores: the durable state of stateful operators, versioned by batch.
//!
//! State is a set of Arrow rows whose first `key_columns` columns are a unique key (for the
//! window aggregate: window start, window end, the group keys; then the aggregates'
//! partial states). Batch `N` loads version `N` and commits version `N + 1`, as Spark does,
//! so a replayed batch recomputes its version from the one before (spec §1.5, §9.1).
//!
//! Both stores encode rows as byte keys and values with [`codec::Codec`] (Arrow's row
//! format), a batch at a time:
//! - [`memory::MemoryState`] (the default, `state_store = 'memory'`): a hash table over
//!   keys packed into per-time-bucket arenas, so that eviction by the watermark drops whole
//!   buckets; made durable by one delta file per version and a snapshot every
//!   [`SNAPSHOT_INTERVAL`] versions;
//! - [`kv::KvState`] over `rocks::RocksBackend` (`state_store = 'rocksdb'`, cargo feature
//!   `rocksdb`): a RocksDB database on disk, ordered by time where eviction allows it, made
//!   durable by one changelog file per version and a RocksDB checkpoint every
//!   [`SNAPSHOT_INTERVAL`] versions, so memory stays bounded however many keys the state
//!   holds.
//!
//! The operator reads only what a batch needs: the stored rows of the keys it touched
//! ([`StateStore::get`]), the sessions of its group keys ([`StateStore::get_groups`]), the
//! rows the watermark has closed ([`StateStore::expired`], through a time index), and for
//! complete mode every row ([`StateStore::rows`]).

pub mod codec;
pub mod kv;
pub mod memory;
#[cfg(feature = "rocksdb")]
pub mod rocks;
#[cfg(test)]
mod tests;

use std::path::Path;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;

use crate::error::{Error, Result};

/// A new snapshot every this many versions (memory store), unless
/// `TIDEMARK_STATE_SNAPSHOT_INTERVAL` says otherwise.
pub const SNAPSHOT_INTERVAL: u64 = 10;

/// The snapshot interval in effect: [`SNAPSHOT_INTERVAL`] or the environment's.
pub fn snapshot_interval() -> u64 {
    std::env::var("TIDEMARK_STATE_SNAPSHOT_INTERVAL")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(SNAPSHOT_INTERVAL)
}

/// The version of the on-disk state encoding of the memory store.
pub const MEMORY_FORMAT_VERSION: u32 = 2;
/// The version of the on-disk state of the RocksDB store (3: changelogs between RocksDB
/// checkpoints, rows ordered by time where they can be).
pub const ROCKSDB_FORMAT_VERSION: u32 = 3;

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

/// Which store keeps a sink's state (`state_store = ...`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    #[default]
    Memory,
    Rocksdb,
}

impl StoreKind {
    pub fn parse(s: &str) -> Result<StoreKind> {
        match s.to_ascii_lowercase().as_str() {
            "memory" => Ok(StoreKind::Memory),
            "rocksdb" => {
                if cfg!(feature = "rocksdb") {
                    Ok(StoreKind::Rocksdb)
                } else {
                    Err(Error::Unsupported {
                        message: "state_store = 'rocksdb' needs a build with the rocksdb feature"
                            .into(),
                        hint: Some(
                            "Rebuild with `cargo build --release --features rocksdb`, or use \
                             state_store = 'memory'."
                                .into(),
                        ),
                    })
                }
            }
            other => Err(Error::InvalidOption {
                message: format!("unknown state_store '{other}'"),
                hint: Some("state_store is 'memory' or 'rocksdb'.".into()),
            }),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            StoreKind::Memory => "memory",
            StoreKind::Rocksdb => "rocksdb",
        }
    }

    /// The version of the store's on-disk format.
    pub fn format_version(self) -> u32 {
        match self {
            StoreKind::Memory => MEMORY_FORMAT_VERSION,
            StoreKind::Rocksdb => ROCKSDB_FORMAT_VERSION,
        }
    }
}

/// The shape of an operator's state rows.
#[derive(Debug, Clone)]
pub struct StateLayout {
    pub schema: SchemaRef,
    /// The first `key_columns` columns are the key.
    pub key_columns: usize,
    /// The first `window_columns` key columns are the window (0 or 2); the rest of the key
    /// is the group, which [`StateStore::get_groups`] looks up.
    pub window_columns: usize,
    /// The key column whose time closes a row (window end, or a grouped event-time
    /// column), if the watermark evicts.
    pub time_column: Option<usize>,
    /// Keys are spread over this many partitions, fixed by the checkpoint.
    pub partitions: usize,
    /// Whether the operator looks rows up by group ([`StateStore::get_groups`]: sessions,
    /// join sides). Without it a store may order rows by time rather than by key.
    pub group_lookups: bool,
}

impl StateLayout {
    /// Whether rows can be ordered by time first: their time is part of the key, and
    /// nobody looks them up by group.
    pub fn orders_by_time(&self) -> bool {
        self.time_column.is_some_and(|c| c < self.key_columns) && !self.group_lookups
    }
}

/// Opens the store of kind `kind` in `dir` (the operator's state directory).
pub fn open(kind: StoreKind, dir: &Path, layout: StateLayout) -> Result<Box<dyn StateStore>> {
    match kind {
        StoreKind::Memory => Ok(Box::new(memory::MemoryState::open(dir, layout)?)),
        #[cfg(feature = "rocksdb")]
        StoreKind::Rocksdb => {
            let backend = rocks::RocksBackend::new(dir)?;
            Ok(Box::new(kv::KvState::open(dir, layout, kind, backend)?))
        }
        #[cfg(not(feature = "rocksdb"))]
        StoreKind::Rocksdb => StoreKind::parse("rocksdb").and_then(|_| {
            Err(Error::Internal(
                "rocksdb accepted by a build without it".into(),
            ))
        }),
    }
}

/// Every entry of the operator state in `dir` at `version`, as the stored key and value
/// bytes, in key order: for tests and tools that compare states.
pub fn dump(dir: &Path, version: u64) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    match codec::stored_kind(dir)? {
        StoreKind::Memory => memory::dump(dir, version),
        #[cfg(feature = "rocksdb")]
        StoreKind::Rocksdb => {
            use kv::Backend;
            let mut b = rocks::RocksBackend::new(dir)?;
            b.load(version)?;
            kv::dump(&b)
        }
        #[cfg(not(feature = "rocksdb"))]
        StoreKind::Rocksdb => {
            StoreKind::parse("rocksdb")?;
            Ok(vec![])
        }
    }
}

/// The state of one stateful operator.
pub trait StateStore: Send + Sync {
    /// The schema of state rows: key columns first.
    fn schema(&self) -> SchemaRef;

    /// Makes the state what it was at `version` (0 = empty).
    fn load(&mut self, version: u64) -> Result<()>;

    /// The stored rows whose keys equal those of `keys`' rows (key columns first).
    fn get(&self, keys: &RecordBatch) -> Result<RecordBatch>;

    /// The stored rows whose group (the key columns after the window) equals that of one of
    /// `rows`' rows.
    fn get_groups(&self, rows: &RecordBatch) -> Result<RecordBatch>;

    /// The stored rows whose time column is at or before `wm_us` (never those without time).
    fn expired(&self, wm_us: i64) -> Result<RecordBatch>;

    /// Removes the rows whose time column is at or before `wm_us`, and returns them: what
    /// [`StateStore::expired`] then [`StateStore::apply`] do, which stores may do as a range
    /// operation.
    fn evict_expired(&mut self, wm_us: i64) -> Result<RecordBatch> {
        let rows = self.expired(wm_us)?;
        self.apply(&RecordBatch::new_empty(self.schema()), &rows)?;
        Ok(rows)
    }

    /// Every row of the current state.
    fn rows(&self) -> Result<Vec<RecordBatch>>;

    /// Upserts `rows` (by key) and removes the rows whose keys are in `removed` (a batch
    /// whose first columns are the key columns). Visible at once; durable at commit.
    fn apply(&mut self, rows: &RecordBatch, removed: &RecordBatch) -> Result<()>;

    /// Makes the current state durable as `version`.
    fn commit(&mut self, version: u64) -> Result<StateMetrics>;

    /// Work after the batch's state, sink and offsets are durable (its commit-log entry may
    /// still be being written): snapshots and removal of versions no longer needed. A
    /// crash before or during it loses nothing. It may leave work running on its own
    /// thread; a later `maintain`, `load` or the store's drop waits for it.
    fn maintain(&mut self) -> Result<()>;
}
