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
use super::progress::{
    EventTimeProgress, Progress, Registry, SinkProgress, SourceProgress, StateOperatorProgress,
    Status, round_rate,
};
use crate::catalog::{SinkDef, StreamDef};
use crate::checkpoint::{
    BatchId, Checkpoint, CheckpointDefinition, CommitEntry, OffsetMetadata, OffsetSeq,
};
use crate::error::{Error, Result};
use crate::sink::delta::{DeltaSink, SinkCommit, WriteMode};
use crate::sink::file::{FileSink, SinkFormat};
use crate::source::file::{FileSourceConfig, ListedFile};
use crate::sql::options::Trigger;
use crate::sql::parser::{WatermarkSpec, parse_watermark_option};
use crate::state::StateMetrics;

/// How often the default trigger looks for new files when idle.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);

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
}

/// The number of threads a batch uses to read files and execute.
pub fn parallelism() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
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
    let src = stream.source();
    let format = src.format.name();
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
        source: format!("file:{} ({format})", src.path.display()),
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
    let write = match shape.write_mode() {
        WriteMode::Append => "append".to_string(),
        WriteMode::Overwrite => "overwrite".to_string(),
        WriteMode::Merge { keys } => format!("merge on ({})", keys.join(", ")),
    };
    let sink = match def.connector() {
        "delta" => "DeltaSink".to_string(),
        "console" => "ConsoleSink".to_string(),
        other => format!("FileSink[{other}]"),
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
    let src = stream.source();
    lines.push(format!(
        "  Source: FileStreamSource[{}] format={}{}",
        src.path.display(),
        src.format.name(),
        src.max_files_per_trigger
            .map(|n| format!(" max_files_per_trigger={n}"))
            .unwrap_or_default()
    ));
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
    start: Option<u64>,
    /// This batch's end offset: the newest file-source log entry it reads.
    end: u64,
    /// `WM(N)`: closes windows and evicts state (spec §2.4).
    watermark_ms: i64,
    /// `WM(N-1)`: judges late rows.
    late_watermark_ms: i64,
}

fn log_offset(seq: &OffsetSeq) -> Result<Option<u64>> {
    match seq.offsets.first() {
        None | Some(None) => Ok(None),
        Some(Some(v)) => v
            .get("logOffset")
            .and_then(|o| o.as_u64())
            .map(Some)
            .ok_or_else(|| Error::Internal(format!("unexpected source offset {v}"))),
    }
}

fn offset_json(o: Option<u64>) -> Option<serde_json::Value> {
    o.map(|k| serde_json::json!({ "logOffset": k }))
}

/// Where a query resumes, from its checkpoint (spec §1.5).
struct Resume {
    next_batch: BatchId,
    /// End offset of the last committed batch.
    committed_end: Option<u64>,
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
    let end = log_offset(&seq)?;
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
        (log_offset(&prev)?, prev.metadata.batch_watermark_ms)
    };
    let end = end.ok_or_else(|| Error::Internal(format!("offsets/{last} has no source offset")))?;
    let wm = seq.metadata.batch_watermark_ms;
    Ok(Resume {
        next_batch: last,
        committed_end: start,
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

/// Where a sink's batches go.
enum Sink {
    Delta(DeltaSink),
    File(FileSink),
    /// Logs every batch's rows (at-least-once: a replayed batch is logged again).
    Console,
}

struct Runner {
    def: SinkDef,
    source: Arc<FileSourceConfig>,
    stream_name: String,
    ckpt: Checkpoint,
    sink: Sink,
    shape: SinkShape,
    write_mode: WriteMode,
    operator: Option<AggregateOperator>,
    ctx: SessionContext,
    registry: Arc<Registry>,
    run_id: Uuid,
}

/// What a batch did, for the progress report.
#[derive(Default)]
struct BatchStats {
    rows_in: u64,
    malformed_rows: u64,
    missing_files: u64,
    rows_out: u64,
    event_time: EventTimeStats,
    state: Option<(StateMetrics, AggregateBatch)>,
}

/// The delay of the watermark, in ms (a month would count as 31 days; we refuse months).
fn delay_ms(wm: &WatermarkSpec) -> i64 {
    (wm.delay_us / 1000) as i64
}

async fn run_inner(mut task: QueryTask) -> Result<Outcome> {
    let def = task.def.clone();
    let mut source = task.stream.source();
    // A sink's max_files_per_trigger overrides its stream's.
    if let Some(n) = def.options.positive_int("max_files_per_trigger")? {
        let mut s = (*source).clone();
        s.max_files_per_trigger = Some(n);
        source = Arc::new(s);
    }
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
    let sink = match def.connector() {
        "delta" => {
            let sink = DeltaSink::new(&def.path)?;
            sink.ensure_table(&def.name, &shape.schema).await?;
            Sink::Delta(sink)
        }
        "console" => Sink::Console,
        other => Sink::File(FileSink::new(
            &def.path,
            SinkFormat::from_connector(other)
                .ok_or_else(|| Error::Internal(format!("unknown sink connector {other}")))?,
        )?),
    };
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
            let mut op = AggregateOperator::try_new(
                info.clone(),
                mode,
                &pre_schema,
                def.state_partitions,
                |layout| crate::state::open(def.state_store, &dir, layout),
            )
            .await?;
            // Batch N reads state version N.
            op.state_mut().load(next_batch)?;
            Some(op)
        }
    };
    let runner = Runner {
        source: source.clone(),
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
    let mut runner = runner;
    let log = runner.ckpt.source_log(0);
    let mut last_log = log.latest()?;
    let mut seen: HashSet<String> = HashSet::new();
    if let Some(latest) = last_log {
        for k in 0..=latest {
            seen.extend(log.entry(k)?.into_iter().map(|e| e.path));
        }
    }
    let trigger = runner.def.trigger;
    // available_now fixes what this run reads when it starts (spec §6.3).
    let fixed: Option<Vec<ListedFile>> = match trigger {
        Trigger::AvailableNow => Some(source.list()?),
        _ => None,
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
                // A source-log entry that no batch covers yet (written just before a crash
                // that came before its offsets entry) is the next batch by itself, so a
                // restart plans the same batches as an uninterrupted run.
                let unplanned = last_log.is_some() && last_log > committed_end;
                let listed = match &fixed {
                    _ if unplanned => vec![],
                    Some(f) => f.clone(),
                    None => source.list()?,
                };
                let limit = match trigger {
                    Trigger::Once => usize::MAX,
                    _ => source
                        .max_files_per_trigger
                        .map(|n| n as usize)
                        .unwrap_or(usize::MAX),
                };
                let new: Vec<ListedFile> = listed
                    .into_iter()
                    .filter(|f| !seen.contains(&f.path))
                    .take(limit)
                    .collect();
                if !new.is_empty() {
                    let k = last_log.map_or(0, |k| k + 1);
                    log.write(k, &new)?;
                    crate::testing::crash_point("after_source_log_write");
                    seen.extend(new.into_iter().map(|f| f.path));
                    last_log = Some(k);
                }
                durations.insert("latestOffset".into(), t.elapsed().as_millis() as u64);
                let has_data = last_log.is_some() && last_log != committed_end;
                match last_log {
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
                            offsets: vec![offset_json(Some(end))],
                        };
                        runner.ckpt.write_offsets(next_batch, &seq)?;
                        crate::testing::crash_point("after_offsets_write");
                        runner.ckpt.purge(next_batch);
                        durations.insert("walCommit".into(), t.elapsed().as_millis() as u64);
                        Some(PlannedBatch {
                            id: next_batch,
                            start: committed_end,
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
                wait(&mut task.stop, &task.wake, wait_until).await;
            }
            Some(b) => {
                let stats = runner.run_batch(&b, &log, &mut durations).await?;
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
                committed_end = Some(b.end);
                next_batch = b.id + 1;
                last_batch_wm = b.watermark_ms;
                no_data_due = wants_no_data && global_wm > b.watermark_ms;
                if trigger == Trigger::Once {
                    return Ok(Outcome::Finished);
                }
                if let Some(d) = deadline {
                    wait(&mut task.stop, &task.wake, d).await;
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

/// Sleeps until `until`, or until a stop request or a `FLUSH` wake-up.
async fn wait(stop: &mut watch::Receiver<Option<StopReason>>, wake: &Notify, until: Instant) {
    if stop.borrow().is_some() {
        return;
    }
    tokio::select! {
        _ = tokio::time::sleep_until(until.into()) => {}
        _ = wake.notified() => {}
        _ = stop.changed() => {}
    }
}

impl Runner {
    /// Reads the batch's files, runs the query, commits state and sink.
    async fn run_batch(
        &mut self,
        b: &PlannedBatch,
        log: &crate::checkpoint::FileSourceLog,
        durations: &mut BTreeMap<String, u64>,
    ) -> Result<BatchStats> {
        let mut stats = BatchStats::default();
        let t = Instant::now();
        let first = b.start.map_or(0, |s| s + 1);
        let mut files = Vec::new();
        if b.start != Some(b.end) {
            for k in first..=b.end {
                files.extend(log.entry(k)?);
            }
        }
        let BatchInput {
            batches: input,
            malformed,
            missing_files,
        } = read_files(&self.source, files.iter().map(|f| f.path.clone()).collect()).await?;
        stats.malformed_rows = malformed;
        stats.missing_files = missing_files;
        stats.rows_in = input.iter().map(|b| b.num_rows() as u64).sum();
        durations.insert("getBatch".into(), t.elapsed().as_millis() as u64);

        let t = Instant::now();
        let table = MemTable::try_new(self.source.schema.clone(), partition(input, parallelism()))?;
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
                    .process(pre_rows, b.late_watermark_ms * 1000, b.watermark_ms * 1000)
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
        let app_id = self.ckpt.id.to_string();
        let committed = match &self.sink {
            Sink::Delta(sink) => {
                sink.add_batch(&app_id, b.id, out, &self.shape.schema, &self.write_mode)
                    .await?
            }
            Sink::File(sink) => sink.add_batch(b.id, out, &self.shape.schema)?,
            Sink::Console => {
                let text = datafusion::arrow::util::pretty::pretty_format_batches(&out)?;
                tracing::info!(sink = %self.def.name, batch = b.id, "console sink\n{text}");
                SinkCommit::Committed {
                    version: b.id as i64,
                }
            }
        };
        match committed {
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
                operator_name: match self
                    .shape
                    .aggregate
                    .as_ref()
                    .and_then(|a| a.window.as_ref())
                {
                    Some(w) if matches!(w.kind, WindowKind::Session { .. }) => {
                        "sessionWindowStateStoreSaveExec".into()
                    }
                    _ => "stateStoreSave".into(),
                },
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
                description: format!("FileStreamSource[file:{}]", self.source.path.display()),
                start_offset: offset_json(b.start),
                end_offset: offset_json(Some(b.end)),
                latest_offset: None,
                num_input_rows: rows_in,
                input_rows_per_second: input_rate,
                processed_rows_per_second: processed,
                metrics: BTreeMap::from([
                    (
                        "numMalformedRows".to_string(),
                        stats.malformed_rows.to_string(),
                    ),
                    (
                        "numMissingFiles".to_string(),
                        stats.missing_files.to_string(),
                    ),
                ]),
            }],
            sink: SinkProgress {
                description: match &self.sink {
                    Sink::Delta(_) => format!("DeltaSink[{}]", self.def.path.display()),
                    Sink::File(_) => format!(
                        "FileSink[{}, {}]",
                        self.def.connector(),
                        self.def.path.display()
                    ),
                    Sink::Console => "ConsoleSink".into(),
                },
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

/// A batch's input rows, and what reading its files counted.
#[derive(Default)]
struct BatchInput {
    batches: Vec<RecordBatch>,
    malformed: u64,
    missing_files: u64,
}

/// Reads files in parallel, keeping their order.
async fn read_files(source: &Arc<FileSourceConfig>, paths: Vec<String>) -> Result<BatchInput> {
    let reads = futures::stream::iter(paths.into_iter().map(|p| {
        let source = source.clone();
        tokio::task::spawn_blocking(move || {
            let f = ListedFile {
                path: p,
                timestamp: 0,
            };
            source.read(&f.local_path())
        })
    }))
    .buffered(parallelism());
    let results: Vec<_> = reads.collect().await;
    let mut out = BatchInput::default();
    for r in results {
        let read = r.map_err(|e| Error::Internal(format!("file reader panicked: {e}")))??;
        out.batches.extend(read.batches);
        out.malformed += read.malformed;
        out.missing_files += u64::from(read.missing);
    }
    Ok(out)
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
