//! The streaming plan: a sink's query as one DataFusion plan whose stateful parts are nodes
//! of their own (spec §2, §3, §5).
//!
//! [`StreamingPlan::build`] plans the query's SQL over one [`BatchTable`] per stream it reads
//! (each stream is one source, numbered in the order the query names them), then rewrites
//! the logical plan bottom-up:
//!
//! - above the scan of a stream with a watermark, an [`EventTimeWatermark`] node (Spark's
//!   `EventTimeWatermark`): it passes rows through and records the event-time statistics of
//!   every row that reaches it. Filters that do not read the event-time column are pushed
//!   below it by DataFusion's optimizer, filters that do stay above (spec §2.3);
//! - each `Aggregate` becomes a [`StatefulAggregate`] node (Spark's `StateStoreSave`), with
//!   the operator id that names its state directory, `state/<id>/`. Ids follow the plan
//!   bottom-up, so a query with one aggregation keeps its state in `state/0/`;
//! - each `Distinct` (`SELECT DISTINCT`, `DISTINCT ON`, `UNION` without `ALL`) becomes a
//!   [`StatefulDedup`] node (Spark's `StreamingDeduplicate`), numbered the same way.
//!
//! They are user-defined logical nodes that the [`StreamingQueryPlanner`] plans into
//! `ExecutionPlan`s with `DisplayAs`: [`EventTimeWatermarkExec`] and
//! [`StatefulOperatorExec`], which runs the operator (a [`StatefulOperator`]) over its
//! input's rows of the batch and emits what it says. `EXPLAIN CREATE SINK`
//! renders this plan. A batch is then: fill the tables, plan (the first batch; the next ones
//! reset and rerun its physical plan, unless the query calls a function such as `now()`),
//! execute, read the counters.

use std::cmp::Ordering;
use std::collections::BTreeSet;
use std::fmt;
use std::hash::Hash;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::Session;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, DFSchemaRef, DataFusionError, ScalarValue, TableReference};
use datafusion::datasource::{TableProvider, TableType};
use datafusion::execution::context::QueryPlanner;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::{
    Distinct, Expr, Extension, Filter, LogicalPlan, LogicalPlanBuilder, UserDefinedLogicalNode,
    UserDefinedLogicalNodeCore, col,
};
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{
    Boundedness, ChildrenPropertiesMode, EmissionType, ReplaceChildrenOptions,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PhysicalExpr, PlanProperties,
};
use datafusion::physical_planner::{DefaultPhysicalPlanner, ExtensionPlanner, PhysicalPlanner};
use datafusion::prelude::{SessionConfig, SessionContext};
use futures::{StreamExt, TryStreamExt};

use super::aggregate::{
    AggregateInfo, EventTimeStats, KeyTime, OutputMode, WindowKind, analyze_aggregate, check_plan,
    find_output_time, set_output_keys,
};
use super::dedup::DedupInfo;
use super::join::{JoinInfo, JoinKind};
use super::operator::{OperatorBatch, StatefulOperator};
use super::side_tables::DroppedRows;
use crate::error::{Error, Result};
use crate::sink::RowTime;
use crate::sql::parser::WatermarkSpec;

type DfResult<T> = datafusion::error::Result<T>;

fn external(e: Error) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

/// A stream's rows of the current batch, in partitions, swapped per batch.
type BatchRows = Arc<RwLock<Vec<Vec<RecordBatch>>>>;

/// A stream as one query reads it: the rows of the current batch, swapped per batch. Its
/// scan reads the rows when it runs, not when it is planned, so a physical plan serves
/// batch after batch.
#[derive(Debug)]
pub struct BatchTable {
    schema: SchemaRef,
    /// How many partitions a scan has: batches fill at most this many.
    partitions: usize,
    rows: BatchRows,
}

impl BatchTable {
    pub fn new(schema: SchemaRef, partitions: usize) -> BatchTable {
        BatchTable {
            schema,
            partitions: partitions.max(1),
            rows: Arc::new(RwLock::new(vec![vec![]])),
        }
    }

    /// The rows the next execution reads (at most `partitions` partitions; more are
    /// dealt into them).
    pub fn set(&self, mut partitions: Vec<Vec<RecordBatch>>) {
        if partitions.len() > self.partitions {
            let extra = partitions.split_off(self.partitions);
            for (i, p) in extra.into_iter().enumerate() {
                partitions[i % self.partitions].extend(p);
            }
        }
        *self.rows.write().unwrap_or_else(|e| e.into_inner()) = partitions;
    }
}

#[async_trait]
impl TableProvider for BatchTable {
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
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let schema = match projection {
            Some(p) => Arc::new(self.schema.project(p)?),
            None => self.schema.clone(),
        };
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(self.partitions),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Ok(Arc::new(BatchScanExec {
            rows: self.rows.clone(),
            projection: projection.cloned(),
            schema,
            properties,
        }))
    }
}

/// The scan of a [`BatchTable`]: partition `p` of the batch the table holds when it runs.
#[derive(Debug)]
struct BatchScanExec {
    rows: BatchRows,
    projection: Option<Vec<usize>>,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
}

impl DisplayAs for BatchScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "BatchScanExec: projection={:?}", self.projection)
    }
}

impl ExecutionPlan for BatchScanExec {
    fn name(&self) -> &str {
        "BatchScanExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn with_new_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn execute(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let rows = self
            .rows
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(partition)
            .cloned()
            .unwrap_or_default();
        let rows = rows
            .into_iter()
            .map(|b| match &self.projection {
                Some(p) => b.project(p).map_err(DataFusionError::from),
                None => Ok(b),
            })
            .collect::<Vec<_>>();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            futures::stream::iter(rows),
        )))
    }
}

/// A stateful operator, locked by its execution node during a batch and by the loop between.
type SharedOperator = Arc<tokio::sync::Mutex<Box<dyn StatefulOperator>>>;

/// What the execution nodes share with the trigger loop during one batch.
#[derive(Default)]
pub struct BatchRuntime {
    /// `(WM_late, WM_evict)` in microseconds (spec §2.4).
    watermarks: Mutex<(i64, i64)>,
    /// Per watermark node: the statistics of this batch's rows.
    stats: Mutex<Vec<EventTimeStats>>,
    /// Per stateful operator, by id.
    operators: RwLock<Vec<SharedOperator>>,
    /// Per stateful operator: what this batch did in it.
    results: Mutex<Vec<Option<OperatorBatch>>>,
    /// Per stateful operator: the stream-stream joins below it, whose output watermark is
    /// its input watermark (spec §2.6).
    joins_below: RwLock<Vec<Vec<JoinInfo>>>,
    /// `max_event_time_skew` (µs), and the batch's processing time (µs): rows further
    /// ahead are set aside at the watermark nodes.
    skew_us: Option<i64>,
    batch_time_us: Mutex<i64>,
    /// This batch's rows set aside for their skew, by watermark node.
    skewed: Mutex<Vec<(usize, DroppedRows)>>,
}

impl fmt::Debug for BatchRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatchRuntime").finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl BatchRuntime {
    fn begin(&self, late_us: i64, evict_us: i64, batch_time_us: i64, watermarks: usize) {
        *lock(&self.watermarks) = (late_us, evict_us);
        *lock(&self.batch_time_us) = batch_time_us;
        lock(&self.skewed).clear();
        *lock(&self.stats) = vec![EventTimeStats::default(); watermarks];
        let n = self
            .operators
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .len();
        *lock(&self.results) = (0..n).map(|_| None).collect();
    }

    /// `rows` without those whose event time (column `index`) is further ahead of the
    /// batch's processing time than `max_event_time_skew`; those are kept for the
    /// late-rows table.
    fn without_skewed(&self, id: usize, rows: RecordBatch, index: usize) -> Result<RecordBatch> {
        let Some(skew) = self.skew_us else {
            return Ok(rows);
        };
        let limit = lock(&self.batch_time_us).saturating_add(skew);
        let times = super::aggregate::time_micros(rows.column(index))?;
        let keep: datafusion::arrow::array::BooleanArray = times
            .iter()
            .map(|t| Some(t.is_none_or(|t| t <= limit)))
            .collect();
        if keep.true_count() == rows.num_rows() {
            return Ok(rows);
        }
        let ahead = datafusion::arrow::compute::filter_record_batch(
            &rows,
            &datafusion::arrow::compute::not(&keep)?,
        )?;
        lock(&self.skewed).push((
            id,
            DroppedRows {
                rows: ahead,
                time: index,
            },
        ));
        Ok(datafusion::arrow::compute::filter_record_batch(
            &rows, &keep,
        )?)
    }

    fn observe(&self, id: usize, column: &datafusion::arrow::array::ArrayRef) -> Result<()> {
        let mut stats = lock(&self.stats);
        match stats.get_mut(id) {
            Some(s) => s.add_column(column),
            None => Ok(()),
        }
    }

    async fn process(
        &self,
        id: usize,
        inputs: Vec<Vec<RecordBatch>>,
    ) -> Result<Vec<super::aggregate::ArrayRefs>> {
        let op = self
            .operators
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
            .ok_or_else(|| Error::Internal(format!("stateful operator {id} is not open")))?;
        let (mut late, mut evict) = *lock(&self.watermarks);
        if let Some(joins) = self
            .joins_below
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
        {
            for j in joins {
                late = late.min(j.output_watermark(late));
                evict = evict.min(j.output_watermark(evict));
            }
        }
        let mut op = op.lock().await;
        let mut out = op.process_batch(inputs, late, evict).await?;
        let emitted = std::mem::take(&mut out.emitted);
        if let Some(slot) = lock(&self.results).get_mut(id) {
            *slot = Some(out);
        }
        Ok(emitted)
    }
}

/// Spark's `EventTimeWatermark` node: `column - delay` over the rows of one source.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd)]
pub struct EventTimeWatermark {
    pub id: usize,
    pub column: String,
    pub delay_us: u64,
    pub input: LogicalPlan,
}

impl UserDefinedLogicalNodeCore for EventTimeWatermark {
    fn name(&self) -> &str {
        "EventTimeWatermark"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.input]
    }

    fn schema(&self) -> &DFSchemaRef {
        self.input.schema()
    }

    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }

    /// Filters on the event time stay above: the rows they reject still move the
    /// watermark (spec §2.3).
    fn prevent_predicate_push_down_columns(&self) -> std::collections::HashSet<String> {
        std::collections::HashSet::from([self.column.clone()])
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "EventTimeWatermark: id={} {} - {}",
            self.id,
            self.column,
            crate::sql::options::format_duration(Duration::from_micros(self.delay_us))
        )
    }

    fn with_exprs_and_inputs(&self, _exprs: Vec<Expr>, inputs: Vec<LogicalPlan>) -> DfResult<Self> {
        Ok(EventTimeWatermark {
            input: one_input(inputs)?,
            ..self.clone()
        })
    }

    /// What the plan above reads, and the event-time column (its statistics move the
    /// watermark even when nothing above reads it).
    fn necessary_children_exprs(&self, output_columns: &[usize]) -> Option<Vec<Vec<usize>>> {
        let time = self
            .input
            .schema()
            .index_of_column_by_name(None, &self.column)?;
        let mut needed: Vec<usize> = output_columns.to_vec();
        needed.push(time);
        needed.sort_unstable();
        needed.dedup();
        Some(vec![needed])
    }
}

fn one_input(mut inputs: Vec<LogicalPlan>) -> DfResult<LogicalPlan> {
    match inputs.len() {
        1 => Ok(inputs.remove(0)),
        n => Err(DataFusionError::Internal(format!(
            "a streaming node takes one input, not {n}"
        ))),
    }
}

/// A stateful aggregation (Spark's `StateStoreRestore`/`StateStoreSave` pair): the operator
/// `id` over its input; its output is the `Aggregate`'s, so the plan above is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StatefulAggregate {
    pub id: usize,
    pub input: LogicalPlan,
    pub schema: DFSchemaRef,
    /// Output columns that carry the watermark mark (the window over the marked column,
    /// or a marked key).
    pub marked: Vec<String>,
    /// What EXPLAIN shows.
    pub label: String,
}

impl PartialOrd for StatefulAggregate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        match self.id.cmp(&other.id) {
            Ordering::Equal => self.input.partial_cmp(&other.input),
            o => Some(o),
        }
    }
}

impl UserDefinedLogicalNodeCore for StatefulAggregate {
    fn name(&self) -> &str {
        "StatefulAggregate"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.input]
    }

    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }

    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}", self.label)
    }

    fn with_exprs_and_inputs(&self, _exprs: Vec<Expr>, inputs: Vec<LogicalPlan>) -> DfResult<Self> {
        Ok(StatefulAggregate {
            input: one_input(inputs)?,
            ..self.clone()
        })
    }

    /// The operator was built for its input's columns: it needs all of them.
    fn necessary_children_exprs(&self, _output_columns: &[usize]) -> Option<Vec<Vec<usize>>> {
        Some(vec![(0..self.input.schema().fields().len()).collect()])
    }
}

/// A streaming deduplication (Spark's `StreamingDeduplicate`): the operator `id` over its
/// input; its output is the input's rows that it keeps, so the schema is the input's.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd)]
pub struct StatefulDedup {
    pub id: usize,
    pub input: LogicalPlan,
    pub info: DedupInfo,
    /// What EXPLAIN shows.
    pub label: String,
}

impl UserDefinedLogicalNodeCore for StatefulDedup {
    fn name(&self) -> &str {
        "StatefulDedup"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.input]
    }

    fn schema(&self) -> &DFSchemaRef {
        self.input.schema()
    }

    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}", self.label)
    }

    fn with_exprs_and_inputs(&self, _exprs: Vec<Expr>, inputs: Vec<LogicalPlan>) -> DfResult<Self> {
        Ok(StatefulDedup {
            input: one_input(inputs)?,
            ..self.clone()
        })
    }

    /// Every column is part of the rows it keeps (and filters above must stay above: which
    /// row of a key comes first decides what is emitted).
    fn necessary_children_exprs(&self, _output_columns: &[usize]) -> Option<Vec<Vec<usize>>> {
        Some(vec![(0..self.input.schema().fields().len()).collect()])
    }
}

/// A stream-stream join (Spark's `StreamingSymmetricHashJoin`): the operator `id` over its
/// two inputs; its schema is the join's, so the plan above it is untouched.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StatefulJoin {
    pub id: usize,
    pub left: LogicalPlan,
    pub right: LogicalPlan,
    pub schema: DFSchemaRef,
    pub info: JoinInfo,
    /// What EXPLAIN shows.
    pub label: String,
}

impl PartialOrd for StatefulJoin {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        self.id.partial_cmp(&other.id)
    }
}

impl UserDefinedLogicalNodeCore for StatefulJoin {
    fn name(&self) -> &str {
        "StatefulJoin"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.left, &self.right]
    }

    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }

    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }

    /// Filters above stay above: a filter over one side would otherwise be copied onto
    /// both inputs.
    fn prevent_predicate_push_down_columns(&self) -> std::collections::HashSet<String> {
        self.schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect()
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}", self.label)
    }

    fn with_exprs_and_inputs(&self, _exprs: Vec<Expr>, inputs: Vec<LogicalPlan>) -> DfResult<Self> {
        let mut inputs = inputs.into_iter();
        match (inputs.next(), inputs.next()) {
            (Some(left), Some(right)) => Ok(StatefulJoin {
                left,
                right,
                ..self.clone()
            }),
            _ => Err(DataFusionError::Internal("a join has two inputs".into())),
        }
    }

    /// The stored rows are whole input rows.
    fn necessary_children_exprs(&self, _output_columns: &[usize]) -> Option<Vec<Vec<usize>>> {
        Some(vec![
            (0..self.left.schema().fields().len()).collect(),
            (0..self.right.schema().fields().len()).collect(),
        ])
    }
}

/// Pass-through that records event-time statistics for watermark node `id`.
#[derive(Debug)]
pub struct EventTimeWatermarkExec {
    id: usize,
    column: String,
    index: usize,
    input: Arc<dyn ExecutionPlan>,
    runtime: Arc<BatchRuntime>,
    cache: Arc<PlanProperties>,
}

impl EventTimeWatermarkExec {
    fn new(
        id: usize,
        column: String,
        input: Arc<dyn ExecutionPlan>,
        runtime: Arc<BatchRuntime>,
    ) -> DfResult<EventTimeWatermarkExec> {
        let index = input.schema().index_of(&column)?;
        // Rows pass through: the input's schema, partitioning and ordering.
        let cache = input.properties().clone();
        Ok(EventTimeWatermarkExec {
            id,
            column,
            index,
            input,
            runtime,
            cache,
        })
    }
}

impl DisplayAs for EventTimeWatermarkExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "EventTimeWatermarkExec: id={} column={}",
            self.id, self.column
        )
    }
}

impl ExecutionPlan for EventTimeWatermarkExec {
    fn name(&self) -> &str {
        "EventTimeWatermarkExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.cache
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let input = children.into_iter().next().ok_or_else(|| {
            DataFusionError::Internal("EventTimeWatermarkExec needs an input".into())
        })?;
        Ok(Arc::new(EventTimeWatermarkExec::new(
            self.id,
            self.column.clone(),
            input,
            self.runtime.clone(),
        )?))
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        self.replace_children(
            children,
            ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute),
        )
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let (id, index, runtime) = (self.id, self.index, self.runtime.clone());
        let rows = self.input.execute(partition, context)?.map(move |b| {
            let b = runtime.without_skewed(id, b?, index).map_err(external)?;
            runtime.observe(id, b.column(index)).map_err(external)?;
            Ok(b)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(self.schema(), rows)))
    }
}

/// Runs stateful operator `id` over all of its inputs' rows of the batch (a join has two),
/// in one output partition. Each input's partitions are read in order, the inputs one after
/// the other, so a replayed batch gives the operator its rows in the same order.
#[derive(Debug)]
pub struct StatefulOperatorExec {
    id: usize,
    label: String,
    inputs: Vec<Arc<dyn ExecutionPlan>>,
    runtime: Arc<BatchRuntime>,
    cache: Arc<PlanProperties>,
}

impl StatefulOperatorExec {
    fn new(
        id: usize,
        label: String,
        schema: SchemaRef,
        inputs: Vec<Arc<dyn ExecutionPlan>>,
        runtime: Arc<BatchRuntime>,
    ) -> StatefulOperatorExec {
        let cache = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        StatefulOperatorExec {
            id,
            label,
            inputs,
            runtime,
            cache,
        }
    }
}

impl DisplayAs for StatefulOperatorExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "StatefulOperatorExec: {}", self.label)
    }
}

impl ExecutionPlan for StatefulOperatorExec {
    fn name(&self) -> &str {
        "StatefulOperatorExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.cache
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        self.inputs.iter().collect()
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false; self.inputs.len()]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        if children.len() != self.inputs.len() {
            return Err(DataFusionError::Internal(format!(
                "StatefulOperatorExec needs {} inputs",
                self.inputs.len()
            )));
        }
        Ok(Arc::new(StatefulOperatorExec::new(
            self.id,
            self.label.clone(),
            self.schema(),
            children,
            self.runtime.clone(),
        )))
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        self.replace_children(
            children,
            ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute),
        )
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "StatefulOperatorExec has one partition, not {partition}"
            )));
        }
        let (id, inputs, runtime, schema) = (
            self.id,
            self.inputs.clone(),
            self.runtime.clone(),
            self.schema(),
        );
        let out_schema = schema.clone();
        let rows = futures::stream::once(async move {
            let mut rows = Vec::with_capacity(inputs.len());
            for input in inputs {
                rows.push(
                    datafusion::physical_plan::collect_partitioned(input, context.clone())
                        .await?
                        .into_iter()
                        .flatten()
                        .collect(),
                );
            }
            let emitted = runtime.process(id, rows).await.map_err(external)?;
            let batches = emitted
                .iter()
                .map(|cols| super::cast_to_schema(cols, &out_schema))
                .collect::<Result<Vec<_>>>()
                .map_err(external)?;
            Ok::<_, DataFusionError>(futures::stream::iter(batches.into_iter().map(Ok)))
        })
        .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, rows)))
    }
}

struct StreamingExtensionPlanner {
    runtime: Arc<BatchRuntime>,
}

#[async_trait]
impl ExtensionPlanner for StreamingExtensionPlanner {
    async fn plan_extension(
        &self,
        _planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        _logical_inputs: &[&LogicalPlan],
        physical_inputs: &[Arc<dyn ExecutionPlan>],
        _session: &dyn Session,
        _planning_ctx: &PhysicalPlanningContext,
    ) -> DfResult<Option<Arc<dyn ExecutionPlan>>> {
        let input = || {
            physical_inputs
                .first()
                .cloned()
                .ok_or_else(|| DataFusionError::Internal("a streaming node needs an input".into()))
        };
        if let Some(w) = node.as_any().downcast_ref::<EventTimeWatermark>() {
            return Ok(Some(Arc::new(EventTimeWatermarkExec::new(
                w.id,
                w.column.clone(),
                input()?,
                self.runtime.clone(),
            )?)));
        }
        if let Some(a) = node.as_any().downcast_ref::<StatefulAggregate>() {
            return Ok(Some(Arc::new(StatefulOperatorExec::new(
                a.id,
                a.label.clone(),
                Arc::new(a.schema.as_arrow().clone()),
                vec![input()?],
                self.runtime.clone(),
            ))));
        }
        if let Some(d) = node.as_any().downcast_ref::<StatefulDedup>() {
            let input = input()?;
            return Ok(Some(Arc::new(StatefulOperatorExec::new(
                d.id,
                d.label.clone(),
                input.schema(),
                vec![input],
                self.runtime.clone(),
            ))));
        }
        if let Some(j) = node.as_any().downcast_ref::<StatefulJoin>() {
            if physical_inputs.len() != 2 {
                return Err(DataFusionError::Internal("a join has two inputs".into()));
            }
            return Ok(Some(Arc::new(StatefulOperatorExec::new(
                j.id,
                j.label.clone(),
                Arc::new(j.schema.as_arrow().clone()),
                physical_inputs.to_vec(),
                self.runtime.clone(),
            ))));
        }
        Ok(None)
    }
}

/// DataFusion's planner, with the streaming nodes.
#[derive(Debug)]
pub struct StreamingQueryPlanner {
    runtime: Arc<BatchRuntime>,
}

#[async_trait]
impl QueryPlanner for StreamingQueryPlanner {
    async fn create_physical_plan(
        &self,
        plan: &LogicalPlan,
        session: &dyn Session,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        DefaultPhysicalPlanner::with_extension_planners(vec![Arc::new(StreamingExtensionPlanner {
            runtime: self.runtime.clone(),
        })])
        .create_physical_plan(plan, session)
        .await
    }
}

/// One stream a query reads: source `i` is the `i`-th distinct stream the query names.
#[derive(Debug, Clone)]
pub struct StreamInput {
    pub name: String,
    pub schema: SchemaRef,
    /// Its watermark, if it has one (the sink's `watermark` option or `WATERMARK FOR`).
    pub watermark: Option<WatermarkSpec>,
}

/// A watermark node of the plan.
#[derive(Debug, Clone)]
pub struct WatermarkNode {
    pub id: usize,
    pub stream: String,
    pub spec: WatermarkSpec,
}

/// What a stateful operator of the plan does.
#[derive(Debug, Clone)]
pub enum OperatorKind {
    Aggregate(AggregateInfo),
    Dedup(DedupInfo),
    Join(Box<JoinInfo>),
}

impl OperatorKind {
    pub fn aggregate(&self) -> Option<&AggregateInfo> {
        match self {
            OperatorKind::Aggregate(a) => Some(a),
            _ => None,
        }
    }
}

/// A stateful operator of the plan.
#[derive(Debug, Clone)]
pub struct OperatorNode {
    pub id: usize,
    pub kind: OperatorKind,
    /// The columns its input produces: what the operator is built for.
    pub input_schema: SchemaRef,
}

/// A static table a streaming query joins with (a `CREATE TABLE` table), read as of each
/// batch.
#[derive(Debug, Clone)]
pub struct StaticInput {
    pub name: String,
    pub table: Arc<dyn TableProvider>,
}

/// How the operators keep state: the store and partitions (for EXPLAIN), and how
/// deduplication keys expire.
#[derive(Debug, Clone)]
pub struct StateConfig {
    pub store: String,
    pub partitions: usize,
    pub dedup: DedupMode,
    /// The query runs over each micro-batch as a static table (a MERGE sink's `USING`
    /// query, Spark's foreachBatch): aggregations, DISTINCT, window functions and LIMIT
    /// apply to the batch alone, and no operator keeps state.
    pub per_batch: bool,
    /// `max_event_time_skew` (µs): rows whose event time is further ahead of their batch's
    /// processing time are set aside at the watermark nodes.
    pub max_event_time_skew_us: Option<i64>,
}

/// A sink's query as a plan of sources, watermarks, stateful operators and the stateless
/// rest, ready to run batch after batch.
pub struct StreamingPlan {
    /// The logical plan with the streaming nodes (not yet optimized).
    pub plan: LogicalPlan,
    pub sources: Vec<StreamInput>,
    tables: Vec<Arc<BatchTable>>,
    pub watermarks: Vec<WatermarkNode>,
    pub operators: Vec<OperatorNode>,
    pub mode: OutputMode,
    /// The output column that tells when a row is final, if there is one.
    pub output_time: Option<RowTime>,
    ctx: SessionContext,
    runtime: Arc<BatchRuntime>,
    /// The physical plan, made by the first batch and reset for each next one, when the
    /// plan calls no function whose value may change between batches (`now()`, `random()`):
    /// its scans read each batch's rows when they run.
    physical: Mutex<Option<Arc<dyn ExecutionPlan>>>,
    reusable: bool,
}

/// Whether every function `plan` calls is immutable: planning it again would give the same
/// physical plan.
fn only_immutable_functions(plan: &LogicalPlan) -> bool {
    use datafusion::logical_expr::Volatility;
    let mut immutable = true;
    let _ = plan.apply(|node| {
        node.apply_expressions(|e| {
            e.apply(|e| {
                let volatility = match e {
                    Expr::ScalarFunction(f) => Some(f.func.signature().volatility),
                    Expr::AggregateFunction(f) => Some(f.func.signature().volatility),
                    _ => None,
                };
                if volatility.is_some_and(|v| v != Volatility::Immutable) {
                    immutable = false;
                    return Ok(TreeNodeRecursion::Stop);
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })?;
        node.apply_subqueries(|sub| {
            if !only_immutable_functions(sub) {
                immutable = false;
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        Ok(if immutable {
            TreeNodeRecursion::Continue
        } else {
            TreeNodeRecursion::Stop
        })
    });
    immutable
}

/// The context a query plans in: UTC, the window functions, the streaming planner.
/// DataFusion's leaf-expression pushdown stays off: it would move a field access such as
/// `w.start` below a stateful node whose schema is its input's (a deduplication, a
/// watermark), giving the operator columns it was not built for.
fn streaming_context(runtime: Arc<BatchRuntime>, partitions: usize) -> SessionContext {
    let config = SessionConfig::new()
        .with_target_partitions(partitions)
        .with_information_schema(false)
        .set_str("datafusion.execution.time_zone", "UTC")
        .set_bool(
            "datafusion.optimizer.enable_leaf_expression_pushdown",
            false,
        );
    let state = SessionStateBuilder::new()
        .with_config(config)
        .with_default_features()
        .with_query_planner(Arc::new(StreamingQueryPlanner { runtime }))
        .build();
    let ctx = SessionContext::new_with_state(state);
    super::window::register_udfs(&ctx);
    super::json::register_udfs(&ctx);
    ctx.add_analyzer_rule(Arc::new(super::checked::CheckedArithmetic));
    ctx
}

/// Columns of `plan`'s output that carry the watermark mark (spec §3.1, §4.3): the
/// watermarked column, a window or session window over it, `window_time` of such a window,
/// through projections (by alias), filters, aliases and unions.
pub fn marked_columns(plan: &LogicalPlan) -> Vec<String> {
    match plan {
        LogicalPlan::Extension(e) => {
            if let Some(w) = e.node.as_any().downcast_ref::<EventTimeWatermark>() {
                // Declaring a watermark removes the mark from any other column (§2.1).
                vec![w.column.clone()]
            } else if let Some(a) = e.node.as_any().downcast_ref::<StatefulAggregate>() {
                a.marked.clone()
            } else if let Some(d) = e.node.as_any().downcast_ref::<StatefulDedup>() {
                marked_columns(&d.input)
            } else if let Some(j) = e.node.as_any().downcast_ref::<StatefulJoin>() {
                let mut marks = marked_columns(&j.left);
                if j.info.kind != JoinKind::LeftSemi {
                    marks.extend(marked_columns(&j.right));
                }
                marks.retain(|m| j.schema.has_column_with_unqualified_name(m));
                marks
            } else {
                vec![]
            }
        }
        LogicalPlan::Projection(p) => {
            let input = marked_columns(&p.input);
            p.expr
                .iter()
                .zip(p.schema.fields())
                .filter(|(e, _)| carries_mark(e, &input))
                .map(|(_, f)| f.name().clone())
                .collect()
        }
        LogicalPlan::Union(u) => {
            let mut positions = BTreeSet::new();
            for input in &u.inputs {
                let m = marked_columns(input);
                for (i, f) in input.schema().fields().iter().enumerate() {
                    if m.contains(f.name()) {
                        positions.insert(i);
                    }
                }
            }
            positions
                .into_iter()
                .filter_map(|i| u.schema.fields().get(i).map(|f| f.name().clone()))
                .collect()
        }
        // A join with a static table: the stream side's marks (the static side has none).
        LogicalPlan::Join(j) => {
            let mut marks = marked_columns(&j.left);
            marks.extend(marked_columns(&j.right));
            marks.retain(|m| j.schema.has_column_with_unqualified_name(m));
            marks
        }
        LogicalPlan::Filter(_)
        | LogicalPlan::SubqueryAlias(_)
        | LogicalPlan::Sort(_)
        | LogicalPlan::Limit(_)
        | LogicalPlan::Repartition(_) => plan
            .inputs()
            .first()
            .map(|i| marked_columns(i))
            .unwrap_or_default(),
        _ => vec![],
    }
}

/// Whether `e` is a marked column, `window_time` of one, or a (tumbling) `window` over one
/// (Spark's `TimeWindowing` gives the window the time column's watermark metadata).
fn carries_mark(e: &Expr, marked: &[String]) -> bool {
    match e.clone().unalias() {
        Expr::Column(c) => marked.contains(&c.name),
        Expr::ScalarFunction(f) if matches!(f.func.name(), "window_time" | "window") => {
            matches!(f.args.first(), Some(Expr::Column(c)) if marked.contains(&c.name))
        }
        _ => false,
    }
}

/// Whether `e` is `window(...)` or `session_window(...)`.
fn is_window_call(e: &Expr) -> bool {
    matches!(e, Expr::ScalarFunction(f) if f.func.name() == "window" || f.func.name() == "session_window")
}

/// Plans and rewrites; `state` only labels EXPLAIN.
struct Builder<'a> {
    sources: &'a [StreamInput],
    mode: OutputMode,
    state: &'a StateConfig,
    dedup: DedupMode,
    /// Whether a rewrite changed a column's type, so that the schemas above it must be
    /// computed again.
    retyped: bool,
    watermarks: Vec<WatermarkNode>,
    operators: Vec<OperatorNode>,
}

impl Builder<'_> {
    fn rewrite(&mut self, node: LogicalPlan) -> Result<Transformed<LogicalPlan>> {
        if self.state.per_batch && !matches!(node, LogicalPlan::TableScan(_)) {
            return Ok(Transformed::no(node));
        }
        match node {
            LogicalPlan::TableScan(scan) => {
                let name = scan.table_name.table().to_string();
                let spec = self
                    .sources
                    .iter()
                    .find(|s| s.name == name)
                    .and_then(|s| s.watermark.clone());
                let Some(spec) = spec else {
                    return Ok(Transformed::no(LogicalPlan::TableScan(scan)));
                };
                let id = self.watermarks.len();
                self.watermarks.push(WatermarkNode {
                    id,
                    stream: name,
                    spec: spec.clone(),
                });
                Ok(Transformed::yes(LogicalPlan::Extension(Extension {
                    node: Arc::new(EventTimeWatermark {
                        id,
                        column: spec.column,
                        delay_us: spec.delay_us,
                        input: LogicalPlan::TableScan(scan),
                    }),
                })))
            }
            LogicalPlan::Aggregate(mut agg) => {
                // The operator evaluates the aggregates itself, from this plan (before the
                // analyzer): their arguments are coerced and their integer sums and
                // arithmetic checked here (engine::checked); the names, and so the schema,
                // stay the same.
                let input_schema = agg.input.schema().clone();
                agg.aggr_expr = agg
                    .aggr_expr
                    .into_iter()
                    .map(|e| super::checked::analyze_aggregate_expr(e, &input_schema))
                    .collect::<DfResult<_>>()?;
                let mut marked = marked_columns(&agg.input);
                // window(window_time(w), ...) groups by an expression that carries the mark:
                // compute it as a column below, so the operator assigns windows over it.
                let mut lifted = Vec::new();
                let mut group_expr = Vec::with_capacity(agg.group_expr.len());
                for (i, g) in agg.group_expr.iter().enumerate() {
                    let mut g = super::checked::check_expr(g.clone(), &input_schema)?.unalias();
                    if let Expr::ScalarFunction(f) = &mut g
                        && is_window_call(&Expr::ScalarFunction(f.clone()))
                        && let Some(arg) = f.args.first()
                        && !matches!(arg, Expr::Column(_))
                        && carries_mark(arg, &marked)
                    {
                        let name = format!("__window_time_{i}");
                        lifted.push(arg.clone().alias(name.clone()));
                        f.args[0] = col(Column::new_unqualified(name.clone()));
                        marked.push(name);
                    }
                    group_expr.push(g);
                }
                let input = if lifted.is_empty() {
                    agg.input.as_ref().clone()
                } else {
                    let mut exprs: Vec<Expr> = agg
                        .input
                        .schema()
                        .columns()
                        .into_iter()
                        .map(Expr::Column)
                        .collect();
                    exprs.extend(lifted);
                    LogicalPlanBuilder::from(agg.input.as_ref().clone())
                        .project(exprs)?
                        .build()?
                };
                // The operator keeps only the columns its keys and aggregates read: window
                // assignment copies every input column once per window, and the scan and
                // the watermark below then read no more than that.
                let input = prune_to_used(input, group_expr.iter().chain(&agg.aggr_expr))?;
                let mut info = analyze_aggregate(&group_expr, &agg.aggr_expr, &marked, self.mode)?;
                info.group_names = agg
                    .group_expr
                    .iter()
                    .map(|g| g.human_display().to_string())
                    .collect();
                let id = self.operators.len();
                let out_marked = aggregate_marks(&info, &agg.schema);
                let label = operator_label(id, &info, self.mode, self.state);
                self.operators.push(OperatorNode {
                    id,
                    kind: OperatorKind::Aggregate(info),
                    input_schema: Arc::new(input.schema().as_arrow().clone()),
                });
                Ok(Transformed::yes(LogicalPlan::Extension(Extension {
                    node: Arc::new(StatefulAggregate {
                        id,
                        input,
                        schema: agg.schema.clone(),
                        marked: out_marked,
                        label,
                    }),
                })))
            }
            LogicalPlan::Distinct(distinct) => self.dedup(distinct).map(Transformed::yes),
            LogicalPlan::Join(join) if self.joins_two_streams(&join) => {
                self.stream_join(join).map(Transformed::yes)
            }
            LogicalPlan::Filter(filter) => {
                if let Some(plan) = push_into_join(&filter)? {
                    return Ok(Transformed::yes(plan));
                }
                match self.first_row_per_key(&filter)? {
                    Some(plan) => Ok(Transformed::yes(plan)),
                    None => Ok(Transformed::no(LogicalPlan::Filter(filter))),
                }
            }
            other => Ok(Transformed::no(other)),
        }
    }

    /// `SELECT DISTINCT` (every column is the key) and `SELECT DISTINCT ON (keys)` as a
    /// [`StatefulDedup`] over the rows below (spec §7).
    fn dedup(&mut self, distinct: Distinct) -> Result<LogicalPlan> {
        let (input, keys, select) = match distinct {
            Distinct::All(input) => {
                let keys = input
                    .schema()
                    .fields()
                    .iter()
                    .map(|f| f.name().clone())
                    .collect();
                (input.as_ref().clone(), keys, None)
            }
            Distinct::On(on) => {
                if on.sort_expr.is_some() {
                    return Err(Error::Unsupported {
                        message: "DISTINCT ON over a stream keeps the first row of each key in \
                                  arrival order; ORDER BY cannot choose another"
                            .into(),
                        hint: Some(
                            "Drop the ORDER BY, or keep the latest row per key with a MERGE \
                             sink."
                                .into(),
                        ),
                    });
                }
                let (input, keys) = keyed_input(on.input.as_ref().clone(), &on.on_expr)?;
                (input, keys, Some(on.select_expr))
            }
        };
        let node = self.dedup_node(input, keys)?;
        Ok(match select {
            None => node,
            Some(select) => LogicalPlanBuilder::from(node).project(select)?.build()?,
        })
    }

    /// Flink's and RisingWave's spelling of a deduplication, `WHERE rn = 1` over
    /// `row_number() OVER (PARTITION BY keys [ORDER BY event_time]) AS rn`: the same
    /// [`StatefulDedup`] over the window's input, `rn` the constant 1. `None` when `filter`
    /// is not that pattern.
    fn first_row_per_key(&mut self, filter: &Filter) -> Result<Option<LogicalPlan>> {
        use datafusion::logical_expr::{BinaryExpr, Operator};
        let rn = match filter.predicate.clone().unalias() {
            Expr::BinaryExpr(BinaryExpr {
                left,
                op: Operator::Eq,
                right,
            }) => match (*left, *right) {
                (Expr::Column(c), Expr::Literal(v, _)) | (Expr::Literal(v, _), Expr::Column(c))
                    if is_one(&v) =>
                {
                    c
                }
                _ => return Ok(None),
            },
            _ => return Ok(None),
        };
        let mut aliases = Vec::new();
        let mut node = filter.input.as_ref();
        while let LogicalPlan::SubqueryAlias(a) = node {
            aliases.push(a.alias.clone());
            node = a.input.as_ref();
        }
        let LogicalPlan::Projection(projection) = node else {
            return Ok(None);
        };
        let Some(rn_index) = projection.schema.index_of_column_by_name(None, &rn.name) else {
            return Ok(None);
        };
        let LogicalPlan::Window(window) = projection.input.as_ref() else {
            return Ok(None);
        };
        let [Expr::WindowFunction(f)] = window.window_expr.as_slice() else {
            return Ok(None);
        };
        if f.fun.name() != "row_number" || f.params.partition_by.is_empty() {
            return Ok(None);
        }
        let window_column = window
            .schema
            .field(window.input.schema().fields().len())
            .name()
            .clone();
        let reads_window = |e: &Expr| e.column_refs().iter().any(|c| c.name == window_column);
        if !matches!(projection.expr[rn_index].clone().unalias(), Expr::Column(c) if c.name == window_column)
            || projection
                .expr
                .iter()
                .enumerate()
                .any(|(i, e)| i != rn_index && reads_window(e))
        {
            return Ok(None);
        }
        // The first row is the first to arrive: an order by the event time, ascending, is
        // that order up to the watermark's delay; any other order is refused.
        let marked = marked_columns(&window.input);
        let by_event_time = match f.params.order_by.as_slice() {
            [] => true,
            [sort] => {
                sort.asc && matches!(&sort.expr, Expr::Column(c) if marked.first() == Some(&c.name))
            }
            _ => false,
        };
        if !by_event_time {
            return Err(Error::Unsupported {
                message: "row_number() = 1 over a stream keeps the first row of each key to \
                          arrive; it may order only by the watermarked event time, ascending"
                    .into(),
                hint: Some(
                    "Write ORDER BY <event time> (or no ORDER BY); for the latest row per key \
                     use an update-mode view or a MERGE sink."
                        .into(),
                ),
            });
        }
        let (input, keys) = keyed_input(window.input.as_ref().clone(), &f.params.partition_by)?;
        let dedup = self.dedup_node(input, keys)?;
        // A BIGINT, as Postgres's row_number() (DataFusion's is unsigned, which Delta and
        // Postgres clients do not have): the plan above is retyped after the rewrite.
        let field = projection.schema.field(rn_index);
        let mut exprs = projection.expr.clone();
        exprs[rn_index] = Expr::Literal(ScalarValue::Int64(Some(1)), None).alias(field.name());
        self.retyped = true;
        let mut plan = LogicalPlanBuilder::from(dedup).project(exprs)?.build()?;
        for alias in aliases.into_iter().rev() {
            plan = LogicalPlanBuilder::from(plan).alias(alias)?.build()?;
        }
        Ok(Some(plan))
    }

    fn joins_two_streams(&self, join: &datafusion::logical_expr::Join) -> bool {
        let names: Vec<String> = self.sources.iter().map(|s| s.name.clone()).collect();
        reads_stream(&join.left, &names) && reads_stream(&join.right, &names)
    }

    /// A join of two streams as a [`StatefulJoin`] (spec §8.2-8.3): the condition split
    /// into equi-join keys, conditions on one side and the rest; one-side conditions pushed
    /// into the inputs where Spark's optimizer pushes them (both sides of an inner or left
    /// semi join, the nullable side of an outer join), with the `IS NOT NULL` filters Spark
    /// infers from the condition; each side's state clean-up; Spark's refusals.
    fn stream_join(&mut self, join: datafusion::logical_expr::Join) -> Result<LogicalPlan> {
        use super::join::{Cleanup, JoinSide, conjuncts, reads_only, value_bounds};
        use datafusion::logical_expr::{BinaryExpr, Operator, utils::conjunction};
        let kind = JoinKind::of(join.join_type).ok_or_else(|| Error::Unsupported {
            message: format!(
                "{} join between two streams is not supported, as in Spark",
                join.join_type
            ),
            hint: Some(
                "Joins of two streams are INNER, LEFT, RIGHT and FULL OUTER, and LEFT SEMI.".into(),
            ),
        })?;
        if self.mode != OutputMode::Append {
            return Err(Error::Unsupported {
                message: format!(
                    "a join of two streams is not supported in {} output mode, as in Spark: \
                     its rows are final when emitted",
                    self.mode.as_str()
                ),
                hint: Some("Use output_mode = 'append'.".into()),
            });
        }
        let (ls, rs) = (join.left.schema().clone(), join.right.schema().clone());
        let mut conditions: Vec<Expr> = join
            .on
            .iter()
            .map(|(l, r)| l.clone().eq(r.clone()))
            .collect();
        if let Some(f) = &join.filter {
            conditions.extend(conjuncts(f));
        }
        let (mut left_keys, mut right_keys) = (Vec::new(), Vec::new());
        let (mut left_only, mut right_only, mut both) = (Vec::new(), Vec::new(), Vec::new());
        // Columns a null-intolerant comparison reads: Spark infers IS NOT NULL for them.
        let mut compared = Vec::new();
        for c in conditions {
            if let Expr::BinaryExpr(BinaryExpr { left, op, right }) = &c {
                if matches!(
                    op,
                    Operator::Eq
                        | Operator::NotEq
                        | Operator::Lt
                        | Operator::LtEq
                        | Operator::Gt
                        | Operator::GtEq
                ) {
                    compared.extend(c.column_refs().into_iter().cloned());
                }
                if *op == Operator::Eq
                    && !left.column_refs().is_empty()
                    && !right.column_refs().is_empty()
                {
                    if reads_only(left, &ls) && reads_only(right, &rs) {
                        left_keys.push(left.as_ref().clone());
                        right_keys.push(right.as_ref().clone());
                        continue;
                    }
                    if reads_only(left, &rs) && reads_only(right, &ls) {
                        left_keys.push(right.as_ref().clone());
                        right_keys.push(left.as_ref().clone());
                        continue;
                    }
                }
            }
            if c.is_volatile() {
                both.push(c);
            } else if reads_only(&c, &ls) {
                left_only.push(c);
            } else if reads_only(&c, &rs) {
                right_only.push(c);
            } else {
                both.push(c);
            }
        }
        // Spark's PushPredicateThroughJoin and InferFiltersFromConstraints.
        let (push_left, push_right) = match kind {
            JoinKind::Inner | JoinKind::LeftSemi => (true, true),
            JoinKind::LeftOuter => (false, true),
            JoinKind::RightOuter => (true, false),
            JoinKind::FullOuter => (false, false),
        };
        let not_null = |schema: &DFSchemaRef| -> Vec<Expr> {
            let mut seen = Vec::new();
            for c in &compared {
                if schema.has_column(c) && !seen.contains(c) {
                    seen.push(c.clone());
                }
            }
            seen.into_iter()
                .map(|c| Expr::Column(c).is_not_null())
                .collect()
        };
        let with_filter = |input: LogicalPlan, mut exprs: Vec<Expr>, extra: Vec<Expr>| {
            exprs.extend(extra);
            match conjunction(exprs) {
                Some(p) => LogicalPlanBuilder::from(input).filter(p)?.build(),
                None => Ok(input),
            }
        };
        let (left_filter, left) = if push_left {
            let extra = not_null(&ls);
            (
                None,
                with_filter(
                    join.left.as_ref().clone(),
                    std::mem::take(&mut left_only),
                    extra,
                )?,
            )
        } else {
            (
                conjunction(std::mem::take(&mut left_only)),
                join.left.as_ref().clone(),
            )
        };
        let (right_filter, right) = if push_right {
            let extra = not_null(&rs);
            (
                None,
                with_filter(
                    join.right.as_ref().clone(),
                    std::mem::take(&mut right_only),
                    extra,
                )?,
            )
        } else {
            (
                conjunction(std::mem::take(&mut right_only)),
                join.right.as_ref().clone(),
            )
        };
        let time_of = |plan: &LogicalPlan| -> Option<String> {
            marked_columns(plan).into_iter().find(|m| {
                plan.schema().fields().iter().any(|f| {
                    f.name() == m
                        && matches!(f.data_type(), DataType::Timestamp(..) | DataType::Struct(_))
                })
            })
        };
        let (left_time, right_time) = (time_of(&left), time_of(&right));
        let (left_marks, right_marks) = (marked_columns(&left), marked_columns(&right));
        // A key that carries the watermark: a marked time or window column, or a window
        // over a marked column written in the condition itself.
        let marked_key = |e: &Expr, marks: &[String], schema: &DFSchemaRef| match e {
            Expr::Column(c) => {
                marks.contains(&c.name)
                    && schema.qualified_field_from_column(c).is_ok_and(|(_, f)| {
                        matches!(f.data_type(), DataType::Timestamp(..) | DataType::Struct(_))
                    })
            }
            Expr::ScalarFunction(f) if f.func.name() == "window" => carries_mark(e, marks),
            _ => false,
        };
        let key_ordinal = left_keys
            .iter()
            .zip(&right_keys)
            .position(|(l, r)| marked_key(l, &left_marks, &ls) || marked_key(r, &right_marks, &rs));
        let left_bounds = value_bounds(&both, &ls, &rs, right_time.as_deref());
        let right_bounds = value_bounds(&both, &rs, &ls, left_time.as_deref());
        let cleanup = |time: &Option<String>, bounds: Vec<super::join::TimeBound>| match key_ordinal
        {
            Some(ordinal) => Cleanup::Key { ordinal },
            None if time.is_some() && !bounds.is_empty() => Cleanup::Value { bounds },
            None => Cleanup::Never,
        };
        // Spark's checkForStreamStreamJoinWatermark.
        let bounded = key_ordinal.is_some()
            || match kind {
                JoinKind::Inner => true,
                JoinKind::LeftOuter | JoinKind::LeftSemi => !left_bounds.is_empty(),
                JoinKind::RightOuter => !right_bounds.is_empty(),
                JoinKind::FullOuter => !left_bounds.is_empty() || !right_bounds.is_empty(),
            };
        if !bounded {
            let (kept, nullable) = match kind {
                JoinKind::RightOuter => ("right", "left"),
                JoinKind::FullOuter => ("either", "other"),
                _ => ("left", "right"),
            };
            return Err(Error::Unsupported {
                message: format!(
                    "{} join between two streams is not supported without a watermark in \
                     the join keys, or a watermark on the {nullable} side and a time-range \
                     condition that bounds how long the {kept} side's rows wait for a match, \
                     as in Spark",
                    kind.spark_name()
                ),
                hint: Some(
                    "Declare a watermark on both streams and add a range condition, for \
                     example ON c.ad_id = i.ad_id AND c.click_time >= i.impression_time AND \
                     c.click_time <= i.impression_time + INTERVAL '1 hour'."
                        .into(),
                ),
            });
        }
        let info = JoinInfo {
            kind,
            left: JoinSide {
                schema: left.schema().clone(),
                keys: left_keys,
                filter: left_filter,
                cleanup: cleanup(&left_time, left_bounds),
                time: left_time,
            },
            right: JoinSide {
                schema: right.schema().clone(),
                keys: right_keys,
                filter: right_filter,
                cleanup: cleanup(&right_time, right_bounds),
                time: right_time,
            },
            residual: conjunction(both),
        };
        let id = self.operators.len();
        let label = format!(
            "StatefulJoin: id={id} {} state={} partitions={}",
            info.describe(),
            self.state.store,
            self.state.partitions
        );
        self.operators.push(OperatorNode {
            id,
            kind: OperatorKind::Join(Box::new(info.clone())),
            input_schema: Arc::new(left.schema().as_arrow().clone()),
        });
        Ok(LogicalPlan::Extension(Extension {
            node: Arc::new(StatefulJoin {
                id,
                left,
                right,
                schema: join.schema.clone(),
                info,
                label,
            }),
        }))
    }

    /// A [`StatefulDedup`] on `keys` (input columns) over `input`.
    fn dedup_node(&mut self, input: LogicalPlan, keys: Vec<String>) -> Result<LogicalPlan> {
        if contains_aggregate(&input) {
            return Err(Error::unsupported(
                "deduplication (DISTINCT) after a streaming aggregation is not supported, as \
                 in Spark",
            ));
        }
        // The marked event time, else a marked window (`window(t, ...) AS w` below), whose
        // end is the time, as in Spark.
        let marked = marked_columns(&input);
        let of_type = |timestamp: bool| {
            marked.iter().find(|t| {
                input
                    .schema()
                    .qualified_field_with_unqualified_name(t)
                    .is_ok_and(|(_, f)| match f.data_type() {
                        DataType::Timestamp(..) => timestamp,
                        DataType::Struct(_) => !timestamp,
                        _ => false,
                    })
            })
        };
        let time = of_type(true).or_else(|| of_type(false)).cloned();
        let within_watermark_us = match self.dedup {
            DedupMode::First => None,
            DedupMode::WithinWatermark => {
                let Some(t) = &time else {
                    return Err(Error::Unsupported {
                        message: "deduplicate = 'within_watermark' needs a watermark on the \
                                  rows it deduplicates"
                            .into(),
                        hint: Some(
                            "Declare WATERMARK FOR on the stream, or set the watermark option."
                                .into(),
                        ),
                    });
                };
                Some(watermark_delay(&input, t)? as i64)
            }
        };
        let info = DedupInfo {
            keys,
            time,
            within_watermark_us,
        };
        let id = self.operators.len();
        let label = format!(
            "StatefulDedup: id={id} {} state={} partitions={}",
            info.describe(),
            self.state.store,
            self.state.partitions
        );
        self.operators.push(OperatorNode {
            id,
            kind: OperatorKind::Dedup(info.clone()),
            input_schema: Arc::new(input.schema().as_arrow().clone()),
        });
        Ok(LogicalPlan::Extension(Extension {
            node: Arc::new(StatefulDedup {
                id,
                input,
                info,
                label,
            }),
        }))
    }
}

/// A `WHERE` over a join of two streams, with its conjuncts over one side moved into that
/// side's input where Spark's `PushPredicateThroughJoin` moves them (both sides of an inner
/// join; the preserved side of an outer join; the left of a semi join): there they apply
/// before the join stores rows and, unless they read the event time, before the watermark
/// counts them. `None` when `filter` is not over such a join or nothing moves.
fn push_into_join(filter: &Filter) -> Result<Option<LogicalPlan>> {
    use super::join::{conjuncts, reads_only};
    use datafusion::logical_expr::utils::conjunction;
    let LogicalPlan::Extension(e) = filter.input.as_ref() else {
        return Ok(None);
    };
    let Some(join) = e.node.as_any().downcast_ref::<StatefulJoin>() else {
        return Ok(None);
    };
    let (to_left, to_right) = match join.info.kind {
        JoinKind::Inner => (true, true),
        JoinKind::LeftOuter | JoinKind::LeftSemi => (true, false),
        JoinKind::RightOuter => (false, true),
        JoinKind::FullOuter => (false, false),
    };
    let (ls, rs) = (join.left.schema(), join.right.schema());
    let (mut left, mut right, mut kept) = (Vec::new(), Vec::new(), Vec::new());
    for c in conjuncts(&filter.predicate) {
        if c.is_volatile() || c.column_refs().is_empty() {
            kept.push(c);
        } else if to_left && reads_only(&c, ls) {
            left.push(c);
        } else if to_right && reads_only(&c, rs) {
            right.push(c);
        } else {
            kept.push(c);
        }
    }
    if left.is_empty() && right.is_empty() {
        return Ok(None);
    }
    let below = |input: &LogicalPlan, exprs: Vec<Expr>| -> Result<LogicalPlan> {
        Ok(match conjunction(exprs) {
            Some(p) => LogicalPlanBuilder::from(input.clone()).filter(p)?.build()?,
            None => input.clone(),
        })
    };
    let node = StatefulJoin {
        left: below(&join.left, left)?,
        right: below(&join.right, right)?,
        ..join.clone()
    };
    let plan = LogicalPlan::Extension(Extension {
        node: Arc::new(node),
    });
    Ok(Some(match conjunction(kept) {
        Some(p) => LogicalPlanBuilder::from(plan).filter(p)?.build()?,
        None => plan,
    }))
}

/// `input` with the key expressions that are not plain columns computed as hidden columns
/// (`__distinct_on_i`), and the keys' column names.
fn keyed_input(input: LogicalPlan, key_exprs: &[Expr]) -> Result<(LogicalPlan, Vec<String>)> {
    let mut keys = Vec::new();
    let mut lifted = Vec::new();
    for (i, e) in key_exprs.iter().enumerate() {
        match e.clone().unalias() {
            Expr::Column(c) => {
                let idx = input.schema().index_of_column(&c)?;
                keys.push(input.schema().field(idx).name().clone());
            }
            other => {
                let name = format!("__distinct_on_{i}");
                lifted.push(other.alias(name.clone()));
                keys.push(name);
            }
        }
    }
    if lifted.is_empty() {
        return Ok((input, keys));
    }
    let mut exprs: Vec<Expr> = input
        .schema()
        .columns()
        .into_iter()
        .map(Expr::Column)
        .collect();
    exprs.extend(lifted);
    Ok((
        LogicalPlanBuilder::from(input).project(exprs)?.build()?,
        keys,
    ))
}

/// Whether `v` is the number 1.
fn is_one(v: &ScalarValue) -> bool {
    v.cast_to(&DataType::Int64)
        .is_ok_and(|v| v == ScalarValue::Int64(Some(1)))
}

/// How `SELECT DISTINCT` deduplicates (the sink's `deduplicate` option): Spark's
/// `dropDuplicates` or `dropDuplicatesWithinWatermark`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DedupMode {
    #[default]
    First,
    WithinWatermark,
}

impl DedupMode {
    /// The sink's `deduplicate` option.
    pub fn of(options: &crate::sql::options::Options) -> Result<DedupMode> {
        DedupMode::parse(options.get("deduplicate").unwrap_or("first"))
    }

    pub fn parse(s: &str) -> Result<DedupMode> {
        match s.to_ascii_lowercase().as_str() {
            "first" => Ok(DedupMode::First),
            "within_watermark" => Ok(DedupMode::WithinWatermark),
            other => Err(Error::InvalidOption {
                message: format!("invalid deduplicate \"{other}\""),
                hint: Some("Use 'first' or 'within_watermark'.".into()),
            }),
        }
    }
}

/// Whether a stateful aggregation is below (or at) `plan`.
fn contains_aggregate(plan: &LogicalPlan) -> bool {
    let mut found = false;
    let _ = plan.apply(|node| {
        if let LogicalPlan::Extension(e) = node
            && e.node
                .as_any()
                .downcast_ref::<StatefulAggregate>()
                .is_some()
        {
            found = true;
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

/// The delay of the watermark that marks `column` below `plan`: the watermark node on that
/// column, or the one delay every watermark node below shares (the column was renamed).
fn watermark_delay(plan: &LogicalPlan, column: &str) -> Result<u64> {
    let mut nodes = Vec::new();
    let _ = plan.apply(|node| {
        if let LogicalPlan::Extension(e) = node
            && let Some(w) = e.node.as_any().downcast_ref::<EventTimeWatermark>()
        {
            nodes.push((w.column.clone(), w.delay_us));
        }
        Ok(TreeNodeRecursion::Continue)
    });
    if let Some((_, d)) = nodes.iter().find(|(c, _)| c == column) {
        return Ok(*d);
    }
    match nodes.as_slice() {
        [(_, d), rest @ ..] if rest.iter().all(|(_, e)| e == d) => Ok(*d),
        _ => Err(Error::unsupported(format!(
            "deduplicate = 'within_watermark': the watermark delay of \"{column}\" is not \
             known"
        ))),
    }
}

/// `input` projected to the columns `exprs` read, in input order (unchanged when they read
/// all of them).
fn prune_to_used<'a>(
    input: LogicalPlan,
    exprs: impl Iterator<Item = &'a Expr>,
) -> DfResult<LogicalPlan> {
    let schema = input.schema().clone();
    let mut used = std::collections::BTreeSet::new();
    for e in exprs {
        for c in e.column_refs() {
            used.insert(schema.index_of_column(c)?);
        }
    }
    if used.len() == schema.fields().len() {
        return Ok(input);
    }
    // Arrow batches without columns lose their row count: `count(*)` keeps one column.
    if used.is_empty() {
        used.insert(0);
    }
    let columns = schema.columns();
    LogicalPlanBuilder::from(input)
        .project(used.into_iter().map(|i| Expr::Column(columns[i].clone())))?
        .build()
}

/// The aggregation's output columns that carry the mark: its key time, if any.
fn aggregate_marks(info: &AggregateInfo, schema: &DFSchemaRef) -> Vec<String> {
    let position = match (info.key_time, &info.window) {
        (Some(KeyTime::Window), Some(w)) => Some(w.position),
        (Some(KeyTime::Column(k)), window) => {
            // Keys other than the window, in order, around the window's position.
            let w = window.as_ref().map(|w| w.position);
            (0..info.group_names.len()).filter(|i| Some(*i) != w).nth(k)
        }
        _ => None,
    };
    position
        .and_then(|p| schema.fields().get(p))
        .map(|f| vec![f.name().clone()])
        .unwrap_or_default()
}

/// The one line EXPLAIN shows for a stateful aggregation.
fn operator_label(id: usize, a: &AggregateInfo, mode: OutputMode, state: &StateConfig) -> String {
    let dur = |us: i64| crate::sql::options::format_duration(Duration::from_micros(us as u64));
    let window = match a.window.as_ref().map(|w| (w.kind, &w.time_column)) {
        Some((WindowKind::Fixed(spec), col)) => format!(
            " window={} size={} slide={} over {}",
            if spec.is_tumbling() {
                "tumbling"
            } else {
                "sliding"
            },
            dur(spec.size),
            dur(spec.slide),
            display_column(col)
        ),
        Some((WindowKind::Session { gap }, col)) => {
            format!(
                " window=session gap={} over {}",
                dur(gap),
                display_column(col)
            )
        }
        None => String::new(),
    };
    let closes = match a.key_time {
        Some(KeyTime::Window) => "window.end".to_string(),
        Some(KeyTime::Column(i)) => a.keys[i].to_string(),
        None => String::new(),
    };
    let rule = match (mode, a.key_time.is_some()) {
        (OutputMode::Append | OutputMode::Update, true) => {
            format!(" late/evict: {closes} <= WM(N-1) / WM(N)")
        }
        (OutputMode::Complete, true)
            if matches!(
                a.window.as_ref().map(|w| w.kind),
                Some(WindowKind::Session { .. })
            ) =>
        {
            format!(" late: {closes} <= WM(N-1); nothing evicted")
        }
        (OutputMode::Complete, _) => " nothing late, nothing evicted".to_string(),
        (_, false) => " no watermarked key: nothing late, nothing evicted".to_string(),
    };
    format!(
        "StatefulAggregate: id={id} keys=[{}] aggregates=[{}]{window}{rule} state={} partitions={}",
        a.group_names.join(", "),
        a.aggregates
            .iter()
            .map(|e| e.human_display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
        state.store,
        state.partitions
    )
}

fn display_column(c: &str) -> String {
    c.strip_prefix("__window_time_")
        .map(|_| "window_time(...)".to_string())
        .unwrap_or_else(|| c.to_string())
}

/// Whether `plan` reads one of the `streams`.
fn reads_stream(plan: &LogicalPlan, streams: &[String]) -> bool {
    let mut found = false;
    let _ = plan.apply_with_subqueries(|node| {
        if let LogicalPlan::TableScan(scan) = node
            && streams.iter().any(|s| s == scan.table_name.table())
        {
            found = true;
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

/// Spark's rules for a join of a stream with a static table (spec §8.1): the stream must be
/// on the side whose rows are all kept (an outer join's preserved side, a semi or anti
/// join's left); `None` when the join is allowed.
fn stream_static_refusal(
    join: &datafusion::logical_expr::Join,
    streams: &[String],
) -> Option<Error> {
    use datafusion::logical_expr::JoinType;
    let (left, right) = (
        reads_stream(&join.left, streams),
        reads_stream(&join.right, streams),
    );
    let allowed = match (left, right) {
        // A join of two streams: the builder's (`stream_join`).
        (true, true) | (false, false) => true,
        (true, false) => matches!(
            join.join_type,
            JoinType::Inner | JoinType::Left | JoinType::LeftSemi | JoinType::LeftAnti
        ),
        (false, true) => matches!(
            join.join_type,
            JoinType::Inner | JoinType::Right | JoinType::RightSemi | JoinType::RightAnti
        ),
    };
    if allowed {
        return None;
    }
    let (stream_side, static_side) = if left {
        ("left", "right")
    } else {
        ("right", "left")
    };
    Some(Error::Unsupported {
        message: format!(
            "{} join with a stream on the {stream_side} and a static table on the \
             {static_side} is not supported, as in Spark: the static side's unmatched rows \
             would have to wait for the whole stream",
            join.join_type
        ),
        hint: Some(
            "Put the stream on the preserved side (stream LEFT JOIN table), or use an inner \
             join."
                .into(),
        ),
    })
}

/// Refuses query shapes Tidemark does not run on streams (spec §5.2); over each batch
/// alone (`per_batch`), a LIMIT is the batch's. Joins with static tables follow Spark's
/// rules; joins of two streams are refused.
fn check_shape(plan: &LogicalPlan, per_batch: bool, streams: &[String]) -> Result<()> {
    let mut err = None;
    plan.apply_with_subqueries(|node| {
        let refusal = match node {
            LogicalPlan::Limit(_) if !per_batch => {
                Some(Error::unsupported("LIMIT is not supported in sinks yet"))
            }
            LogicalPlan::Join(join) => stream_static_refusal(join, streams),
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

impl StreamingPlan {
    /// Plans `sql` (after `sql::expand_window_refs`) over `sources` and checks it against
    /// Spark's rules for `mode`.
    pub async fn build(
        sql: &str,
        sources: Vec<StreamInput>,
        statics: &[StaticInput],
        mode: OutputMode,
        state: &StateConfig,
        partitions: usize,
    ) -> Result<StreamingPlan> {
        let dedup = state.dedup;
        let runtime = Arc::new(BatchRuntime {
            skew_us: state.max_event_time_skew_us,
            ..BatchRuntime::default()
        });
        let ctx = streaming_context(runtime.clone(), partitions);
        let mut tables = Vec::with_capacity(sources.len());
        for s in &sources {
            let table = Arc::new(BatchTable::new(s.schema.clone(), partitions));
            ctx.register_table(TableReference::bare(s.name.clone()), table.clone())?;
            tables.push(table);
        }
        for t in statics {
            ctx.register_table(TableReference::bare(t.name.clone()), t.table.clone())?;
        }
        let plan = ctx.state().create_logical_plan(sql).await?;
        let stream_names: Vec<String> = sources.iter().map(|s| s.name.clone()).collect();
        check_shape(&plan, state.per_batch, &stream_names)?;
        let mut builder = Builder {
            sources: &sources,
            mode,
            state,
            dedup,
            retyped: false,
            watermarks: vec![],
            operators: vec![],
        };
        let rewritten = plan
            .clone()
            .transform_up(|node| builder.rewrite(node).map_err(external))?;
        let mut plan = rewritten.data;
        if builder.retyped {
            plan = plan
                .transform_up(|n| n.recompute_schema().map(Transformed::yes))?
                .data;
        }
        // The row_number() = 1 pattern became a deduplication; other window functions
        // remain.
        let mut window = false;
        plan.apply_with_subqueries(|n| {
            window |= matches!(n, LogicalPlan::Window(_));
            Ok(if window {
                TreeNodeRecursion::Stop
            } else {
                TreeNodeRecursion::Continue
            })
        })?;
        if window && !state.per_batch {
            return Err(Error::Unsupported {
                message: "window functions (OVER) are not supported on streams".into(),
                hint: Some(
                    "row_number() OVER (PARTITION BY keys [ORDER BY event time]) = 1 is \
                     supported, as a deduplication."
                        .into(),
                ),
            });
        }
        let (watermarks, mut operators) = (builder.watermarks, builder.operators);
        *runtime
            .joins_below
            .write()
            .unwrap_or_else(|e| e.into_inner()) = joins_below(&plan, operators.len());
        let aggregations = operators
            .iter()
            .filter(|o| o.kind.aggregate().is_some())
            .count();
        if !state.per_batch {
            check_plan(&plan, aggregations, mode)?;
        }
        // Deduplication never comes after an aggregation: the last operator is the top one.
        let output_time = match operators.last_mut().map(|o| &mut o.kind) {
            Some(OperatorKind::Aggregate(top)) => {
                let schema = top_aggregate_schema(&plan)?;
                set_output_keys(top, &plan, &schema, mode)?;
                find_output_time(&plan, &schema, top)
            }
            _ => stateless_output_time(&plan),
        };
        // A static table is read as of each batch (its latest version, as Spark re-reads a
        // Delta table per micro-batch): such a plan is made again for every batch.
        let reusable = statics.is_empty() && only_immutable_functions(&plan);
        Ok(StreamingPlan {
            plan,
            sources,
            tables,
            watermarks,
            operators,
            mode,
            output_time,
            ctx,
            runtime,
            physical: Mutex::new(None),
            reusable,
        })
    }

    /// The information about the plan's last (top) aggregation, if any.
    pub fn top_aggregate(&self) -> Option<&AggregateInfo> {
        self.operators.last().and_then(|o| o.kind.aggregate())
    }

    /// The plan as EXPLAIN shows it.
    pub fn display(&self) -> String {
        self.plan.display_indent().to_string()
    }

    /// The output columns, as the sink writes them.
    pub fn output_schema(&self) -> SchemaRef {
        Arc::new(self.plan.schema().as_arrow().clone())
    }

    /// Opens the stateful operators, in id order.
    pub fn set_operators(&self, operators: Vec<Box<dyn StatefulOperator>>) {
        *self
            .runtime
            .operators
            .write()
            .unwrap_or_else(|e| e.into_inner()) = operators
            .into_iter()
            .map(|o| Arc::new(tokio::sync::Mutex::new(o)))
            .collect();
    }

    fn shared_operators(&self) -> Vec<SharedOperator> {
        self.runtime
            .operators
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Runs `f` on each operator, in id order.
    pub async fn for_each_operator<T>(
        &self,
        mut f: impl FnMut(usize, &mut dyn StatefulOperator) -> Result<T>,
    ) -> Result<Vec<T>> {
        let ops = self.shared_operators();
        let mut out = Vec::with_capacity(ops.len());
        for (i, op) in ops.iter().enumerate() {
            let mut op = op.lock().await;
            out.push(f(i, op.as_mut())?);
        }
        Ok(out)
    }

    /// Commits every operator's state as `version` on a blocking thread, so that the sink
    /// can write at the same time (both must be durable before the commit log).
    pub fn commit_operators(
        &self,
        version: u64,
    ) -> tokio::task::JoinHandle<Result<Vec<crate::state::StateMetrics>>> {
        let ops = self.shared_operators();
        tokio::task::spawn_blocking(move || {
            ops.iter()
                .map(|op| op.blocking_lock().commit(version))
                .collect()
        })
    }

    /// Spark's names for the operators, by id.
    pub async fn operator_names(&self) -> Vec<&'static str> {
        self.for_each_operator(|_, op| Ok(op.name()))
            .await
            .unwrap_or_default()
    }

    /// Sets source `i`'s rows for the next batch.
    pub fn set_rows(&self, i: usize, partitions: Vec<Vec<RecordBatch>>) {
        if let Some(t) = self.tables.get(i) {
            t.set(partitions);
        }
    }

    /// Plans (or reuses the plan of the previous batch) and runs one batch: `(WM_late,
    /// WM_evict)` in microseconds. Returns the rows, the planning time, each watermark node's statistics and each operator's counters.
    pub async fn execute(
        &self,
        late_us: i64,
        evict_us: i64,
        batch_time_us: i64,
    ) -> Result<BatchOutput> {
        self.runtime
            .begin(late_us, evict_us, batch_time_us, self.watermarks.len());
        let t = std::time::Instant::now();
        let cached = lock(&self.physical).clone();
        let physical = match cached {
            Some(p) => datafusion::physical_plan::execution_plan::reset_plan_states(p)?,
            None => {
                let p = self.ctx.state().create_physical_plan(&self.plan).await?;
                if self.reusable {
                    *lock(&self.physical) = Some(p.clone());
                }
                p
            }
        };
        let planning = t.elapsed();
        let rows = datafusion::physical_plan::collect(physical, self.ctx.task_ctx()).await?;
        let stats = std::mem::take(&mut *lock(&self.runtime.stats));
        let operators = std::mem::take(&mut *lock(&self.runtime.results));
        let skewed = std::mem::take(&mut *lock(&self.runtime.skewed));
        Ok(BatchOutput {
            rows,
            planning,
            stats,
            operators,
            skewed,
        })
    }
}

/// Per operator id: the stream-stream joins in its input, whose output watermark its input
/// watermark is (spec §2.6).
fn joins_below(plan: &LogicalPlan, operators: usize) -> Vec<Vec<JoinInfo>> {
    fn joins_in(plan: &LogicalPlan, out: &mut Vec<JoinInfo>) {
        let _ = plan.apply(|node| {
            if let LogicalPlan::Extension(e) = node
                && let Some(j) = e.node.as_any().downcast_ref::<StatefulJoin>()
            {
                out.push(j.info.clone());
            }
            Ok(TreeNodeRecursion::Continue)
        });
    }
    let mut below = vec![Vec::new(); operators];
    let _ = plan.apply(|node| {
        if let LogicalPlan::Extension(e) = node {
            let id = if let Some(a) = e.node.as_any().downcast_ref::<StatefulAggregate>() {
                Some(a.id)
            } else if let Some(d) = e.node.as_any().downcast_ref::<StatefulDedup>() {
                Some(d.id)
            } else {
                e.node.as_any().downcast_ref::<StatefulJoin>().map(|j| j.id)
            };
            if let Some(slot) = id.and_then(|id| below.get_mut(id)) {
                for input in e.node.inputs() {
                    joins_in(input, slot);
                }
            }
        }
        Ok(TreeNodeRecursion::Continue)
    });
    below
}

/// What one execution of the plan produced.
pub struct BatchOutput {
    pub rows: Vec<RecordBatch>,
    pub planning: Duration,
    /// By watermark node id.
    pub stats: Vec<EventTimeStats>,
    /// By operator id; `None` if the operator did not run.
    pub operators: Vec<Option<OperatorBatch>>,
    /// Rows set aside for their skew, with their watermark node's id.
    pub skewed: Vec<(usize, DroppedRows)>,
}

/// The output schema of the top `StatefulAggregate`.
/// The output column of a query without aggregation that tells when a row is final: the
/// first one that carries the watermark mark (the event time, or a window over it).
fn stateless_output_time(plan: &LogicalPlan) -> Option<RowTime> {
    let schema = plan.schema();
    marked_columns(plan).into_iter().find_map(|column| {
        let (_, field) = schema.qualified_field_with_unqualified_name(&column).ok()?;
        match field.data_type() {
            DataType::Timestamp(..) => Some(RowTime::EventTime { column }),
            DataType::Struct(_) => Some(RowTime::WindowEnd {
                column,
                field: Some("end".into()),
                plus_us: 0,
            }),
            _ => None,
        }
    })
}

fn top_aggregate_schema(plan: &LogicalPlan) -> Result<datafusion::common::DFSchema> {
    let mut found = None;
    plan.apply(|node| {
        if let LogicalPlan::Extension(e) = node
            && let Some(a) = e.node.as_any().downcast_ref::<StatefulAggregate>()
        {
            found = Some(a.schema.as_ref().clone());
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    found.ok_or_else(|| Error::Internal("no stateful aggregate in the plan".into()))
}

/// How several watermarks make the global one (Spark's
/// `spark.sql.streaming.multipleWatermarkPolicy`, the `multiple_watermark_policy` option).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WatermarkPolicy {
    /// The slowest input sets the pace: nothing of any input is late before its time.
    #[default]
    Min,
    /// The fastest input sets the pace: the slower ones' rows may be dropped as late.
    Max,
}

impl WatermarkPolicy {
    pub fn parse(s: &str) -> Result<WatermarkPolicy> {
        match s.to_ascii_lowercase().as_str() {
            "min" => Ok(WatermarkPolicy::Min),
            "max" => Ok(WatermarkPolicy::Max),
            other => Err(Error::InvalidOption {
                message: format!("invalid multiple_watermark_policy \"{other}\""),
                hint: Some("Use 'min' or 'max'.".into()),
            }),
        }
    }

    /// The sink's `multiple_watermark_policy` option (checked when the sink was created).
    pub fn of(options: &crate::sql::options::Options) -> Result<WatermarkPolicy> {
        WatermarkPolicy::parse(options.get("multiple_watermark_policy").unwrap_or("min"))
    }

    pub fn as_str(self) -> &'static str {
        match self {
            WatermarkPolicy::Min => "min",
            WatermarkPolicy::Max => "max",
        }
    }
}

/// Spark's multiple-watermark policies (spec §2.2): each node's watermark moves to
/// `max event time - delay` when it saw rows and never goes down; unset nodes count as 0;
/// the global watermark moves to the minimum (`min`) or maximum (`max`) of the nodes' only
/// if that is larger.
pub fn advance_watermark(
    global_ms: i64,
    node_wms: &mut [Option<i64>],
    candidates: &[Option<i64>],
    policy: WatermarkPolicy,
) -> i64 {
    for (wm, c) in node_wms.iter_mut().zip(candidates) {
        if let Some(c) = c {
            *wm = Some(wm.map_or(*c, |w| w.max(*c)));
        }
    }
    if node_wms.is_empty() {
        return global_ms;
    }
    let values = node_wms.iter().map(|w| w.unwrap_or(0));
    let chosen = match policy {
        WatermarkPolicy::Min => values.min(),
        WatermarkPolicy::Max => values.max(),
    }
    .unwrap_or(0);
    global_ms.max(chosen).max(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_plan_is_reused_only_when_its_functions_are_immutable() {
        let ctx = SessionContext::new();
        let plan = |sql: &'static str| {
            let ctx = ctx.clone();
            async move { ctx.sql(sql).await.unwrap().into_unoptimized_plan() }
        };
        assert!(only_immutable_functions(&plan("SELECT abs(-1) + 1").await));
        assert!(!only_immutable_functions(&plan("SELECT now()").await));
        assert!(!only_immutable_functions(
            &plan("SELECT random() AS r").await
        ));
        assert!(!only_immutable_functions(
            &plan("SELECT 1 WHERE 1 IN (SELECT CAST(random() AS INT))").await
        ));
    }

    const MIN: WatermarkPolicy = WatermarkPolicy::Min;

    #[test]
    fn max_policy_follows_the_fastest_input() {
        let max = WatermarkPolicy::Max;
        let mut nodes = vec![None, None];
        // One input has rows: the other counts as 0, the maximum is the first's.
        assert_eq!(
            advance_watermark(0, &mut nodes, &[Some(5_000), None], max),
            5_000
        );
        assert_eq!(
            advance_watermark(5_000, &mut nodes, &[None, Some(3_000)], max),
            5_000
        );
        assert_eq!(
            advance_watermark(5_000, &mut nodes, &[None, Some(9_000)], max),
            9_000
        );
        // Never down, though the node that moved it is now behind the other's new rows.
        assert_eq!(
            advance_watermark(9_000, &mut nodes, &[Some(6_000), Some(1_000)], max),
            9_000
        );
        assert_eq!(nodes, vec![Some(6_000), Some(9_000)]);
    }

    #[test]
    fn min_policy_waits_for_every_watermarked_input() {
        let mut nodes = vec![None, None];
        // Only the first input has rows: unset counts as 0.
        assert_eq!(
            advance_watermark(0, &mut nodes, &[Some(5_000), None], MIN),
            0
        );
        assert_eq!(nodes, vec![Some(5_000), None]);
        // Both have rows: the minimum.
        assert_eq!(
            advance_watermark(0, &mut nodes, &[None, Some(3_000)], MIN),
            3_000
        );
        // A node's watermark never goes down; the global never goes down.
        assert_eq!(
            advance_watermark(3_000, &mut nodes, &[Some(1_000), Some(2_000)], MIN),
            3_000
        );
        assert_eq!(nodes, vec![Some(5_000), Some(3_000)]);
        assert_eq!(
            advance_watermark(3_000, &mut nodes, &[Some(9_000), Some(8_000)], MIN),
            8_000
        );
    }

    #[test]
    fn one_watermark_is_its_own_maximum_and_never_negative() {
        let mut nodes = vec![None];
        assert_eq!(advance_watermark(0, &mut nodes, &[Some(-600_000)], MIN), 0);
        assert_eq!(
            advance_watermark(0, &mut nodes, &[Some(10_000)], MIN),
            10_000
        );
        assert_eq!(advance_watermark(10_000, &mut nodes, &[None], MIN), 10_000);
        // No watermark at all: nothing moves.
        assert_eq!(advance_watermark(7, &mut [], &[], MIN), 7);
    }
}
