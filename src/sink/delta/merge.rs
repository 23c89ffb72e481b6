//! Delta's MERGE: a [`MergeSpec`] run by delta-rs over a batch of source rows, as a
//! statement (`MERGE INTO`) or once per micro-batch by a MERGE sink ([`MergeSink`]).
//!
//! A MERGE sink's commit carries the transaction `(query id, batch id)`, and a batch the
//! table already holds is skipped, so a batch replayed after a crash changes nothing: the
//! seed's foreachBatch upsert, exactly once.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;
use deltalake::DeltaTable;
use deltalake::kernel::Transaction;
use deltalake::kernel::transaction::CommitProperties;
use deltalake::operations::merge::MergeBuilder;

use super::{delta_err, expired_log_cleanup, latest, statement_err, table_lock, table_url};
use crate::error::{Error, Result};
use crate::sink::{BatchInfo, Sink, SinkCommit};
use crate::sql::merge::{MergeAction, MergeSpec, MergeWhen};

/// What a MERGE did (delta-rs's metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MergeReport {
    pub source_rows: u64,
    pub inserted: u64,
    pub updated: u64,
    pub deleted: u64,
    pub files_scanned: u64,
    pub files_skipped: u64,
    /// The table version the MERGE committed; `None` when it changed nothing.
    pub version: Option<i64>,
}

impl MergeReport {
    /// The rows the MERGE changed: Postgres's `MERGE n`.
    pub fn rows_changed(&self) -> u64 {
        self.inserted + self.updated + self.deleted
    }
}

/// The transaction a MERGE sink's batch commits with.
#[derive(Debug, Clone, Copy)]
pub struct MergeTxn<'a> {
    pub app_id: &'a str,
    pub batch: i64,
}

fn quote(c: &str) -> String {
    format!("\"{}\"", c.replace('"', "\"\""))
}

/// Checks a MERGE against the target's and the source's columns, as `CREATE SINK` and a
/// `MERGE` statement do before anything runs: `*` needs every target column in the source,
/// assigned columns must be the target's, an INSERT without columns gives every one.
pub fn check(spec: &MergeSpec, target: &SchemaRef, source: &SchemaRef) -> Result<()> {
    let target_has = |c: &str| target.fields().iter().any(|f| f.name() == c);
    let missing_in_source = || {
        target
            .fields()
            .iter()
            .find(|f| source.field_with_name(f.name()).is_err())
            .map(|f| f.name().clone())
    };
    for clause in &spec.clauses {
        match &clause.action {
            MergeAction::UpdateAll | MergeAction::InsertAll => {
                if let Some(c) = missing_in_source() {
                    return Err(Error::UndefinedColumn {
                        column: c,
                        relation: spec.source_alias.clone(),
                    });
                }
            }
            MergeAction::Update(sets) => {
                if let Some((c, _)) = sets.iter().find(|(c, _)| !target_has(c)) {
                    return Err(Error::UndefinedColumn {
                        column: c.clone(),
                        relation: spec.target_alias.clone(),
                    });
                }
            }
            MergeAction::Insert { columns, values } => {
                if let Some(c) = columns.iter().find(|c| !target_has(c)) {
                    return Err(Error::UndefinedColumn {
                        column: c.clone(),
                        relation: spec.target_alias.clone(),
                    });
                }
                if columns.is_empty() && values.len() != target.fields().len() {
                    return Err(Error::Syntax(format!(
                        "INSERT VALUES has {} values, the target has {} columns",
                        values.len(),
                        target.fields().len()
                    )));
                }
            }
            MergeAction::Delete => {}
        }
    }
    Ok(())
}

/// Adds the spec's clauses, in order, with `*` expanded to the target's columns.
fn with_clauses(
    mut builder: MergeBuilder,
    spec: &MergeSpec,
    target: &SchemaRef,
) -> deltalake::DeltaResult<MergeBuilder> {
    let columns: Vec<String> = target.fields().iter().map(|f| f.name().clone()).collect();
    let from_source = |c: &str| format!("{}.{}", quote(&spec.source_alias), quote(c));
    for clause in &spec.clauses {
        let cond = clause.condition.clone();
        let all: Vec<(String, String)> =
            columns.iter().map(|c| (quote(c), from_source(c))).collect();
        let sets: Vec<(String, String)> = match &clause.action {
            MergeAction::UpdateAll | MergeAction::InsertAll => all,
            MergeAction::Update(sets) => sets.iter().map(|(c, e)| (quote(c), e.clone())).collect(),
            MergeAction::Insert {
                columns: cols,
                values,
            } => {
                let cols = if cols.is_empty() { &columns } else { cols };
                cols.iter()
                    .zip(values)
                    .map(|(c, e)| (quote(c), e.clone()))
                    .collect()
            }
            MergeAction::Delete => vec![],
        };
        builder = match (clause.when, &clause.action) {
            (MergeWhen::Matched, MergeAction::Delete) => {
                builder.when_matched_delete(|d| match cond {
                    Some(c) => d.predicate(c),
                    None => d,
                })?
            }
            (MergeWhen::Matched, _) => builder.when_matched_update(|mut u| {
                if let Some(c) = cond {
                    u = u.predicate(c);
                }
                for (c, e) in sets {
                    u = u.update(c.as_str(), e);
                }
                u
            })?,
            (MergeWhen::NotMatched, _) => builder.when_not_matched_insert(|mut i| {
                if let Some(c) = cond {
                    i = i.predicate(c);
                }
                for (c, e) in sets {
                    i = i.set(c.as_str(), e);
                }
                i
            })?,
            (MergeWhen::NotMatchedBySource, MergeAction::Delete) => builder
                .when_not_matched_by_source_delete(|d| match cond {
                    Some(c) => d.predicate(c),
                    None => d,
                })?,
            (MergeWhen::NotMatchedBySource, _) => {
                builder.when_not_matched_by_source_update(|mut u| {
                    if let Some(c) = cond {
                        u = u.predicate(c);
                    }
                    for (c, e) in sets {
                        u = u.update(c.as_str(), e);
                    }
                    u
                })?
            }
        };
    }
    Ok(builder)
}

/// Runs `spec` with `rows` (of `schema`) as its source on the table at `path`, in one
/// commit. With `txn`, a batch the table already holds is skipped (`Ok(None)`) and the
/// commit records the batch. A MERGE that would change nothing (no source rows and no
/// `NOT MATCHED BY SOURCE` clause) commits nothing.
pub async fn merge(
    path: &Path,
    spec: &MergeSpec,
    schema: SchemaRef,
    rows: Vec<RecordBatch>,
    txn: Option<MergeTxn<'_>>,
) -> Result<Option<MergeReport>> {
    merge_kept(path, &mut None, spec, schema, rows, txn).await
}

/// [`merge`], with the table kept in `kept` between calls (a MERGE sink's batches), read
/// again only when another writer committed since.
async fn merge_kept(
    path: &Path,
    kept: &mut Option<DeltaTable>,
    spec: &MergeSpec,
    schema: SchemaRef,
    rows: Vec<RecordBatch>,
    txn: Option<MergeTxn<'_>>,
) -> Result<Option<MergeReport>> {
    let lock = table_lock(path);
    let _write = lock.lock().await;
    let table = latest(kept, path, &table_url(path)?).await?;
    // Read again next time unless this MERGE's own commit replaces it.
    *kept = None;
    if let Some(t) = txn
        && committed_batch(path, &table, t.app_id).await? >= Some(t.batch)
    {
        *kept = Some(table);
        return Ok(None);
    }
    let source_rows: usize = rows.iter().map(|b| b.num_rows()).sum();
    if source_rows == 0 && !spec.acts_without_source() {
        *kept = Some(table);
        return Ok(Some(MergeReport::default()));
    }
    let target = target_schema(path, &table)?;
    check(spec, &target, &schema)?;
    let ctx = SessionContext::new();
    let source = ctx
        .read_table(Arc::new(
            MemTable::try_new(schema, vec![rows]).map_err(Error::DataFusion)?,
        ))
        .map_err(Error::DataFusion)?;
    let mut props =
        CommitProperties::default().with_cleanup_expired_logs(expired_log_cleanup(&table));
    if let Some(t) = txn {
        props = props
            .with_application_transaction(Transaction::new(t.app_id, t.batch))
            .with_metadata([
                ("queryId".to_string(), serde_json::json!(t.app_id)),
                (
                    "epochId".to_string(),
                    serde_json::json!(t.batch.to_string()),
                ),
            ]);
    }
    let before = table.version();
    let builder = table
        .merge(source, spec.on.as_str())
        .with_source_alias(&spec.source_alias)
        .with_target_alias(&spec.target_alias)
        .with_commit_properties(props);
    let builder = with_clauses(builder, spec, &target).map_err(|e| statement_err(path, e))?;
    let (table, metrics) = builder.await.map_err(|e| statement_err(path, e))?;
    let version = table
        .version()
        .filter(|v| Some(*v) != before)
        .map(|v| v as i64);
    *kept = Some(table);
    Ok(Some(MergeReport {
        source_rows: metrics.num_source_rows as u64,
        inserted: metrics.num_target_rows_inserted as u64,
        updated: metrics.num_target_rows_updated as u64,
        deleted: metrics.num_target_rows_deleted as u64,
        files_scanned: metrics.num_target_files_scanned as u64,
        files_skipped: metrics.num_target_files_skipped_during_scan as u64,
        version,
    }))
}

/// The target's columns, as the Delta table declares them.
fn target_schema(path: &Path, table: &DeltaTable) -> Result<SchemaRef> {
    Ok(table
        .snapshot()
        .map_err(|e| delta_err(path, e))?
        .snapshot()
        .arrow_schema())
}

/// The last batch `app_id` committed to `table`, if any.
async fn committed_batch(path: &Path, table: &DeltaTable, app_id: &str) -> Result<Option<i64>> {
    table
        .snapshot()
        .map_err(|e| delta_err(path, e))?
        .transaction_version(table.log_store().as_ref(), app_id)
        .await
        .map_err(|e| delta_err(path, e))
}

/// The Arrow schema of the Delta table at `path`, or `None` when there is no table yet.
pub async fn existing_schema(path: &Path) -> Result<Option<SchemaRef>> {
    if !path.join("_delta_log").is_dir() {
        return Ok(None);
    }
    let table = deltalake::open_table(table_url(path)?)
        .await
        .map_err(|e| delta_err(path, e))?;
    target_schema(path, &table).map(Some)
}

/// A MERGE sink: each micro-batch's rows (the `USING` query's output for that batch) are
/// the source of one MERGE into the target, committed with `txn(query id, batch id)`.
pub struct MergeSink {
    path: PathBuf,
    spec: MergeSpec,
    /// The source rows' schema.
    schema: SchemaRef,
    /// The target as of this sink's last MERGE.
    table: tokio::sync::Mutex<Option<DeltaTable>>,
}

impl MergeSink {
    pub fn new(path: &Path, spec: MergeSpec, schema: SchemaRef) -> MergeSink {
        MergeSink {
            path: path.to_path_buf(),
            spec,
            schema,
            table: tokio::sync::Mutex::new(None),
        }
    }
}

#[async_trait]
impl Sink for MergeSink {
    async fn add_batch(&self, batch: &BatchInfo<'_>, rows: Vec<RecordBatch>) -> Result<SinkCommit> {
        let txn = MergeTxn {
            app_id: batch.query_id,
            batch: batch.id.get() as i64,
        };
        let mut kept = self.table.lock().await;
        let merged = merge_kept(
            &self.path,
            &mut kept,
            &self.spec,
            self.schema.clone(),
            rows,
            Some(txn),
        )
        .await?;
        match merged {
            None => Ok(SinkCommit::AlreadyCommitted),
            Some(report) => {
                tracing::debug!(
                    path = %self.path.display(),
                    batch = txn.batch,
                    inserted = report.inserted,
                    updated = report.updated,
                    deleted = report.deleted,
                    files_skipped = report.files_skipped,
                    "merged"
                );
                Ok(SinkCommit::Committed {
                    version: report.version.unwrap_or(-1),
                })
            }
        }
    }

    fn describe(&self) -> String {
        format!("DeltaMergeSink[{}]", self.path.display())
    }
}
