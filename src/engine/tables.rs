//! DataFusion tables that Tidemark registers: table streams (read and `INSERT`), and the
//! system tables `tidemark.queries` and `tidemark.progress`. (A file stream's table is
//! [`crate::format::FilesTable`].)

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{
    ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::catalog::Session;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::sink::{DataSink, DataSinkExec};
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::DataFusionError;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::Expr;
use datafusion::logical_expr::dml::InsertOp;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan};

use super::progress::{Progress, QueryStatus, Registry, StateOperatorProgress};
use crate::error::Error;
use crate::source::table::TableLog;

/// A table stream (`connector = 'table'`) as a table: `SELECT` reads every retained row,
/// `INSERT` appends a statement's rows to the log, durably and atomically.
#[derive(Debug)]
pub struct TableStreamTable {
    log: Arc<TableLog>,
    /// The declared schema with every field nullable: NOT NULL is checked by the append
    /// itself, so the error names the column and the relation as Postgres does.
    schema: SchemaRef,
}

impl TableStreamTable {
    pub fn new(log: Arc<TableLog>) -> TableStreamTable {
        let schema = Arc::new(Schema::new(
            log.schema()
                .fields()
                .iter()
                .map(|f| f.as_ref().clone().with_nullable(true))
                .collect::<Vec<_>>(),
        ));
        TableStreamTable { log, schema }
    }
}

#[async_trait]
impl TableProvider for TableStreamTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        let batches = self
            .log
            .read_all()
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))?
            .into_iter()
            .map(|b| RecordBatch::try_new(self.schema.clone(), b.columns().to_vec()))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let exec =
            MemorySourceConfig::try_new_exec(&[batches], self.schema.clone(), projection.cloned())?;
        Ok(exec)
    }

    async fn insert_into(
        &self,
        _state: &dyn Session,
        input: Arc<dyn ExecutionPlan>,
        op: InsertOp,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        if op != InsertOp::Append {
            return Err(DataFusionError::NotImplemented(format!(
                "{op} on a stream: a stream only appends"
            )));
        }
        Ok(Arc::new(DataSinkExec::new(
            input,
            Arc::new(LogAppend {
                log: self.log.clone(),
                schema: self.schema.clone(),
            }),
            None,
        )))
    }
}

/// A stream only a sink can read (a rate source: its rows exist only batch by batch).
#[derive(Debug)]
pub struct SinkOnlyTable {
    name: String,
    connector: &'static str,
    schema: SchemaRef,
}

impl SinkOnlyTable {
    pub fn new(name: &str, connector: &'static str, schema: SchemaRef) -> SinkOnlyTable {
        SinkOnlyTable {
            name: name.to_string(),
            connector,
            schema,
        }
    }
}

#[async_trait]
impl TableProvider for SinkOnlyTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        _projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        Err(DataFusionError::External(Box::new(Error::Unsupported {
            message: format!(
                "stream \"{}\" ({} source) can only be read by a sink",
                self.name, self.connector
            ),
            hint: Some("Create a sink over it and query the sink.".into()),
        })))
    }
}

/// The write side of a table stream: one statement's rows, all or none.
#[derive(Debug)]
struct LogAppend {
    log: Arc<TableLog>,
    /// What DataFusion hands in: every field nullable.
    schema: SchemaRef,
}

impl DisplayAs for LogAppend {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "StreamLogAppend")
    }
}

#[async_trait]
impl DataSink for LogAppend {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    async fn write_all(
        &self,
        mut data: SendableRecordBatchStream,
        _context: &Arc<TaskContext>,
    ) -> datafusion::error::Result<u64> {
        use futures::StreamExt;
        // The whole statement first: a bad row anywhere appends nothing.
        let declared = self.log.schema();
        let mut batches = Vec::new();
        while let Some(b) = data.next().await {
            let b = b?;
            check_not_null(&declared, &b, self.log.name())
                .map_err(|e| DataFusionError::External(Box::new(e)))?;
            batches.push(RecordBatch::try_new(
                declared.clone(),
                b.columns().to_vec(),
            )?);
        }
        self.log
            .append(batches)
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))
    }
}

/// 23502 for a NULL in a NOT NULL column, in Postgres's words.
pub fn check_not_null(schema: &SchemaRef, b: &RecordBatch, relation: &str) -> Result<(), Error> {
    for (f, c) in schema.fields().iter().zip(b.columns()) {
        if !f.is_nullable() && c.null_count() > 0 {
            return Err(Error::NotNullViolation {
                column: f.name().clone(),
                relation: relation.to_string(),
            });
        }
    }
    Ok(())
}

/// A table computed from the registry at every scan.
pub struct SystemTable {
    schema: SchemaRef,
    registry: Arc<Registry>,
    build: fn(&Registry, &SchemaRef) -> datafusion::error::Result<RecordBatch>,
}

impl std::fmt::Debug for SystemTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SystemTable")
            .field("schema", &self.schema)
            .finish()
    }
}

impl SystemTable {
    /// `tidemark.queries`.
    pub fn queries(registry: Arc<Registry>) -> SystemTable {
        SystemTable {
            schema: queries_schema(),
            registry,
            build: |r, s| queries_batch(&r.all(), s),
        }
    }

    /// `tidemark.progress`.
    pub fn progress(registry: Arc<Registry>) -> SystemTable {
        SystemTable {
            schema: progress_schema(),
            registry,
            build: |r, s| progress_batch(&r.all_progress(), s),
        }
    }
}

#[async_trait]
impl TableProvider for SystemTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::View
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        let batch = (self.build)(&self.registry, &self.schema)?;
        Ok(MemorySourceConfig::try_new_exec(
            &[vec![batch]],
            self.schema.clone(),
            projection.cloned(),
        )?)
    }
}

fn ts_type() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
}

/// The columns of `SHOW QUERIES` and `tidemark.queries`.
pub fn queries_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("name", DataType::Utf8, false),
        Field::new("id", DataType::Utf8, true),
        Field::new("run_id", DataType::Utf8, true),
        Field::new("status", DataType::Utf8, false),
        Field::new("last_batch_id", DataType::Int64, true),
        Field::new("last_progress_at", ts_type(), true),
        Field::new("error", DataType::Utf8, true),
    ]))
}

/// One row per query.
pub fn queries_batch(
    statuses: &[QueryStatus],
    schema: &SchemaRef,
) -> datafusion::error::Result<RecordBatch> {
    let text = |f: &dyn Fn(&QueryStatus) -> Option<String>| -> ArrayRef {
        Arc::new(StringArray::from_iter(statuses.iter().map(f)))
    };
    let cols: Vec<ArrayRef> = vec![
        text(&|s| Some(s.name.clone())),
        text(&|s| s.id.map(|u| u.to_string())),
        text(&|s| s.run_id.map(|u| u.to_string())),
        text(&|s| Some(s.status.as_str().to_string())),
        Arc::new(Int64Array::from_iter(
            statuses
                .iter()
                .map(|s| s.last_batch_id.map(|b| b.get() as i64)),
        )),
        Arc::new(
            TimestampMicrosecondArray::from_iter(
                statuses
                    .iter()
                    .map(|s| s.last_progress_at.map(|t| t.timestamp_micros())),
            )
            .with_timezone("UTC"),
        ),
        text(&|s| s.error.clone()),
    ];
    Ok(RecordBatch::try_new(schema.clone(), cols)?)
}

/// The columns of `tidemark.progress`.
pub fn progress_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("name", DataType::Utf8, false),
        Field::new("id", DataType::Utf8, false),
        Field::new("run_id", DataType::Utf8, false),
        Field::new("batch_id", DataType::Int64, false),
        Field::new("timestamp", ts_type(), false),
        Field::new("batch_duration_ms", DataType::Int64, false),
        Field::new("num_input_rows", DataType::Int64, false),
        Field::new("input_rows_per_second", DataType::Float64, false),
        Field::new("processed_rows_per_second", DataType::Float64, false),
        Field::new("duration_ms", DataType::Utf8, false),
        Field::new("source_start_offset", DataType::Utf8, true),
        Field::new("source_end_offset", DataType::Utf8, true),
        Field::new("sink_output_rows", DataType::Int64, false),
        Field::new("watermark", ts_type(), true),
        Field::new("event_time_min", ts_type(), true),
        Field::new("event_time_max", ts_type(), true),
        Field::new("rows_dropped_by_watermark", DataType::Int64, true),
        Field::new("state_rows_total", DataType::Int64, true),
        Field::new("state_rows_updated", DataType::Int64, true),
        Field::new("state_rows_removed", DataType::Int64, true),
        Field::new("malformed_rows", DataType::Int64, false),
        Field::new("missing_files", DataType::Int64, false),
        Field::new("progress", DataType::Utf8, false),
    ]))
}

/// One row per kept progress report.
pub fn progress_batch(
    reports: &[Progress],
    schema: &SchemaRef,
) -> datafusion::error::Result<RecordBatch> {
    let text = |f: &dyn Fn(&Progress) -> Option<String>| -> ArrayRef {
        Arc::new(StringArray::from_iter(reports.iter().map(f)))
    };
    let int = |f: &dyn Fn(&Progress) -> i64| -> ArrayRef {
        Arc::new(Int64Array::from_iter_values(reports.iter().map(f)))
    };
    let float = |f: &dyn Fn(&Progress) -> f64| -> ArrayRef {
        Arc::new(Float64Array::from_iter_values(reports.iter().map(f)))
    };
    let time = |f: &dyn Fn(&Progress) -> Option<chrono::DateTime<chrono::Utc>>| -> ArrayRef {
        Arc::new(
            TimestampMicrosecondArray::from_iter(
                reports.iter().map(|p| f(p).map(|t| t.timestamp_micros())),
            )
            .with_timezone("UTC"),
        )
    };
    // Several stateful operators: the sum over them (the JSON has each).
    let state = |f: &dyn Fn(&StateOperatorProgress) -> u64| -> ArrayRef {
        Arc::new(Int64Array::from_iter(reports.iter().map(|p| {
            (!p.state_operators.is_empty())
                .then(|| p.state_operators.iter().map(|s| f(s) as i64).sum::<i64>())
        })))
    };
    // One source: its offset; several: a JSON array of theirs, by source index.
    let offset = |p: &Progress, start: bool| {
        let pick = |src: &super::progress::SourceProgress| {
            if start {
                src.start_offset.clone()
            } else {
                src.end_offset.clone()
            }
        };
        match p.sources.as_slice() {
            [] => None,
            [one] => pick(one).map(|v| v.to_string()),
            many => Some(
                serde_json::Value::Array(
                    many.iter()
                        .map(|s| pick(s).unwrap_or(serde_json::Value::Null))
                        .collect(),
                )
                .to_string(),
            ),
        }
    };
    let cols: Vec<ArrayRef> = vec![
        text(&|p| Some(p.name.clone())),
        text(&|p| Some(p.id.to_string())),
        text(&|p| Some(p.run_id.to_string())),
        int(&|p| p.batch_id.get() as i64),
        Arc::new(
            TimestampMicrosecondArray::from_iter_values(
                reports.iter().map(|p| p.timestamp.timestamp_micros()),
            )
            .with_timezone("UTC"),
        ),
        int(&|p| p.batch_duration as i64),
        int(&|p| p.num_input_rows as i64),
        float(&|p| p.input_rows_per_second),
        float(&|p| p.processed_rows_per_second),
        text(&|p| serde_json::to_string(&p.duration_ms).ok()),
        text(&|p| offset(p, true)),
        text(&|p| offset(p, false)),
        int(&|p| p.sink.num_output_rows),
        time(&|p| p.event_time.as_ref().map(|e| e.watermark)),
        time(&|p| p.event_time.as_ref().and_then(|e| e.min)),
        time(&|p| p.event_time.as_ref().and_then(|e| e.max)),
        state(&|s| s.num_rows_dropped_by_watermark),
        state(&|s| s.num_rows_total),
        state(&|s| s.num_rows_updated),
        state(&|s| s.num_rows_removed),
        int(&|p| p.sources.iter().map(|s| s.malformed_rows()).sum()),
        int(&|p| p.sources.iter().map(|s| s.missing_files()).sum()),
        text(&|p| Some(p.to_json())),
    ];
    Ok(RecordBatch::try_new(schema.clone(), cols)?)
}
