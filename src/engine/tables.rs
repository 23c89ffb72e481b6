//! DataFusion tables that Tidemark registers: streams (a batch read of the files landed so
//! far) and the system tables `tidemark.queries` and `tidemark.progress`.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{
    ArrayRef, Float64Builder, Int64Builder, RecordBatch, StringBuilder, TimestampMicrosecondBuilder,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::catalog::Session;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::DataFusionError;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;

use super::progress::{Progress, QueryStatus, Registry};
use crate::error::Error;
use crate::source::file::FileSourceConfig;

/// A stream queried as a table: everything landed in its directory right now.
#[derive(Debug)]
pub struct StreamReadTable {
    source: Arc<FileSourceConfig>,
}

impl StreamReadTable {
    pub fn new(source: Arc<FileSourceConfig>) -> StreamReadTable {
        StreamReadTable { source }
    }
}

#[async_trait]
impl TableProvider for StreamReadTable {
    fn schema(&self) -> SchemaRef {
        self.source.schema.clone()
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
        let source = self.source.clone();
        let batches =
            tokio::task::spawn_blocking(move || -> crate::error::Result<Vec<RecordBatch>> {
                let mut out = Vec::new();
                for f in source.list()? {
                    out.extend(source.read(&f.local_path())?);
                }
                Ok(out)
            })
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))?
            .map_err(|e: Error| DataFusionError::External(Box::new(e)))?;
        let exec = MemorySourceConfig::try_new_exec(
            &[batches],
            self.source.schema.clone(),
            projection.cloned(),
        )?;
        Ok(exec)
    }
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
    let mut name = StringBuilder::new();
    let mut id = StringBuilder::new();
    let mut run_id = StringBuilder::new();
    let mut status = StringBuilder::new();
    let mut last_batch = Int64Builder::new();
    let mut last_at = TimestampMicrosecondBuilder::new().with_timezone("UTC");
    let mut error = StringBuilder::new();
    for s in statuses {
        name.append_value(&s.name);
        id.append_option(s.id.map(|u| u.to_string()));
        run_id.append_option(s.run_id.map(|u| u.to_string()));
        status.append_value(s.status.as_str());
        last_batch.append_option(s.last_batch_id.map(|b| b as i64));
        last_at.append_option(s.last_progress_at.map(|t| t.timestamp_micros()));
        error.append_option(s.error.as_deref());
    }
    let cols: Vec<ArrayRef> = vec![
        Arc::new(name.finish()),
        Arc::new(id.finish()),
        Arc::new(run_id.finish()),
        Arc::new(status.finish()),
        Arc::new(last_batch.finish()),
        Arc::new(last_at.finish()),
        Arc::new(error.finish()),
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
        Field::new("progress", DataType::Utf8, false),
    ]))
}

/// One row per kept progress report.
pub fn progress_batch(
    reports: &[Progress],
    schema: &SchemaRef,
) -> datafusion::error::Result<RecordBatch> {
    let mut name = StringBuilder::new();
    let mut id = StringBuilder::new();
    let mut run_id = StringBuilder::new();
    let mut batch_id = Int64Builder::new();
    let mut ts = TimestampMicrosecondBuilder::new().with_timezone("UTC");
    let mut duration = Int64Builder::new();
    let mut rows = Int64Builder::new();
    let mut in_rate = Float64Builder::new();
    let mut proc_rate = Float64Builder::new();
    let mut phases = StringBuilder::new();
    let mut start = StringBuilder::new();
    let mut end = StringBuilder::new();
    let mut out_rows = Int64Builder::new();
    let mut json = StringBuilder::new();
    for p in reports {
        name.append_value(&p.name);
        id.append_value(p.id.to_string());
        run_id.append_value(p.run_id.to_string());
        batch_id.append_value(p.batch_id as i64);
        let t = chrono::DateTime::parse_from_rfc3339(&p.timestamp)
            .map(|t| t.timestamp_micros())
            .unwrap_or(0);
        ts.append_value(t);
        duration.append_value(p.batch_duration as i64);
        rows.append_value(p.num_input_rows as i64);
        in_rate.append_value(p.input_rows_per_second);
        proc_rate.append_value(p.processed_rows_per_second);
        phases.append_value(serde_json::to_string(&p.duration_ms).unwrap_or_default());
        let src = p.sources.first();
        start.append_option(
            src.and_then(|s| s.start_offset.as_ref())
                .map(|v| v.to_string()),
        );
        end.append_option(
            src.and_then(|s| s.end_offset.as_ref())
                .map(|v| v.to_string()),
        );
        out_rows.append_value(p.sink.num_output_rows);
        json.append_value(p.to_json());
    }
    let cols: Vec<ArrayRef> = vec![
        Arc::new(name.finish()),
        Arc::new(id.finish()),
        Arc::new(run_id.finish()),
        Arc::new(batch_id.finish()),
        Arc::new(ts.finish()),
        Arc::new(duration.finish()),
        Arc::new(rows.finish()),
        Arc::new(in_rate.finish()),
        Arc::new(proc_rate.finish()),
        Arc::new(phases.finish()),
        Arc::new(start.finish()),
        Arc::new(end.finish()),
        Arc::new(out_rows.finish()),
        Arc::new(json.finish()),
    ];
    Ok(RecordBatch::try_new(schema.clone(), cols)?)
}
