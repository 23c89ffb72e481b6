//! The Delta Lake sink: one Delta commit per micro-batch, idempotent by batch id.
//!
//! Each commit carries an application transaction `(app id = query id, version = batch id)`.
//! delta-rs does not skip a commit whose version it has already seen for an app id, so
//! [`DeltaSink::add_batch`] reads the table's transaction version first and skips batch `N`
//! when `N <= version` (spec §11.2). A batch replayed after a crash between the Delta commit
//! and `commits/N` is therefore never written twice.

pub mod merge;
pub mod scan;
pub mod table;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Weak};

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::Session;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::DataFusionError;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;
use deltalake::DeltaTable;
use deltalake::kernel::engine::arrow_conversion::TryIntoKernel;
use deltalake::kernel::transaction::{CommitBuilder, CommitProperties};
use deltalake::kernel::{Action, StructType, Transaction};
use deltalake::operations::optimize::{Metrics, OptimizeType};
use deltalake::protocol::DeltaOperation;
use deltalake::protocol::SaveMode;
use deltalake::writer::{DeltaWriter, RecordBatchWriter};
use tokio::sync::Mutex;
use url::Url;

use super::{BatchInfo, Sink, SinkCommit, WriteMode};
use crate::error::{Error, Result};

/// A Delta table that a streaming query appends to.
pub struct DeltaSink {
    path: PathBuf,
    url: Url,
    /// The rows' schema.
    schema: SchemaRef,
    /// The table as of our last commit; this sink is the table's only streaming writer.
    table: Mutex<Option<DeltaTable>>,
    /// The last batch committed by an app id, once read from the table or written by us:
    /// the transaction version is then known without reading the log again.
    last_batch: std::sync::Mutex<Option<(String, Option<i64>)>>,
    /// Compact once this many files were added since the last compaction; 0: never.
    auto_compact: u64,
    /// The table's number of files after this sink last compacted it, or when the sink
    /// first wrote (`u64::MAX` before that).
    files_at_compaction: AtomicU64,
}

/// What a compaction did (Delta's `OPTIMIZE` metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CompactionReport {
    pub files_removed: u64,
    pub files_added: u64,
    pub bytes_removed: u64,
    pub bytes_added: u64,
    /// Files looked at, and those left alone (already at the target size).
    pub files_considered: u64,
    pub files_skipped: u64,
}

impl From<&Metrics> for CompactionReport {
    fn from(m: &Metrics) -> CompactionReport {
        CompactionReport {
            files_removed: m.num_files_removed,
            files_added: m.num_files_added,
            bytes_removed: if m.num_files_removed == 0 {
                0
            } else {
                m.files_removed.total_size.max(0) as u64
            },
            bytes_added: if m.num_files_added == 0 {
                0
            } else {
                m.files_added.total_size.max(0) as u64
            },
            files_considered: m.total_considered_files as u64,
            files_skipped: m.total_files_skipped as u64,
        }
    }
}

/// The lock that this process's writers of the table at `path` take around a commit.
pub fn table_lock(path: &Path) -> Arc<Mutex<()>> {
    static LOCKS: LazyLock<std::sync::Mutex<HashMap<PathBuf, Weak<Mutex<()>>>>> =
        LazyLock::new(Default::default);
    let mut locks = LOCKS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(lock) = locks.get(path).and_then(Weak::upgrade) {
        return lock;
    }
    locks.retain(|_, l| l.strong_count() > 0);
    let lock = Arc::new(Mutex::new(()));
    locks.insert(path.to_path_buf(), Arc::downgrade(&lock));
    lock
}

/// Rewrites the small files of the Delta table at `path` into files of the table's target
/// size (`delta.targetFileSize`, 100 MB by default), or, with `zorder` columns, rewrites
/// every file in Z-order of those columns, so that filters on them skip files. One commit,
/// `dataChange: false`; a table with nothing to compact gets no commit.
pub async fn optimize(path: &Path, zorder: &[String]) -> Result<CompactionReport> {
    let lock = table_lock(path);
    let _guard = lock.lock().await;
    let table = deltalake::open_table(table_url(path)?)
        .await
        .map_err(|e| delta_err(path, e))?;
    let (_, metrics) = compact(table, zorder)
        .await
        .map_err(|e| delta_err(path, e))?;
    Ok(CompactionReport::from(&metrics))
}

async fn compact(
    table: DeltaTable,
    zorder: &[String],
) -> deltalake::DeltaResult<(DeltaTable, Metrics)> {
    let kind = if zorder.is_empty() {
        OptimizeType::Compact
    } else {
        OptimizeType::ZOrder(zorder.to_vec())
    };
    table.optimize().with_type(kind).await
}

fn delta_err(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Delta {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

/// The table at `path` as of its latest commit: `kept` (opened on first use), brought up to
/// date only when another writer (a compaction, a statement, another engine) committed
/// since, so that a writer does not replay the log before each of its commits.
async fn latest(kept: &mut Option<DeltaTable>, path: &Path, url: &Url) -> Result<DeltaTable> {
    if let Some(t) = kept.as_mut() {
        if let Some(v) = t.version()
            && commit_file(path, v + 1).exists()
        {
            t.update_incremental(None)
                .await
                .map_err(|e| delta_err(path, e))?;
        }
        return Ok(t.clone());
    }
    let t = deltalake::open_table(url.clone())
        .await
        .map_err(|e| delta_err(path, e))?;
    *kept = Some(t.clone());
    Ok(t)
}

/// A delta-rs error of a statement (MERGE, UPDATE, DELETE): planning errors (an unknown
/// column or function, a type mismatch, two source rows for one target row) are the
/// statement's fault, with Postgres's codes, not an I/O error.
fn statement_err(path: &Path, e: deltalake::DeltaTableError) -> Error {
    let message = e.to_string();
    let lower = message.to_ascii_lowercase();
    if lower.contains("cardinality") || lower.contains("multiple source rows") {
        // Postgres: "MERGE command cannot affect row a second time".
        return Error::Cardinality(format!(
            "MERGE command cannot affect row a second time: more than one source row matched \
             a target row ({message})"
        ));
    }
    match e {
        // DataFusion's planning errors, stringified by delta-rs: classified as DataFusion's.
        deltalake::DeltaTableError::Generic(m) => Error::DataFusion(DataFusionError::Plan(m)),
        other => delta_err(path, other),
    }
}

/// The `file://` URL of a local table directory (created if missing).
pub fn table_url(path: &Path) -> Result<Url> {
    crate::fsutil::create_dir_all(path)?;
    deltalake::ensure_table_uri(path.to_string_lossy()).map_err(|e| delta_err(path, e))
}

impl DeltaSink {
    /// A sink that compacts the table once `auto_compact` files were added (0: never).
    pub fn new(path: &Path, schema: SchemaRef, auto_compact: u64) -> Result<DeltaSink> {
        Ok(DeltaSink {
            path: path.to_path_buf(),
            url: table_url(path)?,
            schema,
            table: Mutex::new(None),
            last_batch: std::sync::Mutex::new(None),
            auto_compact,
            files_at_compaction: AtomicU64::new(u64::MAX),
        })
    }

    /// Creates the table with `schema` if there is none. An existing table must have the
    /// same column names and types.
    pub async fn ensure_table(&self, name: &str, schema: &SchemaRef) -> Result<()> {
        ensure_table(&self.path, name, schema).await
    }

    /// The table as of its latest commit: the kept one, brought up to date when another
    /// writer (a compaction, another engine) committed since.
    async fn load(&self) -> Result<DeltaTable> {
        let mut guard = self.table.lock().await;
        latest(&mut guard, &self.path, &self.url).await
    }

    /// The last batch id committed by `app_id`, if any.
    pub async fn committed_batch(&self, app_id: &str) -> Result<Option<i64>> {
        if let Some((id, v)) = self.last_batch.lock().ok().and_then(|g| g.clone())
            && id == app_id
        {
            return Ok(v);
        }
        let table = self.load().await?;
        let snapshot = table.snapshot().map_err(|e| delta_err(&self.path, e))?;
        let snapshot = snapshot
            .transaction_version(table.log_store().as_ref(), app_id)
            .await
            .map_err(|e| delta_err(&self.path, e))?;
        self.remember(app_id, snapshot);
        Ok(snapshot)
    }

    fn remember(&self, app_id: &str, batch: Option<i64>) {
        if let Ok(mut g) = self.last_batch.lock() {
            *g = Some((app_id.to_string(), batch));
        }
    }
}

#[async_trait]
impl Sink for DeltaSink {
    /// Writes a batch's rows in one commit tagged `(app_id, batch_id)`, unless the table
    /// already holds that batch.
    async fn add_batch(
        &self,
        batch: &BatchInfo<'_>,
        mut batches: Vec<RecordBatch>,
    ) -> Result<SinkCommit> {
        let (app_id, batch_id, mode) = (batch.query_id, batch.id, batch.mode);
        let schema = &self.schema;
        let lock = table_lock(&self.path);
        let _write = lock.lock().await;
        if let Some(v) = self.committed_batch(app_id).await?
            && v >= batch_id.get() as i64
        {
            return Ok(SinkCommit::AlreadyCommitted);
        }
        let table = self.load().await?;
        let props = CommitProperties::default()
            .with_cleanup_expired_logs(expired_log_cleanup(&table))
            .with_application_transaction(Transaction::new(app_id, batch_id.get() as i64))
            .with_metadata([
                ("queryId".to_string(), serde_json::json!(app_id)),
                (
                    "epochId".to_string(),
                    serde_json::json!(batch_id.to_string()),
                ),
                (
                    "outputMode".to_string(),
                    serde_json::json!(mode.spark_name()),
                ),
            ]);
        if batches.is_empty() && *mode == WriteMode::Overwrite {
            // Spark commits every batch, empty and no-data ones too (spec §11.2); delta-rs
            // needs at least one batch to write.
            batches.push(RecordBatch::new_empty(schema.clone()));
        }
        let files = table.snapshot().map_or(0, |s| s.log_data().num_files()) as u64;
        let _ = self.files_at_compaction.compare_exchange(
            u64::MAX,
            files,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        let result = match mode {
            WriteMode::Append => self.append(table, batches, props).await,
            WriteMode::Overwrite => {
                table
                    .write(batches)
                    .with_save_mode(SaveMode::Overwrite)
                    .with_commit_properties(props)
                    .await
            }
            WriteMode::Merge { keys } => {
                let Some(first) = batches.first() else {
                    // Nothing to upsert; a replay would write nothing either.
                    return Ok(SinkCommit::Committed {
                        version: table.version().map_or(-1, |v| v as i64),
                    });
                };
                let schema = first.schema();
                let source = datafusion::prelude::SessionContext::new()
                    .read_batches(batches)
                    .map_err(|e| delta_err(&self.path, e))?;
                let quote = |c: &str| format!("\"{}\"", c.replace('"', "\"\""));
                let predicate = keys
                    .iter()
                    .map(|k| format!("(t.{0} IS NOT DISTINCT FROM s.{0})", quote(k)))
                    .collect::<Vec<_>>()
                    .join(" AND ");
                let columns: Vec<String> =
                    schema.fields().iter().map(|f| f.name().clone()).collect();
                let updates: Vec<&String> = columns.iter().filter(|c| !keys.contains(c)).collect();
                table
                    .merge(source, predicate.as_str())
                    .with_source_alias("s")
                    .with_target_alias("t")
                    .when_matched_update(|mut u| {
                        for c in &updates {
                            u = u.update(quote(c).as_str(), format!("s.{}", quote(c)).as_str());
                        }
                        u
                    })
                    .and_then(|m| {
                        m.when_not_matched_insert(|mut i| {
                            for c in &columns {
                                i = i.set(quote(c).as_str(), format!("s.{}", quote(c)).as_str());
                            }
                            i
                        })
                    })
                    .map(|m| m.with_commit_properties(props))
                    .map_err(|e| delta_err(&self.path, e))?
                    .await
                    .map(|(t, _metrics)| t)
            }
        };
        let mut guard = self.table.lock().await;
        match result {
            Ok(t) => {
                let version = t.version().map_or(-1, |v| v as i64);
                self.remember(app_id, Some(batch_id.get() as i64));
                let t = if *mode == WriteMode::Overwrite {
                    t
                } else {
                    self.maybe_compact(t).await
                };
                *guard = Some(t);
                Ok(SinkCommit::Committed { version })
            }
            Err(e) => {
                // Reload next time: the commit may or may not have happened.
                *guard = None;
                if let Ok(mut g) = self.last_batch.lock() {
                    *g = None;
                }
                Err(delta_err(&self.path, e))
            }
        }
    }

    fn describe(&self) -> String {
        format!("DeltaSink[{}]", self.path.display())
    }
}

impl DeltaSink {
    /// Compacts the table once it has `auto_compact` more files than after the last
    /// compaction (appends add a file per batch; MERGEs rewrite some and add others). The
    /// batch is committed already: a failed compaction is logged and changes nothing (its
    /// files, if any, are orphans no reader sees).
    async fn maybe_compact(&self, table: DeltaTable) -> DeltaTable {
        let files = table.snapshot().map_or(0, |s| s.log_data().num_files()) as u64;
        let base = self.files_at_compaction.load(Ordering::Relaxed);
        if self.auto_compact == 0 || files < base.saturating_add(self.auto_compact) {
            return table;
        }
        match compact(table.clone(), &[]).await {
            Ok((t, m)) => {
                crate::testing::crash_point("after_compaction");
                let files = t.snapshot().map_or(0, |s| s.log_data().num_files()) as u64;
                self.files_at_compaction.store(files, Ordering::Relaxed);
                tracing::debug!(
                    path = %self.path.display(),
                    removed = m.num_files_removed,
                    added = m.num_files_added,
                    "auto-compacted"
                );
                t
            }
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "auto-compaction failed");
                self.files_at_compaction.store(files, Ordering::Relaxed);
                table
            }
        }
    }

    /// Appends in two steps, data files then the log entry, so that a crash between them
    /// (crash point `sink_files_written`) can be tested: the files are then orphans that no
    /// reader sees, and the replayed batch writes new ones.
    async fn append(
        &self,
        mut table: DeltaTable,
        batches: Vec<RecordBatch>,
        props: CommitProperties,
    ) -> deltalake::DeltaResult<DeltaTable> {
        let mut writer = RecordBatchWriter::for_table(&table)?;
        for b in batches.into_iter().filter(|b| b.num_rows() > 0) {
            writer.write(b).await?;
        }
        let actions: Vec<Action> = writer.flush().await?.into_iter().map(Action::Add).collect();
        crate::testing::crash_point("sink_files_written");
        let operation = DeltaOperation::Write {
            mode: SaveMode::Append,
            partition_by: None,
            predicate: None,
        };
        let snapshot = table.snapshot()?.clone();
        let finalized = CommitBuilder::from(props)
            .with_actions(actions)
            .build(Some(&snapshot), table.log_store(), operation)
            .await?;
        table.state = Some(finalized.snapshot());
        Ok(table)
    }
}

/// Whether the commit after `table`'s version cleans up expired log files: only when it
/// also writes a checkpoint (Delta's rule: "each time a checkpoint is written"), so that the
/// other commits do not list `_delta_log` for nothing. `None`: delta-rs decides.
fn expired_log_cleanup(table: &DeltaTable) -> Option<bool> {
    use deltalake::table::config::TablePropertiesExt;
    let (Some(v), Ok(snapshot)) = (table.version(), table.snapshot()) else {
        return None;
    };
    let interval = snapshot.table_config().checkpoint_interval().get();
    (!(v + 2).is_multiple_of(interval)).then_some(false)
}

/// See [`DeltaSink::ensure_table`].
pub async fn ensure_table(path: &Path, name: &str, schema: &SchemaRef) -> Result<()> {
    let url = table_url(path)?;
    // A new table is not loaded first: the kernel would log an error for its empty log.
    let table = if path.join("_delta_log").is_dir() {
        DeltaTable::try_from_url(url).await
    } else {
        deltalake::DeltaTableBuilder::from_url(url).and_then(|b| b.build())
    }
    .map_err(|e| delta_err(path, e))?;
    if table.version().is_some() {
        let existing = table
            .snapshot()
            .map_err(|e| delta_err(path, e))?
            .snapshot()
            .arrow_schema();
        let same = existing.fields().len() == schema.fields().len()
            && existing
                .fields()
                .iter()
                .zip(schema.fields())
                .all(|(a, b)| a.name() == b.name() && a.data_type() == b.data_type());
        if !same {
            let columns = |s: &SchemaRef| {
                s.fields()
                    .iter()
                    .map(|f| format!("{} {}", f.name(), f.data_type()))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            return Err(Error::InvalidOption {
                message: format!(
                    "the Delta table at \"{}\" has a different schema than \"{name}\"",
                    path.display()
                ),
                hint: Some(format!(
                    "The table has ({}), \"{name}\" has ({}). Use another path, or a query \
                     with the table's columns.",
                    columns(&existing),
                    columns(schema)
                )),
            });
        }
        return Ok(());
    }
    let kschema: StructType = schema
        .as_ref()
        .try_into_kernel()
        .map_err(|e| delta_err(path, e))?;
    table
        .create()
        .with_table_name(name)
        .with_columns(kschema.fields().cloned())
        .with_save_mode(SaveMode::Ignore)
        .await
        .map_err(|e| delta_err(path, e))?;
    Ok(())
}

/// A sink's Delta table as a DataFusion table: every scan reads the latest version.
///
/// The snapshot is kept between scans. A scan first checks whether the commit after the
/// kept version exists (one `stat` of `_delta_log/<v+1>.json`); only then does it read the
/// new commits (`update_incremental`), instead of replaying the log for every query.
pub struct DeltaReadTable {
    schema: SchemaRef,
    versions: Arc<Versions>,
}

/// The versions of a sink's table that scans read: the kept snapshot and its rows. Scans
/// ([`scan::CachedScanExec`]) hold it to bind themselves to a newer version later.
struct Versions {
    path: PathBuf,
    schema: SchemaRef,
    cache: Mutex<Option<CachedSnapshot>>,
    /// Set once the table outgrew the read cache: its scans read the files from then on.
    too_big: std::sync::atomic::AtomicBool,
    /// The read cache's size: [`crate::config::READ_CACHE_BYTES`] (tests set another).
    budget: u64,
}

/// The table as of `version`, and its DataFusion provider.
struct CachedSnapshot {
    table: DeltaTable,
    version: u64,
    provider: Arc<dyn TableProvider>,
    /// The version's rows, decoded, when the table fits the read cache.
    rows: Option<Arc<TableRows>>,
    /// Whether `rows` was tried for this version.
    decoded: bool,
}

/// Bytes of decoded rows that every table's read cache holds together.
static CACHED_BYTES: AtomicU64 = AtomicU64::new(0);

/// One table version's rows in memory: each live file's batches, cast to the table's
/// schema. Files are shared with the previous version's, so a new commit decodes only the
/// files it adds.
pub struct TableRows {
    files: Vec<(String, Arc<CachedFile>)>,
}

/// A data file's decoded rows, counted in [`CACHED_BYTES`] once, however many versions
/// share it, until the last one drops.
struct CachedFile {
    batches: Vec<RecordBatch>,
    bytes: u64,
}

impl CachedFile {
    /// Counts `batches` in the cache; `false` with it if the cache is then over `budget`.
    fn reserve(batches: Vec<RecordBatch>, budget: u64) -> (CachedFile, bool) {
        let bytes = batches
            .iter()
            .map(|b| b.get_array_memory_size() as u64)
            .sum();
        let before = CACHED_BYTES.fetch_add(bytes, Ordering::Relaxed);
        let fits = before + bytes <= budget;
        (CachedFile { batches, bytes }, fits)
    }
}

impl Drop for CachedFile {
    fn drop(&mut self) {
        CACHED_BYTES.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// Why a table version is read from its files instead of the cache.
fn uncacheable(table: &DeltaTable) -> Option<&'static str> {
    let Ok(state) = table.snapshot() else {
        return Some("no snapshot");
    };
    let snapshot = state.snapshot();
    if !snapshot.metadata().partition_columns().is_empty() {
        return Some("partitioned");
    }
    if snapshot
        .metadata()
        .configuration()
        .get("delta.columnMapping.mode")
        .is_some_and(|m| !m.eq_ignore_ascii_case("none"))
    {
        return Some("column mapping");
    }
    if state
        .log_data()
        .iter()
        .any(|f| f.deletion_vector_descriptor().is_some())
    {
        return Some("deletion vectors");
    }
    None
}

impl std::fmt::Debug for DeltaReadTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeltaReadTable")
            .field("path", &self.versions.path)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Versions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Versions")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// The file of commit `version` in the table at `path`.
fn commit_file(path: &Path, version: u64) -> PathBuf {
    path.join("_delta_log").join(format!("{version:020}.json"))
}

/// The Arrow schema of the Delta table at `path` (a Delta stream's columns).
pub async fn table_schema(path: &Path) -> Result<SchemaRef> {
    if !path.join("_delta_log").is_dir() {
        return Err(Error::InvalidOption {
            message: format!(
                "\"{}\" is not a Delta table (no _delta_log)",
                path.display()
            ),
            hint: Some("Point path at a Delta table, such as a Delta sink's path.".into()),
        });
    }
    Ok(DeltaReadTable::try_new(path).await?.schema)
}

impl DeltaReadTable {
    /// Opens the table to learn its schema as the Delta provider reports it, and keeps the
    /// snapshot for the first scan.
    pub async fn try_new(path: &Path) -> Result<DeltaReadTable> {
        let table = deltalake::open_table(table_url(path)?)
            .await
            .map_err(|e| delta_err(path, e))?;
        let provider = table
            .table_provider()
            .await
            .map_err(|e| delta_err(path, e))?;
        let schema = provider.schema();
        let cache = table.version().map(|version| CachedSnapshot {
            table,
            version,
            provider,
            rows: None,
            decoded: false,
        });
        Ok(DeltaReadTable {
            schema: schema.clone(),
            versions: Arc::new(Versions {
                path: path.to_path_buf(),
                schema,
                cache: Mutex::new(cache),
                too_big: std::sync::atomic::AtomicBool::new(false),
                budget: crate::config::READ_CACHE_BYTES,
            }),
        })
    }

    #[cfg(test)]
    async fn latest(&self) -> Result<(Arc<dyn TableProvider>, Option<Arc<TableRows>>)> {
        self.versions.latest().await
    }
}

impl Versions {
    /// The table's latest version: the kept one while no newer commit exists. Its rows are
    /// decoded on the version's first scan.
    async fn latest(&self) -> Result<(Arc<dyn TableProvider>, Option<Arc<TableRows>>)> {
        let mut cache = self.cache.lock().await;
        let current = cache
            .as_ref()
            .is_some_and(|c| !commit_file(&self.path, c.version + 1).exists());
        if !current {
            let (table, old_rows) = match cache.take() {
                Some(mut c) => {
                    c.table
                        .update_incremental(None)
                        .await
                        .map_err(|e| delta_err(&self.path, e))?;
                    (c.table, c.rows)
                }
                None => (
                    deltalake::open_table(table_url(&self.path)?)
                        .await
                        .map_err(|e| delta_err(&self.path, e))?,
                    None,
                ),
            };
            let provider = table
                .table_provider()
                .await
                .map_err(|e| delta_err(&self.path, e))?;
            let rows = self.decode(&table, old_rows.as_deref()).await;
            let Some(version) = table.version() else {
                return Ok((provider, None));
            };
            *cache = Some(CachedSnapshot {
                table,
                version,
                provider,
                rows,
                decoded: true,
            });
        }
        let Some(c) = cache.as_mut() else {
            return Err(delta_err(&self.path, "the table has no version"));
        };
        if !c.decoded {
            c.rows = self.decode(&c.table, None).await;
            c.decoded = true;
        }
        Ok((c.provider.clone(), c.rows.clone()))
    }

    /// The version's rows decoded into memory, reusing `old`'s files, if the table can be
    /// read that way and fits [`crate::config::READ_CACHE_BYTES`]; `None` otherwise (the
    /// scan then reads the files).
    async fn decode(&self, table: &DeltaTable, old: Option<&TableRows>) -> Option<Arc<TableRows>> {
        if self.too_big.load(Ordering::Relaxed) {
            return None;
        }
        if let Some(why) = uncacheable(table) {
            tracing::debug!(path = %self.path.display(), why, "read from files");
            return None;
        }
        let live: Vec<(String, u64)> = table
            .snapshot()
            .ok()?
            .log_data()
            .iter()
            .map(|f| (f.path().into_owned(), f.size().max(0) as u64))
            .collect();
        let kept: HashMap<&str, &Arc<CachedFile>> = old
            .map(|o| o.files.iter().map(|(p, f)| (p.as_str(), f)).collect())
            .unwrap_or_default();
        // Decoded rows take at least the room of their compressed files: a table whose new
        // files alone exceed what is left of the budget is not decoded at all.
        let new_bytes: u64 = live
            .iter()
            .filter(|(p, _)| !kept.contains_key(p.as_str()))
            .map(|(_, size)| size)
            .sum();
        if CACHED_BYTES.load(Ordering::Relaxed) + new_bytes > self.budget {
            return self.outgrown();
        }
        // New files are decoded on every core, as many at a time as there are cores, and
        // taken in the log's order; the budget is checked file by file as they come, so a
        // table that outgrows it stops the decoding after at most that many more files.
        use futures::StreamExt;
        enum Rows {
            Kept(Arc<CachedFile>),
            Read(Vec<RecordBatch>),
            Failed(String),
        }
        let mut decoded = futures::stream::iter(live.into_iter().map(|(path, _size)| {
            let kept = kept.get(path.as_str()).map(|f| Arc::clone(f));
            let file = self.path.join(&path);
            let schema = self.schema.clone();
            async move {
                let rows = match kept {
                    Some(f) => Rows::Kept(f),
                    None => {
                        match tokio::task::spawn_blocking(move || read_parquet(&file, &schema))
                            .await
                        {
                            Ok(Ok(batches)) => Rows::Read(batches),
                            Ok(Err(e)) => Rows::Failed(e.to_string()),
                            Err(e) => Rows::Failed(e.to_string()),
                        }
                    }
                };
                (path, rows)
            }
        }))
        .buffered(crate::config::parallelism());
        let mut files = Vec::new();
        while let Some((path, rows)) = decoded.next().await {
            let batches = match rows {
                Rows::Kept(f) => {
                    files.push((path, f));
                    continue;
                }
                Rows::Read(batches) => batches,
                Rows::Failed(error) => {
                    tracing::debug!(path = %self.path.display(), error, "read from files");
                    return None;
                }
            };
            let (cached, fits) = CachedFile::reserve(batches, self.budget);
            if !fits {
                return self.outgrown();
            }
            files.push((path, Arc::new(cached)));
        }
        Some(Arc::new(TableRows { files }))
    }

    /// Marks the table as read from its files from now on: it does not fit the cache.
    fn outgrown<T>(&self) -> Option<T> {
        self.too_big.store(true, Ordering::Relaxed);
        tracing::info!(
            path = %self.path.display(),
            budget = self.budget,
            "the read cache is full; queries of this table read its files"
        );
        None
    }
}

/// A data file's rows, cast to the table's `schema` (a column the file lacks is NULL).
fn read_parquet(file: &Path, schema: &SchemaRef) -> Result<Vec<RecordBatch>> {
    use datafusion::arrow::array::new_null_array;
    use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let bad = |e: &dyn std::fmt::Display| delta_err(file, e);
    let f = std::fs::File::open(file).map_err(|e| bad(&e))?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(f)
        .map_err(|e| bad(&e))?
        .with_batch_size(8192)
        .build()
        .map_err(|e| bad(&e))?;
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| bad(&e))?;
        let columns = schema
            .fields()
            .iter()
            .map(|field| match batch.column_by_name(field.name()) {
                Some(c) if c.data_type() == field.data_type() => Ok(c.clone()),
                Some(c) => datafusion::arrow::compute::cast(c, field.data_type()),
                None => Ok(new_null_array(field.data_type(), batch.num_rows())),
            })
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| bad(&e))?;
        out.push(RecordBatch::try_new(schema.clone(), columns).map_err(|e| bad(&e))?);
    }
    Ok(out)
}

#[async_trait]
impl TableProvider for DeltaReadTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        let (provider, rows) = self
            .versions
            .latest()
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        let Some(rows) = rows else {
            return provider.scan(state, projection, filters, limit).await;
        };
        // The version's rows from memory, spread over the session's partitions; filters
        // stay above the scan.
        let partitions = state.config().target_partitions().max(1);
        Ok(Arc::new(scan::CachedScanExec::try_new(
            self.versions.clone(),
            rows,
            projection.cloned(),
            limit,
            partitions,
        )?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::BatchId;
    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::prelude::SessionContext;

    fn id_page_schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("page", DataType::Utf8, true),
        ]))
    }

    fn batch(schema: &SchemaRef, ids: &[i64], pages: &[&str]) -> RecordBatch {
        RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from(ids.to_vec())),
                Arc::new(StringArray::from(pages.to_vec())),
            ],
        )
        .unwrap()
    }

    /// `SELECT ... FROM t` over `table`, sorted, as text.
    async fn rows(table: Arc<dyn TableProvider>, sql: &str) -> Vec<String> {
        let ctx = SessionContext::new();
        ctx.register_table("t", table).unwrap();
        let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
        let text = datafusion::arrow::util::pretty::pretty_format_batches(&batches)
            .unwrap()
            .to_string();
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        lines.sort();
        lines
    }

    #[tokio::test]
    async fn a_read_table_serves_each_version_from_memory_as_delta_reads_it() {
        let dir = tempfile::tempdir().unwrap();
        let schema = id_page_schema();
        let sink = DeltaSink::new(dir.path(), schema.clone(), 2).unwrap();
        sink.ensure_table("t", &schema).await.unwrap();
        let write = |b: u64, ids: &'static [i64], pages: &'static [&'static str]| {
            let batch = batch(&schema, ids, pages);
            let sink = &sink;
            async move {
                sink.add_batch(
                    &BatchInfo::new("q", BatchId(b), &WriteMode::Append),
                    vec![batch],
                )
                .await
                .unwrap()
            }
        };
        write(0, &[1, 2], &["/a", "/b"]).await;
        let read = Arc::new(DeltaReadTable::try_new(dir.path()).await.unwrap());
        let sql = "SELECT id, page FROM t WHERE id > 0";
        // The independent reading: delta-rs's own provider over a freshly opened table.
        let delta = || async {
            let t = deltalake::open_table(table_url(dir.path()).unwrap())
                .await
                .unwrap();
            t.table_provider().await.unwrap()
        };
        assert_eq!(
            rows(read.clone(), sql).await,
            rows(delta().await, sql).await
        );
        let (_, cached) = read.latest().await.unwrap();
        assert_eq!(cached.unwrap().files.len(), 1);
        // The second file makes the sink compact the two (auto_compact = 2).
        write(1, &[3], &["/c"]).await;
        assert_eq!(
            rows(read.clone(), sql).await,
            rows(delta().await, sql).await
        );
        let (_, cached) = read.latest().await.unwrap();
        let compacted = cached.unwrap().files.clone();
        assert_eq!(compacted.len(), 1, "the compacted file");
        // A third: the compacted file is kept decoded, the new one decoded once.
        write(2, &[4, 5], &["/d", "/e"]).await;
        let got = rows(read.clone(), sql).await;
        assert_eq!(got, rows(delta().await, sql).await);
        assert_eq!(got.iter().filter(|l| l.contains("| /")).count(), 5);
        let (_, cached) = read.latest().await.unwrap();
        let files = cached.unwrap().files.clone();
        assert_eq!(files.len(), 2);
        assert!(files.iter().any(|(_, f)| Arc::ptr_eq(f, &compacted[0].1)));
        let agg = "SELECT page, count(*) FROM t GROUP BY page";
        assert_eq!(
            rows(read.clone(), agg).await,
            rows(delta().await, agg).await
        );
    }

    #[tokio::test]
    async fn a_first_read_decodes_many_files_together_and_keeps_the_logs_order() {
        let dir = tempfile::tempdir().unwrap();
        let schema = id_page_schema();
        let sink = DeltaSink::new(dir.path(), schema.clone(), 0).unwrap();
        sink.ensure_table("t", &schema).await.unwrap();
        let pages = ["/a", "/b", "/c", "/d", "/e", "/f", "/g"];
        for (b, page) in pages.iter().enumerate() {
            let ids: Vec<i64> = (0..=b as i64).map(|i| 10 * b as i64 + i).collect();
            let batch = batch(&schema, &ids, &vec![*page; ids.len()]);
            sink.add_batch(
                &BatchInfo::new("q", BatchId(b as u64), &WriteMode::Append),
                vec![batch],
            )
            .await
            .unwrap();
        }
        let read = Arc::new(DeltaReadTable::try_new(dir.path()).await.unwrap());
        let opened = deltalake::open_table(table_url(dir.path()).unwrap())
            .await
            .unwrap();
        let log_order: Vec<String> = opened
            .snapshot()
            .unwrap()
            .log_data()
            .iter()
            .map(|f| f.path().into_owned())
            .collect();
        let delta = opened.table_provider().await.unwrap();
        let sql = "SELECT id, page FROM t";
        assert_eq!(rows(read.clone(), sql).await, rows(delta, sql).await);
        let (_, cached) = read.latest().await.unwrap();
        let files = cached.unwrap().files.clone();
        assert_eq!(files.len(), pages.len());
        let cached_order: Vec<&str> = files.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(cached_order, log_order);
        // Each file's rows are its own batch's: file k holds k + 1 rows.
        let mut counts: Vec<usize> = files
            .iter()
            .map(|(_, f)| f.batches.iter().map(RecordBatch::num_rows).sum())
            .collect();
        counts.sort_unstable();
        assert_eq!(counts, (1..=pages.len()).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn a_table_over_the_cache_budget_is_read_from_its_files() {
        let dir = tempfile::tempdir().unwrap();
        let schema = id_page_schema();
        let sink = DeltaSink::new(dir.path(), schema.clone(), 0).unwrap();
        sink.ensure_table("t", &schema).await.unwrap();
        let rows_in = batch(&schema, &[1, 2, 3], &["/a", "/b", "/c"]);
        sink.add_batch(
            &BatchInfo::new("q", BatchId(0), &WriteMode::Append),
            vec![rows_in],
        )
        .await
        .unwrap();
        let mut read = DeltaReadTable::try_new(dir.path()).await.unwrap();
        Arc::get_mut(&mut read.versions).unwrap().budget = 1;
        let read = Arc::new(read);
        let sql = "SELECT id, page FROM t";
        let delta = deltalake::open_table(table_url(dir.path()).unwrap())
            .await
            .unwrap()
            .table_provider()
            .await
            .unwrap();
        assert_eq!(rows(read.clone(), sql).await, rows(delta, sql).await);
        let (_, cached) = read.latest().await.unwrap();
        assert!(cached.is_none());
        assert!(read.versions.too_big.load(Ordering::Relaxed));
    }

    #[tokio::test]
    async fn a_partitioned_table_is_read_from_its_files() {
        let dir = tempfile::tempdir().unwrap();
        let schema = id_page_schema();
        let table = DeltaTable::try_from_url(table_url(dir.path()).unwrap())
            .await
            .unwrap();
        table
            .write(vec![batch(&schema, &[1, 2, 3], &["/a", "/b", "/a"])])
            .with_partition_columns(["page"])
            .await
            .unwrap();
        let read = Arc::new(DeltaReadTable::try_new(dir.path()).await.unwrap());
        let sql = "SELECT id, page FROM t";
        let got = rows(read.clone(), sql).await;
        assert!(got.iter().any(|l| l.contains("| 3  | /a")), "{got:?}");
        let (_, cached) = read.latest().await.unwrap();
        assert!(
            cached.is_none(),
            "partition values live in the log, not the files"
        );
    }
}
