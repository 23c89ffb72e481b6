//! Materialized views (`CREATE MATERIALIZED VIEW`): a streaming query's result kept in
//! memory, indexed by its group key, durable through a log of its batches, and read as a
//! table as of one whole batch.
//!
//! What a batch does to the view follows what the query writes ([`QueryOutput`]): a query
//! that selects its whole group key is kept *keyed*, one row per key, each batch's rows
//! upserted by key (update mode: the latest row of every group, including the groups whose
//! operator state the watermark has evicted; append mode: each group once, when final).
//! Complete mode replaces the rows every batch; a query without aggregation appends them.
//! With a [`Retention`], a batch then removes the rows that were final long enough before
//! its watermark.
//!
//! Durability: a batch's rows are applied and shown, then written whole to
//! `<dir>/log/<batch>.arrow` (Arrow IPC, atomically, with the batch's watermark in its
//! metadata): that file is the batch's commit, so a batch replayed after a crash finds it
//! and changes nothing. Showing a batch before its file is safe because the engine hands
//! the view a batch only once the batch's offsets are in the checkpoint's write-ahead log
//! and its input is durable: a crash replays exactly that batch, so no reader ever sees a
//! row that a restart loses. Every [`SNAPSHOT_EVERY`] batches the contents are written to
//! `<dir>/snapshot/<batch>.arrow` and the log files it covers are removed; opening a view
//! reads its newest snapshot and applies the log files after it, never the streams' raw
//! rows.
//!
//! Reads: the contents are persistent maps and vectors (`imbl`), so a batch builds the next
//! [`Snapshot`] sharing all but what it changed, and swaps it in. A reader takes the
//! current snapshot (an `Arc` clone under a lock held for nothing else): it sees one
//! whole batch, never blocks the writer and is never blocked by it. A keyed view's map
//! is ordered by its key in Arrow's row format, time columns first: filters on key
//! columns are answered through that order ([`KeyRead`]): lookups for fixed values,
//! ranges for bounds, and seeks through the distinct values of a leading column that no
//! filter constrains (a skip scan).

use std::collections::HashMap;
use std::fmt;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex, OnceLock, RwLock};

use async_trait::async_trait;
use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch};
use datafusion::arrow::compute::{cast, filter_record_batch};
use datafusion::arrow::datatypes::{DataType, Int64Type, SchemaRef, TimeUnit};
use datafusion::arrow::ipc::reader::FileReader;
use datafusion::arrow::ipc::writer::FileWriter;
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::catalog::Session;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::logical_expr::{Expr, Operator, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::scalar::ScalarValue;

use super::{BatchInfo, QueryOutput, RowTime, Sink, SinkCommit, WriteMode};
use crate::error::{Error, Result};
use crate::fsutil;
use crate::sql::options::{Options, parse_duration};
use crate::state::StoreKind;
use crate::types::BatchId;

#[cfg(feature = "rocksdb")]
mod rocks;

/// How many batches the log holds before the contents are written as a snapshot.
pub const SNAPSHOT_EVERY: u64 = 100;

/// Rows per Arrow batch when a keyed view is scanned.
const SCAN_BATCH_ROWS: usize = 8192;

/// The log files' metadata key for the batch's watermark (ms).
const WATERMARK_KEY: &str = "tidemark.watermark_ms";

/// The open views of this process, by directory: the query that writes a view and the
/// table that reads it share one store.
static STORES: LazyLock<Mutex<HashMap<PathBuf, Arc<ViewStore>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// Opens the view kept in `dir` (loading it on first use in this process) for the rows
/// `output` describes; `options` are the view's (its `retention`).
pub fn open(dir: &Path, output: &QueryOutput, options: &Options) -> Result<Arc<ViewStore>> {
    let retention = Retention::from_options(options, output)?;
    let kind = StoreKind::parse(options.get("state_store").unwrap_or("memory"))?;
    let mut stores = STORES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(s) = stores.get(dir)
        && s.output == *output
        && s.retention == retention
        && s.kind == kind
    {
        return Ok(s.clone());
    }
    // The old store's files go to the new one: its database closes first.
    stores.remove(dir);
    let store = Arc::new(ViewStore::load_in(dir, output.clone(), retention, kind)?);
    stores.insert(dir.to_path_buf(), store.clone());
    Ok(store)
}

/// Forgets the view kept in `dir` (`DROP MATERIALIZED VIEW`); readers that hold one of its
/// snapshots keep it. A snapshot being written in the background stops before its file.
pub fn forget(dir: &Path) {
    if let Some(s) = STORES.lock().unwrap_or_else(|e| e.into_inner()).remove(dir) {
        s.dropped.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A view's `retention`: a batch removes the rows that were final `keep_us` before its
/// watermark. A window is final once the watermark reaches its end, so a windowed row goes
/// when `end + keep <= watermark`; a row without aggregation once the watermark passes its
/// event time, so it goes when `event_time + keep < watermark` (it would be late by
/// `keep`). Before the first watermark nothing is removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retention {
    pub time: RowTime,
    pub keep_us: i64,
}

impl Retention {
    /// The view's `retention` option, checked against what its query writes.
    pub fn from_options(options: &Options, output: &QueryOutput) -> Result<Option<Retention>> {
        let Some(text) = options.get("retention") else {
            return Ok(None);
        };
        let keep = parse_duration(text)?;
        if output.mode == WriteMode::Overwrite {
            return Err(Error::invalid_option(
                "retention does not apply to a view in complete mode: each batch replaces the \
                 whole view",
            ));
        }
        let time = output.time.clone().ok_or_else(|| Error::InvalidOption {
            message: "retention needs a column that says when a row is final, and the view's \
                      query has none"
                .into(),
            hint: Some(
                "Select the window (window, window.start or window.end) of a windowed \
                 aggregation or, without aggregation, the watermarked column."
                    .into(),
            ),
        })?;
        Ok(Some(Retention {
            time,
            keep_us: i64::try_from(keep.as_micros()).unwrap_or(i64::MAX),
        }))
    }

    /// Rows whose time is below this go at `watermark_ms`; `None` before a watermark.
    fn cutoff_us(&self, watermark_ms: i64) -> Option<i64> {
        if watermark_ms <= 0 {
            return None;
        }
        let bound = watermark_ms
            .saturating_mul(1000)
            .saturating_sub(self.keep_us);
        Some(match self.time {
            RowTime::WindowEnd { .. } => bound.saturating_add(1),
            RowTime::EventTime { .. } => bound,
        })
    }

    /// Each row's time in µs (a window's end), null where the row has none.
    fn times(&self, batch: &RecordBatch) -> Result<Vec<Option<i64>>> {
        let (column, field, plus) = match &self.time {
            RowTime::WindowEnd {
                column,
                field,
                plus_us,
            } => (column, field.as_deref(), *plus_us),
            RowTime::EventTime { column } => (column, None, 0),
        };
        let missing = || Error::Internal(format!("view retention column {column} is missing"));
        let mut array = batch.column_by_name(column).ok_or_else(missing)?.clone();
        if let Some(f) = field {
            array = array
                .as_struct_opt()
                .and_then(|s| s.column_by_name(f))
                .ok_or_else(missing)?
                .clone();
        }
        let tz = match array.data_type() {
            DataType::Timestamp(_, tz) => tz.clone(),
            other => {
                return Err(Error::Internal(format!(
                    "view retention column {column} is {other}, not a timestamp"
                )));
            }
        };
        let us = cast(&array, &DataType::Timestamp(TimeUnit::Microsecond, tz))?;
        let us = cast(&us, &DataType::Int64)?;
        Ok(us
            .as_primitive::<Int64Type>()
            .iter()
            .map(|t| t.map(|t| t.saturating_add(plus)))
            .collect())
    }
}

/// A view's rows at one committed batch.
#[derive(Clone)]
pub struct Snapshot {
    /// The last batch applied; `None` before the first.
    pub batch: Option<BatchId>,
    contents: Contents,
    /// The rows as Arrow batches, built by the first full scan of this snapshot.
    scanned: Arc<OnceLock<Vec<RecordBatch>>>,
}

#[derive(Clone)]
enum Contents {
    /// Rows as the batches wrote them (complete mode, and queries without aggregation).
    Rows(imbl::Vector<Chunk>),
    /// Each group's latest row (the whole row, in Arrow's row format) by its key; with a
    /// retention, the keys by row time too.
    Keyed {
        rows: imbl::OrdMap<RowBytes, RowBytes>,
        by_time: imbl::OrdSet<(i64, RowBytes)>,
    },
    /// A keyed view in RocksDB (`state_store = 'rocksdb'`): the rows are on disk, read
    /// through the store's reader, which sees the newest whole batch. Built only with the
    /// rocksdb feature.
    #[cfg_attr(not(feature = "rocksdb"), allow(dead_code))]
    Stored { rows: u64 },
}

/// Rows of one batch.
#[derive(Clone)]
struct Chunk {
    rows: RecordBatch,
    /// The oldest row time, with a retention.
    oldest: Option<i64>,
}

impl Snapshot {
    /// How many rows the view holds.
    pub fn num_rows(&self) -> usize {
        match &self.contents {
            Contents::Rows(v) => v.iter().map(|c| c.rows.num_rows()).sum(),
            Contents::Keyed { rows, .. } => rows.len(),
            Contents::Stored { rows } => usize::try_from(*rows).unwrap_or(usize::MAX),
        }
    }
}

/// Bytes in Arrow's row format, shared between snapshots.
type RowBytes = Arc<[u8]>;

/// The rows of a keyed view in and out of Arrow's row format.
struct KeyCodec {
    /// The key columns, by index in the view's schema, timestamps first; empty for a
    /// global aggregate (one row).
    key_columns: Vec<usize>,
    keys: Option<RowConverter>,
    /// Each key column alone, in `key_columns` order: a key is the concatenation of its
    /// columns' encodings, so the first `j` of them are a prefix of every key that has
    /// those values.
    columns: Vec<RowConverter>,
    rows: RowConverter,
}

impl KeyCodec {
    fn new(schema: &SchemaRef, key_names: &[String]) -> Result<KeyCodec> {
        let mut key_columns = key_names
            .iter()
            .map(|k| {
                schema.index_of(k).map_err(|_| {
                    Error::Internal(format!("view key column {k} is not in the view's rows"))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        // Time first, so that a range of windows is a range of keys.
        key_columns
            .sort_by_key(|&i| !matches!(schema.field(i).data_type(), DataType::Timestamp(..)));
        let field = |i: usize| SortField::new(schema.field(i).data_type().clone());
        let keys = match key_columns.is_empty() {
            true => None,
            false => Some(RowConverter::new(
                key_columns.iter().map(|&i| field(i)).collect(),
            )?),
        };
        let columns = key_columns
            .iter()
            .map(|&i| RowConverter::new(vec![field(i)]))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let rows = RowConverter::new((0..schema.fields().len()).map(field).collect())?;
        Ok(KeyCodec {
            key_columns,
            keys,
            columns,
            rows,
        })
    }

    /// Each row's key, then each whole row.
    fn encode(&self, batch: &RecordBatch) -> Result<Vec<(RowBytes, RowBytes)>> {
        let rows = self.rows.convert_columns(batch.columns())?;
        let keys = match &self.keys {
            Some(conv) => {
                let cols: Vec<ArrayRef> = self
                    .key_columns
                    .iter()
                    .map(|&i| batch.column(i).clone())
                    .collect();
                Some(conv.convert_columns(&cols)?)
            }
            None => None,
        };
        Ok((0..batch.num_rows())
            .map(|i| {
                let key: Arc<[u8]> = match &keys {
                    Some(k) => Arc::from(k.row(i).as_ref()),
                    None => Arc::from(&[][..]),
                };
                (key, Arc::from(rows.row(i).as_ref()))
            })
            .collect())
    }

    /// One value of key column `j` in its row format, as the prefix that follows the
    /// first `j` columns' in the keys that have it; `None` if the value does not convert
    /// to the column's type and back unchanged (then it cannot narrow what is read).
    fn column_value(&self, schema: &SchemaRef, j: usize, value: &ScalarValue) -> Option<Vec<u8>> {
        if value.is_null() {
            return None;
        }
        let array = value.to_array_of_size(1).ok()?;
        let cast_to = cast(&array, schema.field(self.key_columns[j]).data_type()).ok()?;
        let back =
            ScalarValue::try_from_array(&cast(&cast_to, &value.data_type()).ok()?, 0).ok()?;
        if back != *value || cast_to.is_null(0) {
            return None;
        }
        let rows = self.columns[j].convert_columns(&[cast_to]).ok()?;
        Some(rows.row(0).as_ref().to_vec())
    }

    /// The smallest encoding above a NULL of key column `j` (NULLs sort first).
    fn above_null(&self, schema: &SchemaRef, j: usize) -> Option<Vec<u8>> {
        let data_type = schema.field(self.key_columns[j]).data_type();
        let nulls = datafusion::arrow::array::new_null_array(data_type, 1);
        let rows = self.columns[j].convert_columns(&[nulls]).ok()?;
        prefix_successor(rows.row(0).as_ref())
    }

    /// The encoding of key column `j` within `key`, which starts at `at` (after the
    /// encodings of columns `..j`).
    fn column_of(&self, schema: &SchemaRef, key: &[u8], j: usize, at: usize) -> Result<Vec<u8>> {
        // A fixed-width value is a null byte and the value's bytes (arrow-row's format):
        // sliced, not decoded. The time columns, which come first, are such.
        use DataType::*;
        let data_type = schema.field(self.key_columns[j]).data_type();
        let fixed = matches!(
            data_type,
            Int8 | Int16
                | Int32
                | Int64
                | UInt8
                | UInt16
                | UInt32
                | UInt64
                | Float32
                | Float64
                | Timestamp(..)
                | Date32
                | Date64
                | Time32(_)
                | Time64(_)
                | Duration(_)
        );
        if let Some(width) = data_type.primitive_width().filter(|_| fixed)
            && key.len() >= at + 1 + width
        {
            return Ok(key[at..at + 1 + width].to_vec());
        }
        let conv = self
            .keys
            .as_ref()
            .ok_or_else(|| Error::Internal("a view without key columns has no keys".into()))?;
        let parser = conv.parser();
        let cols = conv.convert_rows(std::iter::once(parser.parse(key)))?;
        let rows = self.columns[j].convert_columns(&[cols[j].clone()])?;
        Ok(rows.row(0).as_ref().to_vec())
    }

    /// Whole rows back into Arrow batches.
    fn decode<'a>(
        &self,
        schema: &SchemaRef,
        rows: impl Iterator<Item = &'a Arc<[u8]>>,
    ) -> Result<Vec<RecordBatch>> {
        let parser = self.rows.parser();
        let mut out = Vec::new();
        let mut chunk: Vec<&[u8]> = Vec::with_capacity(SCAN_BATCH_ROWS);
        let mut flush = |chunk: &mut Vec<&[u8]>| -> Result<()> {
            if !chunk.is_empty() {
                let cols = self
                    .rows
                    .convert_rows(chunk.iter().map(|r| parser.parse(r)))?;
                out.push(RecordBatch::try_new(schema.clone(), cols)?);
                chunk.clear();
            }
            Ok(())
        };
        for r in rows {
            chunk.push(r);
            if chunk.len() == SCAN_BATCH_ROWS {
                flush(&mut chunk)?;
            }
        }
        flush(&mut chunk)?;
        Ok(out)
    }
}

/// The smallest byte string above every string that starts with `prefix`; `None` when
/// there is none (all bytes 0xFF).
fn prefix_successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let last = prefix.iter().rposition(|&b| b < 0xFF)?;
    let mut out = prefix[..=last].to_vec();
    out[last] += 1;
    Some(out)
}

/// One materialized view: its current snapshot and its log.
pub struct ViewStore {
    dir: PathBuf,
    output: QueryOutput,
    retention: Option<Retention>,
    /// Where a keyed view's rows live; other views are kept in memory.
    kind: StoreKind,
    codec: Option<KeyCodec>,
    /// A keyed view's rows in RocksDB, read beside the writer.
    #[cfg(feature = "rocksdb")]
    stored: Option<crate::state::rocks::RocksReader>,
    current: RwLock<Arc<Snapshot>>,
    /// One batch at a time.
    writer: tokio::sync::Mutex<LogState>,
    /// The snapshot being written in the background, if any.
    snapshotting: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Set by `DROP MATERIALIZED VIEW`: no more snapshots.
    dropped: std::sync::atomic::AtomicBool,
}

impl fmt::Debug for ViewStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ViewStore")
            .field("dir", &self.dir)
            .field("mode", &self.output.mode)
            .finish()
    }
}

/// What the writer knows of the view's files.
#[derive(Default)]
struct LogState {
    /// The last batch whose log file (or snapshot) is written: the view's durable point,
    /// which the shown snapshot may be one batch ahead of.
    logged: Option<BatchId>,
    /// Batches logged since the last snapshot.
    since_snapshot: u64,
    /// A keyed view's rows in RocksDB: the database's writer.
    #[cfg(feature = "rocksdb")]
    stored: Option<rocks::RocksWriter>,
}

fn log_dir(dir: &Path) -> PathBuf {
    dir.join("log")
}

fn snapshot_dir(dir: &Path) -> PathBuf {
    dir.join("snapshot")
}

fn numbered_file(dir: &Path, n: u64) -> PathBuf {
    dir.join(format!("{n:020}.arrow"))
}

/// Removes the hidden temporary files a crash left in `dir` before their rename.
fn remove_temp_files(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') && name.ends_with(".tmp") {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

impl ViewStore {
    /// A view kept in memory: [`ViewStore::load_in`].
    #[cfg(test)]
    fn load(dir: &Path, output: QueryOutput, retention: Option<Retention>) -> Result<ViewStore> {
        Self::load_in(dir, output, retention, StoreKind::Memory)
    }

    /// Opens the view in `dir`. In memory: reads the newest snapshot and applies the log
    /// after it. A keyed view with `kind` RocksDB opens its database as of its last
    /// logged batch (views of other shapes stay in memory).
    fn load_in(
        dir: &Path,
        output: QueryOutput,
        retention: Option<Retention>,
        kind: StoreKind,
    ) -> Result<ViewStore> {
        let codec = match (&output.keys, &output.mode) {
            (Some(keys), WriteMode::Merge { .. } | WriteMode::Append) => {
                Some(KeyCodec::new(&output.schema, keys)?)
            }
            _ => None,
        };
        // A view that an earlier release kept in memory whatever `state_store` said has a
        // log or snapshot directory: it stays in memory.
        #[cfg(feature = "rocksdb")]
        if kind == StoreKind::Rocksdb
            && codec.is_some()
            && !log_dir(dir).exists()
            && !snapshot_dir(dir).exists()
        {
            let (writer, reader, batch, rows) = rocks::open(dir)?;
            let snapshot = Snapshot {
                batch,
                contents: Contents::Stored { rows },
                scanned: Arc::default(),
            };
            return Ok(ViewStore {
                dir: dir.to_path_buf(),
                output,
                retention,
                kind,
                codec,
                stored: Some(reader),
                current: RwLock::new(Arc::new(snapshot)),
                writer: tokio::sync::Mutex::new(LogState {
                    logged: batch,
                    since_snapshot: 0,
                    stored: Some(writer),
                }),
                snapshotting: Mutex::new(None),
                dropped: std::sync::atomic::AtomicBool::new(false),
            });
        }
        let store = ViewStore {
            dir: dir.to_path_buf(),
            output,
            retention,
            kind,
            codec,
            #[cfg(feature = "rocksdb")]
            stored: None,
            current: RwLock::new(Arc::new(Snapshot {
                batch: None,
                contents: Contents::Rows(imbl::Vector::new()),
                scanned: Arc::default(),
            })),
            writer: tokio::sync::Mutex::new(LogState::default()),
            snapshotting: Mutex::new(None),
            dropped: std::sync::atomic::AtomicBool::new(false),
        };
        remove_temp_files(&log_dir(dir));
        remove_temp_files(&snapshot_dir(dir));
        let mut snap = store.empty();
        let snapshot = fsutil::numbered(&snapshot_dir(dir), ".arrow")?.pop();
        if let Some(n) = snapshot {
            let (rows, wm) = store.read_rows(&numbered_file(&snapshot_dir(dir), n))?;
            snap = store.apply(&snap, BatchId(n), rows, wm)?;
        }
        let mut logged = 0;
        for n in fsutil::numbered(&log_dir(dir), ".arrow")? {
            if snapshot.is_some_and(|s| n <= s) {
                continue;
            }
            let (rows, wm) = store.read_rows(&numbered_file(&log_dir(dir), n))?;
            snap = store.apply(&snap, BatchId(n), rows, wm)?;
            logged += 1;
        }
        let durable = snap.batch;
        *store.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(snap);
        store
            .writer
            .try_lock()
            .map(|mut w| {
                w.logged = durable;
                w.since_snapshot = logged;
            })
            .ok();
        Ok(store)
    }

    fn empty(&self) -> Snapshot {
        Snapshot {
            batch: None,
            contents: match self.codec {
                Some(_) => Contents::Keyed {
                    rows: imbl::OrdMap::new(),
                    by_time: imbl::OrdSet::new(),
                },
                None => Contents::Rows(imbl::Vector::new()),
            },
            scanned: Arc::default(),
        }
    }

    pub fn schema(&self) -> &SchemaRef {
        &self.output.schema
    }

    /// The view as of its last committed batch.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// `base` with batch `batch`'s rows applied, then the retention at `watermark_ms`.
    fn apply(
        &self,
        base: &Snapshot,
        batch: BatchId,
        rows: Vec<RecordBatch>,
        watermark_ms: i64,
    ) -> Result<Snapshot> {
        let rows = rows.into_iter().filter(|b| b.num_rows() > 0);
        let cutoff = self
            .retention
            .as_ref()
            .and_then(|r| r.cutoff_us(watermark_ms));
        let contents = match (&base.contents, &self.codec) {
            (Contents::Keyed { rows: map, by_time }, Some(codec)) => {
                let (mut map, mut by_time) = (map.clone(), by_time.clone());
                for b in rows {
                    let times = match &self.retention {
                        Some(r) => r.times(&b)?,
                        None => Vec::new(),
                    };
                    for (i, (k, v)) in codec.encode(&b)?.into_iter().enumerate() {
                        // A row's time is a function of its key (the window is a key).
                        let new = map.insert(k.clone(), v).is_none();
                        if new && let Some(Some(t)) = times.get(i) {
                            by_time.insert((*t, k));
                        }
                    }
                }
                if let Some(cutoff) = cutoff {
                    while let Some(oldest) = by_time.get_min()
                        && oldest.0 < cutoff
                    {
                        let oldest = oldest.clone();
                        by_time.remove(&oldest);
                        map.remove(&oldest.1);
                    }
                }
                Contents::Keyed { rows: map, by_time }
            }
            (Contents::Rows(v), None) => {
                let mut v = match self.output.mode {
                    WriteMode::Overwrite => imbl::Vector::new(),
                    _ => v.clone(),
                };
                for b in rows {
                    let oldest = match &self.retention {
                        Some(r) => r.times(&b)?.into_iter().flatten().min(),
                        None => None,
                    };
                    v.push_back(Chunk { rows: b, oldest });
                }
                match (cutoff, &self.retention) {
                    (Some(cutoff), Some(r))
                        if v.iter().any(|c| c.oldest.is_some_and(|t| t < cutoff)) =>
                    {
                        Contents::Rows(Self::retain(v, r, cutoff)?)
                    }
                    _ => Contents::Rows(v),
                }
            }
            _ => {
                return Err(Error::Internal(
                    "a view's contents do not fit its mode".into(),
                ));
            }
        };
        Ok(Snapshot {
            batch: Some(batch),
            contents,
            scanned: Arc::default(),
        })
    }

    /// The chunks without their rows older than `cutoff`.
    fn retain(v: imbl::Vector<Chunk>, r: &Retention, cutoff: i64) -> Result<imbl::Vector<Chunk>> {
        let mut out = imbl::Vector::new();
        for c in v {
            if c.oldest.is_none_or(|t| t >= cutoff) {
                out.push_back(c);
                continue;
            }
            let times = r.times(&c.rows)?;
            let keep: BooleanArray = times
                .iter()
                .map(|t| Some(t.is_none_or(|t| t >= cutoff)))
                .collect();
            let rows = filter_record_batch(&c.rows, &keep)?;
            if rows.num_rows() > 0 {
                let oldest = times.into_iter().flatten().filter(|&t| t >= cutoff).min();
                out.push_back(Chunk { rows, oldest });
            }
        }
        Ok(out)
    }

    /// A log or snapshot file's rows and the watermark it was written at.
    fn read_rows(&self, file: &Path) -> Result<(Vec<RecordBatch>, i64)> {
        let f = std::fs::File::open(file)
            .map_err(|e| Error::io(format!("opening {}", file.display()), e))?;
        let corrupt = |e: datafusion::arrow::error::ArrowError| {
            Error::Internal(format!("{}: {e}", file.display()))
        };
        let reader = FileReader::try_new(std::io::BufReader::new(f), None).map_err(corrupt)?;
        let watermark_ms = reader
            .custom_metadata()
            .get(WATERMARK_KEY)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut out = Vec::new();
        for b in reader {
            let b = b.map_err(corrupt)?;
            out.push(RecordBatch::try_new(
                self.output.schema.clone(),
                b.columns().to_vec(),
            )?);
        }
        Ok((out, watermark_ms))
    }

    /// Writes `rows` to `file` atomically, with the watermark they were written at;
    /// `point` names the crash point before the rename.
    fn write_rows(
        file: &Path,
        schema: &SchemaRef,
        rows: &[RecordBatch],
        watermark_ms: i64,
        point: &'static str,
    ) -> Result<()> {
        fsutil::write_atomic_with(
            file,
            |out| {
                let mut w = FileWriter::try_new(out, schema)?;
                w.write_metadata(WATERMARK_KEY, watermark_ms.to_string());
                for b in rows {
                    w.write(b)?;
                }
                w.finish()?;
                Ok(())
            },
            || crate::testing::crash_point(point),
        )
    }

    /// Commits batch `batch` written at `watermark_ms`: shows the new snapshot, then
    /// writes its log file. A batch the view has logged is skipped. Every [`SNAPSHOT_EVERY`]
    /// batches the contents are written as a snapshot in the background, off the commit
    /// path (one at a time; a batch that finds one still running leaves it to the next).
    pub async fn commit(
        self: &Arc<Self>,
        batch: BatchId,
        rows: Vec<RecordBatch>,
        watermark_ms: i64,
    ) -> Result<SinkCommit> {
        let mut writer = self.writer.lock().await;
        if writer.logged.is_some_and(|b| b >= batch) {
            return Ok(SinkCommit::AlreadyCommitted);
        }
        #[cfg(feature = "rocksdb")]
        if let Some(stored) = writer.stored.take() {
            let store = self.clone();
            let (stored, done) = tokio::task::spawn_blocking(move || {
                let mut stored = stored;
                let done = store.commit_stored(&mut stored, batch, &rows, watermark_ms);
                (stored, done)
            })
            .await
            .map_err(|e| Error::Internal(format!("view writer: {e}")))?;
            writer.stored = Some(stored);
            done?;
            writer.logged = Some(batch);
            return Ok(SinkCommit::Committed {
                version: batch.get() as i64,
            });
        }
        let base = self.snapshot();
        // Shown first, logged second: the batch's offsets are already in the write-ahead
        // log and its input is durable, so a crash before the log file replays exactly
        // this batch and a reader can never have seen a row that a restart loses. A
        // batch shown before a failure stopped its log write is only logged.
        let next = if base.batch.is_some_and(|b| b >= batch) {
            base
        } else {
            let next = Arc::new(self.apply(&base, batch, rows.clone(), watermark_ms)?);
            *self.current.write().unwrap_or_else(|e| e.into_inner()) = next.clone();
            next
        };
        let dir = self.dir.clone();
        let schema = self.output.schema.clone();
        tokio::task::spawn_blocking(move || {
            let file = numbered_file(&log_dir(&dir), batch.get());
            Self::write_rows(
                &file,
                &schema,
                &rows,
                watermark_ms,
                "view_log_before_rename",
            )
        })
        .await
        .map_err(|e| Error::Internal(format!("view log writer: {e}")))??;
        crate::testing::crash_point("view_after_log");
        writer.logged = Some(batch);
        writer.since_snapshot += 1;
        // Complete mode's log file holds the whole view: the older ones are garbage.
        if self.output.mode == WriteMode::Overwrite {
            self.write_snapshot(next, watermark_ms).await?;
            writer.since_snapshot = 0;
        } else if writer.since_snapshot >= SNAPSHOT_EVERY && self.start_snapshot(next, watermark_ms)
        {
            writer.since_snapshot = 0;
        }
        Ok(SinkCommit::Committed {
            version: batch.get() as i64,
        })
    }

    /// Commits batch `batch` of a view in RocksDB: writes it to the database as one write
    /// and shows it, then writes its changelog (the batch's commit), then takes a
    /// checkpoint if one is due. Shown before it is logged, for the reason
    /// [`ViewStore::commit`] gives.
    #[cfg(feature = "rocksdb")]
    fn commit_stored(
        &self,
        stored: &mut rocks::RocksWriter,
        batch: BatchId,
        rows: &[RecordBatch],
        watermark_ms: i64,
    ) -> Result<()> {
        let codec = self
            .codec
            .as_ref()
            .ok_or_else(|| Error::Internal("a view in RocksDB without a key".into()))?;
        let cutoff = self
            .retention
            .as_ref()
            .and_then(|r| r.cutoff_us(watermark_ms));
        let count = stored.show(batch, rows, codec, self.retention.as_ref(), cutoff)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(Snapshot {
            batch: Some(batch),
            contents: Contents::Stored { rows: count },
            scanned: Arc::default(),
        });
        crate::testing::crash_point("view_log_before_rename");
        stored.log(batch)?;
        crate::testing::crash_point("view_after_log");
        if let Err(e) = stored.maintain() {
            // The changelogs still hold every batch: the view loses nothing.
            tracing::warn!(view = %self.dir.display(), error = %e, "view checkpoint failed");
        }
        Ok(())
    }

    /// Starts writing `snap` in the background, unless a snapshot is being written.
    fn start_snapshot(self: &Arc<Self>, snap: Arc<Snapshot>, watermark_ms: i64) -> bool {
        let mut running = self.snapshotting.lock().unwrap_or_else(|e| e.into_inner());
        if running.as_ref().is_some_and(|h| !h.is_finished()) {
            return false;
        }
        let store = self.clone();
        *running = Some(tokio::spawn(async move {
            if let Err(e) = store.write_snapshot(snap, watermark_ms).await {
                // The log still holds every batch: the view loses nothing.
                tracing::warn!(view = %store.dir.display(), error = %e, "view snapshot failed");
            }
        }));
        true
    }

    /// Waits for the snapshot being written in the background, if any.
    pub async fn settle(&self) {
        let running = self
            .snapshotting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(h) = running {
            let _ = h.await;
        }
    }

    /// Writes `snap` whole, then removes the log files and snapshots it covers.
    async fn write_snapshot(&self, snap: Arc<Snapshot>, watermark_ms: i64) -> Result<()> {
        let Some(batch) = snap.batch else {
            return Ok(());
        };
        if self.dropped.load(std::sync::atomic::Ordering::SeqCst) {
            return Ok(());
        }
        let dir = self.dir.clone();
        let schema = self.output.schema.clone();
        let rows = if self.output.mode == WriteMode::Overwrite {
            None
        } else {
            Some(self.scan_all(&snap)?)
        };
        tokio::task::spawn_blocking(move || -> Result<()> {
            if let Some(rows) = rows {
                let file = numbered_file(&snapshot_dir(&dir), batch.get());
                Self::write_rows(
                    &file,
                    &schema,
                    &rows,
                    watermark_ms,
                    "view_snapshot_before_rename",
                )?;
                for n in fsutil::numbered(&snapshot_dir(&dir), ".arrow")? {
                    if n < batch.get() {
                        let _ = std::fs::remove_file(numbered_file(&snapshot_dir(&dir), n));
                    }
                }
            }
            for n in fsutil::numbered(&log_dir(&dir), ".arrow")? {
                if n < batch.get() {
                    let _ = std::fs::remove_file(numbered_file(&log_dir(&dir), n));
                }
            }
            Ok(())
        })
        .await
        .map_err(|e| Error::Internal(format!("view snapshot writer: {e}")))?
    }

    /// Every row of `snap`, as Arrow batches (built once per snapshot).
    pub fn scan_all(&self, snap: &Snapshot) -> Result<Vec<RecordBatch>> {
        if let Some(rows) = snap.scanned.get() {
            return Ok(rows.clone());
        }
        let rows = match (&snap.contents, &self.codec) {
            (Contents::Rows(v), _) => v.iter().map(|c| c.rows.clone()).collect(),
            (Contents::Keyed { rows, .. }, Some(codec)) => {
                codec.decode(&self.output.schema, rows.values())?
            }
            (Contents::Keyed { .. }, None) => Vec::new(),
            (Contents::Stored { .. }, _) => {
                // Not kept: the rows are read again from the database each time.
                let mut out = Vec::new();
                self.scan_stored(&[], &mut |b| {
                    out.push(b);
                    true
                })?;
                return Ok(out);
            }
        };
        Ok(snap.scanned.get_or_init(|| rows).clone())
    }

    /// The rows of `snap` that `filters` may keep, found through the key (see
    /// [`KeyRead`]); `None` when the filters constrain no key column, the view is not
    /// keyed, or skipping through the key would take more seeks than a scan is worth.
    fn find(&self, snap: &Snapshot, filters: &[Expr]) -> Result<Option<Vec<RecordBatch>>> {
        let (Contents::Keyed { rows: map, .. }, Some(codec)) = (&snap.contents, &self.codec) else {
            return Ok(None);
        };
        let Some(constraints) = self.constraints(filters) else {
            return Ok(None);
        };
        let schema = &self.output.schema;
        match read_keys(&mut &*map, codec, schema, &constraints, usize::MAX)? {
            Some(found) => codec.decode(schema, found.iter()).map(Some),
            None => Ok(None),
        }
    }

    /// Reads a view in RocksDB as one point in time saw it: through the key where
    /// `filters` allow it (up to [`MAX_STORED_FOUND`] rows), every row otherwise. `emit`
    /// gets the rows as Arrow batches of at most [`SCAN_BATCH_ROWS`], and stops the read
    /// by returning `false`; memory holds one batch at a time.
    #[cfg(feature = "rocksdb")]
    fn scan_stored(
        &self,
        filters: &[Expr],
        emit: &mut dyn FnMut(RecordBatch) -> bool,
    ) -> Result<()> {
        let (Some(reader), Some(codec)) = (&self.stored, &self.codec) else {
            return Err(Error::Internal("a view read as in RocksDB is not".into()));
        };
        let schema = &self.output.schema;
        let mut cursor = rocks::RowsCursor::new(reader);
        if let Some(constraints) = self.constraints(filters)
            && let Some(found) =
                read_keys(&mut cursor, codec, schema, &constraints, MAX_STORED_FOUND)?
        {
            for b in codec.decode(schema, found.iter())? {
                if !emit(b) {
                    break;
                }
            }
            return Ok(());
        }
        let mut chunk = Vec::with_capacity(SCAN_BATCH_ROWS);
        let mut failed = None;
        let mut flush = |chunk: &mut Vec<RowBytes>| -> bool {
            let go = match codec.decode(schema, chunk.iter()) {
                Ok(batches) => batches.into_iter().all(&mut *emit),
                Err(e) => {
                    failed = Some(e);
                    false
                }
            };
            chunk.clear();
            go
        };
        let finished = cursor.range(&[], None, &mut |row| {
            chunk.push(row);
            chunk.len() < SCAN_BATCH_ROWS || flush(&mut chunk)
        })?;
        if finished && !chunk.is_empty() {
            flush(&mut chunk);
        }
        failed.map_or(Ok(()), Err)
    }

    #[cfg(not(feature = "rocksdb"))]
    fn scan_stored(&self, _: &[Expr], _: &mut dyn FnMut(RecordBatch) -> bool) -> Result<()> {
        Err(Error::Internal(
            "a view in RocksDB in a build without it".into(),
        ))
    }

    /// What `filters` allow for each key column; `None` for a view without a key, or
    /// filters that constrain no key column.
    fn constraints(&self, filters: &[Expr]) -> Option<Vec<Constraint>> {
        let codec = self.codec.as_ref()?;
        let schema = &self.output.schema;
        let constraints: Vec<Constraint> = (0..codec.key_columns.len())
            .map(|j| {
                let name = schema.field(codec.key_columns[j]).name();
                Constraint::of(filters, name, |v| codec.column_value(schema, j, v))
                    .without_nulls(|| codec.above_null(schema, j))
            })
            .collect();
        (!constraints.iter().all(|c| matches!(c, Constraint::Any))).then_some(constraints)
    }
}

/// At most this many lookups and seeks answer one scan through a view's key; past them,
/// the view is scanned.
const MAX_KEY_SEEKS: usize = 16_384;

/// A read through the key of a view in RocksDB holds at most this many rows before they go
/// to the query; past them, the view is scanned a batch at a time.
#[cfg(feature = "rocksdb")]
const MAX_STORED_FOUND: usize = 1 << 16;

/// What the filters allow for one key column, in its row format.
#[derive(Debug, PartialEq, Eq)]
enum Constraint {
    Any,
    /// The filters contradict each other.
    Empty,
    /// `k = v` or `k IN (...)`: these values, ascending.
    Values(Vec<Vec<u8>>),
    /// From an inclusive lower to an exclusive upper encoding.
    Range(Option<Vec<u8>>, Option<Vec<u8>>),
}

impl Constraint {
    /// The constraint that `filters` (a conjunction) put on `column`; `encode` gives a
    /// value's encoding, `None` for a value that cannot narrow the read (a NULL, or one
    /// that does not convert to the column's type exactly).
    fn of(
        filters: &[Expr],
        column: &str,
        encode: impl Fn(&ScalarValue) -> Option<Vec<u8>>,
    ) -> Constraint {
        let values = filters.iter().find_map(|f| {
            allowed_values(f, column)?
                .iter()
                .map(&encode)
                .collect::<Option<Vec<_>>>()
        });
        if let Some(mut values) = values {
            values.sort();
            values.dedup();
            return Constraint::Values(values);
        }
        match key_range(filters, column, encode) {
            None => Constraint::Any,
            Some(KeyRange::Empty) => Constraint::Empty,
            Some(KeyRange::Between(lower, upper)) => Constraint::Range(lower, upper),
        }
    }

    /// A comparison holds for no NULL: a range without a lower bound starts above the
    /// NULLs, which sort first (`above_null` gives that encoding).
    fn without_nulls(self, above_null: impl FnOnce() -> Option<Vec<u8>>) -> Constraint {
        match self {
            Constraint::Range(None, upper) => Constraint::Range(above_null(), upper),
            c => c,
        }
    }
}

/// A keyed view's rows in key order, as one read sees them: the in-memory map, or a
/// cursor over the RocksDB store.
trait SortedRows {
    /// The row stored under `key`.
    fn get(&mut self, key: &[u8]) -> Result<Option<RowBytes>>;
    /// The first key at or after `from`.
    fn first_key(&mut self, from: &[u8]) -> Result<Option<Vec<u8>>>;
    /// Calls `f` with each row from `from` up to `end` (excluded), in key order, until `f`
    /// returns `false`; returns whether it went to the end.
    fn range(
        &mut self,
        from: &[u8],
        end: Option<&[u8]>,
        f: &mut dyn FnMut(RowBytes) -> bool,
    ) -> Result<bool>;
}

impl SortedRows for &imbl::OrdMap<RowBytes, RowBytes> {
    fn get(&mut self, key: &[u8]) -> Result<Option<RowBytes>> {
        Ok(imbl::OrdMap::get(*self, key).cloned())
    }

    fn first_key(&mut self, from: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(
            imbl::OrdMap::range::<_, [u8]>(*self, (Bound::Included(from), Bound::Unbounded))
                .next()
                .map(|(k, _)| k.to_vec()),
        )
    }

    fn range(
        &mut self,
        from: &[u8],
        end: Option<&[u8]>,
        f: &mut dyn FnMut(RowBytes) -> bool,
    ) -> Result<bool> {
        let range = (
            Bound::Included(from),
            end.map_or(Bound::Unbounded, Bound::Excluded),
        );
        for (_, v) in imbl::OrdMap::range::<_, [u8]>(*self, range) {
            if !f(v.clone()) {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// One read of a keyed view through its key, column by column. A key is its columns'
/// encodings end to end, so the keys whose first `j` columns have given values are one
/// range of the map, starting with their encodings (the prefix):
/// - where a column's values are fixed (`=`, `IN`), each value extends the prefix;
/// - where a column is bounded (`<`, `>=`, `BETWEEN`, ...) or free and no later column is
///   constrained, the keys between the bounds are read as one range;
/// - where it is bounded or free and a later column is constrained, the read skips through
///   the column's distinct values: it seeks the first key past the last value, takes that
///   key's value, goes on with the next columns, then seeks past it (a skip scan).
///
/// So `page = '/a'` in a view keyed by `(window_start, window_end, page)` costs a few
/// seeks per window, not a scan of every page of every window.
struct KeyRead<'a, R: SortedRows> {
    rows: &'a mut R,
    codec: &'a KeyCodec,
    schema: &'a SchemaRef,
    constraints: &'a [Constraint],
    found: Vec<RowBytes>,
    seeks_left: usize,
    /// At most this many rows are found; past them, the view is scanned.
    max_rows: usize,
}

impl<R: SortedRows> KeyRead<'_, R> {
    /// Reads the keys that start with `prefix` (the encodings of key columns `..j`) and
    /// meet the constraints of columns `j..`; `false` when the seeks or rows ran out.
    fn visit(&mut self, j: usize, prefix: Vec<u8>) -> Result<bool> {
        if self.seeks_left == 0 {
            return Ok(false);
        }
        self.seeks_left -= 1;
        if j == self.constraints.len() {
            if let Some(row) = self.rows.get(&prefix)? {
                self.found.push(row);
            }
            return Ok(self.found.len() <= self.max_rows);
        }
        let (lower, upper) = match &self.constraints[j] {
            Constraint::Empty => return Ok(true),
            Constraint::Values(values) => {
                for v in values {
                    if !self.visit(j + 1, [prefix.as_slice(), v].concat())? {
                        return Ok(false);
                    }
                }
                return Ok(true);
            }
            Constraint::Any => (None, None),
            Constraint::Range(lower, upper) => (lower.as_deref(), upper.as_deref()),
        };
        let start = [prefix.as_slice(), lower.unwrap_or_default()].concat();
        let end = match upper {
            Some(u) => Some([prefix.as_slice(), u].concat()),
            None => prefix_successor(&prefix),
        };
        let below_end = |k: &[u8]| end.as_deref().is_none_or(|e| k < e);
        let later = &self.constraints[j + 1..];
        if later.iter().all(|c| matches!(c, Constraint::Any)) {
            if !below_end(&start) {
                return Ok(true);
            }
            let (found, max) = (&mut self.found, self.max_rows);
            return self.rows.range(&start, end.as_deref(), &mut |row| {
                found.push(row);
                found.len() <= max
            });
        }
        let mut from = start;
        while below_end(&from) {
            let Some(key) = self.rows.first_key(&from)? else {
                break;
            };
            if !below_end(&key) {
                break;
            }
            let value = self.codec.column_of(self.schema, &key, j, prefix.len())?;
            let next = [prefix.as_slice(), &value].concat();
            if !key.starts_with(&next) {
                return Err(Error::Internal(
                    "a view's key does not start with its columns' encodings".into(),
                ));
            }
            if !self.visit(j + 1, next.clone())? {
                return Ok(false);
            }
            match prefix_successor(&next) {
                Some(s) => from = s,
                None => break,
            }
        }
        Ok(true)
    }
}

/// The rows of a keyed view (read through `rows`) that `constraints` allow, found through
/// the key; `None` when more than `max_rows` rows or [`MAX_KEY_SEEKS`] seeks would be
/// needed.
fn read_keys<R: SortedRows>(
    rows: &mut R,
    codec: &KeyCodec,
    schema: &SchemaRef,
    constraints: &[Constraint],
    max_rows: usize,
) -> Result<Option<Vec<RowBytes>>> {
    let mut read = KeyRead {
        rows,
        codec,
        schema,
        constraints,
        found: Vec::new(),
        seeks_left: MAX_KEY_SEEKS,
        max_rows,
    };
    Ok(read.visit(0, Vec::new())?.then_some(read.found))
}

/// The sink side of a view: the query's batches go into its store.
pub struct ViewSink {
    store: Arc<ViewStore>,
}

impl ViewSink {
    pub fn new(store: Arc<ViewStore>) -> ViewSink {
        ViewSink { store }
    }
}

#[async_trait]
impl Sink for ViewSink {
    async fn add_batch(&self, batch: &BatchInfo<'_>, rows: Vec<RecordBatch>) -> Result<SinkCommit> {
        self.store.commit(batch.id, rows, batch.watermark_ms).await
    }

    fn describe(&self) -> String {
        format!("MaterializedView[{}]", self.store.dir.display())
    }
}

/// The read side of a view: a table at the snapshot current when a query scans it. Filters
/// on key columns (`k = v`, `k IN (...)`, `<`, `<=`, `>`, `>=`, `BETWEEN`, `AND`-ed) are
/// answered through the key ([`KeyRead`]); anything else by a scan.
#[derive(Debug)]
pub struct ViewTable {
    store: Arc<ViewStore>,
    /// The view's query, as `pg_matviews` shows it.
    definition: String,
}

impl ViewTable {
    pub fn new(store: Arc<ViewStore>, definition: impl Into<String>) -> ViewTable {
        ViewTable {
            store,
            definition: definition.into(),
        }
    }

    pub fn definition(&self) -> &str {
        &self.definition
    }

    /// The view as of its last committed batch.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.store.snapshot()
    }

    /// The columns (indices in the view's rows) whose values identify a row, in the order
    /// [`ViewTable::get`] takes them; `None` for a view not kept by key.
    pub fn key_columns(&self) -> Option<&[usize]> {
        let codec = self.store.codec.as_ref()?;
        (!codec.key_columns.is_empty()).then_some(codec.key_columns.as_slice())
    }

    /// Whether a read goes to RocksDB (and may block on the disk).
    pub fn on_disk(&self) -> bool {
        #[cfg(feature = "rocksdb")]
        return self.store.stored.is_some();
        #[cfg(not(feature = "rocksdb"))]
        false
    }

    /// The row whose key is `key` (one value per [`ViewTable::key_columns`], each of its
    /// column's type), as of the last committed batch: the rows a scan filtered on
    /// `k = v` for every key column returns, read by the same path the scan takes. No row
    /// if a value is NULL. `None` when the view cannot answer by key: a view not kept by
    /// key, a value of another type, or a view not loaded yet.
    pub fn get(&self, key: &[ScalarValue]) -> Result<Option<Vec<RecordBatch>>> {
        let Some(columns) = self.key_columns() else {
            return Ok(None);
        };
        let schema = &self.store.output.schema;
        if key.len() != columns.len()
            || columns
                .iter()
                .zip(key)
                .any(|(&i, v)| v.data_type() != *schema.field(i).data_type())
        {
            return Ok(None);
        }
        if key.iter().any(ScalarValue::is_null) {
            return Ok(Some(Vec::new()));
        }
        let filters: Vec<Expr> = columns
            .iter()
            .zip(key)
            .map(|(&i, v)| {
                let column = datafusion::common::Column::new_unqualified(schema.field(i).name());
                Expr::Column(column).eq(Expr::Literal(v.clone(), None))
            })
            .collect();
        if self.on_disk() {
            let mut rows = Vec::new();
            self.store.scan_stored(&filters, &mut |b| {
                rows.push(b);
                true
            })?;
            return Ok(Some(rows));
        }
        self.store.find(&self.store.snapshot(), &filters)
    }
}

/// `column op literal` or `literal op column` as (op with the column on the left, value).
fn compared(filter: &Expr, column: &str) -> Option<(Operator, ScalarValue)> {
    let Expr::BinaryExpr(b) = filter else {
        return None;
    };
    match (&*b.left, &*b.right) {
        (Expr::Column(c), Expr::Literal(v, _)) if c.name == column => Some((b.op, v.clone())),
        (Expr::Literal(v, _), Expr::Column(c)) if c.name == column => {
            Some((b.op.swap()?, v.clone()))
        }
        _ => None,
    }
}

/// The values a filter allows for `column`: `column = v`, `v = column`, `column IN (...)`,
/// and `OR`s of them (DataFusion's form of a short `IN` list).
fn allowed_values(filter: &Expr, column: &str) -> Option<Vec<ScalarValue>> {
    match filter {
        Expr::BinaryExpr(b) if b.op == Operator::Or => {
            let mut values = allowed_values(&b.left, column)?;
            values.extend(allowed_values(&b.right, column)?);
            Some(values)
        }
        Expr::BinaryExpr(_) => match compared(filter, column)? {
            (Operator::Eq, v) => Some(vec![v]),
            _ => None,
        },
        Expr::InList(l) if !l.negated => match &*l.expr {
            Expr::Column(c) if c.name == column => l
                .list
                .iter()
                .map(|e| match e {
                    Expr::Literal(v, _) => Some(v.clone()),
                    _ => None,
                })
                .collect(),
            _ => None,
        },
        _ => None,
    }
}

/// The encodings of one key column that a conjunction of filters allows.
#[derive(Debug, PartialEq, Eq)]
enum KeyRange {
    /// None: the filters contradict each other.
    Empty,
    /// From an inclusive lower to an exclusive upper byte string.
    Between(Option<Vec<u8>>, Option<Vec<u8>>),
}

/// The range of encodings that the filters on `column` (a key column) allow; `prefix`
/// encodes one value of the column (`None` for a value that cannot narrow the read).
/// `None` when no filter bounds the column.
fn key_range(
    filters: &[Expr],
    column: &str,
    prefix: impl Fn(&ScalarValue) -> Option<Vec<u8>>,
) -> Option<KeyRange> {
    let mut lowers: Vec<Vec<u8>> = Vec::new();
    let mut uppers: Vec<Vec<u8>> = Vec::new();
    let mut bounded = false;
    for f in filters {
        let comparisons = match f {
            Expr::Between(b) if !b.negated => match (&*b.expr, &*b.low, &*b.high) {
                (Expr::Column(c), Expr::Literal(lo, _), Expr::Literal(hi, _))
                    if c.name == column =>
                {
                    vec![(Operator::GtEq, lo.clone()), (Operator::LtEq, hi.clone())]
                }
                _ => continue,
            },
            _ => match compared(f, column) {
                Some(c) => vec![c],
                None => continue,
            },
        };
        for (op, v) in comparisons {
            // `column < NULL` holds for no row; leave it to DataFusion.
            let Some(p) = (!v.is_null()).then(|| prefix(&v)).flatten() else {
                continue;
            };
            // The keys whose first column is `v` are those from `p` up to its successor.
            let after = prefix_successor(&p);
            match op {
                Operator::Eq => {
                    uppers.extend(after);
                    lowers.push(p);
                }
                Operator::GtEq => lowers.push(p),
                Operator::Gt => match after {
                    Some(a) => lowers.push(a),
                    None => return Some(KeyRange::Empty),
                },
                Operator::Lt => uppers.push(p),
                Operator::LtEq => uppers.extend(after),
                _ => continue,
            }
            bounded = true;
        }
    }
    if !bounded {
        return None;
    }
    let lower = lowers.into_iter().max();
    let upper = uppers.into_iter().min();
    if let (Some(l), Some(u)) = (&lower, &upper)
        && l >= u
    {
        return Some(KeyRange::Empty);
    }
    Some(KeyRange::Between(lower, upper))
}

#[async_trait]
impl TableProvider for ViewTable {
    fn schema(&self) -> SchemaRef {
        self.store.output.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> datafusion::error::Result<Vec<TableProviderFilterPushDown>> {
        // DataFusion applies every filter again: a lookup only narrows what it scans.
        Ok(vec![TableProviderFilterPushDown::Inexact; filters.len()])
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        _limit: Option<usize>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        #[cfg(feature = "rocksdb")]
        if self.store.stored.is_some() {
            let scan = StoredScan {
                store: self.store.clone(),
                filters: filters.to_vec(),
            };
            return Ok(Arc::new(
                datafusion::physical_plan::streaming::StreamingTableExec::try_new(
                    self.store.output.schema.clone(),
                    vec![Arc::new(scan)],
                    projection,
                    [],
                    false,
                    None,
                )?,
            ));
        }
        let snap = self.store.snapshot();
        let to_df = |e: Error| datafusion::error::DataFusionError::External(Box::new(e));
        let rows = match self.store.find(&snap, filters).map_err(to_df)? {
            Some(rows) => rows,
            None => self.store.scan_all(&snap).map_err(to_df)?,
        };
        Ok(MemorySourceConfig::try_new_exec(
            &[rows],
            self.store.output.schema.clone(),
            projection.cloned(),
        )?)
    }
}

/// One scan of a view in RocksDB: the rows are read on a blocking thread, with one
/// cursor (one point in time), and handed over a batch at a time.
#[cfg(feature = "rocksdb")]
#[derive(Debug)]
struct StoredScan {
    store: Arc<ViewStore>,
    filters: Vec<Expr>,
}

#[cfg(feature = "rocksdb")]
impl datafusion::physical_plan::streaming::PartitionStream for StoredScan {
    fn schema(&self) -> &SchemaRef {
        &self.store.output.schema
    }

    fn execute(
        &self,
        _ctx: Arc<datafusion::execution::TaskContext>,
    ) -> datafusion::execution::SendableRecordBatchStream {
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        let (store, filters) = (self.store.clone(), self.filters.clone());
        tokio::task::spawn_blocking(move || {
            let read = store.scan_stored(&filters, &mut |b| tx.blocking_send(Ok(b)).is_ok());
            if let Err(e) = read {
                let e = datafusion::error::DataFusionError::External(Box::new(e));
                let _ = tx.blocking_send(Err(e));
            }
        });
        let rows =
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) });
        Box::pin(
            datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(
                self.store.output.schema.clone(),
                rows,
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
    use datafusion::prelude::SessionContext;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("page", DataType::Utf8, true),
            Field::new("views", DataType::Int64, true),
        ]))
    }

    fn batch(rows: &[(&str, i64)]) -> RecordBatch {
        RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
            ],
        )
        .unwrap()
    }

    fn merge() -> QueryOutput {
        QueryOutput {
            schema: schema(),
            mode: WriteMode::Merge {
                keys: vec!["page".into()],
            },
            keys: Some(vec!["page".into()]),
            time: None,
        }
    }

    fn output(mode: WriteMode) -> QueryOutput {
        QueryOutput {
            mode,
            ..QueryOutput::append(schema())
        }
    }

    async fn rows_of(store: &Arc<ViewStore>, sql: &str) -> Vec<(String, i64)> {
        use datafusion::arrow::array::AsArray;
        use datafusion::arrow::datatypes::Int64Type;
        let ctx = SessionContext::new();
        ctx.register_table("v", Arc::new(ViewTable::new(store.clone(), "SELECT 1")))
            .unwrap();
        let mut out = Vec::new();
        for b in ctx.sql(sql).await.unwrap().collect().await.unwrap() {
            let p = b.column(0).as_string::<i32>();
            let n = b.column(1).as_primitive::<Int64Type>();
            for i in 0..b.num_rows() {
                out.push((p.value(i).to_string(), n.value(i)));
            }
        }
        out.sort();
        out
    }

    fn pairs(rows: &[(&str, i64)]) -> Vec<(String, i64)> {
        let mut v: Vec<_> = rows.iter().map(|(p, n)| (p.to_string(), *n)).collect();
        v.sort();
        v
    }

    #[tokio::test]
    async fn merge_keeps_the_latest_row_per_key_and_survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(ViewStore::load(dir.path(), merge(), None).unwrap());
        let c = store
            .commit(BatchId(0), vec![batch(&[("/a", 1), ("/b", 2)])], 0)
            .await
            .unwrap();
        assert_eq!(c, SinkCommit::Committed { version: 0 });
        let before = store.snapshot();
        store
            .commit(BatchId(1), vec![batch(&[("/b", 5), ("/c", 1)])], 0)
            .await
            .unwrap();
        // A replayed batch changes nothing.
        let again = store
            .commit(BatchId(1), vec![batch(&[("/b", 99)])], 0)
            .await
            .unwrap();
        assert_eq!(again, SinkCommit::AlreadyCommitted);
        let want = pairs(&[("/a", 1), ("/b", 5), ("/c", 1)]);
        assert_eq!(rows_of(&store, "SELECT * FROM v").await, want);
        // A snapshot taken before the batch still reads as it was.
        assert_eq!(
            (
                before.batch,
                before.num_rows(),
                store.scan_all(&before).unwrap().len()
            ),
            (Some(BatchId(0)), 2, 1)
        );
        // Lookups by key, and filters that do not fix the key.
        assert_eq!(
            rows_of(&store, "SELECT * FROM v WHERE page = '/b'").await,
            pairs(&[("/b", 5)])
        );
        assert_eq!(
            rows_of(&store, "SELECT * FROM v WHERE page IN ('/a', '/c', '/z')").await,
            pairs(&[("/a", 1), ("/c", 1)])
        );
        assert_eq!(
            rows_of(&store, "SELECT * FROM v WHERE page = '/b' AND views > 5").await,
            vec![]
        );
        assert_eq!(
            rows_of(&store, "SELECT * FROM v WHERE views = 1").await,
            pairs(&[("/a", 1), ("/c", 1)])
        );
        let reopened = Arc::new(ViewStore::load(dir.path(), merge(), None).unwrap());
        assert_eq!(reopened.snapshot().batch, Some(BatchId(1)));
        assert_eq!(rows_of(&reopened, "SELECT * FROM v").await, want);
    }

    #[cfg(feature = "rocksdb")]
    #[tokio::test]
    async fn a_view_in_rocksdb_keeps_the_latest_row_per_key_across_checkpoints_and_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let open =
            || Arc::new(ViewStore::load_in(dir.path(), merge(), None, StoreKind::Rocksdb).unwrap());
        let store = open();
        // 25 batches: past two checkpoints (every 10 versions), with changelogs after the
        // last. Page /p{i % 7} gets views i; the answer is the last i of each page.
        let mut want = std::collections::BTreeMap::new();
        for i in 0..25i64 {
            let page = format!("/p{}", i % 7);
            let c = store
                .commit(BatchId(i as u64), vec![batch(&[(&page, i)])], 0)
                .await
                .unwrap();
            assert_eq!(c, SinkCommit::Committed { version: i });
            want.insert(page, i);
        }
        let want: Vec<(String, i64)> = want.into_iter().collect();
        // A replayed batch changes nothing.
        let again = store
            .commit(BatchId(24), vec![batch(&[("/p3", 99)])], 0)
            .await
            .unwrap();
        assert_eq!(again, SinkCommit::AlreadyCommitted);
        assert_eq!(rows_of(&store, "SELECT * FROM v").await, want);
        assert_eq!(store.snapshot().num_rows(), 7);
        assert_eq!(
            rows_of(&store, "SELECT * FROM v WHERE page IN ('/p1', '/zz')").await,
            pairs(&[("/p1", 22)])
        );
        assert!(dir.path().join("rocksdb/20").is_dir(), "a checkpoint at 20");
        drop(store);
        let reopened = open();
        assert_eq!(reopened.snapshot().batch, Some(BatchId(24)));
        assert_eq!(reopened.snapshot().num_rows(), 7);
        assert_eq!(rows_of(&reopened, "SELECT * FROM v").await, want);
        // It goes on where it stopped.
        reopened
            .commit(BatchId(25), vec![batch(&[("/new", 1), ("/p0", 100)])], 0)
            .await
            .unwrap();
        assert_eq!(reopened.snapshot().num_rows(), 8);
        assert_eq!(
            rows_of(
                &reopened,
                "SELECT * FROM v WHERE page = '/p0' OR page = '/new'"
            )
            .await,
            pairs(&[("/new", 1), ("/p0", 100)])
        );
    }

    #[tokio::test]
    async fn snapshots_replace_the_log_they_cover() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(ViewStore::load(dir.path(), merge(), None).unwrap());
        let mut want = std::collections::BTreeMap::new();
        for b in 0..SNAPSHOT_EVERY + 5 {
            let page = format!("/p{}", b % 7);
            store
                .commit(BatchId(b), vec![batch(&[(&page, b as i64)])], 0)
                .await
                .unwrap();
            want.insert(page, b as i64);
        }
        store.settle().await;
        let logs = fsutil::numbered(&log_dir(dir.path()), ".arrow").unwrap();
        let snaps = fsutil::numbered(&snapshot_dir(dir.path()), ".arrow").unwrap();
        assert_eq!(snaps, vec![SNAPSHOT_EVERY - 1]);
        assert_eq!(logs.first(), Some(&(SNAPSHOT_EVERY - 1)));
        assert_eq!(logs.len(), 6);
        let reopened = Arc::new(ViewStore::load(dir.path(), merge(), None).unwrap());
        let got = rows_of(&reopened, "SELECT * FROM v").await;
        let want: Vec<_> = want.into_iter().collect();
        assert_eq!(got, want);
    }

    #[tokio::test]
    async fn append_adds_and_overwrite_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let append = Arc::new(
            ViewStore::load(&dir.path().join("a"), output(WriteMode::Append), None).unwrap(),
        );
        let complete = Arc::new(
            ViewStore::load(&dir.path().join("c"), output(WriteMode::Overwrite), None).unwrap(),
        );
        for (b, rows) in [&[("/a", 1)][..], &[("/a", 1), ("/b", 2)][..], &[][..]]
            .into_iter()
            .enumerate()
        {
            for s in [&append, &complete] {
                s.commit(BatchId(b as u64), vec![batch(rows)], 0)
                    .await
                    .unwrap();
            }
        }
        let appended = pairs(&[("/a", 1), ("/a", 1), ("/b", 2)]);
        assert_eq!(rows_of(&append, "SELECT * FROM v").await, appended);
        assert_eq!(rows_of(&complete, "SELECT * FROM v").await, vec![]);
        let a = Arc::new(
            ViewStore::load(&dir.path().join("a"), output(WriteMode::Append), None).unwrap(),
        );
        let c = Arc::new(
            ViewStore::load(&dir.path().join("c"), output(WriteMode::Overwrite), None).unwrap(),
        );
        assert_eq!(rows_of(&a, "SELECT * FROM v").await, appended);
        assert_eq!(c.snapshot().batch, Some(BatchId(2)));
        assert_eq!(rows_of(&c, "SELECT * FROM v").await, vec![]);
        // Complete mode keeps only its newest log file.
        assert_eq!(
            fsutil::numbered(&log_dir(&dir.path().join("c")), ".arrow").unwrap(),
            vec![2]
        );
    }

    #[tokio::test]
    async fn a_batch_is_shown_before_its_log_file_and_a_replay_only_logs_it() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("a");
        let store = Arc::new(ViewStore::load(&root, output(WriteMode::Append), None).unwrap());
        store
            .commit(BatchId(0), vec![batch(&[("/a", 1)])], 0)
            .await
            .unwrap();
        // The log directory replaced by a file: batch 1's log write fails after the batch
        // is shown.
        std::fs::rename(log_dir(&root), root.join("moved")).unwrap();
        std::fs::write(log_dir(&root), b"").unwrap();
        let shown = pairs(&[("/a", 1), ("/b", 2)]);
        assert!(
            store
                .commit(BatchId(1), vec![batch(&[("/b", 2)])], 0)
                .await
                .is_err()
        );
        assert_eq!(rows_of(&store, "SELECT * FROM v").await, shown);
        // The replay of batch 1 (same rows) writes its log file and adds nothing.
        std::fs::remove_file(log_dir(&root)).unwrap();
        std::fs::rename(root.join("moved"), log_dir(&root)).unwrap();
        let replay = store
            .commit(BatchId(1), vec![batch(&[("/b", 2)])], 0)
            .await
            .unwrap();
        assert!(matches!(replay, SinkCommit::Committed { .. }));
        assert_eq!(rows_of(&store, "SELECT * FROM v").await, shown);
        assert!(matches!(
            store
                .commit(BatchId(1), vec![batch(&[("/b", 2)])], 0)
                .await
                .unwrap(),
            SinkCommit::AlreadyCommitted
        ));
        let reopened = Arc::new(ViewStore::load(&root, output(WriteMode::Append), None).unwrap());
        assert_eq!(rows_of(&reopened, "SELECT * FROM v").await, shown);
    }

    /// Windows of five minutes by page: `(start minute, page, views)`.
    fn windows_schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("page", DataType::Utf8, true),
            Field::new(
                "window_start",
                DataType::Timestamp(TimeUnit::Microsecond, None),
                true,
            ),
            Field::new("views", DataType::Int64, true),
        ]))
    }

    const MINUTE_US: i64 = 60_000_000;

    fn windows(rows: &[(&str, i64, i64)]) -> RecordBatch {
        use datafusion::arrow::array::TimestampMicrosecondArray;
        RecordBatch::try_new(
            windows_schema(),
            vec![
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(TimestampMicrosecondArray::from_iter_values(
                    rows.iter().map(|r| r.1 * MINUTE_US),
                )),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.2))),
            ],
        )
        .unwrap()
    }

    fn windowed(mode: WriteMode) -> QueryOutput {
        QueryOutput {
            schema: windows_schema(),
            mode,
            keys: Some(vec!["page".into(), "window_start".into()]),
            time: Some(RowTime::WindowEnd {
                column: "window_start".into(),
                field: None,
                plus_us: 5 * MINUTE_US,
            }),
        }
    }

    /// `(page, start minute, views)` of `sql` over the view as `v`, sorted.
    async fn window_rows(store: &Arc<ViewStore>, sql: &str) -> Vec<(String, i64, i64)> {
        window_rows_of(Arc::new(ViewTable::new(store.clone(), "SELECT 1")), sql).await
    }

    async fn window_rows_of(v: Arc<dyn TableProvider>, sql: &str) -> Vec<(String, i64, i64)> {
        use datafusion::arrow::datatypes::TimestampMicrosecondType;
        let ctx = SessionContext::new();
        ctx.register_table("v", v).unwrap();
        let mut out = Vec::new();
        for b in ctx.sql(sql).await.unwrap().collect().await.unwrap() {
            let p = b.column(0).as_string::<i32>();
            let t = b.column(1).as_primitive::<TimestampMicrosecondType>();
            let n = b.column(2).as_primitive::<Int64Type>();
            for i in 0..b.num_rows() {
                out.push((p.value(i).to_string(), t.value(i) / MINUTE_US, n.value(i)));
            }
        }
        out.sort();
        out
    }

    fn triples(rows: &[(&str, i64, i64)]) -> Vec<(String, i64, i64)> {
        let mut v: Vec<_> = rows
            .iter()
            .map(|(p, t, n)| (p.to_string(), *t, *n))
            .collect();
        v.sort();
        v
    }

    #[tokio::test]
    async fn ranges_of_windows_are_read_from_the_key_order() {
        let dir = tempfile::tempdir().unwrap();
        let mode = WriteMode::Merge {
            keys: vec!["page".into(), "window_start".into()],
        };
        let store = Arc::new(ViewStore::load(dir.path(), windowed(mode), None).unwrap());
        let mut all = Vec::new();
        for minute in (0..60).step_by(5) {
            for page in ["/a", "/b"] {
                all.push((page, minute, minute + 1));
            }
        }
        store
            .commit(BatchId(0), vec![windows(&all)], 0)
            .await
            .unwrap();
        let ts = |m: i64| format!("TIMESTAMP '1970-01-01 00:{m:02}:00'");
        // The same filters over the rows in a plain table are the independent answer.
        let plain = Arc::new(
            datafusion::datasource::MemTable::try_new(windows_schema(), vec![vec![windows(&all)]])
                .unwrap(),
        );
        let cases = [
            format!("window_start >= {} AND window_start < {}", ts(10), ts(25)),
            format!("window_start > {}", ts(50)),
            format!("window_start <= {}", ts(5)),
            format!("window_start = {} AND page = '/b'", ts(30)),
            format!("window_start BETWEEN {} AND {}", ts(12), ts(20)),
            format!("{} < window_start AND window_start < {}", ts(5), ts(5)),
            format!("window_start > {} AND views > 40", ts(40)),
        ];
        for where_ in &cases {
            let got = window_rows(&store, &format!("SELECT * FROM v WHERE {where_}")).await;
            let scan =
                window_rows_of(plain.clone(), &format!("SELECT * FROM v WHERE {where_}")).await;
            assert_eq!(got, scan, "{where_}");
        }
        assert_eq!(
            window_rows(
                &store,
                &format!(
                    "SELECT * FROM v WHERE window_start >= {} AND window_start < {}",
                    ts(10),
                    ts(20)
                )
            )
            .await,
            triples(&[
                ("/a", 10, 11),
                ("/a", 15, 16),
                ("/b", 10, 11),
                ("/b", 15, 16)
            ])
        );
        // The range itself: only the rows it bounds are decoded.
        let snap = store.snapshot();
        let filters = [
            datafusion::prelude::col("window_start").gt_eq(datafusion::prelude::lit(
                ScalarValue::TimestampMicrosecond(Some(50 * MINUTE_US), None),
            )),
        ];
        let found: usize = store
            .find(&snap, &filters)
            .unwrap()
            .unwrap()
            .iter()
            .map(RecordBatch::num_rows)
            .sum();
        assert_eq!(found, 4);
    }

    /// The seed's shape: `(window_start, window_end, page)` keys, some pages NULL.
    fn seed_view_rows() -> RecordBatch {
        use datafusion::arrow::array::TimestampMicrosecondArray;
        let schema = Arc::new(Schema::new(vec![
            Field::new(
                "window_start",
                DataType::Timestamp(TimeUnit::Microsecond, None),
                true,
            ),
            Field::new(
                "window_end",
                DataType::Timestamp(TimeUnit::Microsecond, None),
                true,
            ),
            Field::new("page", DataType::Utf8, true),
            Field::new("views", DataType::Int64, true),
        ]));
        let (mut starts, mut pages, mut views) = (vec![], vec![], vec![]);
        for window in 0..40i64 {
            for (i, page) in [None, Some("/a"), Some("/b"), Some("/c\u{ff}"), Some("/d")]
                .into_iter()
                .enumerate()
            {
                // Not every page in every window.
                if (window + i as i64) % 4 != 0 {
                    starts.push(window * 5 * MINUTE_US);
                    pages.push(page);
                    views.push(window * 10 + i as i64);
                }
            }
        }
        let ends: Vec<i64> = starts.iter().map(|s| s + 5 * MINUTE_US).collect();
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(TimestampMicrosecondArray::from(starts)),
                Arc::new(TimestampMicrosecondArray::from(ends)),
                Arc::new(StringArray::from(pages)),
                Arc::new(Int64Array::from(views)),
            ],
        )
        .unwrap()
    }

    #[tokio::test]
    async fn filters_on_any_key_column_are_read_through_the_key() {
        filters_through_the_key(StoreKind::Memory).await;
    }

    #[cfg(feature = "rocksdb")]
    #[tokio::test]
    async fn filters_on_any_key_column_are_read_through_the_key_in_rocksdb() {
        filters_through_the_key(StoreKind::Rocksdb).await;
    }

    /// The rows a read of the view through its key gives for `filters`, or `None` where it
    /// reads every row.
    fn found_by_key(store: &ViewStore, filters: &[Expr]) -> Option<usize> {
        let snap = store.snapshot();
        if let Contents::Stored { rows } = snap.contents {
            let mut n = 0;
            store
                .scan_stored(filters, &mut |b| {
                    n += b.num_rows();
                    true
                })
                .unwrap();
            // Every row back: the key was not used (the cases never keep every row).
            return (n as u64 != rows).then_some(n);
        }
        let found = store.find(&snap, filters).unwrap()?;
        Some(found.iter().map(RecordBatch::num_rows).sum())
    }

    async fn filters_through_the_key(kind: StoreKind) {
        let dir = tempfile::tempdir().unwrap();
        let rows = seed_view_rows();
        let keys: Vec<String> = vec!["page".into(), "window_start".into(), "window_end".into()];
        let output = QueryOutput {
            schema: rows.schema(),
            mode: WriteMode::Merge { keys: keys.clone() },
            keys: Some(keys),
            time: None,
        };
        let store = Arc::new(ViewStore::load_in(dir.path(), output, None, kind).unwrap());
        store
            .commit(BatchId(0), vec![rows.clone()], 0)
            .await
            .unwrap();
        let plain = Arc::new(
            datafusion::datasource::MemTable::try_new(rows.schema(), vec![vec![rows]]).unwrap(),
        );
        let view: Arc<dyn TableProvider> = Arc::new(ViewTable::new(store.clone(), "SELECT 1"));
        let ts = |m: i64| format!("TIMESTAMP '1970-01-01 {:02}:{:02}:00'", m / 60, m % 60);
        // (filter, whether it is read through the key)
        let cases = [
            ("page = '/b'".to_string(), true),
            ("page IN ('/a', '/d')".to_string(), true),
            ("page > '/b'".to_string(), true),
            ("page < '/b'".to_string(), true),
            (format!("window_end = {}", ts(50)), true),
            (format!("window_end >= {} AND page = '/a'", ts(150)), true),
            (
                format!("window_start = {} AND window_end = {}", ts(45), ts(50)),
                true,
            ),
            (
                format!("window_start = {} AND page = '/c\u{ff}'", ts(45)),
                true,
            ),
            (
                format!(
                    "window_start BETWEEN {} AND {} AND page = '/d'",
                    ts(20),
                    ts(60)
                ),
                true,
            ),
            (
                format!(
                    "window_start > {} AND window_start < {} AND page = '/a'",
                    ts(60),
                    ts(60)
                ),
                true,
            ),
            ("page = '/none'".to_string(), true),
            ("page = NULL".to_string(), false),
            ("page IS NULL".to_string(), false),
            ("views > 100".to_string(), false),
        ];
        let sql = |w: &str| {
            format!(
                "SELECT window_start, window_end, page, views FROM v WHERE {w} ORDER BY 1, 2, 3"
            )
        };
        for (where_, keyed) in &cases {
            let collect = |t: Arc<dyn TableProvider>| {
                let q = sql(where_);
                async move {
                    let ctx = SessionContext::new();
                    ctx.register_table("v", t).unwrap();
                    let batches = ctx.sql(&q).await.unwrap().collect().await.unwrap();
                    datafusion::arrow::util::pretty::pretty_format_batches(&batches)
                        .unwrap()
                        .to_string()
                }
            };
            let got = collect(view.clone()).await;
            assert_eq!(got, collect(plain.clone()).await, "{where_}");
            // The key read decodes exactly the rows the filter keeps.
            let ctx = SessionContext::new();
            ctx.register_table("v", plain.clone()).unwrap();
            let df = ctx.sql(&sql(where_)).await.unwrap();
            let expected: usize = df.clone().count().await.unwrap();

            // The filters as DataFusion hands them to a scan: optimized (casts of the
            // literals folded), split at AND.
            let mut filters = Vec::new();
            use datafusion::common::tree_node::TreeNode;
            df.into_optimized_plan()
                .unwrap()
                .apply(|node| {
                    if let datafusion::logical_expr::LogicalPlan::Filter(f) = node {
                        filters.extend(
                            datafusion::logical_expr::utils::split_conjunction(&f.predicate)
                                .into_iter()
                                .cloned(),
                        );
                    }
                    Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
                })
                .unwrap();
            let found = found_by_key(&store, &filters);
            assert_eq!(found.is_some(), *keyed, "{where_}");
            if let Some(n) = found {
                assert_eq!(n, expected, "{where_}");
            }
        }
    }

    #[tokio::test]
    async fn a_skip_scan_through_too_many_values_gives_way_to_a_scan() {
        let dir = tempfile::tempdir().unwrap();
        let mode = WriteMode::Merge {
            keys: vec!["page".into(), "window_start".into()],
        };
        let store = Arc::new(ViewStore::load(dir.path(), windowed(mode), None).unwrap());
        // More distinct windows than seeks allowed, each with two pages.
        let windows_n = MAX_KEY_SEEKS as i64 + 10;
        let all: Vec<(&str, i64, i64)> = (0..windows_n)
            .flat_map(|m| [("/a", m, m), ("/b", m, m + 1)])
            .collect();
        store
            .commit(BatchId(0), vec![windows(&all)], 0)
            .await
            .unwrap();
        let snap = store.snapshot();
        let page = |p: &str| datafusion::prelude::col("page").eq(datafusion::prelude::lit(p));
        assert!(store.find(&snap, &[page("/a")]).unwrap().is_none());
        // A bound on the window keeps the skip within the budget.
        let since = datafusion::prelude::col("window_start").gt_eq(datafusion::prelude::lit(
            ScalarValue::TimestampMicrosecond(Some((windows_n - 100) * MINUTE_US), None),
        ));
        let found = store.find(&snap, &[page("/a"), since]).unwrap().unwrap();
        assert_eq!(found.iter().map(RecordBatch::num_rows).sum::<usize>(), 100);
        let got = window_rows(&store, "SELECT * FROM v WHERE page = '/b'").await;
        assert_eq!(got.len(), windows_n as usize);
    }

    #[test]
    fn a_prefix_successor_is_above_every_string_with_the_prefix() {
        assert_eq!(prefix_successor(&[1, 2, 3]), Some(vec![1, 2, 4]));
        assert_eq!(prefix_successor(&[1, 0xFF, 0xFF]), Some(vec![2]));
        assert_eq!(prefix_successor(&[0xFF]), None);
        assert_eq!(prefix_successor(&[]), None);
    }

    #[tokio::test]
    async fn retention_removes_windows_that_ended_long_enough_before_the_watermark() {
        retention_of_windows(StoreKind::Memory).await;
    }

    #[cfg(feature = "rocksdb")]
    #[tokio::test]
    async fn retention_removes_windows_that_ended_long_enough_before_the_watermark_in_rocksdb() {
        retention_of_windows(StoreKind::Rocksdb).await;
    }

    async fn retention_of_windows(kind: StoreKind) {
        let dir = tempfile::tempdir().unwrap();
        let mode = WriteMode::Merge {
            keys: vec!["page".into(), "window_start".into()],
        };
        let output = windowed(mode);
        let keep = Retention {
            time: output.time.clone().unwrap(),
            keep_us: 10 * MINUTE_US,
        };
        let open = || {
            Arc::new(
                ViewStore::load_in(dir.path(), output.clone(), Some(keep.clone()), kind).unwrap(),
            )
        };
        let store = open();
        let minute_ms = 60_000;
        // Windows [0, 5), [5, 10), [10, 15); the watermark is still 0.
        store
            .commit(
                BatchId(0),
                vec![windows(&[("/a", 0, 1), ("/a", 5, 1), ("/b", 10, 1)])],
                0,
            )
            .await
            .unwrap();
        assert_eq!(store.snapshot().num_rows(), 3);
        // At 15: [0, 5) ended at 5, exactly 10 minutes before, and goes; [5, 10) stays.
        store
            .commit(BatchId(1), vec![windows(&[("/a", 5, 2)])], 15 * minute_ms)
            .await
            .unwrap();
        let want = triples(&[("/a", 5, 2), ("/b", 10, 1)]);
        assert_eq!(window_rows(&store, "SELECT * FROM v").await, want);
        assert_eq!(store.snapshot().num_rows(), 2);
        // Reopened, the log replays each batch at its own watermark.
        drop(store);
        let reopened = open();
        assert_eq!(window_rows(&reopened, "SELECT * FROM v").await, want);
        // A batch with no rows moves the watermark too: at 24:59.999 [10, 15) stays.
        reopened
            .commit(BatchId(2), vec![], 25 * minute_ms - 1)
            .await
            .unwrap();
        assert_eq!(
            window_rows(&reopened, "SELECT * FROM v").await,
            triples(&[("/b", 10, 1)])
        );
        assert_eq!(reopened.snapshot().num_rows(), 1);
        // A row already past the retention is not kept, and an old one is not counted.
        reopened
            .commit(
                BatchId(3),
                vec![windows(&[("/c", 0, 1), ("/b", 10, 7), ("/d", 20, 1)])],
                25 * minute_ms - 1,
            )
            .await
            .unwrap();
        assert_eq!(
            window_rows(&reopened, "SELECT * FROM v").await,
            triples(&[("/b", 10, 7), ("/d", 20, 1)])
        );
        assert_eq!(reopened.snapshot().num_rows(), 2);
    }

    #[tokio::test]
    async fn retention_without_aggregation_removes_rows_by_event_time() {
        let dir = tempfile::tempdir().unwrap();
        let output = QueryOutput {
            time: Some(RowTime::EventTime {
                column: "window_start".into(),
            }),
            ..QueryOutput::append(windows_schema())
        };
        let keep = Retention {
            time: output.time.clone().unwrap(),
            keep_us: MINUTE_US,
        };
        let store =
            Arc::new(ViewStore::load(dir.path(), output.clone(), Some(keep.clone())).unwrap());
        let minute_ms = 60_000;
        store
            .commit(BatchId(0), vec![windows(&[("/a", 1, 1), ("/a", 3, 1)])], 0)
            .await
            .unwrap();
        // At 2: the row at 1 is kept (1 + 1 is not before 2); at 2:00.001 it goes, and the
        // row of the same batch at 3 stays.
        store
            .commit(BatchId(1), vec![windows(&[("/b", 2, 1)])], 2 * minute_ms)
            .await
            .unwrap();
        assert_eq!(store.snapshot().num_rows(), 3);
        store
            .commit(BatchId(2), vec![], 2 * minute_ms + 1)
            .await
            .unwrap();
        let want = triples(&[("/a", 3, 1), ("/b", 2, 1)]);
        assert_eq!(window_rows(&store, "SELECT * FROM v").await, want);
        let reopened = Arc::new(ViewStore::load(dir.path(), output, Some(keep)).unwrap());
        assert_eq!(window_rows(&reopened, "SELECT * FROM v").await, want);
    }

    #[test]
    fn retention_needs_a_time_column_and_no_complete_mode() {
        let options = Options::try_from_pairs(vec![("retention".into(), "1 day".into())]).unwrap();
        let append = QueryOutput::append(schema());
        assert!(matches!(
            Retention::from_options(&options, &append),
            Err(Error::InvalidOption { .. })
        ));
        let complete = QueryOutput {
            mode: WriteMode::Overwrite,
            ..windowed(WriteMode::Overwrite)
        };
        assert!(matches!(
            Retention::from_options(&options, &complete),
            Err(Error::InvalidOption { .. })
        ));
        let day = Retention::from_options(&options, &windowed(WriteMode::Append))
            .unwrap()
            .unwrap();
        assert_eq!(day.keep_us, 86_400_000_000);
    }
}
