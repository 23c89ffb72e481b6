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
use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::datasource::MemTable;
use datafusion::logical_expr::LogicalPlan;
use datafusion::prelude::{SessionConfig, SessionContext};
use futures::StreamExt;
use tokio::sync::{Notify, watch};
use uuid::Uuid;

use super::aggregate::{
    AggregateBatch, AggregateInfo, AggregateOperator, EventTimeStats, KeyTime, OutputMode,
    WindowKind, part_above, stateless_part,
};
use super::operator::StatefulOperator;
use super::progress::{
    EventTimeProgress, Progress, Registry, SinkProgress, SourceProgress, StateOperatorProgress,
    Status, round_rate,
};
use crate::catalog::{SinkDef, StreamDef, StreamSource};
use crate::checkpoint::{Checkpoint, CheckpointDefinition, CommitEntry, OffsetMetadata, OffsetSeq};
pub use crate::config::{POLL_INTERVAL, parallelism};
use crate::error::{Error, Result};
use crate::sink::{Sink, SinkCommit, SinkConnector, WriteMode};
use crate::source::file::FileSource;
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
    pub stream: StreamDef,
    pub registry: Arc<Registry>,
    pub stop: watch::Receiver<Option<StopReason>>,
    /// Notified by `FLUSH` to run a trigger now.
    pub wake: Arc<Notify>,
    /// The log of the stream, if it is a table stream.
    pub table_log: Option<Arc<TableLog>>,
    /// Wall time, for sources that read it (`rate`).
    pub clock: Arc<dyn crate::clock::Clock>,
}

fn query_context() -> SessionContext {
    let ctx = SessionContext::new_with_config(
        SessionConfig::new()
            .with_target_partitions(parallelism())
            .with_information_schema(false)
            .set_str("datafusion.execution.time_zone", "UTC"),
    );
    super::window::register_udfs(&ctx);
    ctx
}

/// What a sink's query is, as the engine runs it.
#[derive(Debug, Clone)]
pub struct SinkShape {
    /// The query DataFusion plans, after Spark's `window.start` references are expanded.
    pub sql: String,
    /// The rows it writes: every field nullable, as Spark's sinks make them.
    pub schema: SchemaRef,
    /// Its aggregation, if it has one.
    pub aggregate: Option<AggregateInfo>,
    pub mode: OutputMode,
    pub watermark: Option<WatermarkSpec>,
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
}

/// What the sink's checkpoint depends on (spec §9.4).
pub fn checkpoint_definition(
    def: &SinkDef,
    stream: &StreamDef,
    shape: &SinkShape,
) -> CheckpointDefinition {
    let (group_keys, aggregates) = match &shape.aggregate {
        Some(a) => (
            a.group_names.clone(),
            a.aggregates
                .iter()
                .map(|e| e.human_display().to_string())
                .collect(),
        ),
        None => (vec![], vec![]),
    };
    CheckpointDefinition {
        source: match stream.source() {
            StreamSource::File(f) => f.identity(),
            StreamSource::Delta(d) => format!("delta:{}", d.path.display()),
            other => format!("{}:{}", other.connector(), stream.name),
        },
        group_keys,
        aggregates,
        watermark_column: shape.watermark.as_ref().map(|w| w.column.clone()),
        output_mode: shape.mode.as_str().to_string(),
        state_partitions: def.state_partitions,
        state_store: def.state_store.as_str().to_string(),
    }
}

/// The sink's watermark: its `watermark` option, else the stream's `WATERMARK FOR`.
pub fn sink_watermark(def: &SinkDef, stream: &StreamDef) -> Result<Option<WatermarkSpec>> {
    match def.options.get("watermark") {
        Some(w) => Ok(Some(parse_watermark_option(w)?)),
        None => Ok(stream.watermark.clone()),
    }
}

/// Plans a sink's query over an empty stream and checks it: one stream, shapes Spark
/// allows for the output mode (spec §5.2–5.3), distinct column names.
pub async fn analyze_sink(
    query: &str,
    stream: &StreamDef,
    watermark: Option<WatermarkSpec>,
    mode: OutputMode,
) -> Result<SinkShape> {
    let sql = crate::sql::expand_window_refs(query)?;
    let ctx = query_context();
    let schema = stream.schema();
    ctx.register_table(
        datafusion::common::TableReference::bare(stream.name.clone()),
        Arc::new(MemTable::try_new(schema.clone(), vec![vec![]])?),
    )?;
    let df = ctx.sql(&sql).await?;
    check_shape(df.logical_plan())?;
    let aggregate = super::aggregate::analyze(
        df.logical_plan(),
        watermark.as_ref().map(|w| w.column.as_str()),
        mode,
    )?;
    let fields: Vec<Field> = df
        .schema()
        .as_arrow()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_nullable(true))
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
        sql,
        schema: Arc::new(Schema::new(fields)),
        aggregate,
        mode,
        watermark,
    })
}

/// The lines of `EXPLAIN CREATE SINK`: sink, emit rule, stateful operator, stateless part,
/// source. Stable text, no addresses.
pub async fn explain(def: &SinkDef, stream: &StreamDef, shape: &SinkShape) -> Result<Vec<String>> {
    let ctx = query_context();
    ctx.register_table(
        datafusion::common::TableReference::bare(stream.name.clone()),
        Arc::new(MemTable::try_new(stream.schema(), vec![vec![]])?),
    )?;
    let plan = ctx.sql(&shape.sql).await?.into_unoptimized_plan();
    let write = shape.write_mode().describe();
    let sink = match def.connector()? {
        SinkConnector::Delta => "DeltaSink".to_string(),
        SinkConnector::Console => "ConsoleSink".to_string(),
        SinkConnector::File(f) => format!("FileSink[{}]", f.name()),
    };
    let mut lines = vec![format!(
        "{sink}: path={} output_mode={} trigger={} write={write}",
        def.path.display(),
        shape.mode.as_str(),
        def.trigger
    )];
    let indent = |lines: &mut Vec<String>, plan: &LogicalPlan, depth: usize| {
        for l in plan.display_indent().to_string().lines() {
            lines.push(format!("{}{l}", "  ".repeat(depth)));
        }
    };
    match &shape.aggregate {
        None => {
            lines.push("  Emit: every row of every micro-batch (stateless, no state)".into());
            indent(&mut lines, &plan, 1);
        }
        Some(a) => {
            let closes = match a.key_time {
                Some(KeyTime::Window) => "window.end".to_string(),
                Some(KeyTime::Column(i)) => a.keys[i].to_string(),
                None => String::new(),
            };
            lines.push(format!(
                "  Emit: {}",
                match (shape.mode, a.key_time.is_some()) {
                    (OutputMode::Append, _) => format!(
                        "each group once, when the watermark passes {closes}; then evicted"
                    ),
                    (OutputMode::Update, true) => format!(
                        "every group the batch updated; evicted silently once the watermark \
                         passes {closes}"
                    ),
                    (OutputMode::Update, false) => {
                        "every group the batch updated; nothing evicted".to_string()
                    }
                    (OutputMode::Complete, _) => {
                        "the whole result every batch; nothing evicted, nothing late".to_string()
                    }
                }
            ));
            let above = part_above(&plan, vec![])?;
            let mut above_lines = Vec::new();
            indent(&mut above_lines, &above, 0);
            for l in above_lines.iter().filter(|l| !l.contains("__emitted")) {
                lines.push(format!("  {l}"));
            }
            lines.push(format!(
                "  StatefulAggregate: keys=[{}] aggregates=[{}] state={} partitions={}",
                a.group_names.join(", "),
                a.aggregates
                    .iter()
                    .map(|e| e.human_display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                def.state_store.as_str(),
                def.state_partitions
            ));
            let dur =
                |us: i64| crate::sql::options::format_duration(Duration::from_micros(us as u64));
            match a.window.as_ref().map(|w| (w.kind, &w.time_column)) {
                Some((WindowKind::Fixed(spec), col)) => lines.push(format!(
                    "    Window: {} size={} slide={} over {col}",
                    if spec.is_tumbling() { "tumbling" } else { "sliding" },
                    dur(spec.size),
                    dur(spec.slide),
                )),
                Some((WindowKind::Session { gap }, col)) => lines.push(format!(
                    "    Window: session gap={} over {col} (sessions of a key merge when they touch)",
                    dur(gap)
                )),
                None => {}
            }
            match (&shape.watermark, a.key_time) {
                (Some(wm), Some(_)) => lines.push(format!(
                    "    Watermark: {} - {}; late when {closes} <= the previous batch's watermark{}",
                    wm.column,
                    crate::sql::options::format_duration(wm.delay()),
                    if shape.mode == OutputMode::Complete { " (complete: never)" } else { "" }
                )),
                (Some(wm), None) => lines.push(format!(
                    "    Watermark: {} - {}; no group key carries it: nothing is late or evicted",
                    wm.column,
                    crate::sql::options::format_duration(wm.delay())
                )),
                (None, _) => lines.push("    Watermark: none".into()),
            }
            if let Some(pre) = stateless_part(&plan) {
                indent(&mut lines, &pre, 2);
            }
        }
    }
    lines.push(match stream.source() {
        StreamSource::File(src) => format!(
            "  Source: FileStreamSource[{}] format={}{}",
            src.path.display(),
            src.decoder.format.name(),
            src.max_files_per_trigger
                .map(|n| format!(" max_files_per_trigger={n}"))
                .unwrap_or_default()
        ),
        StreamSource::Table(t) => format!(
            "  Source: TableStreamSource[{}]{}",
            stream.name,
            t.max_rows_per_trigger
                .map(|n| format!(" max_rows_per_trigger={n}"))
                .unwrap_or_default()
        ),
        StreamSource::Rate(r) => format!(
            "  Source: RateStream[rows_per_second={}, ramp_up_time={}s, num_partitions={}]",
            r.rows_per_second, r.ramp_up_secs, r.num_partitions
        ),
        StreamSource::Delta(d) => format!(
            "  Source: DeltaSource[{}] max_files_per_trigger={}{}{}",
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
            "  Source: RatePerMicroBatchStream[rows_per_batch={}, num_partitions={}, \
             start_timestamp={}, advance_millis_per_batch={}]",
            r.rows_per_batch, r.num_partitions, r.start_timestamp_ms, r.advance_ms_per_batch
        ),
    });
    Ok(lines)
}

/// Refuses query shapes Tidemark does not run on streams (spec §5.2).
fn check_shape(plan: &LogicalPlan) -> Result<()> {
    let mut err = None;
    plan.apply_with_subqueries(|node| {
        let refusal = match node {
            LogicalPlan::Distinct(_) => Some(Error::Unsupported {
                message: "SELECT DISTINCT is not supported on streams yet".into(),
                hint: Some("Use GROUP BY over the columns instead.".into()),
            }),
            LogicalPlan::Window(_) => Some(Error::unsupported(
                "window functions (OVER) are not supported on streams",
            )),
            LogicalPlan::Limit(_) => {
                Some(Error::unsupported("LIMIT is not supported in sinks yet"))
            }
            LogicalPlan::Join(_) => {
                Some(Error::unsupported("joins in sinks are not supported yet"))
            }
            LogicalPlan::Union(_) => {
                Some(Error::unsupported("UNION in sinks is not supported yet"))
            }
            LogicalPlan::RecursiveQuery(_) => Some(Error::unsupported(
                "recursive queries are not supported on streams",
            )),
            _ => None,
        };
        if let Some(e) = refusal {
            err = Some(e);
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    match err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// A batch to run: planned now, or found in the offsets log without a commit.
#[derive(Debug, Clone)]
struct PlannedBatch {
    id: BatchId,
    /// The source's end offset of the previous batch (exclusive start), if any.
    start: Option<Offset>,
    /// This batch's end offset.
    end: Offset,
    /// `WM(N)`: closes windows and evicts state (spec §2.4).
    watermark_ms: i64,
    /// `WM(N-1)`: judges late rows.
    late_watermark_ms: i64,
}

/// The first source's offset in an `offsets/N` entry.
fn source_offset(seq: &OffsetSeq) -> Option<Offset> {
    seq.offsets.first().cloned().flatten()
}

/// Where a query resumes, from its checkpoint (spec §1.5).
struct Resume {
    next_batch: BatchId,
    /// End offset of the last committed batch.
    committed_end: Option<Offset>,
    /// An uncommitted batch to replay first.
    pending: Option<PlannedBatch>,
    /// The global watermark to continue from, and the last batch's `WM(N)`.
    watermark_ms: i64,
    last_batch_watermark_ms: i64,
}

fn resume(ckpt: &Checkpoint) -> Result<Resume> {
    let Some((last, seq)) = ckpt.latest_offsets()? else {
        return Ok(Resume {
            next_batch: 0,
            committed_end: None,
            pending: None,
            watermark_ms: 0,
            last_batch_watermark_ms: 0,
        });
    };
    let end = source_offset(&seq);
    let commit = ckpt.latest_commit()?;
    if let Some((c, entry)) = &commit
        && *c == last
    {
        return Ok(Resume {
            next_batch: last + 1,
            committed_end: end,
            pending: None,
            watermark_ms: seq
                .metadata
                .batch_watermark_ms
                .max(entry.next_batch_watermark_ms),
            last_batch_watermark_ms: seq.metadata.batch_watermark_ms,
        });
    }
    if commit.is_some_and(|(c, _)| c + 1 < last) {
        tracing::warn!(
            batch = last,
            "commit log is behind by more than one batch; replaying the last"
        );
    }
    let (start, prev_wm) = if last == 0 {
        (None, 0)
    } else {
        let prev = ckpt
            .offsets(last - 1)?
            .ok_or_else(|| Error::Internal(format!("batch {} doesn't exist", last - 1)))?;
        (source_offset(&prev), prev.metadata.batch_watermark_ms)
    };
    let end = end.ok_or_else(|| Error::Internal(format!("offsets/{last} has no source offset")))?;
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
        }),
        watermark_ms: wm,
        last_batch_watermark_ms: prev_wm,
    })
}

/// Runs a query until it finishes, is stopped, or fails.
pub async fn run(task: QueryTask) -> Outcome {
    let name = task.def.name.clone();
    let registry = task.registry.clone();
    match run_inner(task).await {
        Ok(o) => o,
        Err(e) => {
            tracing::error!(sink = %name, error = %e, "streaming query failed");
            registry.update(&name, |s| {
                s.status = Status::Failed;
                s.error = Some(e.to_string());
            });
            Outcome::Failed(e)
        }
    }
}

struct Runner {
    def: SinkDef,
    source: Box<dyn Source>,
    stream_name: String,
    ckpt: Checkpoint,
    sink: Box<dyn Sink>,
    shape: SinkShape,
    write_mode: WriteMode,
    operator: Option<Box<dyn StatefulOperator>>,
    ctx: SessionContext,
    registry: Arc<Registry>,
    run_id: Uuid,
}

/// What a batch did, for the progress report.
#[derive(Default)]
struct BatchStats {
    rows_in: u64,
    rows_out: u64,
    event_time: EventTimeStats,
    state: Option<(StateMetrics, AggregateBatch)>,
}

/// The delay of the watermark, in ms (a month would count as 31 days; we refuse months).
fn delay_ms(wm: &WatermarkSpec) -> i64 {
    (wm.delay_us / 1000) as i64
}

/// Opens the source a query reads: its stream's connector, with the sink's rate limit.
fn open_source(task: &QueryTask, ckpt: &Checkpoint) -> Result<Box<dyn Source>> {
    let def = &task.def;
    Ok(match task.stream.source() {
        StreamSource::File(config) => {
            let mut config = config.clone();
            // A sink's max_files_per_trigger overrides its stream's.
            if let Some(n) = def.options.positive_int("max_files_per_trigger")? {
                let mut c = (*config).clone();
                c.max_files_per_trigger = Some(n);
                config = Arc::new(c);
            }
            Box::new(FileSource::open(config, ckpt.source_dir(0))?)
        }
        StreamSource::Table(_) => {
            let log = task.table_log.clone().ok_or_else(|| {
                Error::Internal(format!(
                    "the log of stream \"{}\" is not open",
                    task.stream.name
                ))
            })?;
            Box::new(TableSource::new(
                log,
                &ckpt.id.to_string(),
                def.options.positive_int("max_rows_per_trigger")?,
            )?)
        }
        StreamSource::Rate(config) => Box::new(RateSource::open(
            config.clone(),
            ckpt.source_dir(0),
            task.clock.clone(),
        )?),
        StreamSource::RateMicroBatch(config) => Box::new(RateMicroBatchSource::new(config.clone())),
        StreamSource::Delta(config) => {
            let mut config = config.clone();
            if let Some(n) = def.options.positive_int("max_files_per_trigger")? {
                config.max_files_per_trigger = n;
            }
            Box::new(crate::source::delta::DeltaSource::new(config))
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
    });
    let watermark = sink_watermark(&def, &task.stream)?;
    let mode = OutputMode::parse(&def.output_mode)?;
    let shape = analyze_sink(&def.query, &task.stream, watermark.clone(), mode).await?;
    crate::checkpoint::record_definition(
        ckpt.root(),
        &def.name,
        &checkpoint_definition(&def, &task.stream, &shape),
    )?;
    let sink = def
        .connector()?
        .open(&def.name, &def.path, &shape.schema)
        .await?;
    let mut source = open_source(&task, &ckpt)?;
    let Resume {
        mut next_batch,
        mut committed_end,
        mut pending,
        watermark_ms: mut global_wm,
        last_batch_watermark_ms: mut last_batch_wm,
    } = resume(&ckpt)?;
    let ctx = query_context();
    let operator = match &shape.aggregate {
        None => None,
        Some(info) => {
            let pre_schema = stateless_schema(&ctx, &shape.sql, &task.stream).await?;
            let dir = ckpt.root().join("state").join("0");
            let op = AggregateOperator::try_new(
                info.clone(),
                mode,
                &pre_schema,
                def.state_partitions,
                |layout| crate::state::open(def.state_store, &dir, layout),
            )
            .await?;
            let mut op: Box<dyn StatefulOperator> = Box::new(op);
            // Batch N reads state version N.
            op.load(next_batch)?;
            Some(op)
        }
    };
    let trigger = match def.trigger {
        // Spark runs available_now as once over a source that cannot fix an end.
        Trigger::AvailableNow if !source.supports_available_now() => Trigger::Once,
        t => t,
    };
    // available_now fixes what this run reads when it starts (spec §6.3).
    if trigger == Trigger::AvailableNow {
        source.prepare_available_now().await?;
    }
    let mut arrivals = source.arrivals();
    let mut runner = Runner {
        source,
        stream_name: task.stream.name.clone(),
        ckpt,
        sink,
        write_mode: shape.write_mode(),
        shape,
        operator,
        ctx,
        registry: task.registry.clone(),
        run_id,
        def,
    };
    let wants_no_data = runner
        .operator
        .as_ref()
        .is_some_and(|o| o.wants_no_data_batches());
    // A no-data batch is due when the watermark moved past the last batch's (spec §1.3).
    // Spark never runs one as the first batch of a run; Tidemark does when the previous
    // run ended owing one and no new data is there (after a crash right after the commit
    // log, say), so that a restart emits what an uninterrupted run would have.
    let mut no_data_due =
        wants_no_data && pending.is_none() && next_batch > 0 && global_wm > last_batch_wm;
    let mut prev_trigger_start: Option<Instant> = None;
    let mut trigger_no: u64 = 0;
    let limit = match trigger {
        Trigger::Once => ReadLimit::AllAvailable,
        _ => ReadLimit::Default,
    };
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
        if let Some(a) = arrivals.as_mut() {
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
        let batch = match pending.take() {
            Some(p) => Some(p),
            None => {
                let t = Instant::now();
                let latest = runner
                    .source
                    .latest_offset(committed_end.as_ref(), limit)
                    .await?;
                durations.insert("latestOffset".into(), t.elapsed().as_millis() as u64);
                let has_data = latest.is_some() && latest != committed_end;
                match latest {
                    Some(end) if has_data || no_data_due => {
                        let t = Instant::now();
                        let seq = OffsetSeq {
                            metadata: OffsetMetadata {
                                batch_watermark_ms: global_wm,
                                batch_timestamp_ms: Utc::now().timestamp_millis(),
                                conf: BTreeMap::from([
                                    (
                                        "spark.sql.streaming.multipleWatermarkPolicy".to_string(),
                                        "min".to_string(),
                                    ),
                                    (
                                        "spark.sql.shuffle.partitions".to_string(),
                                        runner.def.state_partitions.to_string(),
                                    ),
                                ]),
                            },
                            offsets: vec![Some(end.clone())],
                        };
                        runner.ckpt.write_offsets(next_batch, &seq)?;
                        crate::testing::crash_point("after_offsets_write");
                        runner.ckpt.purge(next_batch);
                        durations.insert("walCommit".into(), t.elapsed().as_millis() as u64);
                        Some(PlannedBatch {
                            id: next_batch,
                            start: committed_end.clone(),
                            end,
                            watermark_ms: global_wm,
                            late_watermark_ms: last_batch_wm,
                        })
                    }
                    _ => None,
                }
            }
        };
        match batch {
            None => {
                runner
                    .registry
                    .update(&runner.def.name, |s| s.last_idle_trigger = trigger_no);
                prev_trigger_start = Some(trigger_start);
                if trigger.is_bounded() {
                    return Ok(Outcome::Finished);
                }
                let wait_until = deadline.unwrap_or(trigger_start + POLL_INTERVAL);
                wait(&mut task.stop, &task.wake, arrivals.as_mut(), wait_until).await;
            }
            Some(b) => {
                let stats = runner.run_batch(&b, &mut durations).await?;
                // The watermark moves at the end of the batch (spec §2.2).
                if let Some(wm) = &runner.shape.watermark
                    && stats.event_time.count > 0
                {
                    let candidate = stats.event_time.max.div_euclid(1000) - delay_ms(wm);
                    global_wm = global_wm.max(candidate).max(0);
                }
                let t = Instant::now();
                runner.ckpt.write_commit(
                    b.id,
                    &CommitEntry {
                        next_batch_watermark_ms: global_wm,
                    },
                )?;
                durations.insert("commitOffsets".into(), t.elapsed().as_millis() as u64);
                crate::testing::crash_point("after_commit_log");
                runner.source.commit(&b.end).await?;
                if let Some(op) = runner.operator.as_mut() {
                    op.maintain()?;
                }
                let elapsed = trigger_start.elapsed();
                durations.insert("triggerExecution".into(), elapsed.as_millis() as u64);
                runner.report(
                    &b,
                    trigger_wall,
                    elapsed,
                    prev_trigger_start.map(|p| trigger_start.duration_since(p)),
                    stats,
                    durations,
                );
                prev_trigger_start = Some(trigger_start);
                committed_end = Some(b.end.clone());
                next_batch = b.id + 1;
                last_batch_wm = b.watermark_ms;
                no_data_due = wants_no_data && global_wm > b.watermark_ms;
                if trigger == Trigger::Once {
                    return Ok(Outcome::Finished);
                }
                if let Some(d) = deadline {
                    wait(&mut task.stop, &task.wake, None, d).await;
                }
            }
        }
    }
}

/// The schema of a query's stateless part (the aggregate's input).
async fn stateless_schema(ctx: &SessionContext, sql: &str, stream: &StreamDef) -> Result<Schema> {
    let name = datafusion::common::TableReference::bare(stream.name.clone());
    ctx.deregister_table(name.clone())?;
    ctx.register_table(
        name,
        Arc::new(MemTable::try_new(stream.schema(), vec![vec![]])?),
    )?;
    let plan = ctx.sql(sql).await?.into_unoptimized_plan();
    let pre = stateless_part(&plan).ok_or_else(|| Error::Internal("no aggregate".into()))?;
    Ok(pre.schema().as_arrow().clone())
}

/// Sleeps until `until`, or until a stop request, a `FLUSH` wake-up or new data.
async fn wait(
    stop: &mut watch::Receiver<Option<StopReason>>,
    wake: &Notify,
    arrivals: Option<&mut watch::Receiver<u64>>,
    until: Instant,
) {
    if stop.borrow().is_some() {
        return;
    }
    let arrived = async {
        match arrivals {
            Some(a) => {
                if a.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending::<()>().await,
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
    /// Reads the batch's rows, runs the query, commits state and sink.
    async fn run_batch(
        &mut self,
        b: &PlannedBatch,
        durations: &mut BTreeMap<String, u64>,
    ) -> Result<BatchStats> {
        let mut stats = BatchStats::default();
        let t = Instant::now();
        let mut rows = self.source.read(b.start.as_ref(), &b.end).await?;
        let mut input = Vec::new();
        while let Some(batch) = rows.next().await {
            input.push(batch?);
        }
        stats.rows_in = input.iter().map(|b| b.num_rows() as u64).sum();
        durations.insert("getBatch".into(), t.elapsed().as_millis() as u64);

        let t = Instant::now();
        let table = MemTable::try_new(self.source.schema(), partition(input, parallelism()))?;
        let name = datafusion::common::TableReference::bare(self.stream_name.clone());
        self.ctx.deregister_table(name.clone())?;
        self.ctx.register_table(name, Arc::new(table))?;
        let df = self.ctx.sql(&self.shape.sql).await?;
        durations.insert("queryPlanning".into(), t.elapsed().as_millis() as u64);

        let t = Instant::now();
        let out = match self.operator.as_mut() {
            None => df.collect().await?,
            Some(op) => {
                let plan = df.into_unoptimized_plan();
                let pre = stateless_part(&plan)
                    .ok_or_else(|| Error::Internal("no aggregate in the batch plan".into()))?;
                let pre_rows = self.ctx.execute_logical_plan(pre).await?.collect().await?;
                if let Some(wm) = &self.shape.watermark {
                    for r in &pre_rows {
                        if let Ok(i) = r.schema().index_of(&wm.column) {
                            stats.event_time.add_column(r.column(i))?;
                        }
                    }
                }
                let mut agg = op
                    .process_batch(pre_rows, b.late_watermark_ms * 1000, b.watermark_ms * 1000)
                    .await?;
                let emitted = std::mem::take(&mut agg.emitted);
                // Batch N commits state version N + 1.
                let metrics = op.commit(b.id + 1)?;
                let above = part_above(&plan, emitted)?;
                let rows = self
                    .ctx
                    .execute_logical_plan(above)
                    .await?
                    .collect()
                    .await?;
                stats.state = Some((metrics, agg));
                rows
            }
        };
        let out = out
            .into_iter()
            .filter(|b| b.num_rows() > 0)
            .map(|b| super::cast_to_schema(b.columns(), &self.shape.schema))
            .collect::<Result<Vec<_>>>()?;
        stats.rows_out = out.iter().map(|b| b.num_rows() as u64).sum();
        crate::testing::crash_point("before_sink_commit");
        crate::testing::fail_point(&format!("sink_write:{}", self.def.name))?;
        let query_id = self.ckpt.id.to_string();
        match self
            .sink
            .add_batch(&query_id, b.id, out, &self.write_mode)
            .await?
        {
            SinkCommit::Committed { version } => {
                tracing::debug!(sink = %self.def.name, batch = b.id, version, "delta commit");
            }
            SinkCommit::AlreadyCommitted => {
                tracing::info!(sink = %self.def.name, batch = b.id, "batch already in the table; skipped");
            }
        }
        crate::testing::crash_point("after_sink_commit");
        durations.insert("addBatch".into(), t.elapsed().as_millis() as u64);
        Ok(stats)
    }

    fn report(
        &self,
        b: &PlannedBatch,
        trigger_wall: chrono::DateTime<Utc>,
        elapsed: Duration,
        since_prev_trigger: Option<Duration>,
        stats: BatchStats,
        duration_ms: BTreeMap<String, u64>,
    ) {
        let rows_in = stats.rows_in;
        let processing_s = (elapsed.as_millis().max(1)) as f64 / 1000.0;
        let processed = round_rate(rows_in as f64 / processing_s);
        let input_rate = match since_prev_trigger {
            Some(d) if d.as_millis() > 0 => round_rate(rows_in as f64 / d.as_secs_f64()),
            _ => 0.0,
        };
        let ts = |us: i64| chrono::DateTime::from_timestamp_micros(us).unwrap_or_default();
        let event_time = self.shape.watermark.as_ref().map(|_| {
            let e = &stats.event_time;
            // Spark keeps event-time statistics in milliseconds.
            let ms = |us: i64| ts(us.div_euclid(1000) * 1000);
            EventTimeProgress {
                avg: e.avg().map(ms),
                max: (e.count > 0).then(|| ms(e.max)),
                min: (e.count > 0).then(|| ms(e.min)),
                watermark: ts(b.watermark_ms * 1000),
            }
        });
        let state_operators = match &stats.state {
            None => vec![],
            Some((m, agg)) => vec![StateOperatorProgress {
                operator_name: self
                    .operator
                    .as_ref()
                    .map_or("stateStoreSave", |o| o.name())
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
                num_state_store_instances: self.def.state_partitions,
            }],
        };
        let progress = Progress {
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
            sources: vec![SourceProgress {
                description: self.source.describe(),
                start_offset: b.start.clone(),
                end_offset: Some(b.end.clone()),
                latest_offset: None,
                num_input_rows: rows_in,
                input_rows_per_second: input_rate,
                processed_rows_per_second: processed,
                metrics: self.source.metrics(),
            }],
            sink: SinkProgress {
                description: self.sink.describe(),
                num_output_rows: stats.rows_out as i64,
            },
        };
        tracing::info!(
            sink = %self.def.name,
            batch = b.id,
            rows = rows_in,
            elapsed_ms = elapsed.as_millis() as u64,
            "micro-batch committed"
        );
        let now = Utc::now();
        self.registry.update(&self.def.name, |s| {
            s.last_batch_id = Some(b.id);
            s.last_progress_at = Some(now);
        });
        self.registry.push_progress(progress);
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
