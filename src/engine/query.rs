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
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::datasource::MemTable;
use datafusion::logical_expr::LogicalPlan;
use datafusion::prelude::{SessionConfig, SessionContext};
use futures::StreamExt;
use tokio::sync::{Notify, watch};
use uuid::Uuid;

use super::progress::{
    Progress, Registry, SinkProgress, SourceProgress, Status, format_ts, round_rate,
};
use crate::catalog::{SinkDef, StreamDef};
use crate::checkpoint::{BatchId, Checkpoint, CommitEntry, OffsetMetadata, OffsetSeq};
use crate::error::{Error, Result};
use crate::sink::delta::{DeltaSink, SinkCommit};
use crate::source::file::{FileSourceConfig, ListedFile};
use crate::sql::options::Trigger;

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
    SessionContext::new_with_config(
        SessionConfig::new()
            .with_target_partitions(parallelism())
            .with_information_schema(false),
    )
}

/// Plans a sink's query over an empty stream, checks that it is a stateless query over
/// that one stream, and returns the schema of the rows it writes (all fields nullable,
/// as Spark's sinks make them).
pub async fn output_schema(query: &str, stream: &StreamDef) -> Result<SchemaRef> {
    let ctx = query_context();
    let schema = stream.schema();
    ctx.register_table(
        datafusion::common::TableReference::bare(stream.name.clone()),
        Arc::new(MemTable::try_new(schema.clone(), vec![vec![]])?),
    )?;
    let df = ctx.sql(query).await?;
    check_stateless(df.logical_plan())?;
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
    Ok(Arc::new(Schema::new(fields)))
}

/// Refuses query shapes that need state. Aggregations and windows come with the
/// windowed-aggregation work; the rest follow Spark's rules (spec §5.2).
fn check_stateless(plan: &LogicalPlan) -> Result<()> {
    let mut err = None;
    plan.apply_with_subqueries(|node| {
        let refusal = match node {
            LogicalPlan::Aggregate(_) | LogicalPlan::Distinct(_) => Some(Error::Unsupported {
                message: "aggregations in sinks are not supported yet".into(),
                hint: Some("Sinks run stateless queries: projections, filters, functions.".into()),
            }),
            LogicalPlan::Window(_) => Some(Error::unsupported(
                "window functions (OVER) are not supported on streams",
            )),
            LogicalPlan::Sort(_) => Some(Error::Unsupported {
                message: "ORDER BY is not supported on a stream".into(),
                hint: Some(
                    "Spark allows sorting only after an aggregation in complete mode.".into(),
                ),
            }),
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
}

fn resume(ckpt: &Checkpoint) -> Result<Resume> {
    let Some((last, seq)) = ckpt.latest_offsets()? else {
        return Ok(Resume {
            next_batch: 0,
            committed_end: None,
            pending: None,
        });
    };
    let end = log_offset(&seq)?;
    let committed = ckpt.latest_commit()?.map(|(n, _)| n);
    if committed == Some(last) {
        return Ok(Resume {
            next_batch: last + 1,
            committed_end: end,
            pending: None,
        });
    }
    if committed.is_some_and(|c| c + 1 < last) {
        tracing::warn!(
            batch = last,
            "commit log is behind by more than one batch; replaying the last"
        );
    }
    let start = if last == 0 {
        None
    } else {
        let prev = ckpt
            .offsets(last - 1)?
            .ok_or_else(|| Error::Internal(format!("batch {} doesn't exist", last - 1)))?;
        log_offset(&prev)?
    };
    let end = end.ok_or_else(|| Error::Internal(format!("offsets/{last} has no source offset")))?;
    Ok(Resume {
        next_batch: last,
        committed_end: start,
        pending: Some(PlannedBatch {
            id: last,
            start,
            end,
        }),
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
    source: Arc<FileSourceConfig>,
    stream_name: String,
    ckpt: Checkpoint,
    sink: DeltaSink,
    sink_schema: SchemaRef,
    ctx: SessionContext,
    registry: Arc<Registry>,
    run_id: Uuid,
}

async fn run_inner(mut task: QueryTask) -> Result<Outcome> {
    let def = task.def.clone();
    let source = task.stream.source();
    let ckpt = Checkpoint::open(&def.checkpoint)?;
    let run_id = Uuid::new_v4();
    task.registry.update(&def.name, |s| {
        s.id = Some(ckpt.id);
        s.run_id = Some(run_id);
        s.status = Status::Running;
        s.error = None;
    });
    let sink_schema = output_schema(&def.query, &task.stream).await?;
    let sink = DeltaSink::new(&def.path)?;
    sink.ensure_table(&def.name, &sink_schema).await?;
    let runner = Runner {
        source: source.clone(),
        stream_name: task.stream.name.clone(),
        ckpt,
        sink,
        sink_schema,
        ctx: query_context(),
        registry: task.registry.clone(),
        run_id,
        def,
    };
    let log = runner.ckpt.source_log(0);
    let Resume {
        mut next_batch,
        mut committed_end,
        mut pending,
    } = resume(&runner.ckpt)?;
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
                let listed = match &fixed {
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
                    seen.extend(new.into_iter().map(|f| f.path));
                    last_log = Some(k);
                }
                durations.insert("latestOffset".into(), t.elapsed().as_millis() as u64);
                match last_log {
                    Some(end) if Some(end) != committed_end => {
                        let t = Instant::now();
                        let timestamp_ms = Utc::now().timestamp_millis();
                        let seq = OffsetSeq {
                            metadata: OffsetMetadata {
                                batch_watermark_ms: 0,
                                batch_timestamp_ms: timestamp_ms,
                                conf: BTreeMap::from([(
                                    "spark.sql.streaming.multipleWatermarkPolicy".to_string(),
                                    "min".to_string(),
                                )]),
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
                let (rows_in, rows_out) = runner.run_batch(&b, &log, &mut durations).await?;
                let t = Instant::now();
                runner.ckpt.write_commit(
                    b.id,
                    &CommitEntry {
                        next_batch_watermark_ms: 0,
                    },
                )?;
                durations.insert("commitOffsets".into(), t.elapsed().as_millis() as u64);
                let elapsed = trigger_start.elapsed();
                durations.insert("triggerExecution".into(), elapsed.as_millis() as u64);
                runner.report(
                    &b,
                    trigger_wall,
                    elapsed,
                    prev_trigger_start.map(|p| trigger_start.duration_since(p)),
                    rows_in,
                    rows_out,
                    durations,
                );
                prev_trigger_start = Some(trigger_start);
                committed_end = Some(b.end);
                next_batch = b.id + 1;
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
    /// Reads the batch's files, runs the query, commits to the sink. Returns (rows in, rows out).
    async fn run_batch(
        &self,
        b: &PlannedBatch,
        log: &crate::checkpoint::FileSourceLog,
        durations: &mut BTreeMap<String, u64>,
    ) -> Result<(u64, u64)> {
        let t = Instant::now();
        let first = b.start.map_or(0, |s| s + 1);
        let mut files = Vec::new();
        for k in first..=b.end {
            files.extend(log.entry(k)?);
        }
        let input =
            read_files(&self.source, files.iter().map(|f| f.path.clone()).collect()).await?;
        let rows_in: u64 = input.iter().map(|b| b.num_rows() as u64).sum();
        durations.insert("getBatch".into(), t.elapsed().as_millis() as u64);

        let t = Instant::now();
        let table = MemTable::try_new(self.source.schema.clone(), partition(input, parallelism()))?;
        let name = datafusion::common::TableReference::bare(self.stream_name.clone());
        self.ctx.deregister_table(name.clone())?;
        self.ctx.register_table(name, Arc::new(table))?;
        let df = self.ctx.sql(&self.def.query).await?;
        durations.insert("queryPlanning".into(), t.elapsed().as_millis() as u64);

        let t = Instant::now();
        let out = df.collect().await?;
        let out = out
            .into_iter()
            .filter(|b| b.num_rows() > 0)
            .map(|b| conform(&b, &self.sink_schema))
            .collect::<Result<Vec<_>>>()?;
        let rows_out: u64 = out.iter().map(|b| b.num_rows() as u64).sum();
        crate::testing::crash_point("before_sink_commit");
        let app_id = self.ckpt.id.to_string();
        match self.sink.add_batch(&app_id, b.id, out).await? {
            SinkCommit::Committed { version } => {
                tracing::debug!(sink = %self.def.name, batch = b.id, version, "delta commit");
            }
            SinkCommit::AlreadyCommitted => {
                tracing::info!(sink = %self.def.name, batch = b.id, "batch already in the table; skipped");
            }
        }
        crate::testing::crash_point("after_sink_commit");
        durations.insert("addBatch".into(), t.elapsed().as_millis() as u64);
        Ok((rows_in, rows_out))
    }

    #[allow(clippy::too_many_arguments)]
    fn report(
        &self,
        b: &PlannedBatch,
        trigger_wall: chrono::DateTime<Utc>,
        elapsed: Duration,
        since_prev_trigger: Option<Duration>,
        rows_in: u64,
        rows_out: u64,
        duration_ms: BTreeMap<String, u64>,
    ) {
        let processing_s = (elapsed.as_millis().max(1)) as f64 / 1000.0;
        let processed = round_rate(rows_in as f64 / processing_s);
        let input_rate = match since_prev_trigger {
            Some(d) if d.as_millis() > 0 => round_rate(rows_in as f64 / d.as_secs_f64()),
            _ => 0.0,
        };
        let progress = Progress {
            id: self.ckpt.id,
            run_id: self.run_id,
            name: self.def.name.clone(),
            timestamp: format_ts(trigger_wall),
            batch_id: b.id,
            batch_duration: elapsed.as_millis() as u64,
            num_input_rows: rows_in,
            input_rows_per_second: input_rate,
            processed_rows_per_second: processed,
            duration_ms,
            state_operators: vec![],
            sources: vec![SourceProgress {
                description: format!("FileStreamSource[file:{}]", self.source.path.display()),
                start_offset: offset_json(b.start),
                end_offset: offset_json(Some(b.end)),
                latest_offset: None,
                num_input_rows: rows_in,
                input_rows_per_second: input_rate,
                processed_rows_per_second: processed,
            }],
            sink: SinkProgress {
                description: format!("DeltaSink[{}]", self.def.path.display()),
                num_output_rows: rows_out as i64,
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

/// Reads files in parallel, keeping their order.
async fn read_files(
    source: &Arc<FileSourceConfig>,
    paths: Vec<String>,
) -> Result<Vec<RecordBatch>> {
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
    let mut out = Vec::new();
    for r in results {
        out.extend(r.map_err(|e| Error::Internal(format!("file reader panicked: {e}")))??);
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

/// Gives a result batch the sink's schema (nullable fields; the same types).
fn conform(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    let columns = batch
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(c, f)| {
            if c.data_type() == f.data_type() {
                Ok(c.clone())
            } else {
                cast(c, f.data_type()).map_err(Error::from)
            }
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}
