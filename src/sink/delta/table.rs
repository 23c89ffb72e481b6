//! A table made with `CREATE TABLE`: a Delta table that ordinary statements read and change.
//!
//! Reads go through [`DeltaReadTable`] (the cached snapshot). DataFusion plans `INSERT`
//! against this provider's `insert_into`: the rows are written in one Delta commit when
//! the plan executes. `UPDATE` and `DELETE` are run by [`update`] and [`delete`] (delta-rs's
//! operations, one commit each) with their expressions as SQL text.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::Session;
use datafusion::common::DataFusionError;
use datafusion::datasource::sink::{DataSink, DataSinkExec};
use datafusion::datasource::{TableProvider, TableType};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan};
use deltalake::protocol::SaveMode;
use futures::StreamExt;

use super::{DeltaReadTable, delta_err, statement_err, table_lock, table_url};
use crate::error::Error;

type DfResult<T> = datafusion::error::Result<T>;

fn external(e: Error) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

/// A `CREATE TABLE` table.
pub struct DeltaWriteTable {
    path: PathBuf,
    read: DeltaReadTable,
}

impl fmt::Debug for DeltaWriteTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeltaWriteTable")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl DeltaWriteTable {
    pub async fn try_new(path: &Path) -> crate::error::Result<DeltaWriteTable> {
        Ok(DeltaWriteTable {
            path: path.to_path_buf(),
            read: DeltaReadTable::try_new(path).await?,
        })
    }
}

#[async_trait]
impl TableProvider for DeltaWriteTable {
    fn schema(&self) -> SchemaRef {
        self.read.schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DfResult<Vec<TableProviderFilterPushDown>> {
        self.read.supports_filters_pushdown(filters)
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        self.read.scan(state, projection, filters, limit).await
    }

    async fn insert_into(
        &self,
        _state: &dyn Session,
        input: Arc<dyn ExecutionPlan>,
        op: InsertOp,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let mode = match op {
            InsertOp::Append => SaveMode::Append,
            InsertOp::Overwrite => SaveMode::Overwrite,
            InsertOp::Replace => {
                return Err(DataFusionError::NotImplemented(
                    "REPLACE INTO is not supported".into(),
                ));
            }
        };
        let sink = DeltaInsert {
            path: self.path.clone(),
            schema: self.schema(),
            mode,
        };
        Ok(Arc::new(DataSinkExec::new(input, Arc::new(sink), None)))
    }
}

/// `DELETE FROM table [WHERE predicate]` (SQL text, resolved by delta-rs against the
/// table's columns) in one commit: the rows deleted.
pub async fn delete(path: &Path, predicate: Option<&str>) -> crate::error::Result<u64> {
    let lock = table_lock(path);
    let _write = lock.lock().await;
    let mut delete = open(path).await?.delete();
    if let Some(p) = predicate {
        delete = delete.with_predicate(p);
    }
    let (_, metrics) = delete.await.map_err(|e| statement_err(path, e))?;
    Ok(metrics.num_deleted_rows.unwrap_or(0) as u64)
}

/// `UPDATE table SET col = expr, ... [WHERE predicate]` in one commit: the rows updated.
pub async fn update(
    path: &Path,
    assignments: &[(String, String)],
    predicate: Option<&str>,
) -> crate::error::Result<u64> {
    let lock = table_lock(path);
    let _write = lock.lock().await;
    let mut update = open(path).await?.update();
    if let Some(p) = predicate {
        update = update.with_predicate(p);
    }
    for (c, e) in assignments {
        update = update.with_update(
            format!("\"{}\"", c.replace('"', "\"\"")).as_str(),
            e.as_str(),
        );
    }
    let (_, metrics) = update.await.map_err(|e| statement_err(path, e))?;
    Ok(metrics.num_updated_rows as u64)
}

async fn open(path: &Path) -> crate::error::Result<deltalake::DeltaTable> {
    deltalake::open_table(table_url(path)?)
        .await
        .map_err(|e| delta_err(path, e))
}

/// `INSERT INTO table ...`: the rows in one Delta commit.
struct DeltaInsert {
    path: PathBuf,
    schema: SchemaRef,
    mode: SaveMode,
}

impl fmt::Debug for DeltaInsert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeltaInsert({})", self.path.display())
    }
}

impl DisplayAs for DeltaInsert {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "DeltaInsert: {}", self.path.display())
    }
}

#[async_trait]
impl DataSink for DeltaInsert {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    async fn write_all(
        &self,
        mut data: SendableRecordBatchStream,
        _context: &Arc<TaskContext>,
    ) -> DfResult<u64> {
        let mut batches = Vec::new();
        let mut rows = 0u64;
        while let Some(b) = data.next().await {
            let b = b?;
            rows += b.num_rows() as u64;
            if b.num_rows() > 0 {
                batches.push(b);
            }
        }
        if batches.is_empty() && self.mode == SaveMode::Append {
            return Ok(0);
        }
        let lock = table_lock(&self.path);
        let _write = lock.lock().await;
        let table = open(&self.path).await.map_err(external)?;
        table
            .write(batches)
            .with_save_mode(self.mode)
            .await
            .map_err(|e| external(delta_err(&self.path, e)))?;
        Ok(rows)
    }
}
