//! Incremental aggregation with event-time windows, watermarks and output modes
//! (spec §3, §4, §5.4).
//!
//! Each `Aggregate` of a sink's plan becomes a `StatefulAggregate` node (`engine::plan`)
//! whose execution runs an [`AggregateOperator`] over the rows its input produced in the
//! batch: window assignment, the late-row filter, a Partial aggregation of the batch,
//! merged (PartialReduce) with the stored partial states of the groups it touched, and the
//! emit rule of the output mode, which runs Final over the groups to emit. State is the
//! aggregates' partial state (DataFusion accumulators' `state`), never raw rows. The
//! emitted rows have the `Aggregate`'s shape, so the plan above runs over them unchanged.
//! [`analyze_aggregate`] and [`check_plan`] hold Spark's rules for one aggregation and
//! for a whole query.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch, StructArray};
use datafusion::arrow::compute::{cast, concat_batches, filter_record_batch};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef, TimeUnit};
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, DFSchema, ScalarValue};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::logical_expr::{Expr, LogicalPlan, col};
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode, PhysicalGroupBy};
use datafusion::physical_plan::udaf::AggregateFunctionExpr;
use datafusion::physical_plan::{ExecutionPlan, PhysicalExpr, collect};
use datafusion::prelude::{SessionConfig, SessionContext};

use super::window::{
    WINDOW_END, WINDOW_START, WindowSpec, assign, assign_session, spec_from_args, window_type,
};
use crate::error::{Error, Result};
use crate::sink::RowTime;
use crate::state::{StateLayout, StateMetrics, StateStore};

/// Spark's output modes (spec §5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputMode {
    Append,
    Update,
    Complete,
}

impl OutputMode {
    pub fn parse(s: &str) -> Result<OutputMode> {
        match s.to_ascii_lowercase().as_str() {
            "append" => Ok(OutputMode::Append),
            "update" => Ok(OutputMode::Update),
            "complete" => Ok(OutputMode::Complete),
            other => Err(Error::InvalidOption {
                message: format!("invalid output_mode \"{other}\""),
                hint: Some("Use 'append', 'update' or 'complete'.".into()),
            }),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            OutputMode::Append => "append",
            OutputMode::Update => "update",
            OutputMode::Complete => "complete",
        }
    }
}

/// Fixed windows (tumbling or sliding) or session windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowKind {
    Fixed(WindowSpec),
    /// `session_window(ts, gap)`, the gap in microseconds.
    Session {
        gap: i64,
    },
}

/// The window of a `GROUP BY window(...)` or `GROUP BY session_window(...)`.
#[derive(Debug, Clone)]
pub struct WindowKey {
    pub kind: WindowKind,
    /// The time column, in the stateless part's output.
    pub time_column: String,
    /// Its position among the group expressions.
    pub position: usize,
}

/// The time that decides when a group is late and when it is final.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyTime {
    /// `window.end` of a window over the watermarked column.
    Window,
    /// A group key that is the watermarked column itself (its index among the keys).
    Column(usize),
}

/// What [`analyze`] learns about a query's aggregation.
#[derive(Debug, Clone)]
pub struct AggregateInfo {
    pub window: Option<WindowKey>,
    /// The group expressions other than the window, columns unqualified.
    pub keys: Vec<Expr>,
    /// The aggregate expressions, columns unqualified.
    pub aggregates: Vec<Expr>,
    /// The group expressions as written, for EXPLAIN.
    pub group_names: Vec<String>,
    /// How lateness and eviction are judged; `None` = never.
    pub key_time: Option<KeyTime>,
    /// Output columns that identify a group (for update mode's MERGE), if complete.
    pub output_keys: Option<Vec<String>>,
}

fn unqualify(e: &Expr) -> Result<Expr> {
    Ok(e.clone()
        .transform(|e| match e {
            Expr::Column(c) => Ok(Transformed::yes(Expr::Column(Column::new_unqualified(
                c.name,
            )))),
            other => Ok(Transformed::no(other)),
        })?
        .data)
}

fn literal(e: &Expr) -> Option<ScalarValue> {
    match e.clone().unalias() {
        Expr::Literal(v, _) => Some(v),
        Expr::Cast(c) => literal(&c.expr),
        _ => None,
    }
}

/// Checks a whole query against Spark's rules for `mode` that are not about one
/// aggregation (spec §5.2 rules 4, 14 and 16); `aggregations` is how many it has.
pub fn check_plan(plan: &LogicalPlan, aggregations: usize, mode: OutputMode) -> Result<()> {
    // Sorting is allowed only after an aggregation in complete mode (rule 14).
    let mut sorted = false;
    plan.apply(|node| {
        if matches!(node, LogicalPlan::Sort(_)) {
            sorted = true;
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    if sorted && (mode != OutputMode::Complete || aggregations == 0) {
        return Err(Error::Unsupported {
            message: "ORDER BY on a stream is supported only after an aggregation in complete \
                      output mode"
                .into(),
            hint: Some("Use output_mode = 'complete', or sort when you read the table.".into()),
        });
    }
    if aggregations == 0 && mode == OutputMode::Complete {
        return Err(Error::Unsupported {
            message: "output mode \"complete\" is not supported when there are no streaming \
                      aggregations"
                .into(),
            hint: Some("Use output_mode = 'append' for a query without GROUP BY.".into()),
        });
    }
    // An aggregation below another emits rows the upper one would judge against the
    // global watermark; Spark allows the chain only when every operator appends (rule 16).
    if aggregations > 1 && mode != OutputMode::Append {
        return Err(Error::Unsupported {
            message: format!(
                "several streaming aggregations in one query are supported only in append \
                 output mode, not {}",
                mode.as_str()
            ),
            hint: Some(
                "Use output_mode = 'append' with a watermarked window at every level \
                 (window(window_time(w), ...) over the lower aggregation's window w)."
                    .into(),
            ),
        });
    }
    Ok(())
}

/// Analyses one aggregation (its group and aggregate expressions) against Spark's rules for
/// `mode` (spec §5.2–5.3). `marked` are the input columns that carry the watermark mark
/// (spec §3.1). `output_keys` is left to the caller.
pub fn analyze_aggregate(
    group_expr: &[Expr],
    aggr_expr: &[Expr],
    marked: &[String],
    mode: OutputMode,
) -> Result<AggregateInfo> {
    let mut window = None;
    let mut keys = Vec::new();
    let mut group_names = Vec::new();
    for (i, g) in group_expr.iter().enumerate() {
        group_names.push(g.human_display().to_string());
        match g.clone().unalias() {
            Expr::GroupingSet(_) => {
                return Err(Error::unsupported(
                    "GROUPING SETS, CUBE and ROLLUP are not supported on streams",
                ));
            }
            Expr::ScalarFunction(f) if f.func.name() == "window" => {
                if window.is_some() {
                    return Err(Error::unsupported(
                        "at most one window() per aggregation (multiTimeWindowExpressions)",
                    ));
                }
                let Expr::Column(time) = &f.args[0] else {
                    return Err(Error::Unsupported {
                        message: "window() over an expression cannot carry a watermark".into(),
                        hint: Some("Use a column as window()'s first argument.".into()),
                    });
                };
                let args = f.args[1..]
                    .iter()
                    .map(|a| {
                        literal(a).ok_or_else(|| {
                            Error::invalid_option("window durations must be literals")
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                window = Some(WindowKey {
                    kind: WindowKind::Fixed(spec_from_args(&args)?),
                    time_column: time.name.clone(),
                    position: i,
                });
            }
            Expr::ScalarFunction(f) if f.func.name() == "session_window" => {
                if window.is_some() {
                    return Err(Error::unsupported(
                        "at most one window() per aggregation (multiTimeWindowExpressions)",
                    ));
                }
                let Expr::Column(time) = &f.args[0] else {
                    return Err(Error::Unsupported {
                        message: "session_window() over an expression cannot carry a watermark"
                            .into(),
                        hint: Some("Use a column as session_window()'s first argument.".into()),
                    });
                };
                let gap = literal(&f.args[1])
                    .ok_or_else(|| Error::Unsupported {
                        message: "a session gap computed per row is not supported yet".into(),
                        hint: Some("Use a literal gap such as '5 minutes'.".into()),
                    })
                    .and_then(|g| super::window::duration_arg(&g))?;
                if gap.is_zero() {
                    return Err(Error::invalid_option("the session gap must be positive"));
                }
                window = Some(WindowKey {
                    kind: WindowKind::Session {
                        gap: gap.as_micros() as i64,
                    },
                    time_column: time.name.clone(),
                    position: i,
                });
            }
            _ => keys.push(unqualify(g)?),
        }
    }
    let aggregates_exprs = aggr_expr
        .iter()
        .map(unqualify)
        .collect::<Result<Vec<_>>>()?;
    if let Some(WindowKey {
        kind: WindowKind::Session { .. },
        ..
    }) = &window
    {
        if mode == OutputMode::Update {
            return Err(Error::Unsupported {
                message: "update output mode is not supported for session windows".into(),
                hint: Some("Use output_mode = 'append' (with a watermark) or 'complete'.".into()),
            });
        }
        if keys.is_empty() {
            return Err(Error::Unsupported {
                message: "a session window needs at least one other grouping column".into(),
                hint: Some("Group by session_window(...) and a key, e.g. user_id.".into()),
            });
        }
    }
    let key_time = match &window {
        Some(w) if marked.contains(&w.time_column) => Some(KeyTime::Window),
        _ => keys
            .iter()
            .position(|k| matches!(k, Expr::Column(c) if marked.contains(&c.name)))
            .map(KeyTime::Column),
    };
    if mode == OutputMode::Append && key_time.is_none() {
        let time = window
            .as_ref()
            .map(|w| w.time_column.clone())
            .or_else(|| marked.first().cloned())
            .unwrap_or_else(|| "the event time".into());
        return Err(Error::Unsupported {
            message: "append output mode is not supported for a streaming aggregation without \
                      a watermark on a grouping key"
                .into(),
            hint: Some(format!(
                "Add a watermark on {time} (WATERMARK FOR in the stream, or watermark = \
                 '{time} - 10 minutes' in the sink) and group by a window over it, or use \
                 output_mode = 'complete'."
            )),
        });
    }
    Ok(AggregateInfo {
        window,
        keys,
        aggregates: aggregates_exprs,
        group_names,
        key_time,
        output_keys: None,
    })
}

/// Sets the top aggregation's `output_keys`, which update mode needs to MERGE by.
pub fn set_output_keys(
    info: &mut AggregateInfo,
    plan: &LogicalPlan,
    agg_schema: &DFSchema,
    mode: OutputMode,
) -> Result<()> {
    info.output_keys = find_output_keys(
        plan,
        agg_schema,
        info.group_names.len(),
        info.window.as_ref(),
    );
    if mode == OutputMode::Update && info.output_keys.is_none() {
        return Err(Error::Unsupported {
            message: "update mode into Delta needs every group key in the sink's columns".into(),
            hint: Some(
                "Select the GROUP BY columns (and window.start) so rows can be merged by key."
                    .into(),
            ),
        });
    }
    Ok(())
}

/// The output columns that are group keys: each non-window key selected as is, and the
/// window's start (or end). `None` if a key is missing.
fn find_output_keys(
    plan: &LogicalPlan,
    agg_schema: &DFSchema,
    n_groups: usize,
    window: Option<&WindowKey>,
) -> Option<Vec<String>> {
    let mut top = plan;
    while !matches!(top, LogicalPlan::Projection(_)) {
        top = top.inputs().first()?;
    }
    let LogicalPlan::Projection(p) = top else {
        return None;
    };
    let group_fields: Vec<String> = (0..n_groups)
        .map(|i| agg_schema.field(i).name().clone())
        .collect();
    let mut found = vec![false; group_fields.len()];
    let mut out = Vec::new();
    for (e, field) in p.expr.iter().zip(p.schema.fields()) {
        let inner = e.clone().unalias();
        let hit = match &inner {
            Expr::Column(c) => group_fields.iter().position(|g| *g == c.name),
            Expr::ScalarFunction(f) if f.func.name() == "get_field" => {
                match (&f.args[0], &f.args.get(1)) {
                    (Expr::Column(c), Some(arg)) => {
                        let field_name = literal(arg).map(|v| v.to_string()).unwrap_or_default();
                        window
                            .filter(|w| group_fields[w.position] == c.name)
                            .filter(|_| field_name == "start" || field_name == "end")
                            .map(|w| w.position)
                    }
                    _ => None,
                }
            }
            _ => None,
        };
        if let Some(i) = hit {
            found[i] = true;
            out.push(field.name().clone());
        }
    }
    found.iter().all(|f| *f).then_some(out)
}

/// The output column that tells when the top aggregation's row is final: the window (its
/// struct, `window.end`, or `window.start` of a fixed window) or the group key that is the
/// watermarked column.
pub fn find_output_time(
    plan: &LogicalPlan,
    agg_schema: &DFSchema,
    info: &AggregateInfo,
) -> Option<RowTime> {
    let mut top = plan;
    while !matches!(top, LogicalPlan::Projection(_)) {
        top = top.inputs().first()?;
    }
    let LogicalPlan::Projection(p) = top else {
        return None;
    };
    let group_field = |i: usize| agg_schema.field(i).name().clone();
    let mut found: Vec<(u8, RowTime)> = Vec::new();
    for (e, field) in p.expr.iter().zip(p.schema.fields()) {
        let column = field.name().clone();
        match (e.clone().unalias(), &info.window, info.key_time) {
            (Expr::Column(c), Some(w), _) if c.name == group_field(w.position) => found.push((
                0,
                RowTime::WindowEnd {
                    column,
                    field: Some("end".into()),
                    plus_us: 0,
                },
            )),
            (Expr::ScalarFunction(f), Some(w), _) if f.func.name() == "get_field" => {
                let (Some(Expr::Column(c)), Some(arg)) = (f.args.first(), f.args.get(1)) else {
                    continue;
                };
                if c.name != group_field(w.position) {
                    continue;
                }
                match (literal(arg).map(|v| v.to_string()).as_deref(), &w.kind) {
                    (Some("end"), _) => found.push((
                        0,
                        RowTime::WindowEnd {
                            column,
                            field: None,
                            plus_us: 0,
                        },
                    )),
                    (Some("start"), WindowKind::Fixed(spec)) => found.push((
                        1,
                        RowTime::WindowEnd {
                            column,
                            field: None,
                            plus_us: spec.size,
                        },
                    )),
                    _ => {}
                }
            }
            (Expr::Column(c), None, Some(KeyTime::Column(i))) if c.name == group_field(i) => {
                found.push((0, RowTime::EventTime { column }))
            }
            _ => {}
        }
    }
    found.sort_by_key(|(rank, _)| *rank);
    found.into_iter().next().map(|(_, t)| t)
}

/// The stateful window aggregate of one query run.
pub struct AggregateOperator {
    info: AggregateInfo,
    mode: OutputMode,
    state: Box<dyn StateStore>,
    /// The schema the Partial aggregation reads: the stateless part's output, plus the
    /// window columns.
    input_schema: SchemaRef,
    group_by: PhysicalGroupBy,
    aggr: Vec<Arc<AggregateFunctionExpr>>,
    filters: Vec<Option<Arc<dyn PhysicalExpr>>>,
    key_columns: usize,
    ctx: SessionContext,
}

/// What one batch did.
#[derive(Debug, Default)]
pub struct AggregateBatch {
    /// Rows in the shape of the logical `Aggregate`'s output, to run the part above over.
    pub emitted: Vec<ArrayRefs>,
    /// Input rows (one per row and window) dropped as late.
    pub dropped_late: u64,
    /// Groups written to state by this batch.
    pub rows_updated: u64,
    /// Groups evicted by this batch.
    pub rows_removed: u64,
    pub all_updates_ms: u64,
    pub all_removals_ms: u64,
    /// The operator's own counters, as Spark's `customMetrics`.
    pub custom_metrics: Vec<(&'static str, u64)>,
    /// The rows dropped as late, as the operator's input (for `late_rows = 'table'`).
    pub late: Vec<super::side_tables::DroppedRows>,
}

impl AggregateBatch {
    /// `batch` (operator input) less its rows whose time in column `time` is at or before
    /// `wm_late_us`: the late-row filter of every stateful operator (spec §3.1). The late
    /// rows are counted as dropped by the watermark and kept for the late-rows table. No
    /// filter without a time column, or before the first watermark.
    pub fn keep_on_time(
        &mut self,
        batch: RecordBatch,
        time: Option<usize>,
        wm_late_us: i64,
    ) -> Result<RecordBatch> {
        let Some(time) = time.filter(|_| wm_late_us > 0) else {
            return Ok(batch);
        };
        let (kept, late) = drop_late(&batch, time, wm_late_us)?;
        if late.num_rows() > 0 {
            self.dropped_late += late.num_rows() as u64;
            self.late
                .push(super::side_tables::DroppedRows { rows: late, time });
        }
        Ok(kept)
    }
}

impl AggregateOperator {
    /// The partial-state schema and aggregate plan pieces for a stateless part with output
    /// `pre_schema`.
    pub async fn plan(
        info: &AggregateInfo,
        pre_schema: &Schema,
    ) -> Result<(
        SchemaRef,
        PhysicalGroupBy,
        Vec<Arc<AggregateFunctionExpr>>,
        Vec<Option<Arc<dyn PhysicalExpr>>>,
        SchemaRef,
    )> {
        let mut fields: Vec<Field> = pre_schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect();
        let mut group: Vec<Expr> = Vec::new();
        if let Some(w) = &info.window {
            let tz = match pre_schema
                .field_with_name(&w.time_column)
                .map(|f| f.data_type().clone())
            {
                Ok(DataType::Timestamp(_, tz)) => tz,
                Ok(other) => {
                    return Err(Error::invalid_option(format!(
                        "window() needs a TIMESTAMP column, not {other}"
                    )));
                }
                Err(_) => {
                    return Err(Error::UndefinedObject {
                        kind: "column",
                        name: w.time_column.clone(),
                    });
                }
            };
            let ts = DataType::Timestamp(TimeUnit::Microsecond, tz);
            fields.push(Field::new(WINDOW_START, ts.clone(), true));
            fields.push(Field::new(WINDOW_END, ts, true));
            group.push(col(WINDOW_START));
            group.push(col(WINDOW_END));
        }
        for (i, k) in info.keys.iter().enumerate() {
            group.push(k.clone().alias(format!("__key_{i}")));
        }
        let input_schema = Arc::new(Schema::new(fields));
        // Physical expressions bound to the full input schema (the physical planner would
        // prune columns and bind them to a narrower one).
        let df_schema = DFSchema::try_from(input_schema.as_ref().clone())?;
        let state = SessionContext::new().state();
        let group_exprs = group
            .iter()
            .map(|e| {
                let name = match e {
                    Expr::Alias(a) => a.name.clone(),
                    other => other.schema_name().to_string(),
                };
                Ok((
                    state.create_physical_expr(e.clone().unalias(), &df_schema)?,
                    name,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let group_by = PhysicalGroupBy::new_single(group_exprs);
        let mut aggr = Vec::new();
        let mut filters = Vec::new();
        for e in &info.aggregates {
            // Deprecated in favour of a builder in a crate DataFusion does not re-export;
            // it still builds exactly what the planner builds.
            #[allow(deprecated)]
            let (a, f, _order) =
                datafusion::physical_planner::create_aggregate_expr_and_maybe_filter(
                    e,
                    &df_schema,
                    &input_schema,
                    state.execution_props(),
                )?;
            aggr.push(a);
            filters.push(f);
        }
        let partial = AggregateExec::try_new(
            AggregateMode::Partial,
            group_by.clone(),
            aggr.clone(),
            filters.clone(),
            MemorySourceConfig::try_new_exec(&[vec![]], input_schema.clone(), None)?,
            input_schema.clone(),
        )?;
        Ok((partial.schema(), group_by, aggr, filters, input_schema))
    }

    /// Builds the operator over the state store that `open_store` opens for its layout.
    pub async fn try_new(
        info: AggregateInfo,
        mode: OutputMode,
        pre_schema: &Schema,
        partitions: usize,
        open_store: impl FnOnce(StateLayout) -> Result<Box<dyn StateStore>>,
    ) -> Result<AggregateOperator> {
        let (state_schema, group_by, aggr, filters, input_schema) =
            Self::plan(&info, pre_schema).await?;
        let key_columns = group_by.expr().len();
        let session = matches!(
            info.window,
            Some(WindowKey {
                kind: WindowKind::Session { .. },
                ..
            })
        );
        let evicts = mode != OutputMode::Complete || session;
        let state = open_store(StateLayout {
            schema: state_schema,
            key_columns,
            window_columns: if info.window.is_some() { 2 } else { 0 },
            time_column: key_time_columns(&info, &input_schema)
                .filter(|_| evicts)
                .map(|(s, _)| s),
            partitions,
            group_lookups: session,
        })?;
        Ok(AggregateOperator {
            info,
            mode,
            state,
            input_schema,
            group_by,
            aggr,
            filters,
            key_columns,
            ctx: SessionContext::new_with_config(SessionConfig::new().with_target_partitions(1)),
        })
    }

    pub fn info(&self) -> &AggregateInfo {
        &self.info
    }

    pub fn state_mut(&mut self) -> &mut dyn StateStore {
        self.state.as_mut()
    }

    /// Whether this operator asks for a no-data batch when the watermark advances (§1.3).
    pub fn wants_no_data_batches(&self) -> bool {
        self.info.key_time.is_some() && self.mode != OutputMode::Complete
    }

    /// Index of the key-time column in state rows, and in input rows.
    fn key_time_columns(&self) -> Option<(usize, usize)> {
        key_time_columns(&self.info, &self.input_schema)
    }

    fn exec_over(
        &self,
        batches: Vec<RecordBatch>,
        schema: &SchemaRef,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(MemorySourceConfig::try_new_exec(
            &[batches],
            schema.clone(),
            None,
        )?)
    }

    async fn run(&self, plan: Arc<dyn ExecutionPlan>) -> Result<Vec<RecordBatch>> {
        Ok(collect(plan, self.ctx.task_ctx())
            .await?
            .into_iter()
            .filter(|b| b.num_rows() > 0)
            .collect())
    }

    /// Runs an aggregation over stored partial states: `PartialReduce` merges them into one
    /// row of partial state per group, `Final` evaluates the aggregates.
    async fn over_states(
        &self,
        mode: AggregateMode,
        batches: Vec<RecordBatch>,
    ) -> Result<Vec<RecordBatch>> {
        if batches.iter().all(|b| b.num_rows() == 0) {
            return Ok(vec![]);
        }
        let schema = self.state.schema();
        let exec = AggregateExec::try_new(
            mode,
            self.group_by.as_final(),
            self.aggr.clone(),
            vec![None; self.aggr.len()],
            self.exec_over(batches, &schema)?,
            self.input_schema.clone(),
        )?;
        self.run(Arc::new(exec)).await
    }

    async fn reduce(&self, batches: Vec<RecordBatch>) -> Result<Vec<RecordBatch>> {
        self.over_states(AggregateMode::PartialReduce, batches)
            .await
    }

    async fn finalize(&self, batches: Vec<RecordBatch>) -> Result<Vec<RecordBatch>> {
        self.over_states(AggregateMode::Final, batches).await
    }

    /// Runs one batch: `pre_rows` are the stateless part's output. `wm_late_us` judges late
    /// rows (the previous batch's watermark), `wm_evict_us` closes groups (this batch's).
    pub async fn process(
        &mut self,
        pre_rows: Vec<RecordBatch>,
        wm_late_us: i64,
        wm_evict_us: i64,
    ) -> Result<AggregateBatch> {
        let mut out = AggregateBatch::default();
        let started = std::time::Instant::now();
        let key_time = self.key_time_columns();
        let session = self.is_session();
        // Session windows drop late rows in every mode (spec §3.2).
        let late_filter = self.mode != OutputMode::Complete || session;
        let mut input = Vec::with_capacity(pre_rows.len());
        for b in pre_rows {
            let b = match &self.info.window {
                Some(w) => {
                    let idx = b.schema().index_of(&w.time_column)?;
                    match w.kind {
                        WindowKind::Fixed(spec) => assign(&b, idx, &spec)?,
                        WindowKind::Session { gap } => assign_session(&b, idx, gap)?,
                    }
                }
                None => b,
            };
            let b = RecordBatch::try_new(self.input_schema.clone(), b.columns().to_vec())?;
            let time = key_time.filter(|_| late_filter).map(|(_, col)| col);
            let b = out.keep_on_time(b, time, wm_late_us)?;
            if b.num_rows() > 0 {
                input.push(b);
            }
        }

        // Partial aggregation of the batch, merged with the stored state of the groups it touched.
        let mut merged = Vec::new();
        if !input.is_empty() {
            let partial = AggregateExec::try_new(
                AggregateMode::Partial,
                self.group_by.clone(),
                self.aggr.clone(),
                self.filters.clone(),
                self.exec_over(input, &self.input_schema.clone())?,
                self.input_schema.clone(),
            )?;
            let partial = self.run(Arc::new(partial)).await?;
            if session {
                merged = self.merge_sessions(partial).await?;
                out.rows_updated = merged.iter().map(|b| b.num_rows() as u64).sum();
            } else {
                let schema = self.state.schema();
                let touched = concat_batches(&schema, &partial)?;
                let mut to_merge = vec![self.state.get(&touched)?];
                to_merge.push(touched);
                merged = self.reduce(to_merge).await?;
                let schema = self.state.schema();
                let merged_one = concat_batches(&schema, &merged)?;
                out.rows_updated = merged_one.num_rows() as u64;
                self.state
                    .apply(&merged_one, &RecordBatch::new_empty(schema))?;
            }
        }
        out.all_updates_ms = started.elapsed().as_millis() as u64;

        // Emit, and evict what the watermark has closed.
        let started = std::time::Instant::now();
        let evict = |this: &mut Self| -> Result<RecordBatch> {
            match key_time {
                Some(_) if wm_evict_us > 0 => this.state.evict_expired(wm_evict_us),
                _ => Ok(RecordBatch::new_empty(this.state.schema())),
            }
        };
        let finals = match self.mode {
            OutputMode::Append => {
                let evicted = evict(self)?;
                out.rows_removed = evicted.num_rows() as u64;
                self.finalize(vec![evicted]).await?
            }
            OutputMode::Update => {
                let finals = self.finalize(merged).await?;
                out.rows_removed = evict(self)?.num_rows() as u64;
                finals
            }
            OutputMode::Complete => self.finalize(self.state.rows()?).await?,
        };
        out.all_removals_ms = started.elapsed().as_millis() as u64;
        out.emitted = finals
            .iter()
            .map(|b| self.to_aggregate_shape(b))
            .collect::<Result<_>>()?;
        Ok(out)
    }

    fn is_session(&self) -> bool {
        matches!(
            self.info.window,
            Some(WindowKey {
                kind: WindowKind::Session { .. },
                ..
            })
        )
    }

    /// Session windows: merges the batch's per-row sessions with the stored sessions of
    /// the same keys (spec §4.2), replaces those keys' sessions in state, and returns the
    /// merged sessions.
    async fn merge_sessions(&mut self, partial: Vec<RecordBatch>) -> Result<Vec<RecordBatch>> {
        let schema = self.state.schema();
        // Group keys without the window (columns 2..key_columns).
        let key_rows = |b: &RecordBatch| -> Result<Vec<Vec<u8>>> {
            let conv = RowConverter::new(
                schema.fields()[2..self.key_columns]
                    .iter()
                    .map(|f| SortField::new(f.data_type().clone()))
                    .collect(),
            )?;
            let rows = conv.convert_columns(&b.columns()[2..self.key_columns])?;
            Ok(rows.iter().map(|r| r.as_ref().to_vec()).collect())
        };
        let partial = concat_batches(&schema, &partial)?;
        let old = self.state.get_groups(&partial)?;
        let combined = concat_batches(&schema, [&old, &partial])?;
        let as_i64 = |c: &ArrayRef| -> Result<Vec<i64>> {
            let c = cast(c, &DataType::Int64)?;
            Ok(c.as_primitive::<Int64Type>().values().to_vec())
        };
        let (starts, ends) = super::window::merge_sessions(
            &key_rows(&combined)?,
            &as_i64(combined.column(0))?,
            &as_i64(combined.column(1))?,
        );
        let ts_type = combined.column(0).data_type().clone();
        let mut cols = combined.columns().to_vec();
        cols[0] = cast(
            &(Arc::new(datafusion::arrow::array::Int64Array::from(starts)) as ArrayRef),
            &ts_type,
        )?;
        cols[1] = cast(
            &(Arc::new(datafusion::arrow::array::Int64Array::from(ends)) as ArrayRef),
            &ts_type,
        )?;
        let merged = self
            .reduce(vec![RecordBatch::try_new(schema.clone(), cols)?])
            .await?;
        let merged_one = concat_batches(&schema, &merged)?;
        self.state.apply(&merged_one, &old)?;
        Ok(merged)
    }

    /// Commits the state as `version` (batch N commits N + 1).
    pub fn commit(&mut self, version: u64) -> Result<StateMetrics> {
        self.state.commit(version)
    }

    /// State maintenance, after the batch's commit log.
    pub fn maintain(&mut self) -> Result<()> {
        self.state.maintain()
    }

    /// Final rows `[window_start, window_end, keys..., aggregates...]` in the shape of the
    /// logical `Aggregate`: the window as a struct, at its place among the group keys.
    fn to_aggregate_shape(&self, b: &RecordBatch) -> Result<ArrayRefs> {
        let mut cols: Vec<ArrayRef> = Vec::new();
        let mut next = 0;
        let n_groups = self.info.keys.len() + usize::from(self.info.window.is_some());
        let window_cols = if self.info.window.is_some() { 2 } else { 0 };
        for i in 0..n_groups {
            match &self.info.window {
                Some(w) if w.position == i => {
                    let start = b.column(0).clone();
                    let end = b.column(1).clone();
                    let DataType::Timestamp(_, tz) = start.data_type().clone() else {
                        return Err(Error::Internal("window start is not a timestamp".into()));
                    };
                    let DataType::Struct(fields) = window_type(tz) else {
                        return Err(Error::Internal("window type is not a struct".into()));
                    };
                    cols.push(Arc::new(StructArray::try_new(
                        fields,
                        vec![start, end],
                        None,
                    )?));
                }
                _ => {
                    cols.push(b.column(window_cols + next).clone());
                    next += 1;
                }
            }
        }
        cols.extend(b.columns()[self.key_columns..].iter().cloned());
        Ok(cols)
    }
}

pub type ArrayRefs = Vec<ArrayRef>;

/// Microseconds of a time column: a timestamp, or a window's end (a struct's `end`).
pub(crate) fn time_micros(column: &ArrayRef) -> Result<datafusion::arrow::array::Int64Array> {
    let column = match column.data_type() {
        DataType::Struct(fields) => {
            let s: &StructArray = column.as_struct();
            let end = fields
                .iter()
                .position(|f| f.name() == "end")
                .unwrap_or(1.min(fields.len().saturating_sub(1)));
            s.column(end).clone()
        }
        _ => column.clone(),
    };
    let c = cast(&column, &DataType::Timestamp(TimeUnit::Microsecond, None))?;
    let c = cast(&c, &DataType::Int64)?;
    Ok(c.as_primitive::<Int64Type>().clone())
}

/// `batch` split into its rows whose time in `column` (a timestamp, or a window's end) is
/// after `wm_us`, and the late ones. NULL times are never late.
fn drop_late(batch: &RecordBatch, column: usize, wm_us: i64) -> Result<(RecordBatch, RecordBatch)> {
    let c = time_micros(batch.column(column))?;
    let keep: BooleanArray = c
        .iter()
        .map(|v| Some(v.is_none_or(|v| v > wm_us)))
        .collect();
    let kept = filter_record_batch(batch, &keep)?;
    let late = if kept.num_rows() == batch.num_rows() {
        RecordBatch::new_empty(batch.schema())
    } else {
        filter_record_batch(batch, &datafusion::arrow::compute::not(&keep)?)?
    };
    Ok((kept, late))
}

/// Index of the key-time column in state rows, and in the aggregation's input rows.
fn key_time_columns(info: &AggregateInfo, input_schema: &Schema) -> Option<(usize, usize)> {
    let window_cols = if info.window.is_some() { 2 } else { 0 };
    let n_pre = input_schema.fields().len() - window_cols;
    match info.key_time? {
        KeyTime::Window => Some((1, n_pre + 1)),
        KeyTime::Column(i) => {
            let Expr::Column(c) = &info.keys[i] else {
                return None;
            };
            let input_idx = input_schema.index_of(&c.name).ok()?;
            Some((i + window_cols, input_idx))
        }
    }
}

/// Event-time statistics of a batch (spec §12.1 `eventTime`), in microseconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct EventTimeStats {
    pub min: i64,
    pub max: i64,
    pub sum: i128,
    pub count: u64,
}

impl EventTimeStats {
    pub fn add_column(&mut self, array: &ArrayRef) -> Result<()> {
        let c = cast(array, &DataType::Timestamp(TimeUnit::Microsecond, None))?;
        let c = cast(&c, &DataType::Int64)?;
        for v in c.as_primitive::<Int64Type>().iter().flatten() {
            if self.count == 0 {
                self.min = v;
                self.max = v;
            } else {
                self.min = self.min.min(v);
                self.max = self.max.max(v);
            }
            self.sum += v as i128;
            self.count += 1;
        }
        Ok(())
    }

    /// Adds another node's statistics (progress reports one `eventTime` per query).
    pub fn merge(&mut self, o: &EventTimeStats) {
        if o.count == 0 {
            return;
        }
        if self.count == 0 {
            *self = *o;
            return;
        }
        self.min = self.min.min(o.min);
        self.max = self.max.max(o.max);
        self.sum += o.sum;
        self.count += o.count;
    }

    pub fn avg(&self) -> Option<i64> {
        (self.count > 0).then(|| (self.sum / self.count as i128) as i64)
    }
}
