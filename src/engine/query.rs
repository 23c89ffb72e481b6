//! The trigger loop of one streaming query (spec §1.1, §6): construct a batch, write its
//! offsets, read the source, execute, commit to the sink, write the commit log, report.
//!
//! Durable effects of batch `N`, in order: `sources/0/<k>` (files taken), `offsets/N`,
//! the Delta commit tagged `(query id, N)`, `commits/N`. A crash anywhere replays batch `N`
//! with the same offsets; the sink skips a batch it already holds.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use futures::StreamExt;
use tokio::sync::{Notify, watch};
use uuid::Uuid;

use super::aggregate::{
    AggregateBatch, AggregateInfo, AggregateOperator, EventTimeStats, KeyTime, OutputMode,
};
use super::dedup::DedupOperator;
use super::join::JoinOperator;
use super::operator::StatefulOperator;
use super::plan::{
    DedupMode, OperatorKind, StateConfig, StaticInput, StreamInput, StreamingPlan, WatermarkNode,
    WatermarkPolicy, advance_watermark,
};
use super::progress::{
    EventTimeProgress, IDLE_REPORT_INTERVAL, ListenerEvent, Progress, Registry, SinkProgress,
    SourceProgress, StateOperatorProgress, Status, round_rate,
};
use crate::catalog::{SinkDef, StreamDef, StreamSource, TableDef};
use crate::checkpoint::{Checkpoint, CheckpointDefinition, CommitEntry, OffsetMetadata, OffsetSeq};
pub use crate::config::{POLL_INTERVAL, parallelism};
use crate::error::{Error, Result};
use crate::sink::{BatchInfo, QueryOutput, RowTime, Sink, SinkCommit, SinkConnector, WriteMode};
use crate::source::file::FileSource;
use crate::source::nexmark::NexmarkSource;
use crate::source::rate::{RateMicroBatchSource, RateSource};
use crate::source::table::{TableLog, TableSource};
use crate::source::{Offset, ReadLimit, Source};
use crate::sql::options::Trigger;
use crate::sql::parser::{WatermarkSpec, parse_watermark_option};
use crate::state::StateMetrics;
use crate::types::BatchId;

/// Why a query was asked to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// `STOP SINK` or `DROP SINK`: stays stopped.
    User,
    /// Server shutdown: resumes on the next start.
    Shutdown,
}

/// How a run of a query ended.
#[derive(Debug)]
pub enum Outcome {
    /// An `available_now` or `once` run that caught up.
    Finished,
    Stopped(StopReason),
    Failed(Error),
}

/// Everything a query's task needs.
pub struct QueryTask {
    pub def: SinkDef,
    /// The streams the query reads, in the order its plan numbers its sources.
    pub streams: Vec<StreamDef>,
    pub registry: Arc<Registry>,
    pub stop: watch::Receiver<Option<StopReason>>,
    /// Notified by `FLUSH` to run a trigger now.
    pub wake: Arc<Notify>,
    /// The logs of the table streams among them, by name.
    pub table_logs: std::collections::HashMap<String, Arc<TableLog>>,
    /// Wall time, for sources that read it (`rate`).
    pub clock: Arc<dyn crate::clock::Clock>,
    /// The static tables the query joins with.
    pub tables: Vec<TableDef>,
    /// The side tables its options ask for (`late_rows = 'table'`, ...).
    pub side_tables: Vec<(super::side_tables::SideTable, TableDef)>,
}

/// What a sink's query is, as the engine runs it.
#[derive(Debug, Clone)]
pub struct SinkShape {
    /// The query DataFusion plans, after Spark's `window.start` references are expanded.
    pub sql: String,
    /// The rows it writes: every field nullable, as Spark's sinks make them.
    pub schema: SchemaRef,
    /// The top (last) aggregation, if the query has one.
    pub aggregate: Option<AggregateInfo>,
    /// Every stateful operator, by id.
    pub operators: Vec<OperatorKind>,
    pub mode: OutputMode,
    /// The plan's watermark nodes.
    pub watermarks: Vec<WatermarkNode>,
    /// The output column that tells when a row is final, if there is one.
    pub output_time: Option<RowTime>,
    /// The streaming plan as EXPLAIN shows it.
    pub plan_text: String,
}

impl SinkShape {
    /// How batches go into the Delta table.
    pub fn write_mode(&self) -> WriteMode {
        match (&self.aggregate, self.mode) {
            (Some(_), OutputMode::Complete) => WriteMode::Overwrite,
            (Some(a), OutputMode::Update) => WriteMode::Merge {
                keys: a.output_keys.clone().unwrap_or_default(),
            },
            _ => WriteMode::Append,
        }
    }

    /// What the query writes, as its sink or view opens for it.
    pub fn output(&self) -> QueryOutput {
        let mode = self.write_mode();
        let keys = match &mode {
            WriteMode::Merge { keys } => Some(keys.clone()),
            WriteMode::Overwrite => None,
            WriteMode::Append => self.aggregate.as_ref().and_then(|a| a.output_keys.clone()),
        };
        QueryOutput {
            schema: self.schema.clone(),
            mode,
            keys,
            time: self.output_time.clone(),
        }
    }
}

/// What the sink's checkpoint depends on (spec §9.4).
pub fn checkpoint_definition(
    def: &SinkDef,
    streams: &[&StreamDef],
    shape: &SinkShape,
) -> CheckpointDefinition {
    let mut group_keys = Vec::new();
    let mut aggregates = Vec::new();
    for (i, op) in shape.operators.iter().enumerate() {
        // Operator 0 as it always was; later operators prefixed with their id.
        let prefix = if i == 0 {
            String::new()
        } else {
            format!("{i}:")
        };
        match op {
            OperatorKind::Aggregate(a) => {
                group_keys.extend(a.group_names.iter().map(|g| format!("{prefix}{g}")));
                aggregates.extend(
                    a.aggregates
                        .iter()
                        .map(|e| format!("{prefix}{}", e.human_display())),
                );
            }
            // A deduplication's keys, and how they expire, fix its state.
            OperatorKind::Dedup(d) => {
                let keep = match d.within_watermark_us {
                    Some(us) => format!("within watermark {us}us"),
                    None => "first".into(),
                };
                group_keys.extend(
                    d.keys
                        .iter()
                        .map(|k| format!("{prefix}distinct({keep}) {k}")),
                );
            }
            // A join's type and keys fix its state (spec §8.5).
            OperatorKind::Join(j) => {
                group_keys.extend(
                    j.left
                        .keys
                        .iter()
                        .zip(&j.right.keys)
                        .map(|(l, r)| format!("{prefix}join({}) {l} = {r}", j.kind.spark_name())),
                );
                if j.left.keys.is_empty() {
                    group_keys.push(format!("{prefix}join({})", j.kind.spark_name()));
                }
            }
        }
    }
    CheckpointDefinition {
        source: streams
            .iter()
            .map(|stream| match stream.source() {
                Ok(StreamSource::File(f)) => f.identity(),
                Ok(StreamSource::Delta(d)) => format!("delta:{}", d.path.display()),
                Ok(StreamSource::Kafka(k)) => k.identity(),
                _ => format!("{}:{}", stream.connector(), stream.name),
            })
            .collect::<Vec<_>>()
            .join(", "),
        group_keys,
        aggregates,
        watermark_column: shape.watermarks.first().map(|w| w.spec.column.clone()),
        watermark_policy: WatermarkPolicy::of(&def.options)
            .unwrap_or_default()
            .as_str()
            .to_string(),
        output_mode: shape.mode.as_str().to_string(),
        state_partitions: def.state_partitions,
        state_store: def.state_store.as_str().to_string(),
    }
}

/// The sink's `watermark` option, if it has one.
pub fn sink_watermark(def: &SinkDef) -> Result<Option<WatermarkSpec>> {
    def.options
        .get("watermark")
        .map(parse_watermark_option)
        .transpose()
}

/// The streams a query reads, with their watermarks: the sink's `watermark` option on each
/// stream that has its column, otherwise the stream's `WATERMARK FOR`.
pub fn stream_inputs(streams: &[&StreamDef], sink_wm: Option<&WatermarkSpec>) -> Vec<StreamInput> {
    streams
        .iter()
        .map(|s| StreamInput {
            name: s.name.clone(),
            schema: s.schema(),
            watermark: match sink_wm {
                Some(w) if s.schema().field_with_name(&w.column).is_ok() => Some(w.clone()),
                _ => s.watermark.clone(),
            },
        })
        .collect()
}

/// Builds the streaming plan of a sink's query.
pub async fn build_plan(
    query: &str,
    streams: &[&StreamDef],
    tables: &[TableDef],
    sink_wm: Option<&WatermarkSpec>,
    mode: OutputMode,
    state: &StateConfig,
) -> Result<StreamingPlan> {
    let sql = crate::sql::expand_window_refs(query)?;
    StreamingPlan::build(
        &sql,
        stream_inputs(streams, sink_wm),
        &static_inputs(tables).await?,
        mode,
        state,
        parallelism(),
    )
    .await
}

/// The static tables a query joins with, each read through its own snapshot of the table.
pub async fn static_inputs(tables: &[TableDef]) -> Result<Vec<StaticInput>> {
    let mut out = Vec::with_capacity(tables.len());
    for t in tables {
        out.push(StaticInput {
            name: t.name.clone(),
            table: Arc::new(crate::sink::delta::DeltaReadTable::try_new(&t.path).await?),
        });
    }
    Ok(out)
}

/// Plans a sink's query and checks it: shapes Spark allows for the output mode (spec
/// §5.2–5.3), distinct column names.
pub async fn analyze_sink(
    query: &str,
    streams: &[&StreamDef],
    tables: &[TableDef],
    sink_wm: Option<&WatermarkSpec>,
    mode: OutputMode,
    state: &StateConfig,
) -> Result<SinkShape> {
    let plan = build_plan(query, streams, tables, sink_wm, mode, state).await?;
    shape_of(query, &plan)
}

/// The type a sink stores a column as. The signed type that holds an unsigned one's values:
/// Delta tables and Postgres have no unsigned integers (DataFusion's `approx_distinct` and
/// `row_number` are UInt64); a UInt64 above `i64::MAX` does not fit, counts never get
/// there. Strings and binaries in their plain layout.
pub(crate) fn storable(t: &DataType) -> DataType {
    match t {
        DataType::UInt8 => DataType::Int16,
        DataType::UInt16 => DataType::Int32,
        DataType::UInt32 | DataType::UInt64 => DataType::Int64,
        // A Delta table's strings read back as Utf8, whichever Arrow layout a scan (of a
        // static table, say) produced them in.
        DataType::Utf8View | DataType::LargeUtf8 => DataType::Utf8,
        DataType::BinaryView | DataType::LargeBinary => DataType::Binary,
        other => other.clone(),
    }
}

/// What a built plan writes and how.
fn shape_of(query: &str, plan: &StreamingPlan) -> Result<SinkShape> {
    let fields: Vec<Field> = plan
        .output_schema()
        .fields()
        .iter()
        .map(|f| {
            let t = storable(f.data_type());
            f.as_ref().clone().with_nullable(true).with_data_type(t)
        })
        .collect();
    let mut names = HashSet::new();
    for f in &fields {
        if !names.insert(f.name().clone()) {
            return Err(Error::InvalidOption {
                message: format!("the sink's query has two columns named \"{}\"", f.name()),
                hint: Some("Give the columns distinct names with AS.".into()),
            });
        }
    }
    Ok(SinkShape {
        sql: crate::sql::expand_window_refs(query)?,
        schema: Arc::new(Schema::new(fields)),
        aggregate: plan.top_aggregate().cloned(),
        operators: plan.operators.iter().map(|o| o.kind.clone()).collect(),
        mode: plan.mode,
        watermarks: plan.watermarks.clone(),
        output_time: plan.output_time.clone(),
        plan_text: plan.display(),
    })
}

/// The lines of `EXPLAIN CREATE SINK`: the sink, the emit rule, the streaming plan (from
/// DataFusion's display of it, with its stateful nodes), the sources. Stable text.
pub fn explain(def: &SinkDef, streams: &[&StreamDef], shape: &SinkShape) -> Result<Vec<String>> {
    let write = match &def.merge {
        Some(_) => "merge".to_string(),
        None => shape.write_mode().describe(),
    };
    let connector = def.connector()?;
    let sink = match connector {
        SinkConnector::Delta => "DeltaSink".to_string(),
        SinkConnector::Console => "ConsoleSink".to_string(),
        SinkConnector::Noop => "NoopSink".to_string(),
        SinkConnector::File(f) => format!("FileSink[{}]", f.name()),
        SinkConnector::View => "MaterializedView".to_string(),
        SinkConnector::DeltaMerge => "DeltaMergeSink".to_string(),
        SinkConnector::Kafka => format!(
            "KafkaSink[{}] delivery={}",
            def.options.get("topic").unwrap_or("<topic column>"),
            def.options.get("delivery").unwrap_or("exactly_once")
        ),
    };
    let path = if connector.has_path() {
        format!(" path={}", def.path.display())
    } else {
        String::new()
    };
    let mut lines = vec![format!(
        "{sink}:{path} output_mode={} trigger={} write={write}",
        shape.mode.as_str(),
        def.trigger
    )];
    if let Some(merge) = &def.merge {
        lines.push(format!(
            "  Emit: every micro-batch's rows, as the source of one {} \
             (committed with txn(query id, batch id): exactly once)",
            merge.describe()
        ));
    } else {
        lines.push(format!(
            "  Emit: {}",
            match &shape.aggregate {
                None => "every row of every micro-batch (stateless, no state)".to_string(),
                Some(a) => {
                    let closes = match a.key_time {
                        Some(KeyTime::Window) => "window.end".to_string(),
                        Some(KeyTime::Column(i)) => a.keys[i].to_string(),
                        None => String::new(),
                    };
                    match (shape.mode, a.key_time.is_some()) {
                        (OutputMode::Append, _) => {
                            format!(
                                "each group once, when the watermark passes {closes}; then evicted"
                            )
                        }
                        (OutputMode::Update, true) => format!(
                            "every group the batch updated; evicted silently once the watermark \
                         passes {closes}"
                        ),
                        (OutputMode::Update, false) => {
                            "every group the batch updated; nothing evicted".to_string()
                        }
                        (OutputMode::Complete, _) => {
                            "the whole result every batch; nothing evicted, nothing late"
                                .to_string()
                        }
                    }
                }
            }
        ));
    }
    if shape.watermarks.len() > 1 {
        let policy = WatermarkPolicy::of(&def.options)?;
        lines.push(format!(
            "  Watermark: the {} of the inputs' (multipleWatermarkPolicy = {})",
            match policy {
                WatermarkPolicy::Min => "minimum",
                WatermarkPolicy::Max => "maximum",
            },
            policy.as_str()
        ));
    }
    for l in shape.plan_text.lines() {
        lines.push(format!("  {l}"));
    }
    for (i, stream) in streams.iter().enumerate() {
        lines.push(format!("  Source {i}: {}", describe_source(stream)));
    }
    for t in &def.tables {
        lines.push(format!("  Static table: {t} (read as of each batch)"));
    }
    Ok(lines)
}

fn describe_source(stream: &StreamDef) -> String {
    let Ok(source) = stream.source() else {
        return format!("BrokenSource[{}]", stream.name);
    };
    match source {
        StreamSource::File(src) => format!(
            "FileStreamSource[{}] format={}{}",
            src.path.display(),
            src.decoder.format.name(),
            src.max_files_per_trigger
                .map(|n| format!(" max_files_per_trigger={n}"))
                .unwrap_or_default()
        ),
        StreamSource::Table(t) => format!(
            "TableStreamSource[{}]{}",
            stream.name,
            t.max_rows_per_trigger
                .map(|n| format!(" max_rows_per_trigger={n}"))
                .unwrap_or_default()
        ),
        StreamSource::Rate(r) => format!(
            "RateStream[rows_per_second={}, ramp_up_time={}s, num_partitions={}]",
            r.rows_per_second, r.ramp_up_secs, r.num_partitions
        ),
        StreamSource::Delta(d) => format!(
            "DeltaSource[{}] max_files_per_trigger={}{}{}",
            d.path.display(),
            d.max_files_per_trigger,
            d.starting_version
                .map(|v| format!(" starting_version={v}"))
                .unwrap_or_default(),
            if d.ignore_deletes {
                " ignore_deletes"
            } else {
                ""
            }
        ),
        StreamSource::RateMicroBatch(r) => format!(
            "RatePerMicroBatchStream[rows_per_batch={}, num_partitions={}, \
             start_timestamp={}, advance_millis_per_batch={}]",
            r.rows_per_batch, r.num_partitions, r.start_timestamp_ms, r.advance_ms_per_batch
        ),
        StreamSource::Nexmark(n) => n.describe(),
        StreamSource::Kafka(k) => k.describe(),
    }
}

/// Offsets of every source, by source index (`None`: that source had no data yet).
type Offsets = Vec<Option<Offset>>;

/// A batch to run: planned now, or found in the offsets log without a commit.
#[derive(Debug, Clone)]
struct PlannedBatch {
    id: BatchId,
    /// Each source's end offset of the previous batch (exclusive start).
    start: Offsets,
    /// Each source's end offset of this batch.
    end: Offsets,
    /// `WM(N)`: closes windows and evicts state (spec §2.4).
    watermark_ms: i64,
    /// `WM(N-1)`: judges late rows.
    late_watermark_ms: i64,
    /// The batch's processing time (`batchTimestampMs`).
    timestamp_ms: i64,
}

/// The sources' offsets in an `offsets/N` entry, one per source.
fn source_offsets(seq: &OffsetSeq, sources: usize) -> Offsets {
    let mut o = seq.offsets.clone();
    o.resize(sources, None);
    o.truncate(sources);
    o
}

/// Where a query resumes, from its checkpoint (spec §1.5).
#[derive(Debug, PartialEq)]
struct Resume {
    next_batch: BatchId,
    /// End offsets of the last committed batch.
    committed_end: Offsets,
    /// An uncommitted batch to replay first.
    pending: Option<PlannedBatch>,
    /// The global watermark to continue from, and the last batch's `WM(N)`.
    watermark_ms: i64,
    last_batch_watermark_ms: i64,
}

impl PartialEq for PlannedBatch {
    fn eq(&self, o: &Self) -> bool {
        (
            self.id,
            &self.start,
            &self.end,
            self.watermark_ms,
            self.late_watermark_ms,
        ) == (o.id, &o.start, &o.end, o.watermark_ms, o.late_watermark_ms)
    }
}

fn resume(ckpt: &Checkpoint, sources: usize) -> Result<Resume> {
    let Some((last, seq)) = ckpt.latest_offsets()? else {
        return Ok(Resume {
            next_batch: BatchId(0),
            committed_end: vec![None; sources],
            pending: None,
            watermark_ms: 0,
            last_batch_watermark_ms: 0,
        });
    };
    let end = source_offsets(&seq, sources);
    let mut commit = ckpt.latest_commit()?;
    // Batch N's commit-log entry is written while batch N + 1 runs, so `offsets/N+1` can be
    // durable without `commits/N`. Batch N's state and sink were committed before
    // `offsets/N+1` was written, and the entry's one value, the next batch's watermark, is
    // `offsets/N+1`'s: the entry is written back as the run would have written it.
    if let Some(before) = last.prev()
        && commit.as_ref().map_or(BatchId(0), |(c, _)| c.next()) == before
    {
        let entry = CommitEntry {
            next_batch_watermark_ms: seq.metadata.batch_watermark_ms,
        };
        ckpt.write_commit(before, &entry)?;
        tracing::info!(
            batch = before.get(),
            "commit log entry written back from the next batch's offsets"
        );
        commit = Some((before, entry));
    }
    if let Some((c, entry)) = &commit
        && *c == last
    {
        return Ok(Resume {
            next_batch: last.next(),
            committed_end: end,
            pending: None,
            watermark_ms: seq
                .metadata
                .batch_watermark_ms
                .max(entry.next_batch_watermark_ms),
            last_batch_watermark_ms: seq.metadata.batch_watermark_ms,
        });
    }
    if commit.is_some_and(|(c, _)| c.next() < last) {
        tracing::warn!(
            batch = last.get(),
            "commit log is behind by more than one batch; replaying the last"
        );
    }
    let (start, prev_wm) = match last.prev() {
        None => (vec![None; sources], 0),
        Some(before) => {
            let prev = ckpt
                .offsets(before)?
                .ok_or_else(|| Error::Internal(format!("batch {before} doesn't exist")))?;
            (
                source_offsets(&prev, sources),
                prev.metadata.batch_watermark_ms,
            )
        }
    };
    if end.iter().all(Option::is_none) {
        return Err(Error::Internal(format!(
            "offsets/{last} has no source offset"
        )));
    }
    let wm = seq.metadata.batch_watermark_ms;
    Ok(Resume {
        next_batch: last,
        committed_end: start.clone(),
        pending: Some(PlannedBatch {
            id: last,
            start,
            end,
            watermark_ms: wm,
            late_watermark_ms: prev_wm,
            timestamp_ms: seq.metadata.batch_timestamp_ms,
        }),
        watermark_ms: wm,
        last_batch_watermark_ms: prev_wm,
    })
}

/// Runs a query until it finishes, is stopped, or fails.
pub async fn run(task: QueryTask) -> Outcome {
    let name = task.def.name.clone();
    let registry = task.registry.clone();
    let outcome = match run_inner(task).await {
        Ok(o) => o,
        Err(e) => {
            // The engine records the failure (durably, then in the registry that FLUSH and
            // SHOW QUERIES read) when the task ends.
            tracing::error!(query = %name, error = %e, "streaming query failed");
            Outcome::Failed(e)
        }
    };
    announce_end(&registry, &name, &outcome);
    outcome
}

/// Posts a run's `terminated` event (Spark posts QueryTerminatedEvent only after a
/// QueryStartedEvent: the run has ids) and records its end in the metrics.
pub(super) fn announce_end(registry: &Registry, name: &str, outcome: &Outcome) {
    if let Some(status) = registry.get(name)
        && let (Some(id), Some(run_id)) = (status.id, status.run_id)
    {
        registry.post(ListenerEvent::Terminated {
            id,
            run_id,
            name: name.to_string(),
            exception: match outcome {
                Outcome::Failed(e) => Some(e.to_string()),
                _ => None,
            },
        });
    }
    super::metrics::query_ended(name, matches!(outcome, Outcome::Failed(_)));
}

struct Runner {
    def: SinkDef,
    /// By source index: the streams the plan reads, in its order.
    sources: Vec<Box<dyn Source>>,
    ckpt: Checkpoint,
    sink: Box<dyn Sink>,
    shape: SinkShape,
    write_mode: WriteMode,
    plan: StreamingPlan,
    /// Spark's names of the stateful operators, by id.
    operator_names: Vec<&'static str>,
    /// Each watermark node's own watermark (ms): in memory only, as Spark keeps it (§2.2).
    node_watermarks: Vec<Option<i64>>,
    /// How they make the global watermark.
    watermark_policy: WatermarkPolicy,
    registry: Arc<Registry>,
    run_id: Uuid,
    /// The last batch's operators, which idle reports repeat (spec §12.6).
    last_state_operators: Vec<StateOperatorProgress>,
    /// When the last report was kept.
    last_kept_report: Option<Instant>,
    /// Whether this run kept an idle report (its first is not posted).
    idle_reported: bool,
    /// The side tables' writers (`late_rows = 'table'`, ...).
    side_tables: Vec<(super::side_tables::SideTable, crate::sink::delta::DeltaSink)>,
}

/// What a batch did, for the progress report.
#[derive(Default)]
struct BatchStats {
    /// By source index.
    rows_in: Vec<u64>,
    rows_out: u64,
    /// By watermark node.
    event_time: Vec<EventTimeStats>,
    /// By stateful operator.
    state: Vec<(StateMetrics, AggregateBatch)>,
    /// By source index: rows set aside for their event-time skew.
    skewed: Vec<u64>,
    /// By source index: the records that did not parse.
    malformed: Vec<Vec<crate::source::MalformedRecord>>,
    /// When the batch's rows arrived, over every source.
    arrivals: Vec<crate::source::Arrival>,
    /// When the sink committed the batch, ms since the epoch.
    committed_ms: i64,
}

/// Opens source `i` of a query: its stream's connector, with the sink's rate limits.
fn open_source(task: &QueryTask, ckpt: &Checkpoint, i: usize) -> Result<Box<dyn Source>> {
    let def = &task.def;
    let stream = &task.streams[i];
    Ok(match stream.source()? {
        StreamSource::File(config) => {
            let mut config = config.clone();
            // A sink's max_files_per_trigger overrides its stream's.
            if let Some(n) = def.options.positive_int("max_files_per_trigger")? {
                let mut c = (*config).clone();
                c.max_files_per_trigger = Some(n);
                config = Arc::new(c);
            }
            Box::new(FileSource::open(config, ckpt.source_dir(i))?)
        }
        StreamSource::Table(_) => {
            let log = task.table_logs.get(&stream.name).cloned().ok_or_else(|| {
                Error::Internal(format!("the log of stream \"{}\" is not open", stream.name))
            })?;
            Box::new(TableSource::new(
                log,
                &ckpt.id.to_string(),
                def.options.positive_int("max_rows_per_trigger")?,
            )?)
        }
        StreamSource::Rate(config) => Box::new(RateSource::open(
            config.clone(),
            ckpt.source_dir(i),
            task.clock.clone(),
        )?),
        StreamSource::RateMicroBatch(config) => Box::new(RateMicroBatchSource::new(config.clone())),
        StreamSource::Nexmark(config) => Box::new(NexmarkSource::new(config.clone())),
        StreamSource::Delta(config) => {
            let mut config = config.clone();
            if let Some(n) = def.options.positive_int("max_files_per_trigger")? {
                config.max_files_per_trigger = n;
            }
            Box::new(crate::source::delta::DeltaSource::new(config))
        }
        StreamSource::Kafka(config) => {
            let mut config = config.clone();
            // A sink's max_offsets_per_trigger overrides its stream's.
            if let Some(n) = def.options.positive_int("max_offsets_per_trigger")? {
                let mut c = (*config).clone();
                c.max_offsets_per_trigger = Some(n);
                config = Arc::new(c);
            }
            Box::new(crate::source::kafka::KafkaSource::open(
                config,
                ckpt.source_dir(i),
            )?)
        }
    })
}

async fn run_inner(mut task: QueryTask) -> Result<Outcome> {
    let def = task.def.clone();
    let ckpt = Checkpoint::open(&def.checkpoint)?;
    let run_id = Uuid::new_v4();
    task.registry.update(&def.name, |s| {
        s.id = Some(ckpt.id);
        s.run_id = Some(run_id);
        s.status = Status::Running;
        s.error = None;
        s.started_at = Some(Utc::now());
    });
    task.registry.post(ListenerEvent::Started {
        id: ckpt.id,
        run_id,
        name: def.name.clone(),
        timestamp: Utc::now(),
    });
    tracing::info!(query = %def.name, id = %ckpt.id, run_id = %run_id, "query started");
    let sink_wm = sink_watermark(&def)?;
    let mode = OutputMode::parse(&def.output_mode)?;
    let streams: Vec<&StreamDef> = task.streams.iter().collect();
    let state = StateConfig {
        store: def.state_store.as_str().to_string(),
        partitions: def.state_partitions,
        dedup: DedupMode::of(&def.options)?,
        per_batch: def.merge.is_some(),
        max_event_time_skew_us: super::side_tables::skew_of(&def.options)?,
    };
    let plan = build_plan(
        &def.query,
        &streams,
        &task.tables,
        sink_wm.as_ref(),
        mode,
        &state,
    )
    .await?;
    let shape = shape_of(&def.query, &plan)?;
    let lines = explain(&def, &streams, &shape).unwrap_or_default();
    task.registry.update(&def.name, |s| {
        s.plan = lines;
        s.checkpoint = Some(def.checkpoint.display().to_string());
    });
    crate::checkpoint::record_definition(
        ckpt.root(),
        &format!("{} \"{}\"", def.kind.noun(), def.name),
        &checkpoint_definition(&def, &streams, &shape),
    )?;
    let sink = def
        .connector()?
        .open(
            &def.name,
            &def.path,
            &shape.output(),
            &def.options,
            def.merge.as_ref(),
        )
        .await?;
    let mut sources = Vec::with_capacity(plan.sources.len());
    for i in 0..plan.sources.len() {
        sources.push(open_source(&task, &ckpt, i)?);
    }
    let Resume {
        mut next_batch,
        mut committed_end,
        mut pending,
        watermark_ms: mut global_wm,
        last_batch_watermark_ms: mut last_batch_wm,
    } = resume(&ckpt, sources.len())?;
    // One state directory per operator: state/<operator id>/<partition> (Spark's layout).
    let mut operators: Vec<Box<dyn StatefulOperator>> = Vec::new();
    for node in &plan.operators {
        let dir = ckpt.root().join("state").join(node.id.to_string());
        let open = |layout| crate::state::open(def.state_store, &dir, layout);
        let mut op: Box<dyn StatefulOperator> = match &node.kind {
            OperatorKind::Aggregate(info) => Box::new(
                AggregateOperator::try_new(
                    info.clone(),
                    mode,
                    &node.input_schema,
                    def.state_partitions,
                    open,
                )
                .await?,
            ),
            OperatorKind::Dedup(info) => Box::new(DedupOperator::try_new(
                info.clone(),
                &node.input_schema,
                def.state_partitions,
                open,
            )?),
            // Each side's rows in state/<id>/left and state/<id>/right.
            OperatorKind::Join(info) => Box::new(JoinOperator::try_new(
                info.as_ref().clone(),
                def.state_partitions,
                |side, layout| crate::state::open(def.state_store, &dir.join(side), layout),
            )?),
        };
        // Batch N reads state version N.
        op.load(next_batch.state_version())?;
        operators.push(op);
    }
    let wants_no_data = operators.iter().any(|o| o.wants_no_data_batches());
    let operator_names = operators.iter().map(|o| o.name()).collect();
    plan.set_operators(operators);
    let trigger = match def.trigger {
        // Spark runs available_now as once over a source that cannot fix an end.
        Trigger::AvailableNow if !sources.iter().all(|s| s.supports_available_now()) => {
            Trigger::Once
        }
        t => t,
    };
    // available_now fixes what this run reads when it starts (spec §6.3).
    if trigger == Trigger::AvailableNow {
        for s in &mut sources {
            s.prepare_available_now().await?;
        }
    }
    let mut arrivals: Vec<watch::Receiver<u64>> =
        sources.iter().filter_map(|s| s.arrivals()).collect();
    let node_watermarks = vec![None; plan.watermarks.len()];
    let mut runner = Runner {
        sources,
        ckpt,
        sink,
        write_mode: shape.write_mode(),
        shape,
        plan,
        operator_names,
        node_watermarks,
        watermark_policy: WatermarkPolicy::of(&def.options)?,
        registry: task.registry.clone(),
        run_id,
        last_state_operators: Vec::new(),
        last_kept_report: None,
        idle_reported: false,
        side_tables: task
            .side_tables
            .iter()
            .map(|(k, t)| {
                Ok((
                    *k,
                    crate::sink::delta::DeltaSink::new(&t.path, k.schema(), 0)?,
                ))
            })
            .collect::<Result<_>>()?,
        def,
    };
    // A no-data batch is due when the watermark moved past the last batch's (spec §1.3).
    // Spark never runs one as the first batch of a run; Tidemark does when the previous
    // run ended owing one and no new data is there (after a crash right after the commit
    // log, say), so that a restart emits what an uninterrupted run would have.
    let mut no_data_due =
        wants_no_data && pending.is_none() && next_batch > BatchId(0) && global_wm > last_batch_wm;
    let mut prev_trigger_start: Option<Instant> = None;
    let mut trigger_no: u64 = 0;
    // A batch that drained its sources moved the watermark; FLUSH waits for it to apply.
    let mut owed_watermark = false;
    let limit = match trigger {
        Trigger::Once => ReadLimit::AllAvailable,
        _ => ReadLimit::Default,
    };
    // Batch N's commit-log entry while it is being written, and what waits for it.
    let mut committing: Option<Committing> = None;
    let result = outcome_of(async {
        loop {
            if let Some(reason) = *task.stop.borrow() {
                return Ok(Outcome::Stopped(reason));
            }
            let trigger_start = Instant::now();
            let trigger_wall = Utc::now();
            trigger_no += 1;
            runner
                .registry
                .update(&runner.def.name, |s| s.triggers = trigger_no);
            // Arrivals from now on wake the next wait.
            for a in arrivals.iter_mut() {
                a.borrow_and_update();
            }
            let deadline = match trigger {
                Trigger::ProcessingTime(d) => {
                    let now_ms = trigger_wall.timestamp_millis() as u128;
                    let d_ms = d.as_millis().max(1);
                    let next_ms = now_ms / d_ms * d_ms + d_ms;
                    Some(trigger_start + Duration::from_millis((next_ms - now_ms) as u64))
                }
                _ => None,
            };
            let mut durations: BTreeMap<String, u64> = BTreeMap::new();
            let mut phases = Phases::new(trigger_start);
            let mut wal: Option<WalWrite> = None;
            // Whether this trigger's batch takes everything its sources held when it started
            // (a replayed batch was planned by an earlier run: it does not count).
            let mut drains = false;
            let batch = match pending.take() {
                Some(p) => Some(p),
                None => {
                    let t = Instant::now();
                    let mut latest = Vec::with_capacity(runner.sources.len());
                    for (i, source) in runner.sources.iter_mut().enumerate() {
                        let l = source
                            .latest_offset(committed_end[i].as_ref(), limit)
                            .await?;
                        latest.push(l.or_else(|| committed_end[i].clone()));
                    }
                    durations.insert("latestOffset".into(), t.elapsed().as_millis() as u64);
                    phases.mark("latestOffset");
                    drains = !runner.sources.iter().any(|s| s.held_back());
                    let has_data = latest.iter().any(Option::is_some) && latest != committed_end;
                    if (has_data || no_data_due) && latest.iter().any(Option::is_some) {
                        let timestamp_ms = Utc::now().timestamp_millis();
                        let seq = OffsetSeq {
                            metadata: OffsetMetadata {
                                batch_watermark_ms: global_wm,
                                batch_timestamp_ms: timestamp_ms,
                                conf: BTreeMap::from([
                                    (
                                        "spark.sql.streaming.multipleWatermarkPolicy".to_string(),
                                        runner.watermark_policy.as_str().to_string(),
                                    ),
                                    (
                                        "spark.sql.shuffle.partitions".to_string(),
                                        runner.def.state_partitions.to_string(),
                                    ),
                                ]),
                            },
                            offsets: latest.clone(),
                        };
                        // Written while the batch reads and runs; awaited before anything
                        // of the batch is committed or shown (`run_batch`).
                        let ckpt = runner.ckpt.clone();
                        let id = next_batch;
                        wal = Some(tokio::task::spawn_blocking(move || {
                            let t = Instant::now();
                            ckpt.write_offsets(id, &seq)?;
                            crate::testing::crash_point("after_offsets_write");
                            Ok(t.elapsed())
                        }));
                        Some(PlannedBatch {
                            id: next_batch,
                            start: committed_end.clone(),
                            end: latest,
                            watermark_ms: global_wm,
                            late_watermark_ms: last_batch_wm,
                            timestamp_ms,
                        })
                    } else {
                        None
                    }
                }
            };
            match batch {
                None => {
                    runner.finish_commit(committing.take()).await?;
                    owed_watermark = false;
                    // A bounded run (once, available_now) is caught up when it has finished:
                    // FLUSH waits for that, not for a drained trigger.
                    if !trigger.is_bounded() {
                        runner
                            .registry
                            .update(&runner.def.name, |s| s.last_drained_trigger = trigger_no);
                    }
                    let elapsed = trigger_start.elapsed();
                    durations.insert("triggerExecution".into(), elapsed.as_millis() as u64);
                    runner.report_idle(
                        next_batch,
                        &committed_end,
                        global_wm,
                        trigger_wall,
                        elapsed,
                        durations,
                    );
                    prev_trigger_start = Some(trigger_start);
                    if trigger.is_bounded() {
                        return Ok(Outcome::Finished);
                    }
                    let wait_until = deadline.unwrap_or(trigger_start + POLL_INTERVAL);
                    wait(&mut task.stop, &task.wake, &mut arrivals, wait_until).await;
                }
                Some(b) => {
                    let stats = runner
                        .run_batch(&b, wal, &mut durations, &mut phases)
                        .await?;
                    // The watermark moves at the end of the batch (spec §2.2).
                    let candidates: Vec<Option<i64>> = runner
                        .plan
                        .watermarks
                        .iter()
                        .zip(&stats.event_time)
                        .map(|(w, e)| {
                            (e.count > 0).then(|| e.max.div_euclid(1000) - delay_ms(&w.spec))
                        })
                        .collect();
                    global_wm = advance_watermark(
                        global_wm,
                        &mut runner.node_watermarks,
                        &candidates,
                        runner.watermark_policy,
                    );
                    // Batch N - 1's entry is durable before batch N's is written: the commit
                    // log stays in order.
                    runner.finish_commit(committing.take()).await?;
                    phases.mark("previousCommit");
                    // Batch N's entry is written while batch N + 1 is planned and runs;
                    // `offsets/N+1` may be durable first (a restart then writes it back:
                    // `resume`). What needs batch N committed waits for it: `finish_commit`.
                    let (ckpt, id) = (runner.ckpt.clone(), b.id);
                    let entry = CommitEntry {
                        next_batch_watermark_ms: global_wm,
                    };
                    let write = tokio::task::spawn_blocking(move || {
                        let t = Instant::now();
                        ckpt.write_commit(id, &entry)?;
                        crate::testing::crash_point("after_commit_log");
                        let took = t.elapsed();
                        let us = took.as_micros() as u64;
                        tracing::debug!(batch = id.get(), us, "commit log written");
                        Ok(took)
                    });
                    runner.plan.for_each_operator(|_, op| op.maintain()).await?;
                    phases.mark("maintain");
                    let elapsed = trigger_start.elapsed();
                    durations.insert("triggerExecution".into(), elapsed.as_millis() as u64);
                    let progress = runner.progress(
                        &b,
                        trigger_wall,
                        elapsed,
                        prev_trigger_start.map(|p| trigger_start.duration_since(p)),
                        stats,
                        durations,
                    );
                    phases.mark("report");

                    let sink = &runner.def.name;
                    tracing::debug!(%sink, batch = b.id.get(), %phases, "batch phases");
                    prev_trigger_start = Some(trigger_start);
                    committed_end = b.end.clone();
                    next_batch = b.id.next();
                    last_batch_wm = b.watermark_ms;
                    no_data_due = wants_no_data && global_wm > b.watermark_ms;
                    // FLUSH's mark: this batch took everything its sources held, and the
                    // watermark it moved needs no no-data batch, or an earlier such batch's
                    // watermark is now applied (a source that never runs dry leaves no room for
                    // a no-data batch: the next batch applies it).
                    let mut drained_trigger = None;
                    if drains && (owed_watermark || !no_data_due) {
                        owed_watermark = false;
                        if !trigger.is_bounded() {
                            drained_trigger = Some(trigger_no);
                        }
                    } else if drains {
                        owed_watermark = true;
                    }
                    committing = Some(Committing {
                        write,
                        end: b.end,
                        progress,
                        drained_trigger,
                    });
                    if trigger == Trigger::Once {
                        return Ok(Outcome::Finished);
                    }
                    if let Some(d) = deadline {
                        // Nothing runs before the next trigger: the batch's report does not
                        // wait for it.
                        runner.finish_commit(committing.take()).await?;
                        wait(&mut task.stop, &task.wake, &mut [], d).await;
                    }
                }
            }
        }
    })
    .await;
    match result {
        Ok(outcome) => {
            runner.finish_commit(committing.take()).await?;
            Ok(outcome)
        }
        Err(e) => {
            // A restart must not race the commit log's write.
            if let Some(c) = committing.take() {
                let _ = c.write.await;
            }
            Err(e)
        }
    }
}

/// Gives the trigger loop's block its type, for its `?`s.
fn outcome_of<F: std::future::Future<Output = Result<Outcome>>>(f: F) -> F {
    f
}

/// Batch N, run and committed to its sink and state, while its commit-log entry
/// (`commits/N`) is being written; what waits for that entry.
struct Committing {
    write: tokio::task::JoinHandle<Result<Duration>>,
    /// The sources' end offsets, committed to them once the entry is durable.
    end: Offsets,
    /// The report, published then.
    progress: Progress,
    /// FLUSH's mark, set then.
    drained_trigger: Option<u64>,
}

/// The offsets log's write of a planned batch, under way; its duration when done.
type WalWrite = tokio::task::JoinHandle<Result<Duration>>;

/// Where a trigger's time went, phase by phase, in microseconds: logged at debug level
/// (`RUST_LOG=tidemark::engine::query=debug`), finer than the progress's milliseconds.
struct Phases {
    last: Instant,
    marks: Vec<(&'static str, u128)>,
}

impl Phases {
    fn new(start: Instant) -> Phases {
        Phases {
            last: start,
            marks: Vec::new(),
        }
    }

    /// Records a part of the last phase, measured by its owner.
    fn note(&mut self, name: &'static str, d: Duration) {
        self.marks.push((name, d.as_micros()));
    }

    /// Ends phase `name` now.
    fn mark(&mut self, name: &'static str) {
        let now = Instant::now();
        self.marks
            .push((name, now.duration_since(self.last).as_micros()));
        self.last = now;
    }
}

impl std::fmt::Display for Phases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (name, us)) in self.marks.iter().enumerate() {
            write!(f, "{}{name}={us}us", if i > 0 { " " } else { "" })?;
        }
        Ok(())
    }
}

/// The delay of a watermark, in ms.
fn delay_ms(wm: &WatermarkSpec) -> i64 {
    (wm.delay_us / 1000) as i64
}

/// Sleeps until `until`, or until a stop request, a `FLUSH` wake-up or new data in any
/// source.
async fn wait(
    stop: &mut watch::Receiver<Option<StopReason>>,
    wake: &Notify,
    arrivals: &mut [watch::Receiver<u64>],
    until: Instant,
) {
    if stop.borrow().is_some() {
        return;
    }
    let arrived = async {
        if arrivals.is_empty() {
            return std::future::pending::<()>().await;
        }
        let changes = arrivals.iter_mut().map(|a| Box::pin(a.changed()));
        match futures::future::select_all(changes).await {
            (Ok(()), _, _) => {}
            // A closed watch never changes again.
            (Err(_), _, _) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::time::sleep_until(until.into()) => {}
        _ = wake.notified() => {}
        _ = stop.changed() => {}
        _ = arrived => {}
    }
}

impl Runner {
    /// Puts each source's rows of batch `b` in the plan's tables, counting them.
    async fn read_inputs(&mut self, b: &PlannedBatch, stats: &mut BatchStats) -> Result<()> {
        for (i, source) in self.sources.iter().enumerate() {
            let mut input = Vec::new();
            if let Some(end) = &b.end[i]
                && b.start[i].as_ref() != Some(end)
            {
                let mut rows = source.read(b.start[i].as_ref(), end).await?;
                while let Some(batch) = rows.next().await {
                    input.push(batch?);
                }
            }
            stats
                .rows_in
                .push(input.iter().map(|b| b.num_rows() as u64).sum());
            stats.malformed.push(source.take_malformed());
            stats.arrivals.extend(source.take_arrivals());
            self.plan.set_rows(i, partition(input, parallelism()));
        }
        Ok(())
    }

    /// Reads the batch's rows, runs the plan, commits state and sink.
    async fn run_batch(
        &mut self,
        b: &PlannedBatch,
        wal: Option<WalWrite>,
        durations: &mut BTreeMap<String, u64>,
        phases: &mut Phases,
    ) -> Result<BatchStats> {
        crate::testing::pause_point("batch_start").await;
        let mut stats = BatchStats::default();
        let read_start = Instant::now();
        // Spark's addBatch: from the plan's execution to the sink's commit.
        let mut t = read_start;
        let output = match self.read_inputs(b, &mut stats).await {
            Ok(()) => {
                durations.insert("getBatch".into(), read_start.elapsed().as_millis() as u64);
                phases.mark("getBatch");
                t = Instant::now();
                self.plan
                    .execute(
                        b.late_watermark_ms * 1000,
                        b.watermark_ms * 1000,
                        b.timestamp_ms * 1000,
                    )
                    .await
            }
            Err(e) => Err(e),
        };
        // The tables hold the batch's rows only while it runs.
        for i in 0..self.sources.len() {
            self.plan.set_rows(i, vec![vec![]]);
        }
        // The batch is decided once its offsets are durable: only then may its state and
        // rows be committed or shown. Awaited even when the run failed, so that a restart
        // never races the write.
        if let Some(wal) = wal {
            let took = wal
                .await
                .map_err(|e| Error::Internal(format!("offsets log writer: {e}")))??;
            durations.insert("walCommit".into(), took.as_millis() as u64);
            phases.note("walCommit", took);
        }
        let output = output?;
        durations.insert("queryPlanning".into(), output.planning.as_millis() as u64);
        phases.mark("planAndExecute");
        phases.note("ofWhichPlanning", output.planning);
        let side = self.side_rows(b, &output, &mut stats)?;
        stats.malformed.clear();
        stats.event_time = output.stats;
        // Batch N commits state version N + 1, while the sink writes.
        let state_commit = self.plan.commit_operators(b.id.committed_state_version());
        let out = output
            .rows
            .into_iter()
            .filter(|b| b.num_rows() > 0)
            .map(|b| super::cast_to_schema(b.columns(), &self.shape.schema))
            .collect::<Result<Vec<_>>>()?;
        stats.rows_out = out.iter().map(|b| b.num_rows() as u64).sum();
        let query_id = self.ckpt.id.to_string();
        let sink_started = Instant::now();
        let sink_commit = async {
            // The state commit may be under way, done or not started: a crash here must
            // lose nothing either way.
            crate::testing::crash_point("before_sink_commit");
            crate::testing::fail_point(&format!("sink_write:{}", self.def.name))?;
            // Dropped rows first, under their own app id: a replay writes them once.
            for ((kind, table), rows) in self.side_tables.iter().zip(side) {
                if rows.is_empty() {
                    continue;
                }
                let app = kind.app_id(&query_id);
                let batch = BatchInfo {
                    query_id: &app,
                    id: b.id,
                    watermark_ms: b.watermark_ms,
                    mode: &WriteMode::Append,
                };
                table.add_batch(&batch, rows).await?;
            }
            let batch = BatchInfo {
                query_id: &query_id,
                id: b.id,
                watermark_ms: b.watermark_ms,
                mode: &self.write_mode,
            };
            self.sink.add_batch(&batch, out).await
        };
        let (state_commit, sink_commit) = tokio::join!(
            async {
                let metrics = state_commit
                    .await
                    .map_err(|e| Error::Internal(format!("state commit task: {e}")))??;
                Ok::<_, Error>(metrics)
            },
            sink_commit
        );
        stats.state = state_commit?
            .into_iter()
            .zip(output.operators)
            .map(|(m, o)| (m, o.unwrap_or_default()))
            .collect();
        match sink_commit? {
            SinkCommit::Committed { version } => {
                tracing::debug!(sink = %self.def.name, batch = b.id.get(), version,
                    ms = sink_started.elapsed().as_millis() as u64, "sink commit");
            }
            SinkCommit::AlreadyCommitted => {
                tracing::info!(sink = %self.def.name, batch = b.id.get(), "batch already in the table; skipped");
            }
        }
        stats.committed_ms = Utc::now().timestamp_millis();
        crate::testing::crash_point("after_sink_commit");
        phases.mark("stateAndSinkCommit");
        durations.insert("addBatch".into(), t.elapsed().as_millis() as u64);
        Ok(stats)
    }

    /// The batch's rows for each of [`Runner::side_tables`], in their order; and the rows
    /// set aside for their skew counted per source.
    fn side_rows(
        &self,
        b: &PlannedBatch,
        output: &super::plan::BatchOutput,
        stats: &mut BatchStats,
    ) -> Result<Vec<Vec<RecordBatch>>> {
        use super::side_tables::SideTable;
        stats.skewed = vec![0; self.sources.len()];
        for (node, d) in &output.skewed {
            let stream = self.plan.watermarks.get(*node).map(|w| w.stream.as_str());
            if let Some(i) = self
                .plan
                .sources
                .iter()
                .position(|s| Some(s.name.as_str()) == stream)
            {
                stats.skewed[i] += d.rows.num_rows() as u64;
            }
        }
        if stats.skewed.iter().any(|&n| n > 0) {
            tracing::warn!(sink = %self.def.name, batch = b.id.get(),
                rows = stats.skewed.iter().sum::<u64>(),
                "rows further ahead of the batch's time than max_event_time_skew set aside");
        }
        self.side_tables
            .iter()
            .map(|(kind, _)| match kind {
                SideTable::LateRows => self.late_rows(b, output),
                SideTable::MalformedRows => stats
                    .malformed
                    .iter()
                    .zip(&self.plan.sources)
                    .filter(|(records, _)| !records.is_empty())
                    .map(|(records, s)| {
                        super::side_tables::malformed_rows(b.id.get() as i64, &s.name, records)
                    })
                    .collect(),
            })
            .collect()
    }

    /// The batch's rows dropped as late or set aside for their skew, as late-rows table
    /// rows.
    fn late_rows(
        &self,
        b: &PlannedBatch,
        output: &super::plan::BatchOutput,
    ) -> Result<Vec<RecordBatch>> {
        use super::side_tables::{Reason, late_rows};
        let id = b.id.get() as i64;
        let mut out = Vec::new();
        for (i, o) in output.operators.iter().enumerate() {
            let name = format!(
                "{} {i}",
                self.operator_names.get(i).copied().unwrap_or("operator")
            );
            for d in o.iter().flat_map(|o| &o.late) {
                out.push(late_rows(
                    id,
                    &name,
                    Reason::Late,
                    b.late_watermark_ms * 1000,
                    d,
                )?);
            }
        }
        for (node, d) in &output.skewed {
            out.push(late_rows(
                id,
                &format!("watermark {node}"),
                Reason::Skew,
                b.late_watermark_ms * 1000,
                d,
            )?);
        }
        Ok(out)
    }

    /// Waits for a batch's commit-log entry, then does what waits for the batch to be
    /// committed: the sources' commit (what only this query needed may go), the purge of
    /// old log entries, the progress report and FLUSH's mark. Nothing if no batch is waiting.
    async fn finish_commit(&mut self, c: Option<Committing>) -> Result<()> {
        let Some(c) = c else {
            return Ok(());
        };
        let took = c
            .write
            .await
            .map_err(|e| Error::Internal(format!("commit log writer: {e}")))??;
        let mut progress = c.progress;
        progress
            .duration_ms
            .insert("commitOffsets".into(), took.as_millis() as u64);
        // Old log entries go in the background: nothing reads them.
        let (ckpt, id) = (self.ckpt.clone(), progress.batch_id);
        tokio::task::spawn_blocking(move || ckpt.purge(id));
        for (source, end) in self.sources.iter_mut().zip(&c.end) {
            if let Some(end) = end {
                source.commit(end).await?;
            }
        }
        self.publish(progress);
        if let Some(t) = c.drained_trigger {
            self.registry
                .update(&self.def.name, |s| s.last_drained_trigger = t);
        }
        Ok(())
    }

    /// Batch `b`'s progress report, built when it has run (its sources' backlog and
    /// latest offsets as they are then); [`Runner::publish`] shows it once the batch's
    /// commit-log entry is durable.
    fn progress(
        &self,
        b: &PlannedBatch,
        trigger_wall: chrono::DateTime<Utc>,
        elapsed: Duration,
        since_prev_trigger: Option<Duration>,
        stats: BatchStats,
        duration_ms: BTreeMap<String, u64>,
    ) -> Progress {
        let rows_in: u64 = stats.rows_in.iter().sum();
        let processing_s = (elapsed.as_millis().max(1)) as f64 / 1000.0;
        let rates = |rows: u64| {
            let processed = round_rate(rows as f64 / processing_s);
            let input = match since_prev_trigger {
                Some(d) if d.as_millis() > 0 => round_rate(rows as f64 / d.as_secs_f64()),
                _ => 0.0,
            };
            (input, processed)
        };
        let (input_rate, processed) = rates(rows_in);
        let ts = |us: i64| chrono::DateTime::from_timestamp_micros(us).unwrap_or_default();
        let event_time = (!self.plan.watermarks.is_empty()).then(|| {
            let mut e = EventTimeStats::default();
            for s in &stats.event_time {
                e.merge(s);
            }
            // Spark keeps event-time statistics in milliseconds.
            let ms = |us: i64| ts(us.div_euclid(1000) * 1000);
            EventTimeProgress {
                avg: e.avg().map(ms),
                max: (e.count > 0).then(|| ms(e.max)),
                min: (e.count > 0).then(|| ms(e.min)),
                watermark: ts(b.watermark_ms * 1000),
            }
        });
        // Spark lists the operators from the top of the plan down; ids count bottom-up.
        let state_operators: Vec<StateOperatorProgress> = stats
            .state
            .iter()
            .enumerate()
            .rev()
            .map(|(i, (m, agg))| StateOperatorProgress {
                operator_name: self
                    .operator_names
                    .get(i)
                    .copied()
                    .unwrap_or("stateStoreSave")
                    .into(),
                num_rows_total: m.rows_total,
                num_rows_updated: agg.rows_updated,
                all_updates_time_ms: agg.all_updates_ms,
                num_rows_removed: agg.rows_removed,
                all_removals_time_ms: agg.all_removals_ms,
                commit_time_ms: m.commit_ms,
                memory_used_bytes: m.memory_bytes,
                num_rows_dropped_by_watermark: agg.dropped_late,
                num_shuffle_partitions: self.def.state_partitions,
                num_state_store_instances: self.def.state_partitions
                    * self
                        .operator_names
                        .get(i)
                        .map_or(1, |n| stores_per_partition(n)),
                custom_metrics: agg
                    .custom_metrics
                    .iter()
                    .map(|(k, v)| (k.to_string(), i64::try_from(*v).unwrap_or(i64::MAX)))
                    .collect(),
            })
            .collect();
        let sources = self
            .sources
            .iter()
            .enumerate()
            .map(|(i, source)| {
                let rows = stats.rows_in.get(i).copied().unwrap_or(0);
                let (input_rate, processed) = rates(rows);
                let mut metrics = source.metrics();
                if let Some(&n) = stats.skewed.get(i).filter(|&&n| n > 0) {
                    metrics.insert("numSkewedRows".to_string(), n.to_string());
                }
                metrics.extend(source.backlog(b.end[i].as_ref()).metrics());
                SourceProgress {
                    description: source.describe(),
                    start_offset: b.start[i].clone(),
                    end_offset: b.end[i].clone(),
                    latest_offset: source.reported_latest(),
                    num_input_rows: rows,
                    input_rows_per_second: input_rate,
                    processed_rows_per_second: processed,
                    metrics,
                }
            })
            .collect();
        Progress {
            id: self.ckpt.id,
            run_id: self.run_id,
            name: self.def.name.clone(),
            timestamp: trigger_wall,
            batch_id: b.id,
            batch_duration: elapsed.as_millis() as u64,
            num_input_rows: rows_in,
            input_rows_per_second: input_rate,
            processed_rows_per_second: processed,
            duration_ms,
            event_time,
            state_operators,
            sources,
            sink: SinkProgress {
                description: self.sink.describe(),
                num_output_rows: stats.rows_out as i64,
            },
            end_to_end_latency_ms: super::progress::latency_percentiles(
                &stats.arrivals,
                stats.committed_ms,
            ),
            watermark_lag_ms: self.watermark_lag_ms(b.watermark_ms),
            idle: false,
        }
    }

    /// Shows a committed batch's report: the registry, `tidemark.progress`, the listener
    /// bus and the metrics.
    fn publish(&mut self, progress: Progress) {
        tracing::info!(
            query = %self.def.name,
            batch = progress.batch_id.get(),
            rows = progress.num_input_rows,
            elapsed_ms = progress.batch_duration,
            "micro-batch committed"
        );
        super::metrics::record(&progress);
        self.last_state_operators = progress.state_operators.clone();
        self.last_kept_report = Some(Instant::now());
        let now = Utc::now();
        let id = progress.batch_id;
        self.registry.update(&self.def.name, |s| {
            s.last_batch_id = Some(id);
            s.last_progress_at = Some(now);
        });
        let progress = Arc::new(progress);
        self.registry.push_progress((*progress).clone());
        self.registry.post(ListenerEvent::Progress(progress));
    }

    /// The report of an idle trigger (spec §12.3, §12.6): kept only
    /// [`IDLE_REPORT_INTERVAL`] after the last kept report, posted as an idle event except
    /// the first of a run.
    fn report_idle(
        &mut self,
        next_batch: BatchId,
        committed_end: &[Option<Offset>],
        watermark_ms: i64,
        trigger_wall: chrono::DateTime<Utc>,
        elapsed: Duration,
        duration_ms: BTreeMap<String, u64>,
    ) {
        if self
            .last_kept_report
            .is_some_and(|t| t.elapsed() < IDLE_REPORT_INTERVAL)
        {
            return;
        }
        self.last_kept_report = Some(Instant::now());
        let ts = |ms: i64| chrono::DateTime::from_timestamp_millis(ms).unwrap_or_default();
        let progress = Progress {
            id: self.ckpt.id,
            run_id: self.run_id,
            name: self.def.name.clone(),
            timestamp: trigger_wall,
            batch_id: next_batch,
            batch_duration: elapsed.as_millis() as u64,
            num_input_rows: 0,
            input_rows_per_second: 0.0,
            processed_rows_per_second: 0.0,
            duration_ms,
            event_time: (!self.plan.watermarks.is_empty()).then(|| EventTimeProgress {
                avg: None,
                max: None,
                min: None,
                watermark: ts(watermark_ms),
            }),
            state_operators: self
                .last_state_operators
                .iter()
                .map(|o| StateOperatorProgress {
                    num_rows_updated: 0,
                    num_rows_dropped_by_watermark: 0,
                    ..o.clone()
                })
                .collect(),
            sources: self
                .sources
                .iter()
                .enumerate()
                .map(|(i, source)| SourceProgress {
                    description: source.describe(),
                    start_offset: committed_end[i].clone(),
                    end_offset: committed_end[i].clone(),
                    latest_offset: source.reported_latest(),
                    num_input_rows: 0,
                    input_rows_per_second: 0.0,
                    processed_rows_per_second: 0.0,
                    metrics: source
                        .backlog(committed_end[i].as_ref())
                        .metrics()
                        .collect(),
                })
                .collect(),
            sink: SinkProgress {
                description: self.sink.describe(),
                num_output_rows: 0,
            },
            end_to_end_latency_ms: None,
            watermark_lag_ms: self.watermark_lag_ms(watermark_ms),
            idle: true,
        };
        super::metrics::record(&progress);
        let first = !self.idle_reported;
        self.idle_reported = true;
        self.registry.push_progress(progress);
        if !first {
            self.registry.post(ListenerEvent::Idle {
                id: self.ckpt.id,
                run_id: self.run_id,
                name: self.def.name.clone(),
                timestamp: trigger_wall,
            });
        }
    }

    /// The wall clock less the watermark, for a query with one that has moved.
    fn watermark_lag_ms(&self, watermark_ms: i64) -> Option<i64> {
        (!self.plan.watermarks.is_empty() && watermark_ms > 0)
            .then(|| Utc::now().timestamp_millis() - watermark_ms)
    }
}

/// State stores per partition of an operator named as Spark names it: a stream-stream join
/// keeps four (each side's rows and key counts, state format 2), the others one.
fn stores_per_partition(operator_name: &str) -> usize {
    if operator_name == "symmetricHashJoin" {
        4
    } else {
        1
    }
}

/// Deals batches round-robin into `n` partitions for parallel execution.
fn partition(batches: Vec<RecordBatch>, n: usize) -> Vec<Vec<RecordBatch>> {
    let n = n.max(1);
    let mut parts: Vec<Vec<RecordBatch>> = vec![Vec::new(); n];
    for (i, b) in batches.into_iter().enumerate() {
        parts[i % n].push(b);
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offsets(ck: &Checkpoint, n: u64, watermark_ms: i64, end: i64) {
        let seq = OffsetSeq {
            metadata: OffsetMetadata {
                batch_watermark_ms: watermark_ms,
                batch_timestamp_ms: 1_000 + n as i64,
                conf: BTreeMap::new(),
            },
            offsets: vec![Some(serde_json::json!(end))],
        };
        ck.write_offsets(BatchId(n), &seq).unwrap();
    }

    fn commit(ck: &Checkpoint, n: u64, watermark_ms: i64) {
        let entry = CommitEntry {
            next_batch_watermark_ms: watermark_ms,
        };
        ck.write_commit(BatchId(n), &entry).unwrap();
    }

    fn commits(dir: &std::path::Path) -> Vec<u64> {
        crate::fsutil::numbered(&dir.join("commits"), "").unwrap()
    }

    fn replay(id: u64, start: i64, end: i64, watermark_ms: i64, late_ms: i64) -> PlannedBatch {
        PlannedBatch {
            id: BatchId(id),
            start: vec![Some(serde_json::json!(start))],
            end: vec![Some(serde_json::json!(end))],
            watermark_ms,
            late_watermark_ms: late_ms,
            timestamp_ms: 1_000 + id as i64,
        }
    }

    /// Batch 0 committed (next watermark 5), batch 1 planned.
    fn batch_1_planned() -> (tempfile::TempDir, Checkpoint) {
        let dir = tempfile::tempdir().unwrap();
        let ck = Checkpoint::open(dir.path()).unwrap();
        offsets(&ck, 0, 0, 10);
        commit(&ck, 0, 5);
        offsets(&ck, 1, 5, 20);
        (dir, ck)
    }

    #[test]
    fn a_commit_entry_still_being_written_is_written_back_from_the_next_offsets() {
        let (dir, ck) = batch_1_planned();
        // The crash came after offsets/2 was durable, before commits/1 was.
        offsets(&ck, 2, 7, 30);
        let r = resume(&ck, 1).unwrap();
        assert_eq!(commits(dir.path()), vec![0, 1]);
        assert_eq!(
            ck.latest_commit().unwrap(),
            Some((
                BatchId(1),
                CommitEntry {
                    next_batch_watermark_ms: 7
                }
            ))
        );
        // Batch 2 is replayed as planned: from batch 1's end, judged late by WM(1).
        assert_eq!(
            r,
            Resume {
                next_batch: BatchId(2),
                committed_end: vec![Some(serde_json::json!(20))],
                pending: Some(replay(2, 20, 30, 7, 5)),
                watermark_ms: 7,
                last_batch_watermark_ms: 5,
            }
        );
    }

    #[test]
    fn the_first_batch_s_commit_entry_is_written_back_too() {
        let dir = tempfile::tempdir().unwrap();
        let ck = Checkpoint::open(dir.path()).unwrap();
        offsets(&ck, 0, 0, 10);
        offsets(&ck, 1, 4, 20);
        let r = resume(&ck, 1).unwrap();
        assert_eq!(commits(dir.path()), vec![0]);
        assert_eq!(r.pending, Some(replay(1, 10, 20, 4, 0)));
    }

    #[test]
    fn a_batch_planned_and_not_committed_is_replayed_and_nothing_is_written() {
        let (dir, ck) = batch_1_planned();
        let r = resume(&ck, 1).unwrap();
        assert_eq!(commits(dir.path()), vec![0]);
        assert_eq!(r.pending, Some(replay(1, 10, 20, 5, 0)));
        // Committed: the next batch is new.
        commit(&ck, 1, 9);
        let r = resume(&ck, 1).unwrap();
        assert_eq!(r.pending, None);
        assert_eq!((r.next_batch, r.watermark_ms), (BatchId(2), 9));
    }

    #[test]
    fn a_longer_gap_is_not_filled() {
        // Only the entry just before the newest offsets can be under way; a longer gap is
        // not this run's making (Spark warns and replays the newest batch too).
        let (dir, ck) = batch_1_planned();
        offsets(&ck, 2, 6, 30);
        offsets(&ck, 3, 7, 40);
        let r = resume(&ck, 1).unwrap();
        assert_eq!(commits(dir.path()), vec![0]);
        assert_eq!(r.pending, Some(replay(3, 30, 40, 7, 6)));
    }
}
