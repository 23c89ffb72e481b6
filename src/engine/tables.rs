//! DataFusion tables that Tidemark registers: table streams (read and `INSERT`), and the
//! system tables `tidemark.queries`, `tidemark.progress`, `tidemark.sources` and
//! `tidemark.state_operators`, `tidemark.relations`; a refusing table (sink-only streams, broken objects). (A file
//! stream's table is
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

use super::progress::{
    LatencyMs, Progress, QueryStatus, Registry, SourceProgress, StateOperatorProgress,
};
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

/// A relation whose every scan fails with one error: a stream only a sink can read (a rate
/// source: its rows exist only batch by batch), or an object that could not be loaded (its
/// name stays taken, and a query over it gets the error that broke it).
pub struct RefusingTable {
    schema: SchemaRef,
    error: Box<dyn Fn() -> Error + Send + Sync>,
}

impl std::fmt::Debug for RefusingTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RefusingTable({})", (self.error)())
    }
}

impl RefusingTable {
    /// A stream of a connector whose rows only a sink reads.
    pub fn sink_only(name: &str, connector: &'static str, schema: SchemaRef) -> RefusingTable {
        let name = name.to_string();
        RefusingTable {
            schema,
            error: Box::new(move || Error::Unsupported {
                message: format!(
                    "stream \"{name}\" ({connector} source) can only be read by a sink"
                ),
                hint: Some("Create a sink over it and query the sink.".into()),
            }),
        }
    }

    /// A broken catalog object.
    pub fn broken(
        kind: &'static str,
        name: &str,
        schema: SchemaRef,
        broken: crate::catalog::Broken,
    ) -> RefusingTable {
        let name = name.to_string();
        RefusingTable {
            schema,
            error: Box::new(move || broken.error(kind, &name)),
        }
    }
}

#[async_trait]
impl TableProvider for RefusingTable {
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
        Err(DataFusionError::External(Box::new((self.error)())))
    }
}

/// `tidemark.relations`: every stream, sink, view and table, with its connector and,
/// for one that could not be loaded, why.
#[derive(Debug)]
pub struct RelationsTable {
    engine: std::sync::Weak<super::Engine>,
}

impl RelationsTable {
    pub fn new(engine: std::sync::Weak<super::Engine>) -> RelationsTable {
        RelationsTable { engine }
    }

    pub fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("name", DataType::Utf8, false),
            Field::new("kind", DataType::Utf8, false),
            Field::new("connector", DataType::Utf8, false),
            Field::new("status", DataType::Utf8, false),
            Field::new("sqlstate", DataType::Utf8, true),
            Field::new("error", DataType::Utf8, true),
        ]))
    }
}

#[async_trait]
impl TableProvider for RelationsTable {
    fn schema(&self) -> SchemaRef {
        Self::schema()
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
        use crate::catalog::RelationKind;
        let relations = match self.engine.upgrade() {
            Some(e) => e.relations().await,
            None => Vec::new(),
        };
        let col = |f: &dyn Fn(&crate::catalog::Relation) -> Option<String>| -> ArrayRef {
            Arc::new(relations.iter().map(f).collect::<StringArray>())
        };
        let batch = RecordBatch::try_new(
            Self::schema(),
            vec![
                col(&|r| Some(r.name.clone())),
                col(&|r| {
                    Some(
                        match r.kind {
                            RelationKind::Stream => "stream",
                            RelationKind::Sink => "sink",
                            RelationKind::Table => "table",
                            RelationKind::MaterializedView => "materialized view",
                        }
                        .into(),
                    )
                }),
                col(&|r| Some(r.connector.clone())),
                col(&|r| Some(if r.broken.is_some() { "broken" } else { "ok" }.into())),
                col(&|r| r.broken.as_ref().map(|b| b.state.code().to_string())),
                col(&|r| r.broken.as_ref().map(|b| b.message.clone())),
            ],
        )?;
        Ok(MemorySourceConfig::try_new_exec(
            &[vec![batch]],
            Self::schema(),
            projection.cloned(),
        )?)
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
            schema: schema_of(progress_rows),
            registry,
            build: |r, _| progress_rows(&r.all_progress()),
        }
    }

    /// `tidemark.sources`.
    pub fn sources(registry: Arc<Registry>) -> SystemTable {
        SystemTable {
            schema: schema_of(source_rows),
            registry,
            build: |r, _| source_rows(&r.all_progress()),
        }
    }

    /// `tidemark.state_operators`.
    pub fn state_operators(registry: Arc<Registry>) -> SystemTable {
        SystemTable {
            schema: schema_of(state_operator_rows),
            registry,
            build: |r, _| state_operator_rows(&r.all_progress()),
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

/// The schema a system table's rows have.
fn schema_of(rows: fn(&[Progress]) -> datafusion::error::Result<RecordBatch>) -> SchemaRef {
    rows(&[])
        .map(|b| b.schema())
        .unwrap_or_else(|_| Arc::new(Schema::empty()))
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
        Field::new("engine", DataType::Utf8, false),
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
        text(&|s| Some(s.engine.to_string())),
    ];
    Ok(RecordBatch::try_new(schema.clone(), cols)?)
}

/// A system table's columns, built one at a time from a closure over its rows. Every
/// column is nullable; the schema alone is the build over no rows.
struct Columns<'a, T> {
    rows: &'a [T],
    fields: Vec<Field>,
    arrays: Vec<ArrayRef>,
}

impl<'a, T> Columns<'a, T> {
    fn new(rows: &'a [T]) -> Self {
        Columns {
            rows,
            fields: Vec::new(),
            arrays: Vec::new(),
        }
    }

    fn push(mut self, name: &str, array: ArrayRef) -> Self {
        self.fields
            .push(Field::new(name, array.data_type().clone(), true));
        self.arrays.push(array);
        self
    }

    fn text(self, name: &str, f: impl Fn(&T) -> Option<String>) -> Self {
        let a = Arc::new(StringArray::from_iter(self.rows.iter().map(f)));
        self.push(name, a)
    }

    fn int(self, name: &str, f: impl Fn(&T) -> Option<i64>) -> Self {
        let a = Arc::new(Int64Array::from_iter(self.rows.iter().map(f)));
        self.push(name, a)
    }

    fn float(self, name: &str, f: impl Fn(&T) -> Option<f64>) -> Self {
        let a = Arc::new(Float64Array::from_iter(self.rows.iter().map(f)));
        self.push(name, a)
    }

    fn time(self, name: &str, f: impl Fn(&T) -> Option<chrono::DateTime<chrono::Utc>>) -> Self {
        let a = Arc::new(
            TimestampMicrosecondArray::from_iter(
                self.rows.iter().map(|r| f(r).map(|t| t.timestamp_micros())),
            )
            .with_timezone("UTC"),
        );
        self.push(name, a)
    }

    fn batch(self) -> datafusion::error::Result<RecordBatch> {
        Ok(RecordBatch::try_new(
            Arc::new(Schema::new(self.fields)),
            self.arrays,
        )?)
    }
}

/// A source offset as text: one source's, or a JSON array of several, by source index.
fn offsets_text(
    p: &Progress,
    pick: impl Fn(&SourceProgress) -> Option<serde_json::Value>,
) -> Option<String> {
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
}

fn progress_rows(reports: &[Progress]) -> datafusion::error::Result<RecordBatch> {
    // Several stateful operators: the sum over them (the JSON has each).
    let state = |p: &Progress, f: &dyn Fn(&StateOperatorProgress) -> u64| {
        (!p.state_operators.is_empty())
            .then(|| p.state_operators.iter().map(|s| f(s) as i64).sum::<i64>())
    };
    let phase = |p: &Progress, name: &str| p.duration_ms.get(name).map(|&ms| ms as i64);
    let latency = |p: &Progress, f: fn(&LatencyMs) -> i64| p.end_to_end_latency_ms.as_ref().map(f);
    Columns::new(reports)
        .text("name", |p| Some(p.name.clone()))
        .text("id", |p| Some(p.id.to_string()))
        .text("run_id", |p| Some(p.run_id.to_string()))
        .int("batch_id", |p| Some(p.batch_id.get() as i64))
        .time("timestamp", |p| Some(p.timestamp))
        .int("batch_duration_ms", |p| Some(p.batch_duration as i64))
        .int("num_input_rows", |p| Some(p.num_input_rows as i64))
        .float("input_rows_per_second", |p| Some(p.input_rows_per_second))
        .float("processed_rows_per_second", |p| {
            Some(p.processed_rows_per_second)
        })
        .text("duration_ms", |p| {
            serde_json::to_string(&p.duration_ms).ok()
        })
        .text("source_start_offset", |p| {
            offsets_text(p, |s| s.start_offset.clone())
        })
        .text("source_end_offset", |p| {
            offsets_text(p, |s| s.end_offset.clone())
        })
        .int("sink_output_rows", |p| Some(p.sink.num_output_rows))
        .time("watermark", |p| p.event_time.as_ref().map(|e| e.watermark))
        .time("event_time_min", |p| {
            p.event_time.as_ref().and_then(|e| e.min)
        })
        .time("event_time_max", |p| {
            p.event_time.as_ref().and_then(|e| e.max)
        })
        .int("rows_dropped_by_watermark", |p| {
            state(p, &|s| s.num_rows_dropped_by_watermark)
        })
        .int("state_rows_total", |p| state(p, &|s| s.num_rows_total))
        .int("state_rows_updated", |p| state(p, &|s| s.num_rows_updated))
        .int("state_rows_removed", |p| state(p, &|s| s.num_rows_removed))
        .int("malformed_rows", |p| {
            Some(p.sources.iter().map(|s| s.malformed_rows()).sum())
        })
        .int("missing_files", |p| {
            Some(p.sources.iter().map(|s| s.missing_files()).sum())
        })
        .text("source_latest_offset", |p| {
            offsets_text(p, |s| s.latest_offset.clone())
        })
        .time("event_time_avg", |p| {
            p.event_time.as_ref().and_then(|e| e.avg)
        })
        .int("latest_offset_ms", |p| phase(p, "latestOffset"))
        .int("get_batch_ms", |p| phase(p, "getBatch"))
        .int("query_planning_ms", |p| phase(p, "queryPlanning"))
        .int("add_batch_ms", |p| phase(p, "addBatch"))
        .int("wal_commit_ms", |p| phase(p, "walCommit"))
        .int("commit_offsets_ms", |p| phase(p, "commitOffsets"))
        .int("trigger_execution_ms", |p| phase(p, "triggerExecution"))
        .int("state_memory_bytes", |p| state(p, &|s| s.memory_used_bytes))
        .int("backlog_files", |p| {
            p.source_metric_sum("numFilesOutstanding")
        })
        .int("backlog_bytes", |p| {
            p.source_metric_sum("numBytesOutstanding")
        })
        .int("backlog_rows", |p| {
            p.source_metric_sum("numRowsOutstanding")
        })
        .int("latency_p50_ms", |p| latency(p, |l| l.p50))
        .int("latency_p95_ms", |p| latency(p, |l| l.p95))
        .int("latency_p99_ms", |p| latency(p, |l| l.p99))
        .int("latency_max_ms", |p| latency(p, |l| l.max))
        .int("watermark_lag_ms", |p| p.watermark_lag_ms)
        .text("progress", |p| Some(p.to_json()))
        .batch()
}

/// One source of one kept report: `tidemark.sources`.
fn source_rows(reports: &[Progress]) -> datafusion::error::Result<RecordBatch> {
    let rows: Vec<(&Progress, usize, &SourceProgress)> = reports
        .iter()
        .flat_map(|p| p.sources.iter().enumerate().map(move |(i, s)| (p, i, s)))
        .collect();
    let metric = |s: &SourceProgress, name: &str| s.metrics.get(name).and_then(|v| v.parse().ok());
    let json = |v: &Option<serde_json::Value>| v.as_ref().map(|v| v.to_string());
    Columns::new(&rows)
        .text("name", |(p, _, _)| Some(p.name.clone()))
        .int("batch_id", |(p, _, _)| Some(p.batch_id.get() as i64))
        .time("timestamp", |(p, _, _)| Some(p.timestamp))
        .int("source_index", |(_, i, _)| Some(*i as i64))
        .text("description", |(_, _, s)| Some(s.description.clone()))
        .text("start_offset", |(_, _, s)| json(&s.start_offset))
        .text("end_offset", |(_, _, s)| json(&s.end_offset))
        .text("latest_offset", |(_, _, s)| json(&s.latest_offset))
        .int("num_input_rows", |(_, _, s)| Some(s.num_input_rows as i64))
        .float("input_rows_per_second", |(_, _, s)| {
            Some(s.input_rows_per_second)
        })
        .float("processed_rows_per_second", |(_, _, s)| {
            Some(s.processed_rows_per_second)
        })
        .int("backlog_files", |(_, _, s)| {
            metric(s, "numFilesOutstanding")
        })
        .int("backlog_bytes", |(_, _, s)| {
            metric(s, "numBytesOutstanding")
        })
        .int("backlog_rows", |(_, _, s)| metric(s, "numRowsOutstanding"))
        .text("metrics", |(_, _, s)| {
            serde_json::to_string(&s.metrics).ok()
        })
        .batch()
}

/// One stateful operator of one kept report, in plan order from the top: `tidemark.state_operators`.
fn state_operator_rows(reports: &[Progress]) -> datafusion::error::Result<RecordBatch> {
    let rows: Vec<(&Progress, usize, &StateOperatorProgress)> = reports
        .iter()
        .flat_map(|p| {
            p.state_operators
                .iter()
                .enumerate()
                .map(move |(i, s)| (p, i, s))
        })
        .collect();
    let n = |v: u64| Some(v as i64);
    Columns::new(&rows)
        .text("name", |(p, _, _)| Some(p.name.clone()))
        .int("batch_id", |(p, _, _)| Some(p.batch_id.get() as i64))
        .time("timestamp", |(p, _, _)| Some(p.timestamp))
        .int("operator_index", |(_, i, _)| Some(*i as i64))
        .text("operator_name", |(_, _, s)| Some(s.operator_name.clone()))
        .int("num_rows_total", |(_, _, s)| n(s.num_rows_total))
        .int("num_rows_updated", |(_, _, s)| n(s.num_rows_updated))
        .int("all_updates_time_ms", |(_, _, s)| n(s.all_updates_time_ms))
        .int("num_rows_removed", |(_, _, s)| n(s.num_rows_removed))
        .int(
            "all_removals_time_ms",
            |(_, _, s)| n(s.all_removals_time_ms),
        )
        .int("commit_time_ms", |(_, _, s)| n(s.commit_time_ms))
        .int("memory_used_bytes", |(_, _, s)| n(s.memory_used_bytes))
        .int("num_rows_dropped_by_watermark", |(_, _, s)| {
            n(s.num_rows_dropped_by_watermark)
        })
        .int("num_shuffle_partitions", |(_, _, s)| {
            Some(s.num_shuffle_partitions as i64)
        })
        .int("num_state_store_instances", |(_, _, s)| {
            Some(s.num_state_store_instances as i64)
        })
        .text("custom_metrics", |(_, _, s)| {
            serde_json::to_string(&s.custom_metrics).ok()
        })
        .batch()
}

/// The columns of `SHOW PROGRESS name`: the query's last report, Spark's `lastProgress`.
pub fn last_progress_batch(report: Option<&Progress>) -> datafusion::error::Result<RecordBatch> {
    let rows: Vec<&Progress> = report.into_iter().collect();
    Columns::new(&rows)
        .text("name", |p| Some(p.name.clone()))
        .int("batch_id", |p| Some(p.batch_id.get() as i64))
        .time("timestamp", |p| Some(p.timestamp))
        .text("kind", |p| {
            Some(if p.idle { "idle" } else { "batch" }.to_string())
        })
        .text("progress", |p| Some(p.to_pretty_json()))
        .batch()
}
