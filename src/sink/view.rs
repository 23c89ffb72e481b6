//! Materialized views (`CREATE MATERIALIZED VIEW`): a streaming query's result kept in
//! memory, indexed by its group key, durable through a log of its batches, and read as a
//! table as of one committed batch.
//!
//! What a batch does to the view follows the query's [`WriteMode`]: append adds the
//! batch's rows, overwrite (complete mode) replaces them, merge (update mode) upserts each
//! row by the query's group key, so that the view holds the latest row of every group,
//! including the groups whose operator state the watermark has evicted.
//!
//! Durability: a batch's rows are first written whole to `<dir>/log/<batch>.arrow` (Arrow
//! IPC, atomically): that file is the batch's commit, so a batch replayed after a crash
//! finds it and changes nothing. Every [`SNAPSHOT_EVERY`] batches the contents are written
//! to `<dir>/snapshot/<batch>.arrow` and the log files it covers are removed; opening a
//! view reads its newest snapshot and applies the log files after it, never the streams'
//! raw rows.
//!
//! Reads: the contents are persistent maps and vectors (`imbl`), so a batch builds the next
//! [`Snapshot`] sharing all but what it changed, and swaps it in. A reader takes the
//! current snapshot (an `Arc` clone under a lock held for nothing else): it sees one
//! committed batch, never blocks the writer and is never blocked by it.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex, OnceLock, RwLock};

use async_trait::async_trait;
use datafusion::arrow::array::{ArrayRef, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::ipc::reader::FileReader;
use datafusion::arrow::ipc::writer::FileWriter;
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::catalog::Session;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::logical_expr::{Expr, Operator, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::scalar::ScalarValue;

use super::{Sink, SinkCommit, WriteMode};
use crate::error::{Error, Result};
use crate::fsutil;
use crate::types::BatchId;

/// How many batches the log holds before the contents are written as a snapshot.
pub const SNAPSHOT_EVERY: u64 = 100;

/// Rows per Arrow batch when a keyed view is scanned.
const SCAN_BATCH_ROWS: usize = 8192;

/// The open views of this process, by directory: the query that writes a view and the
/// table that reads it share one store.
static STORES: LazyLock<Mutex<HashMap<PathBuf, Arc<ViewStore>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// Opens the view kept in `dir` (loading it on first use in this process), with the rows
/// of `schema` written by `mode`.
pub fn open(dir: &Path, schema: &SchemaRef, mode: &WriteMode) -> Result<Arc<ViewStore>> {
    let mut stores = STORES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(s) = stores.get(dir)
        && s.schema == *schema
        && s.mode == *mode
    {
        return Ok(s.clone());
    }
    let store = Arc::new(ViewStore::load(dir, schema.clone(), mode.clone())?);
    stores.insert(dir.to_path_buf(), store.clone());
    Ok(store)
}

/// Forgets the view kept in `dir` (`DROP MATERIALIZED VIEW`); readers that hold one of its
/// snapshots keep it.
pub fn forget(dir: &Path) {
    STORES.lock().unwrap_or_else(|e| e.into_inner()).remove(dir);
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
    /// Append and overwrite: the rows as the batches wrote them.
    Rows(imbl::Vector<RecordBatch>),
    /// Merge: each group's latest row (the whole row, in Arrow's row format) by its key.
    Keyed(imbl::OrdMap<RowBytes, RowBytes>),
}

impl Snapshot {
    /// How many rows the view holds.
    pub fn num_rows(&self) -> usize {
        match &self.contents {
            Contents::Rows(v) => v.iter().map(RecordBatch::num_rows).sum(),
            Contents::Keyed(m) => m.len(),
        }
    }
}

/// Bytes in Arrow's row format, shared between snapshots.
type RowBytes = Arc<[u8]>;

/// The rows of a keyed view in and out of Arrow's row format.
struct KeyCodec {
    /// The key columns, by index in the view's schema; empty for a global aggregate (one
    /// row).
    key_columns: Vec<usize>,
    keys: Option<RowConverter>,
    rows: RowConverter,
}

impl KeyCodec {
    fn new(schema: &SchemaRef, key_names: &[String]) -> Result<KeyCodec> {
        let key_columns = key_names
            .iter()
            .map(|k| {
                schema.index_of(k).map_err(|_| {
                    Error::Internal(format!("view key column {k} is not in the view's rows"))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let field = |i: usize| SortField::new(schema.field(i).data_type().clone());
        let keys = if key_columns.is_empty() {
            None
        } else {
            Some(RowConverter::new(
                key_columns.iter().map(|&i| field(i)).collect(),
            )?)
        };
        let rows = RowConverter::new((0..schema.fields().len()).map(field).collect())?;
        Ok(KeyCodec {
            key_columns,
            keys,
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

    /// The key of one row given by its key columns' values, if they convert to the key's
    /// types.
    fn key_of(&self, schema: &SchemaRef, values: &[ScalarValue]) -> Option<Arc<[u8]>> {
        let conv = self.keys.as_ref()?;
        let cols = self
            .key_columns
            .iter()
            .zip(values)
            .map(|(&i, v)| {
                let array = v.to_array_of_size(1).ok()?;
                cast(&array, schema.field(i).data_type()).ok()
            })
            .collect::<Option<Vec<ArrayRef>>>()?;
        let rows = conv.convert_columns(&cols).ok()?;
        Some(Arc::from(rows.row(0).as_ref()))
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

/// One materialized view: its current snapshot and its log.
pub struct ViewStore {
    dir: PathBuf,
    schema: SchemaRef,
    mode: WriteMode,
    codec: Option<KeyCodec>,
    current: RwLock<Arc<Snapshot>>,
    /// One batch at a time; holds the batches logged since the last snapshot.
    writer: tokio::sync::Mutex<u64>,
}

impl fmt::Debug for ViewStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ViewStore")
            .field("dir", &self.dir)
            .field("mode", &self.mode)
            .finish()
    }
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

impl ViewStore {
    /// Reads the newest snapshot and applies the log after it.
    fn load(dir: &Path, schema: SchemaRef, mode: WriteMode) -> Result<ViewStore> {
        let codec = match &mode {
            WriteMode::Merge { keys } => Some(KeyCodec::new(&schema, keys)?),
            _ => None,
        };
        let store = ViewStore {
            dir: dir.to_path_buf(),
            schema,
            mode,
            codec,
            current: RwLock::new(Arc::new(Snapshot {
                batch: None,
                contents: Contents::Rows(imbl::Vector::new()),
                scanned: Arc::default(),
            })),
            writer: tokio::sync::Mutex::new(0),
        };
        let mut snap = store.empty();
        let snapshot = fsutil::numbered(&snapshot_dir(dir), ".arrow")?.pop();
        if let Some(n) = snapshot {
            let rows = store.read_rows(&numbered_file(&snapshot_dir(dir), n))?;
            snap = store.apply(&snap, BatchId(n), rows)?;
        }
        let mut logged = 0;
        for n in fsutil::numbered(&log_dir(dir), ".arrow")? {
            if snapshot.is_some_and(|s| n <= s) {
                continue;
            }
            let rows = store.read_rows(&numbered_file(&log_dir(dir), n))?;
            snap = store.apply(&snap, BatchId(n), rows)?;
            logged += 1;
        }
        *store.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(snap);
        store.writer.try_lock().map(|mut l| *l = logged).ok();
        Ok(store)
    }

    fn empty(&self) -> Snapshot {
        Snapshot {
            batch: None,
            contents: match self.codec {
                Some(_) => Contents::Keyed(imbl::OrdMap::new()),
                None => Contents::Rows(imbl::Vector::new()),
            },
            scanned: Arc::default(),
        }
    }

    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// The view as of its last committed batch.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// `base` with batch `batch`'s rows applied.
    fn apply(&self, base: &Snapshot, batch: BatchId, rows: Vec<RecordBatch>) -> Result<Snapshot> {
        let rows = rows.into_iter().filter(|b| b.num_rows() > 0);
        let contents = match (&base.contents, &self.codec) {
            (Contents::Keyed(map), Some(codec)) => {
                let mut map = map.clone();
                for b in rows {
                    for (k, v) in codec.encode(&b)? {
                        map.insert(k, v);
                    }
                }
                Contents::Keyed(map)
            }
            (Contents::Rows(v), None) => Contents::Rows(match self.mode {
                WriteMode::Overwrite => rows.collect(),
                _ => {
                    let mut v = v.clone();
                    v.extend(rows);
                    v
                }
            }),
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

    fn read_rows(&self, file: &Path) -> Result<Vec<RecordBatch>> {
        let f = std::fs::File::open(file)
            .map_err(|e| Error::io(format!("opening {}", file.display()), e))?;
        let corrupt = |e: datafusion::arrow::error::ArrowError| {
            Error::Internal(format!("{}: {e}", file.display()))
        };
        let reader = FileReader::try_new(std::io::BufReader::new(f), None).map_err(corrupt)?;
        let mut out = Vec::new();
        for b in reader {
            let b = b.map_err(corrupt)?;
            out.push(RecordBatch::try_new(
                self.schema.clone(),
                b.columns().to_vec(),
            )?);
        }
        Ok(out)
    }

    /// Writes `rows` to `file` atomically; `point` names the crash point before the rename.
    fn write_rows(
        file: &Path,
        schema: &SchemaRef,
        rows: &[RecordBatch],
        point: &'static str,
    ) -> Result<()> {
        fsutil::write_atomic_with(
            file,
            |out| {
                let mut w = FileWriter::try_new(out, schema)?;
                for b in rows {
                    w.write(b)?;
                }
                w.finish()?;
                Ok(())
            },
            || crate::testing::crash_point(point),
        )
    }

    /// Commits batch `batch`: its log file, then the new snapshot. A batch the view
    /// already holds is skipped.
    pub async fn commit(&self, batch: BatchId, rows: Vec<RecordBatch>) -> Result<SinkCommit> {
        let mut logged = self.writer.lock().await;
        let base = self.snapshot();
        if base.batch.is_some_and(|b| b >= batch) {
            return Ok(SinkCommit::AlreadyCommitted);
        }
        let dir = self.dir.clone();
        let schema = self.schema.clone();
        let rows = tokio::task::spawn_blocking(move || {
            let file = numbered_file(&log_dir(&dir), batch.get());
            Self::write_rows(&file, &schema, &rows, "view_log_before_rename").map(|()| rows)
        })
        .await
        .map_err(|e| Error::Internal(format!("view log writer: {e}")))??;
        crate::testing::crash_point("view_after_log");
        let next = Arc::new(self.apply(&base, batch, rows)?);
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = next.clone();
        *logged += 1;
        // Complete mode's log file holds the whole view: the older ones are garbage.
        if self.mode == WriteMode::Overwrite || *logged >= SNAPSHOT_EVERY {
            self.write_snapshot(next).await?;
            *logged = 0;
        }
        Ok(SinkCommit::Committed {
            version: batch.get() as i64,
        })
    }

    /// Writes `snap` whole, then removes the log files and snapshots it covers.
    async fn write_snapshot(&self, snap: Arc<Snapshot>) -> Result<()> {
        let Some(batch) = snap.batch else {
            return Ok(());
        };
        let dir = self.dir.clone();
        let schema = self.schema.clone();
        let rows = if self.mode == WriteMode::Overwrite {
            None
        } else {
            Some(self.scan_all(&snap)?)
        };
        tokio::task::spawn_blocking(move || -> Result<()> {
            if let Some(rows) = rows {
                let file = numbered_file(&snapshot_dir(&dir), batch.get());
                Self::write_rows(&file, &schema, &rows, "view_snapshot_before_rename")?;
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
            (Contents::Rows(v), _) => v.iter().cloned().collect(),
            (Contents::Keyed(map), Some(codec)) => codec.decode(&self.schema, map.values())?,
            (Contents::Keyed(_), None) => Vec::new(),
        };
        Ok(snap.scanned.get_or_init(|| rows).clone())
    }

    /// The rows of `snap` with these keys (each a value per key column); `None` when the
    /// view is not keyed.
    fn lookup(
        &self,
        snap: &Snapshot,
        keys: &[Vec<ScalarValue>],
    ) -> Result<Option<Vec<RecordBatch>>> {
        let (Contents::Keyed(map), Some(codec)) = (&snap.contents, &self.codec) else {
            return Ok(None);
        };
        let mut found: Vec<&Arc<[u8]>> = Vec::new();
        for k in keys {
            if let Some(key) = codec.key_of(&self.schema, k)
                && let Some(row) = map.get(&key)
            {
                found.push(row);
            }
        }
        codec.decode(&self.schema, found.into_iter()).map(Some)
    }

    /// The key columns' names, for a keyed view.
    fn key_names(&self) -> Vec<String> {
        match &self.codec {
            Some(c) => c
                .key_columns
                .iter()
                .map(|&i| self.schema.field(i).name().clone())
                .collect(),
            None => Vec::new(),
        }
    }
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
    async fn add_batch(
        &self,
        _query_id: &str,
        batch: BatchId,
        rows: Vec<RecordBatch>,
        _mode: &WriteMode,
    ) -> Result<SinkCommit> {
        self.store.commit(batch, rows).await
    }

    fn describe(&self) -> String {
        format!("MaterializedView[{}]", self.store.dir.display())
    }
}

/// The read side of a view: a table at the snapshot current when a query scans it. A
/// filter that fixes every key column (`k = v`, `k IN (...)`, on each key) is answered by
/// looking the keys up instead of scanning.
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
}

/// The values a filter allows for `column`: `column = v`, `v = column`, `column IN (...)`.
fn allowed_values(filter: &Expr, column: &str) -> Option<Vec<ScalarValue>> {
    match filter {
        Expr::BinaryExpr(b) if b.op == Operator::Eq => match (&*b.left, &*b.right) {
            (Expr::Column(c), Expr::Literal(v, _)) | (Expr::Literal(v, _), Expr::Column(c))
                if c.name == column =>
            {
                Some(vec![v.clone()])
            }
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

/// The keys a conjunction of filters fixes: one list of values per combination, when
/// every key column is fixed and the combinations are few.
fn fixed_keys(filters: &[Expr], key_names: &[String]) -> Option<Vec<Vec<ScalarValue>>> {
    if key_names.is_empty() {
        return None;
    }
    let mut keys: Vec<Vec<ScalarValue>> = vec![Vec::new()];
    for k in key_names {
        let values = filters.iter().find_map(|f| allowed_values(f, k))?;
        if values.iter().any(ScalarValue::is_null) {
            return None;
        }
        keys = keys
            .into_iter()
            .flat_map(|prefix| {
                values.iter().map(move |v| {
                    let mut p = prefix.clone();
                    p.push(v.clone());
                    p
                })
            })
            .collect();
        if keys.len() > 1024 {
            return None;
        }
    }
    Some(keys)
}

#[async_trait]
impl TableProvider for ViewTable {
    fn schema(&self) -> SchemaRef {
        self.store.schema.clone()
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
        let snap = self.store.snapshot();
        let to_df = |e: Error| datafusion::error::DataFusionError::External(Box::new(e));
        let rows = match fixed_keys(filters, &self.store.key_names()) {
            Some(keys) => self.store.lookup(&snap, &keys).map_err(to_df)?,
            None => None,
        };
        let rows = match rows {
            Some(rows) => rows,
            None => self.store.scan_all(&snap).map_err(to_df)?,
        };
        Ok(MemorySourceConfig::try_new_exec(
            &[rows],
            self.store.schema.clone(),
            projection.cloned(),
        )?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
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

    fn merge() -> WriteMode {
        WriteMode::Merge {
            keys: vec!["page".into()],
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
        let store = Arc::new(ViewStore::load(dir.path(), schema(), merge()).unwrap());
        let c = store
            .commit(BatchId(0), vec![batch(&[("/a", 1), ("/b", 2)])])
            .await
            .unwrap();
        assert_eq!(c, SinkCommit::Committed { version: 0 });
        let before = store.snapshot();
        store
            .commit(BatchId(1), vec![batch(&[("/b", 5), ("/c", 1)])])
            .await
            .unwrap();
        // A replayed batch changes nothing.
        let again = store
            .commit(BatchId(1), vec![batch(&[("/b", 99)])])
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
        let reopened = Arc::new(ViewStore::load(dir.path(), schema(), merge()).unwrap());
        assert_eq!(reopened.snapshot().batch, Some(BatchId(1)));
        assert_eq!(rows_of(&reopened, "SELECT * FROM v").await, want);
    }

    #[tokio::test]
    async fn snapshots_replace_the_log_they_cover() {
        let dir = tempfile::tempdir().unwrap();
        let store = ViewStore::load(dir.path(), schema(), merge()).unwrap();
        let mut want = std::collections::BTreeMap::new();
        for b in 0..SNAPSHOT_EVERY + 5 {
            let page = format!("/p{}", b % 7);
            store
                .commit(BatchId(b), vec![batch(&[(&page, b as i64)])])
                .await
                .unwrap();
            want.insert(page, b as i64);
        }
        let logs = fsutil::numbered(&log_dir(dir.path()), ".arrow").unwrap();
        let snaps = fsutil::numbered(&snapshot_dir(dir.path()), ".arrow").unwrap();
        assert_eq!(snaps, vec![SNAPSHOT_EVERY - 1]);
        assert_eq!(logs.first(), Some(&(SNAPSHOT_EVERY - 1)));
        assert_eq!(logs.len(), 6);
        let reopened = Arc::new(ViewStore::load(dir.path(), schema(), merge()).unwrap());
        let got = rows_of(&reopened, "SELECT * FROM v").await;
        let want: Vec<_> = want.into_iter().collect();
        assert_eq!(got, want);
    }

    #[tokio::test]
    async fn append_adds_and_overwrite_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let append =
            Arc::new(ViewStore::load(&dir.path().join("a"), schema(), WriteMode::Append).unwrap());
        let complete = Arc::new(
            ViewStore::load(&dir.path().join("c"), schema(), WriteMode::Overwrite).unwrap(),
        );
        for (b, rows) in [&[("/a", 1)][..], &[("/a", 1), ("/b", 2)][..], &[][..]]
            .into_iter()
            .enumerate()
        {
            for s in [&append, &complete] {
                s.commit(BatchId(b as u64), vec![batch(rows)])
                    .await
                    .unwrap();
            }
        }
        let appended = pairs(&[("/a", 1), ("/a", 1), ("/b", 2)]);
        assert_eq!(rows_of(&append, "SELECT * FROM v").await, appended);
        assert_eq!(rows_of(&complete, "SELECT * FROM v").await, vec![]);
        let a =
            Arc::new(ViewStore::load(&dir.path().join("a"), schema(), WriteMode::Append).unwrap());
        let c = Arc::new(
            ViewStore::load(&dir.path().join("c"), schema(), WriteMode::Overwrite).unwrap(),
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
}
