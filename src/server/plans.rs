//! Kept plans: a read-only query's physical plan, kept by the query's text and run again.
//!
//! Dashboards send the same few queries over and over while sinks commit underneath.
//! Planning such a query (parsing, the logical optimizer, physical planning) costs several
//! times what running it over a cached sink table does, so the first run of a query keeps
//! its physical plan, and later runs of the same text bind the plan's scans to the tables'
//! latest versions ([`CachedScanExec::bound`]) and run it, without planning.
//!
//! A plan is kept only if running it again gives what planning again would:
//! - no dynamic filter in it was pushed from one node into another (their state would
//!   outlive a run);
//! - every function in it is immutable (no `now()`, `random()`, `current_user`), and it has
//!   no parameters and no side effects (no DML, DDL, `EXPLAIN`, `COPY`);
//! - every scan in it is a [`CachedScanExec`] (a sink table in the read cache): other scans
//!   hold the rows or files of the moment they were planned, and a table with exact
//!   statistics may have had its answer folded into the plan (`count(*)` as a constant);
//!   only a query that names no table may have leaves that read nothing;
//! - the session is as it was: any statement other than such a query (a `SET`, `CREATE`,
//!   `DROP`, a Tidemark statement) forgets every kept plan ([`PlanCache::invalidate`]);
//! - every table the query names is still the same table: a kept plan is checked against
//!   the catalog before it runs, since tables are also registered outside statements.
//!
//! The server's session is shared by all connections (datafusion-postgres's), so one cache
//! serves them all.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::TableProvider;
use datafusion::common::TableReference;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::datasource::source_as_provider;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{Expr, LogicalPlan, Volatility};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::execution_plan::{ChildrenPropertiesMode, ReplaceChildrenOptions};
use datafusion::physical_plan::placeholder_row::PlaceholderRowExec;
use datafusion::prelude::SessionContext;

use crate::sink::delta::scan::CachedScanExec;

/// At most this many plans are kept; past it, all are forgotten and the cache refills.
const MAX_PLANS: usize = 1024;

/// The kept plans of the server's session.
#[derive(Default)]
pub struct PlanCache {
    /// Bumped by [`PlanCache::invalidate`]; a plan made under another epoch is not used.
    epoch: AtomicU64,
    plans: Mutex<HashMap<String, Arc<KeptPlan>>>,
    /// The session's task context as of an epoch, shared by that epoch's kept plans.
    task: Mutex<Option<(u64, Arc<TaskContext>)>>,
}

struct KeptPlan {
    epoch: u64,
    /// Each table the query names, and the provider it resolved to (as an address).
    tables: Vec<(TableReference, usize)>,
    /// The physical plan, its scans unbound.
    plan: Arc<dyn ExecutionPlan>,
    schema: SchemaRef,
    task: Arc<TaskContext>,
}

/// A plan ready to run, and the columns the client is told about.
pub struct Ready {
    pub schema: SchemaRef,
    pub plan: Arc<dyn ExecutionPlan>,
    pub task: Arc<TaskContext>,
    /// Whether it came from the cache (for tests).
    pub kept: bool,
}

impl PlanCache {
    /// Forgets every kept plan: the session's settings or its catalog may have changed.
    pub fn invalidate(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<KeptPlan>>> {
        self.plans.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The kept plan of `sql`, bound to the latest versions of its tables, if there is one
    /// and it is still good.
    pub async fn get(&self, ctx: &SessionContext, sql: &str) -> DfResult<Option<Ready>> {
        let Some(kept) = self.lock().get(sql).cloned() else {
            return Ok(None);
        };
        if kept.epoch != self.epoch.load(Ordering::SeqCst) || !same_tables(ctx, &kept).await {
            self.forget(sql, &kept);
            return Ok(None);
        }
        let Some(plan) = bind(&kept.plan).await? else {
            // A table left the read cache: plan again, to read its files.
            self.forget(sql, &kept);
            return Ok(None);
        };
        Ok(Some(Ready {
            schema: kept.schema.clone(),
            plan,
            task: kept.task.clone(),
            kept: true,
        }))
    }

    fn forget(&self, sql: &str, kept: &Arc<KeptPlan>) {
        let mut plans = self.lock();
        if plans.get(sql).is_some_and(|k| Arc::ptr_eq(k, kept)) {
            plans.remove(sql);
        }
    }

    /// Plans `logical` (the plan of the query `sql`) to run now, and keeps the plan under
    /// `sql` if it can run again; with no `sql` (a query whose parameters were bound into
    /// `logical`), keeps nothing. `None` if `logical` is not a read-only query: the caller
    /// runs it as any other statement.
    pub async fn plan(
        &self,
        ctx: &SessionContext,
        sql: Option<&str>,
        logical: LogicalPlan,
    ) -> DfResult<Option<Ready>> {
        let Some(check) = inspect(&logical) else {
            return Ok(None);
        };
        let epoch = self.epoch.load(Ordering::SeqCst);
        let state = ctx.state();
        let schema = Arc::new(logical.schema().as_arrow().clone());
        let plan = state.create_physical_plan(&logical).await?;
        let task = {
            let mut task = self.task.lock().unwrap_or_else(|e| e.into_inner());
            match task.as_ref() {
                Some((e, t)) if *e == epoch => t.clone(),
                _ => {
                    let t = Arc::new(TaskContext::from(&state));
                    *task = Some((epoch, t.clone()));
                    t
                }
            }
        };
        if let Some(sql) = sql
            && let Some(tables) = check.tables
            && !shares_dynamic_filters(&plan)?
            && let Some(unbound) = unbind(&plan, tables.is_empty())?
        {
            let kept = Arc::new(KeptPlan {
                epoch,
                tables,
                plan: unbound,
                schema: schema.clone(),
                task: task.clone(),
            });
            let mut plans = self.lock();
            if self.epoch.load(Ordering::SeqCst) == epoch {
                if plans.len() >= MAX_PLANS {
                    plans.clear();
                }
                plans.insert(sql.to_string(), kept);
            }
        }
        Ok(Some(Ready {
            schema,
            plan,
            task,
            kept: false,
        }))
    }

    /// How many plans are kept (for tests).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().len()
    }
}

/// What [`inspect`] found in a read-only plan.
struct Inspection {
    /// The tables it names, if the plan may be kept (immutable functions only, no
    /// parameters).
    tables: Option<Vec<(TableReference, usize)>>,
}

fn address(p: &Arc<dyn TableProvider>) -> usize {
    Arc::as_ptr(p) as *const () as usize
}

/// `None` unless `plan` only reads; then whether it may be kept, and its tables.
fn inspect(plan: &LogicalPlan) -> Option<Inspection> {
    let mut read_only = true;
    let mut keepable = true;
    let mut tables = Vec::new();
    let _ = plan.apply_with_subqueries(|node| {
        match node {
            LogicalPlan::Dml(_)
            | LogicalPlan::Ddl(_)
            | LogicalPlan::Copy(_)
            | LogicalPlan::Statement(_)
            | LogicalPlan::Explain(_)
            | LogicalPlan::Analyze(_)
            | LogicalPlan::DescribeTable(_)
            | LogicalPlan::Extension(_) => {
                read_only = false;
                return Ok(TreeNodeRecursion::Stop);
            }
            LogicalPlan::TableScan(scan) => match source_as_provider(&scan.source) {
                Ok(p) => tables.push((scan.table_name.clone(), address(&p))),
                Err(_) => keepable = false,
            },
            _ => {}
        }
        node.apply_expressions(|e| {
            e.apply(|e| {
                if !immutable(e) {
                    keepable = false;
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })
    });
    read_only.then(|| Inspection {
        tables: keepable.then_some(tables),
    })
}

/// Whether `e` (not its children) gives the same value in every run of a query.
fn immutable(e: &Expr) -> bool {
    match e {
        Expr::ScalarFunction(f) => f.func.signature().volatility == Volatility::Immutable,
        Expr::AggregateFunction(f) => f.func.signature().volatility == Volatility::Immutable,
        Expr::WindowFunction(w) => w.fun.signature().volatility == Volatility::Immutable,
        Expr::Placeholder(_) => false,
        _ => true,
    }
}

/// Whether every table `kept` names still resolves to the provider it was planned with.
async fn same_tables(ctx: &SessionContext, kept: &KeptPlan) -> bool {
    for (name, planned) in &kept.tables {
        match ctx.table_provider(name.clone()).await {
            Ok(p) if address(&p) == *planned => {}
            _ => return false,
        }
    }
    true
}

/// `plan` with its scans unbound, if every leaf is a [`CachedScanExec`] or, in a query
/// that names no table (`tableless`), reads nothing. In a query over tables a leaf that
/// reads nothing may be a table's answer folded into the plan from its statistics (an
/// exact `count(*)` becomes a constant over one placeholder row), so it is not kept.
fn unbind(
    plan: &Arc<dyn ExecutionPlan>,
    tableless: bool,
) -> DfResult<Option<Arc<dyn ExecutionPlan>>> {
    if let Some(scan) = plan.downcast_ref::<CachedScanExec>() {
        return Ok(Some(scan.unbound()));
    }
    let children = plan.children();
    if children.is_empty() {
        let reads_nothing = plan.downcast_ref::<PlaceholderRowExec>().is_some()
            || plan.downcast_ref::<EmptyExec>().is_some();
        return Ok((tableless && reads_nothing).then(|| plan.clone()));
    }
    let mut unbound = Vec::with_capacity(children.len());
    for c in children {
        match unbind(c, tableless)? {
            Some(u) => unbound.push(u),
            None => return Ok(None),
        }
    }
    Ok(Some(plan.clone().replace_children(unbound, keep())?))
}

/// Whether a dynamic filter (a TopK's bound, a join's build-side keys, an aggregate's
/// running minimum) was pushed from the node that fills it into another. The filling node
/// starts a fresh filter when it is reset, but the node it was pushed into would keep the
/// old one, with the last run's values, so such a plan is not kept.
fn shares_dynamic_filters(plan: &Arc<dyn ExecutionPlan>) -> DfResult<bool> {
    let mut nodes_per_filter: HashMap<u64, usize> = HashMap::new();
    plan.apply(|node| {
        let mut ids = Vec::new();
        node.apply_expressions(&mut |root| {
            root.apply(|e| {
                if let Some(id) = e.expression_id() {
                    ids.push(id);
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })?;
        ids.sort_unstable();
        ids.dedup();
        for id in ids {
            *nodes_per_filter.entry(id).or_default() += 1;
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(nodes_per_filter.values().any(|n| *n > 1))
}

fn keep() -> ReplaceChildrenOptions {
    ReplaceChildrenOptions::new(ChildrenPropertiesMode::Keep)
}

/// A kept plan made ready to run: each scan bound to its table's latest version (one
/// version per table, however many scans read it), every other node fresh
/// ([`ExecutionPlan::reset_state`]), so that runs share no state. `None` if a table's
/// latest version is not in the read cache.
async fn bind(plan: &Arc<dyn ExecutionPlan>) -> DfResult<Option<Arc<dyn ExecutionPlan>>> {
    let mut scans: Vec<&CachedScanExec> = Vec::new();
    collect_scans(plan, &mut scans);
    let mut versions = HashMap::new();
    let mut bound = HashMap::new();
    for scan in scans {
        let rows = match versions.get(&scan.table_id()) {
            Some(rows) => Arc::clone(rows),
            None => match scan
                .latest_rows()
                .await
                .map_err(|e| DataFusionError::External(Box::new(e)))?
            {
                Some(rows) => {
                    versions.insert(scan.table_id(), Arc::clone(&rows));
                    rows
                }
                None => return Ok(None),
            },
        };
        bound.insert(scan as *const CachedScanExec as usize, scan.bound(rows));
    }
    rebuild(plan, &bound).map(Some)
}

fn collect_scans<'a>(plan: &'a Arc<dyn ExecutionPlan>, out: &mut Vec<&'a CachedScanExec>) {
    if let Some(scan) = plan.downcast_ref::<CachedScanExec>() {
        out.push(scan);
    }
    for c in plan.children() {
        collect_scans(c, out);
    }
}

fn rebuild(
    plan: &Arc<dyn ExecutionPlan>,
    bound: &HashMap<usize, Arc<dyn ExecutionPlan>>,
) -> DfResult<Arc<dyn ExecutionPlan>> {
    if let Some(scan) = plan.downcast_ref::<CachedScanExec>()
        && let Some(b) = bound.get(&(scan as *const CachedScanExec as usize))
    {
        return Ok(b.clone());
    }
    let children = plan.children();
    let node = if children.is_empty() {
        plan.clone()
    } else {
        let children = children
            .into_iter()
            .map(|c| rebuild(c, bound))
            .collect::<DfResult<Vec<_>>>()?;
        plan.clone().replace_children(children, keep())?
    };
    node.reset_state()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::delta::{DeltaReadTable, DeltaSink};
    use crate::sink::{BatchInfo, Sink, WriteMode};
    use crate::types::BatchId;
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::arrow::record_batch::RecordBatch;
    use datafusion::arrow::util::pretty::pretty_format_batches;

    async fn write(sink: &DeltaSink, schema: &SchemaRef, batch: u64, ns: &[i64]) {
        let rows = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(Int64Array::from(ns.to_vec()))],
        )
        .unwrap();
        sink.add_batch(
            &BatchInfo::new("q", BatchId(batch), &WriteMode::Append),
            vec![rows],
        )
        .await
        .unwrap();
    }

    /// Runs `sql` through `cache` as the server does: the kept plan, else a new one.
    async fn run(cache: &PlanCache, ctx: &SessionContext, sql: &str) -> (String, bool) {
        let ready = match cache.get(ctx, sql).await.unwrap() {
            Some(r) => r,
            None => {
                let logical = ctx.state().create_logical_plan(sql).await.unwrap();
                cache.plan(ctx, Some(sql), logical).await.unwrap().unwrap()
            }
        };
        let batches = datafusion::physical_plan::collect(ready.plan, ready.task)
            .await
            .unwrap();
        (
            pretty_format_batches(&batches).unwrap().to_string(),
            ready.kept,
        )
    }

    /// The independent answer: DataFusion over delta-rs's own provider of a freshly
    /// opened table, planned from scratch.
    async fn expected(path: &std::path::Path, sql: &str) -> String {
        let url = url::Url::from_directory_path(path).unwrap();
        let table = deltalake::open_table(url).await.unwrap();
        let ctx = SessionContext::new();
        ctx.register_table("t", table.table_provider().await.unwrap())
            .unwrap();
        let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
        pretty_format_batches(&batches).unwrap().to_string()
    }

    #[tokio::test]
    async fn a_kept_plan_reads_each_new_version_and_is_dropped_when_its_table_is() {
        let dir = tempfile::tempdir().unwrap();
        let schema = Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, true)]));
        let sink = DeltaSink::new(dir.path(), schema.clone(), 0).unwrap();
        sink.ensure_table("t", &schema).await.unwrap();
        write(&sink, &schema, 0, &[1, 2, 3]).await;
        let ctx = SessionContext::new();
        let read = Arc::new(DeltaReadTable::try_new(dir.path()).await.unwrap());
        ctx.register_table("t", read).unwrap();
        let cache = PlanCache::default();
        let sql = "SELECT count(*) AS c, sum(n) AS s FROM t WHERE n > 1";

        let (first, kept) = run(&cache, &ctx, sql).await;
        assert!(!kept);
        assert_eq!(first, expected(dir.path(), sql).await);
        assert_eq!(cache.len(), 1);
        let (again, kept) = run(&cache, &ctx, sql).await;
        assert!(kept, "the second run uses the kept plan");
        assert_eq!(again, first);

        let count = "SELECT count(*) AS c FROM t";
        run(&cache, &ctx, count).await;

        // A new version: the kept plans read it (a count folded into a plan would not).
        write(&sink, &schema, 1, &[4, 5]).await;
        let (after, kept) = run(&cache, &ctx, sql).await;
        assert!(kept);
        assert_eq!(after, expected(dir.path(), sql).await);
        assert_ne!(after, first);
        let (counted, kept) = run(&cache, &ctx, count).await;
        assert!(kept);
        assert_eq!(counted, expected(dir.path(), count).await);

        // A version with fewer rows (a DELETE): answers that only grow with the table (a
        // maximum, a top 2) must not keep the last run's bound.
        let max = "SELECT max(n) AS m FROM t WHERE n % 2 = 1";
        let top = "SELECT n FROM t ORDER BY n DESC LIMIT 2";
        for q in [max, top] {
            run(&cache, &ctx, q).await;
            let (got, kept) = run(&cache, &ctx, q).await;
            assert!(kept, "{q}");
            assert_eq!(got, expected(dir.path(), q).await);
        }
        crate::sink::delta::table::delete(dir.path(), Some("n >= 4"))
            .await
            .unwrap();
        for q in [max, top] {
            let (got, _) = run(&cache, &ctx, q).await;
            assert_eq!(got, expected(dir.path(), q).await, "{q}");
        }
        assert!(!run(&cache, &ctx, max).await.0.contains('5'));

        // A table read twice in one query reads one version in both scans.
        let self_join = "SELECT count(*) AS c FROM t a JOIN t b ON a.n = b.n";
        run(&cache, &ctx, self_join).await;
        write(&sink, &schema, 2, &[6]).await;
        let (joined, _) = run(&cache, &ctx, self_join).await;
        assert_eq!(joined, expected(dir.path(), self_join).await);

        // Not kept: a stable function, or a table with exact statistics (its count is
        // folded into the plan) and rows held at planning (a memory table).
        let now = "SELECT now() > TIMESTAMP '2000-01-01' AS later, count(*) AS c FROM t";
        let kept_before = cache.len();
        assert!(!run(&cache, &ctx, now).await.1);
        assert!(!run(&cache, &ctx, now).await.1);
        ctx.register_batch(
            "m",
            RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(vec![7]))])
                .unwrap(),
        )
        .unwrap();
        let memory = "SELECT count(*) AS c FROM m";
        assert!(!run(&cache, &ctx, memory).await.1);
        assert_eq!(cache.len(), kept_before);

        // The table replaced by another of the same name (a sink dropped and created
        // again): the kept plan is not used.
        let other = tempfile::tempdir().unwrap();
        let other_sink = DeltaSink::new(other.path(), schema.clone(), 0).unwrap();
        other_sink.ensure_table("t", &schema).await.unwrap();
        write(&other_sink, &schema, 0, &[10]).await;
        ctx.deregister_table("t").unwrap();
        ctx.register_table(
            "t",
            Arc::new(DeltaReadTable::try_new(other.path()).await.unwrap()),
        )
        .unwrap();
        let (replaced, kept) = run(&cache, &ctx, sql).await;
        assert!(!kept);
        assert_eq!(replaced, expected(other.path(), sql).await);

        // Any other statement forgets every plan.
        assert!(run(&cache, &ctx, sql).await.1);
        cache.invalidate();
        assert_eq!(cache.len(), 0);
        assert!(!run(&cache, &ctx, sql).await.1);
    }
}
