//! The engine: owns the catalog, the shared DataFusion session, and the streaming queries.
//!
//! It executes Tidemark's statements (the wire server and `tidemark run` both call
//! [`Engine::execute`]) and starts, stops and watches one tokio task per running sink.

pub mod aggregate;
pub mod checked;
pub mod dedup;
mod delta_tables;
pub mod join;
pub mod json;
pub mod metrics;
pub mod operator;
mod plain_views;
pub mod plan;
pub mod progress;
pub mod query;
mod replace;
mod roles;
pub mod settings;
pub mod side_tables;
mod spark_query;
pub mod tables;
pub mod window;

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use datafusion::arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::MemorySchemaProvider;
use datafusion::common::TableReference;
use datafusion::prelude::SessionContext;
use futures::FutureExt;
use tokio::sync::{Notify, watch};

use crate::catalog::{
    Catalog, DEFAULT_STATE_PARTITIONS, SinkDef, SinkState, StreamDef, StreamSource, check_watermark,
};
use crate::error::{Error, Result};
use crate::sink::{QueryOutput, SinkConnector};
use crate::source::table::TableLog;
use crate::sql::options::{Trigger, format_duration};
use crate::sql::parser::{
    CreateSink, CreateStream, QueryKind, TidemarkStatement, parse_watermark_option,
};
use crate::sql::types::arrow_to_sql;
use crate::types::BatchId;
use aggregate::OutputMode;
use plan::{DedupMode, StateConfig};
use progress::{QueryStatus, Registry, Status};
use query::{Outcome, QueryTask, StopReason};
use tables::{SystemTable, TableStreamTable, last_progress_batch, queries_batch, queries_schema};

/// What a statement returns.
#[derive(Debug)]
pub enum Output {
    /// Rows, with their schema.
    Rows(SchemaRef, Vec<RecordBatch>),
    /// A command tag such as `CREATE SINK`.
    Command(String),
    /// What happened, said to the client first (a Postgres `NOTICE`), then the output.
    Notice(String, Box<Output>),
}

/// A running query's controls.
struct RunningQuery {
    stop: watch::Sender<Option<StopReason>>,
    wake: Arc<Notify>,
    done: tokio::task::JoinHandle<()>,
}

/// The engine of one data directory.
pub struct Engine {
    data_dir: PathBuf,
    /// The session every client query runs in: streams, sinks and system tables.
    ctx: SessionContext,
    /// The durable catalog. Held for the whole of a DDL statement, so DDL is serial.
    catalog: tokio::sync::Mutex<Catalog>,
    registry: Arc<Registry>,
    running: Mutex<HashMap<String, RunningQuery>>,
    /// The open logs of table streams, by stream name.
    logs: Mutex<HashMap<String, Arc<TableLog>>>,
    clock: Arc<dyn crate::clock::Clock>,
    /// Set when the server shuts down: no query starts after it.
    shutting_down: std::sync::atomic::AtomicBool,
    /// The catalog's roles, by name, for logins and privilege checks (which must not wait
    /// for a DDL statement holding the catalog).
    roles: Mutex<HashMap<String, crate::auth::RoleDef>>,
    /// Objects that could not be loaded at startup, by name (beyond the streams the
    /// catalog itself marks broken): shown by `tidemark.relations`, forgotten on `DROP`.
    problems: Mutex<HashMap<String, crate::catalog::Broken>>,
    /// `--spark-remote`: the Spark Connect endpoint of a sink with `engine = 'spark'` and
    /// no `spark_remote` of its own (written into the sink's options at `CREATE`).
    spark_remote: std::sync::OnceLock<String>,
    me: Weak<Engine>,
}

impl Engine {
    /// Opens the data directory (creating it), loads the catalog and registers its objects.
    /// No query starts until [`Engine::start_sinks`].
    pub async fn open(data_dir: &Path) -> Result<Arc<Engine>> {
        crate::fsutil::create_dir_all(data_dir)?;
        let data_dir = std::fs::canonicalize(data_dir)
            .map_err(|e| Error::io(format!("resolving {}", data_dir.display()), e))?;
        let catalog = Catalog::load(&data_dir)?;
        let ctx = SessionContext::new_with_config(
            datafusion::prelude::SessionConfig::new()
                .with_information_schema(true)
                .with_target_partitions(query::parallelism())
                // TIMESTAMPTZ values and now() are in UTC, as Spark's are.
                .set_str("datafusion.execution.time_zone", "UTC"),
        );
        let registry = Registry::new();
        let engine = Arc::new_cyclic(|me| Engine {
            data_dir,
            ctx,
            catalog: tokio::sync::Mutex::new(Catalog::default()),
            registry: registry.clone(),
            running: Mutex::new(HashMap::new()),
            logs: Mutex::new(HashMap::new()),
            clock: crate::clock::system(),
            shutting_down: Default::default(),
            roles: Default::default(),
            problems: Default::default(),
            spark_remote: std::sync::OnceLock::new(),
            me: me.clone(),
        });
        window::register_udfs(&engine.ctx);
        json::register_udfs(&engine.ctx);
        engine
            .ctx
            .add_analyzer_rule(Arc::new(checked::CheckedArithmetic));
        let tidemark_schema = Arc::new(MemorySchemaProvider::new());
        engine
            .ctx
            .catalog("datafusion")
            .ok_or_else(|| Error::Internal("no default catalog".into()))?
            .register_schema("tidemark", tidemark_schema)?;
        engine.ctx.register_table(
            TableReference::partial("tidemark", "queries"),
            Arc::new(SystemTable::queries(registry.clone())),
        )?;
        engine.ctx.register_table(
            TableReference::partial("tidemark", "progress"),
            Arc::new(SystemTable::progress(registry.clone())),
        )?;
        engine.ctx.register_table(
            TableReference::partial("tidemark", "sources"),
            Arc::new(SystemTable::sources(registry.clone())),
        )?;
        engine.ctx.register_table(
            TableReference::partial("tidemark", "state_operators"),
            Arc::new(SystemTable::state_operators(registry.clone())),
        )?;
        let schema = options_schema();
        engine.ctx.register_table(
            TableReference::partial("tidemark", "options"),
            Arc::new(datafusion::datasource::MemTable::try_new(
                schema.clone(),
                vec![vec![options_batch(&schema)?]],
            )?),
        )?;
        // Nothing a catalog object holds stops the server from starting: an object that
        // cannot be loaded is logged, kept and listed with its error (tidemark.relations).
        engine.ctx.register_table(
            TableReference::partial("tidemark", "relations"),
            Arc::new(tables::RelationsTable::new(engine.me.clone())),
        )?;
        for s in &catalog.streams {
            if let Err(e) = engine.register_stream(s).await {
                tracing::error!(stream = %s.name, error = %e, "stream is not readable");
                engine.mark_broken(&s.name, &e);
                let broken = crate::catalog::Broken::of(&e);
                let table = tables::RefusingTable::broken("stream", &s.name, s.schema(), broken);
                engine
                    .ctx
                    .register_table(TableReference::bare(s.name.clone()), Arc::new(table))?;
            }
        }
        for t in &catalog.tables {
            if let Err(e) = engine.register_table(t).await {
                // A table removed while the server was down must not stop startup.
                tracing::error!(table = %t.name, error = %e, "table is not readable");
                engine.mark_broken(&t.name, &e);
            }
        }
        for s in &catalog.sinks {
            if let Err(e) = engine.register_sink(s, &catalog).await {
                tracing::error!(sink = %s.name, error = %e, "sink table is not readable");
                engine.mark_broken(&s.name, &e);
            }
            let status = match s.state {
                SinkState::Running | SinkState::Stopped => Status::Stopped,
                SinkState::Finished => Status::Finished,
                SinkState::Failed => Status::Failed,
            };
            let mut qs = QueryStatus::new(&s.name, status);
            qs.error = s.error.clone();
            if s.runs_on_spark() {
                // Spark's ids, as the sink's last run left them.
                qs.engine = "spark";
                (qs.id, qs.run_id) = spark_query::saved_ids(s).unzip();
            } else if let Ok(ck) = crate::checkpoint::Checkpoint::open(&s.checkpoint) {
                qs.id = Some(ck.id);
                qs.last_batch_id = ck.latest_commit().ok().flatten().map(|(n, _)| n);
            }
            registry.set(qs);
        }
        engine.set_roles(&catalog.roles);
        engine.restore_views(&catalog.views).await;
        *engine.catalog.lock().await = catalog;
        Ok(engine)
    }

    /// Records that a catalog object could not be loaded.
    fn mark_broken(&self, name: &str, e: &Error) {
        self.problems
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string(), crate::catalog::Broken::of(e));
    }

    /// Forgets a dropped object's problem.
    fn forget_problem(&self, name: &str) {
        self.problems
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
    }

    /// The session client queries run in.
    pub fn context(&self) -> &SessionContext {
        &self.ctx
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// Sets the server's default Spark Connect endpoint (`--spark-remote`), once.
    pub fn set_spark_remote(&self, remote: &str) -> Result<()> {
        crate::spark::connect::Remote::parse(remote)?;
        let _ = self.spark_remote.set(remote.to_string());
        Ok(())
    }

    /// Starts every sink whose last requested state is `running` (server start).
    pub async fn start_sinks(&self) {
        let cat = self.catalog.lock().await;
        for s in cat.sinks.iter().filter(|s| s.state == SinkState::Running) {
            if let Err(e) = self.spawn(&cat, s) {
                tracing::error!(sink = %s.name, error = %e, "could not resume sink");
                // Shown by SHOW QUERIES; the catalog keeps `running`, so a restart after
                // the cause is mended resumes it.
                let mut qs = self
                    .registry
                    .get(&s.name)
                    .unwrap_or_else(|| QueryStatus::new(&s.name, Status::Failed));
                qs.status = Status::Failed;
                qs.error = Some(e.to_string());
                self.registry.set(qs);
            }
        }
    }

    async fn register_stream(&self, s: &StreamDef) -> Result<()> {
        if let Some(broken) = &s.broken {
            // Its name stays taken, and a query over it gets its error.
            self.ctx.register_table(
                TableReference::bare(s.name.clone()),
                Arc::new(tables::RefusingTable::broken(
                    "stream",
                    &s.name,
                    s.schema(),
                    broken.clone(),
                )),
            )?;
            return Ok(());
        }
        let table: Arc<dyn datafusion::datasource::TableProvider> = match s.source()? {
            StreamSource::File(f) => Arc::new(f.table()),
            StreamSource::Table(config) => {
                let log = TableLog::open(&s.name, &self.stream_dir(&s.name), config.clone())?;
                self.logs
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(s.name.clone(), log.clone());
                Arc::new(TableStreamTable::new(log))
            }
            StreamSource::Delta(d) => {
                Arc::new(crate::sink::delta::DeltaReadTable::try_new(&d.path).await?)
            }
            StreamSource::Kafka(k) => Arc::new(crate::source::kafka::KafkaTable::new(k.clone())),
            other => Arc::new(tables::RefusingTable::sink_only(
                &s.name,
                other.connector(),
                s.schema(),
            )),
        };
        self.ctx
            .register_table(TableReference::bare(s.name.clone()), table)?;
        Ok(())
    }

    /// The log a `COPY ... FROM STDIN` or `INSERT` writes to: a table stream's.
    pub fn copy_target(&self, name: &str) -> Result<Arc<TableLog>> {
        if let Some(log) = self.table_log(name) {
            return Ok(log);
        }
        let exists = self
            .ctx
            .table_exist(TableReference::bare(name.to_string()))
            .unwrap_or(false);
        Err(if exists {
            Error::WrongObjectType(format!(
                "\"{name}\" is not a table stream: only streams fed over the wire \
                 (connector = 'table') take COPY FROM STDIN"
            ))
        } else {
            Error::UndefinedObject {
                kind: "relation",
                name: name.to_string(),
            }
        })
    }

    /// Where a table stream keeps its log.
    fn stream_dir(&self, name: &str) -> PathBuf {
        self.data_dir.join("streams").join(name)
    }

    /// The open log of a table stream.
    pub fn table_log(&self, stream: &str) -> Option<Arc<TableLog>> {
        self.logs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(stream)
            .cloned()
    }

    /// What a sink's query writes, as its output is read back: a file sink needs the query's
    /// schema to read its files, a view what the query writes to load its rows. Other sinks
    /// read their own table's schema (an empty one here).
    async fn sink_output(s: &SinkDef, cat: &Catalog) -> Result<QueryOutput> {
        match s.connector()? {
            SinkConnector::File(_) | SinkConnector::View => {
                let streams = sink_streams_of(s, cat)?;
                let mode = OutputMode::parse(&s.output_mode)?;
                let wm = query::sink_watermark(s)?;
                let shape = query::analyze_sink(
                    &s.query,
                    &streams,
                    &cat.tables_of(s)?,
                    wm.as_ref(),
                    mode,
                    &state_config(s),
                )
                .await?;
                Ok(shape.output())
            }
            _ => Ok(QueryOutput::append(Arc::new(Schema::empty()))),
        }
    }

    /// Makes a sink's output a table: its Delta table, or its committed files. A console
    /// sink has no table.
    async fn register_sink(&self, s: &SinkDef, cat: &Catalog) -> Result<()> {
        let name = TableReference::bare(s.name.clone());
        self.ctx.deregister_table(name.clone())?;
        let connector = s.connector()?;
        let output = Self::sink_output(s, cat).await?;
        if connector == SinkConnector::View {
            let store = crate::sink::view::open(&s.path, &output, &s.options)?;
            let view = crate::sink::view::ViewTable::new(store, s.query.clone());
            self.ctx.register_table(name, Arc::new(view))?;
        } else if let Some(table) = connector.read_table(&s.path, &output.schema).await? {
            self.ctx.register_table(name, table)?;
        }
        Ok(())
    }

    /// Executes one of Tidemark's statements.
    pub async fn execute(&self, stmt: TidemarkStatement) -> Result<Output> {
        match stmt {
            TidemarkStatement::CreateStream(cs) => self.create_stream(cs).await,
            TidemarkStatement::CreateSink(cs) => self.create_sink(cs).await,
            TidemarkStatement::ExplainCreateSink(cs) => self.explain_sink(cs).await,
            TidemarkStatement::ExplainSparkCreateSink(cs) => self.explain_spark(cs).await,
            TidemarkStatement::DropStream { name, if_exists } => {
                self.drop_stream(&name, if_exists).await
            }
            TidemarkStatement::DropSink {
                name,
                if_exists,
                kind,
                purge,
            } => self.drop_sink(&name, if_exists, kind, purge).await,
            TidemarkStatement::ShowStreams => self.show_streams().await,
            TidemarkStatement::ShowSinks => self.show_sinks().await,
            TidemarkStatement::ShowViews => self.show_views().await,
            TidemarkStatement::ShowQueries => {
                let schema = queries_schema();
                let batch = queries_batch(&self.registry.all(), &schema)?;
                Ok(Output::Rows(schema, vec![batch]))
            }
            TidemarkStatement::ShowProgress(name) => {
                if self.registry.get(&name).is_none() {
                    return Err(Error::UndefinedObject {
                        kind: "query",
                        name,
                    });
                }
                let batch = last_progress_batch(self.registry.last_progress(&name).as_ref())?;
                Ok(Output::Rows(batch.schema(), vec![batch]))
            }
            TidemarkStatement::ShowOptions => {
                let schema = options_schema();
                let batch = options_batch(&schema)?;
                Ok(Output::Rows(schema, vec![batch]))
            }
            TidemarkStatement::StopSink { name, kind } => self.stop_sink(&name, kind).await,
            TidemarkStatement::StartSink { name, kind } => self.start_sink(&name, kind).await,
            TidemarkStatement::AlterSink {
                name,
                options,
                kind,
            } => self.alter_sink(&name, options, kind).await,
            TidemarkStatement::Flush { sink } => self.flush(sink.as_deref()).await,
            TidemarkStatement::Optimize { name, zorder } => self.optimize(&name, &zorder).await,
            // The wire checks the transaction block; there is nothing to undo.
            TidemarkStatement::Savepoint(c) => Ok(Output::Command(c.tag().into())),
            // Without a session (`tidemark run`): the server's values; nothing to discard.
            TidemarkStatement::ShowSetting(name) => {
                let (schema, batch) = settings::show(&name, |_| None)?;
                Ok(Output::Rows(schema, vec![batch]))
            }
            TidemarkStatement::Discard(what) => Ok(Output::Command(format!("DISCARD {what}"))),
            TidemarkStatement::CreateTable(ct) => self.create_table(ct).await,
            TidemarkStatement::DropTable {
                name,
                if_exists,
                purge,
            } => self.drop_table(&name, if_exists, purge).await,
            TidemarkStatement::CreateView { name, sql } => self.create_view(name, sql).await,
            TidemarkStatement::DropView {
                names,
                if_exists,
                sql,
            } => self.drop_views(names, if_exists, &sql).await,
            TidemarkStatement::Merge(spec) => self.merge(spec).await,
            TidemarkStatement::Update {
                table,
                assignments,
                predicate,
            } => {
                self.update(&table, &assignments, predicate.as_deref())
                    .await
            }
            TidemarkStatement::Delete { table, predicate } => {
                self.delete(&table, predicate.as_deref()).await
            }
            TidemarkStatement::CreateRole {
                name,
                if_not_exists,
                options,
            } => self.create_role(&name, if_not_exists, options).await,
            TidemarkStatement::AlterRole { name, options } => self.alter_role(&name, options).await,
            TidemarkStatement::DropRole { names, if_exists } => {
                self.drop_role(&names, if_exists).await
            }
            TidemarkStatement::GrantRole {
                roles,
                members,
                revoke,
            } => self.grant_role(&roles, &members, revoke).await,
            TidemarkStatement::CopyFrom(c) => Err(Error::unsupported(format!(
                "COPY {} FROM STDIN needs a client that sends the data (psql's \\copy, a driver)",
                c.table
            ))),
            // A session's: answered by the wire, which delivers notifications.
            TidemarkStatement::Listen(_)
            | TidemarkStatement::Unlisten(_)
            | TidemarkStatement::Notify { .. } => Err(Error::unsupported(
                "LISTEN, UNLISTEN and NOTIFY need a client connection".to_string(),
            )),
        }
    }

    /// Whether a name is taken by a stream, a sink or any other table.
    fn name_taken(&self, cat: &Catalog, name: &str) -> Option<&'static str> {
        if cat.stream(name).is_some() {
            Some("stream")
        } else if let Some(def) = cat.sink(name) {
            Some(def.kind.noun())
        } else if cat.table(name).is_some() {
            Some("table")
        } else if self
            .ctx
            .table_exist(TableReference::bare(name.to_string()))
            .unwrap_or(false)
        {
            Some("relation")
        } else {
            None
        }
    }

    async fn create_stream(&self, cs: CreateStream) -> Result<Output> {
        let mut cat = self.catalog.lock().await;
        if let Some(kind) = self.name_taken(&cat, &cs.name) {
            if cs.if_not_exists {
                return Ok(Output::Command("CREATE STREAM".into()));
            }
            return Err(Error::DuplicateObject {
                kind,
                name: cs.name,
            });
        }
        let columns = if cs.options.get("connector") == Some("delta") {
            delta_columns(&cs.columns, &cs.options).await?
        } else {
            cs.columns
        };
        let def = StreamDef::try_new(cs.name, columns, cs.watermark, cs.options, true)?;
        if let Ok(StreamSource::Kafka(k)) = def.source() {
            // An unreachable broker is an error now, within a bounded time.
            crate::kafka::check_reachable(&k.conn).await?;
        }
        self.register_stream(&def).await?;
        cat.streams.push(def);
        if let Err(e) = cat.save(&self.data_dir) {
            let def = cat.streams.pop().expect("just pushed");
            let _ = self.ctx.deregister_table(TableReference::bare(def.name));
            return Err(e);
        }
        Ok(Output::Command("CREATE STREAM".into()))
    }

    /// Validates a sink declaration into its definition (without side effects).
    async fn sink_def(
        &self,
        cat: &Catalog,
        cs: &CreateSink,
    ) -> Result<(SinkDef, query::SinkShape)> {
        // The connector first: an unsupported one gets its own 0A000.
        let connector = match cs.kind {
            QueryKind::Sink => {
                SinkConnector::parse(cs.options.get("connector").unwrap_or("delta"))?
            }
            QueryKind::MaterializedView => SinkConnector::View,
        };
        let table = match cs.kind {
            QueryKind::Sink => connector.option_table(),
            QueryKind::MaterializedView => crate::catalog::option_table(cs.kind),
        };
        cs.options.check(table)?;
        let merge_path = match &cs.merge {
            Some(merge) => Some(self.merge_sink_target(cat, cs, merge, connector)?),
            None => None,
        };
        let connector = if merge_path.is_some() {
            SinkConnector::DeltaMerge
        } else {
            connector
        };
        let trigger = Trigger::parse(cs.options.get("trigger").unwrap_or("default"))?;
        let default_mode = table
            .get("output_mode")
            .and_then(|o| o.default)
            .unwrap_or("append");
        let mode = OutputMode::parse(cs.options.get("output_mode").unwrap_or(default_mode))?;
        if connector.append_only() && mode != OutputMode::Append {
            // Spark: "Data source parquet does not support Update output mode".
            return Err(Error::Unsupported {
                message: format!(
                    "a {} sink does not support {} output mode",
                    connector.name(),
                    mode.as_str()
                ),
                hint: Some(
                    "File sinks only append: use output_mode = 'append' (with a watermark \
                     for an aggregation), or a Delta sink."
                        .into(),
                ),
            });
        }
        if !connector.has_path() && cs.options.get("path").is_some() {
            return Err(Error::invalid_option(format!(
                "a {} sink has no path",
                connector.name()
            )));
        }
        if connector != SinkConnector::Delta && cs.options.get("auto_compact").is_some() {
            return Err(Error::invalid_option(format!(
                "auto_compact applies to Delta sinks, not to a {} sink",
                connector.name()
            )));
        }
        let state_partitions = cs
            .options
            .positive_int("state_partitions")?
            .map(|n| n as usize)
            .unwrap_or(DEFAULT_STATE_PARTITIONS);
        let state_store =
            crate::state::StoreKind::parse(cs.options.get("state_store").unwrap_or("memory"))?;
        let (stream_names, table_names) =
            sink_streams(&crate::sql::expand_window_refs(&cs.query)?, cat)?;
        let tables: Vec<crate::catalog::TableDef> = table_names
            .iter()
            .filter_map(|n| cat.table(n).cloned())
            .collect();
        let streams = stream_names
            .iter()
            .map(|n| {
                cat.stream(n).ok_or_else(|| Error::UndefinedObject {
                    kind: "stream",
                    name: n.clone(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let watermark = match cs.options.get("watermark") {
            Some(wm) => {
                let spec = parse_watermark_option(wm)?;
                // The option applies to each stream with that column; one at least.
                let with_column: Vec<_> = streams
                    .iter()
                    .filter(|s| s.columns.iter().any(|c| c.name == spec.column))
                    .collect();
                if with_column.is_empty() {
                    check_watermark(&streams[0].columns, &spec)?;
                }
                for s in with_column {
                    check_watermark(&s.columns, &spec)?;
                }
                Some(spec)
            }
            None => None,
        };
        let state = StateConfig {
            store: state_store.as_str().to_string(),
            partitions: state_partitions,
            dedup: DedupMode::of(&cs.options)?,
            per_batch: cs.merge.is_some(),
            max_event_time_skew_us: side_tables::skew_of(&cs.options)?,
        };
        let shape = query::analyze_sink(
            &cs.query,
            &streams,
            &tables,
            watermark.as_ref(),
            mode,
            &state,
        )
        .await?;
        if let (Some(merge), Some(path)) = (&cs.merge, &merge_path) {
            // A target that does not exist yet is made with the source's columns.
            let target = crate::sink::delta::merge::existing_schema(path)
                .await?
                .unwrap_or_else(|| shape.schema.clone());
            delta_tables::check_merge(merge, &target, &shape.schema).await?;
        }
        if connector == SinkConnector::View {
            crate::sink::view::Retention::from_options(&cs.options, &shape.output())?;
        }
        if connector == SinkConnector::Kafka {
            // The rows' columns fit the records, and the brokers answer: errors at CREATE,
            // within a bounded time, not at the first batch.
            crate::sink::kafka::KafkaSinkConfig::new(&cs.options, &shape.output())?
                .check_reachable()
                .await?;
        }
        let (checkpoint, owns_checkpoint) = match cs.options.get("checkpoint_location") {
            Some(p) => (absolute(p)?, false),
            None => (self.data_dir.join("checkpoints").join(&cs.name), true),
        };
        // A view's rows live in its checkpoint, so that the two always match.
        let path = match (cs.kind, cs.options.get("path")) {
            _ if merge_path.is_some() => merge_path.clone().unwrap_or_default(),
            (QueryKind::MaterializedView, _) => checkpoint.join("view"),
            (_, Some(p)) => absolute(p)?,
            (_, None) => self.data_dir.join("tables").join(&cs.name),
        };
        Ok((
            SinkDef {
                kind: cs.kind,
                name: cs.name.clone(),
                query: cs.query.clone(),
                options: cs.options.clone(),
                streams: stream_names,
                path,
                checkpoint,
                trigger,
                output_mode: mode.as_str().to_string(),
                state: SinkState::Running,
                error: None,
                owns_checkpoint,
                state_partitions,
                state_store,
                merge: cs.merge.clone(),
                tables: table_names,
            },
            shape,
        ))
    }

    /// A MERGE sink's target directory, after the checks of its options: the connector is
    /// Delta's, the target says where the rows go, each batch's rows are appended to the
    /// MERGE (no output mode but append).
    fn merge_sink_target(
        &self,
        cat: &Catalog,
        cs: &CreateSink,
        merge: &crate::sql::merge::MergeSpec,
        connector: SinkConnector,
    ) -> Result<PathBuf> {
        if connector != SinkConnector::Delta {
            return Err(Error::invalid_option(format!(
                "a MERGE sink writes a Delta table; connector = '{}' is not allowed",
                connector.name()
            )));
        }
        for option in ["path", "auto_compact"] {
            if cs.options.get(option).is_some() {
                return Err(Error::InvalidOption {
                    message: format!("a MERGE sink takes no {option} option"),
                    hint: Some(
                        "The MERGE's target names the table; compact it with OPTIMIZE.".into(),
                    ),
                });
            }
        }
        if let Some(mode) = cs.options.get("output_mode")
            && mode != "append"
        {
            return Err(Error::InvalidOption {
                message: format!(
                    "a MERGE sink runs its MERGE over each micro-batch's rows; output_mode = \
                     '{mode}' does not apply"
                ),
                hint: Some(
                    "Leave output_mode out: the USING query runs over each batch as a static \
                     table, as in Spark's foreachBatch."
                        .into(),
                ),
            });
        }
        self.merge_target(cat, &merge.target)
    }

    async fn create_sink(&self, cs: CreateSink) -> Result<Output> {
        let tag = format!("CREATE {}", cs.kind.keyword());
        let mut cat = self.catalog.lock().await;
        if let Some(kind) = self.name_taken(&cat, &cs.name) {
            if cs.if_not_exists {
                return Ok(Output::Command(tag));
            }
            if cs.or_replace && query_def(&cat, &cs.name, cs.kind).is_ok() {
                drop(cat);
                return self.replace_sink(cs).await;
            }
            return Err(Error::DuplicateObject {
                kind,
                name: cs.name,
            });
        }
        let (mut def, shape) = self.sink_def(&cat, &cs).await?;
        let schema = shape.schema.clone();
        if def.options.get("from").is_some() {
            return Err(Error::invalid_option(
                "from applies only to ALTER SINK ... SET (engine = 'spark') on a local sink",
            ));
        }
        if def.runs_on_spark() {
            self.check_spark_sink(&cat, &mut def).await?;
        }
        if cat.sinks.iter().any(|s| s.checkpoint == def.checkpoint) {
            return Err(Error::invalid_option(format!(
                "checkpoint location \"{}\" is used by another sink or view",
                def.checkpoint.display()
            )));
        }
        // A checkpoint from an earlier sink must be able to serve this one (spec §9.4).
        let streams = sink_streams_of(&def, &cat)?;
        crate::checkpoint::check_definition(
            &def.checkpoint,
            &format!("{} \"{}\"", def.kind.noun(), def.name),
            &query::checkpoint_definition(&def, &streams, &shape),
        )?;
        def.connector()?
            .prepare(&def.name, &def.path, &schema)
            .await?;
        // Side tables made now are unregistered again if the sink is not made.
        let mut made = Vec::new();
        let undo_side_tables = |cat: &mut Catalog, made: &[String]| {
            for name in made {
                cat.tables.retain(|t| &t.name != name);
                let _ = self
                    .ctx
                    .deregister_table(TableReference::bare(name.clone()));
            }
        };
        for kind in side_tables::SideTable::wanted_by(&def.options) {
            match self.ensure_side_table(&mut cat, &def.name, kind).await {
                Ok(true) => made.push(kind.table(&def.name)),
                Ok(false) => {}
                Err(e) => {
                    undo_side_tables(&mut cat, &made);
                    return Err(e);
                }
            }
        }
        cat.sinks.push(def.clone());
        if let Err(e) = self.register_sink(&def, &cat).await {
            cat.sinks.pop();
            undo_side_tables(&mut cat, &made);
            return Err(e);
        }
        if let Err(e) = cat.save(&self.data_dir) {
            cat.sinks.pop();
            undo_side_tables(&mut cat, &made);
            let _ = self
                .ctx
                .deregister_table(TableReference::bare(def.name.clone()));
            return Err(e);
        }
        let mut status = QueryStatus::new(&def.name, Status::Stopped);
        if def.runs_on_spark() {
            status.engine = "spark";
        }
        self.registry.set(status);
        self.spawn(&cat, &def)?;
        Ok(Output::Command(tag))
    }

    /// `CREATE SINK ... WITH (engine = 'spark')`: the endpoint (the sink's, else the
    /// server's, written into the sink's options), what Spark cannot run refused, and the
    /// endpoint reached within `spark_query::CALL_TIMEOUT`.
    async fn check_spark_sink(&self, cat: &Catalog, def: &mut SinkDef) -> Result<()> {
        let remote = match def.options.get("spark_remote") {
            Some(r) => r.to_string(),
            None => self.spark_remote.get().cloned().ok_or_else(|| {
                Error::invalid_option(
                    "engine = 'spark' needs spark_remote = 'sc://host:port', or the server's \
                     --spark-remote",
                )
            })?,
        };
        let parsed = crate::spark::connect::Remote::parse(&remote)?;
        def.options.0.insert("spark_remote".into(), remote);
        let streams = sink_streams_of(def, cat)?;
        crate::spark::translate(def, &streams)?;
        crate::spark::connect::Session::connect(
            &parsed,
            &uuid::Uuid::new_v4().to_string(),
            spark_query::CALL_TIMEOUT,
        )
        .await?
        .probe()
        .await
    }

    async fn explain_sink(&self, cs: CreateSink) -> Result<Output> {
        let cat = self.catalog.lock().await;
        let (def, shape) = self.sink_def(&cat, &cs).await?;
        let streams = sink_streams_of(&def, &cat)?;
        let lines = query::explain(&def, &streams, &shape)?;
        let schema = explain_schema();
        let col: ArrayRef = Arc::new(StringArray::from(lines));
        Ok(Output::Rows(
            schema.clone(),
            vec![RecordBatch::try_new(schema, vec![col])?],
        ))
    }

    /// `EXPLAIN SPARK CREATE SINK`: the PySpark program of the sink, a line a row.
    async fn explain_spark(&self, cs: CreateSink) -> Result<Output> {
        let cat = self.catalog.lock().await;
        let (def, _) = self.sink_def(&cat, &cs).await?;
        let streams = sink_streams_of(&def, &cat)?;
        let program = crate::spark::translate(&def, &streams)?.pyspark();
        let schema = explain_schema();
        let col: ArrayRef = Arc::new(StringArray::from(program.lines().collect::<Vec<_>>()));
        Ok(Output::Rows(
            schema.clone(),
            vec![RecordBatch::try_new(schema, vec![col])?],
        ))
    }

    async fn drop_stream(&self, name: &str, if_exists: bool) -> Result<Output> {
        let mut cat = self.catalog.lock().await;
        if cat.stream(name).is_none() {
            if if_exists {
                return Ok(Output::Command("DROP STREAM".into()));
            }
            return Err(Error::UndefinedObject {
                kind: "stream",
                name: name.to_string(),
            });
        }
        let dependents: Vec<String> = cat
            .sinks
            .iter()
            .filter(|s| s.streams.iter().any(|n| n == name))
            .map(|s| format!("sink \"{}\"", s.name))
            .collect();
        if !dependents.is_empty() {
            return Err(Error::DependentObjects {
                kind: "stream",
                name: name.to_string(),
                dependents: dependents.join(", "),
            });
        }
        cat.streams.retain(|s| s.name != name);
        cat.save(&self.data_dir)?;
        self.forget_problem(name);
        self.ctx
            .deregister_table(TableReference::bare(name.to_string()))?;
        let log = self
            .logs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        if let Some(log) = log {
            log.close();
            let dir = self.stream_dir(name);
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                tracing::warn!(stream = %name, dir = %dir.display(), error = %e, "removing the stream's log");
            }
        }
        Ok(Output::Command("DROP STREAM".into()))
    }

    async fn drop_sink(
        &self,
        name: &str,
        if_exists: bool,
        kind: QueryKind,
        purge: bool,
    ) -> Result<Output> {
        let tag = format!("DROP {}", kind.keyword());
        {
            let cat = self.catalog.lock().await;
            match query_def(&cat, name, kind) {
                Err(Error::UndefinedObject { .. }) if if_exists => {
                    return Ok(Output::Command(tag));
                }
                Err(e) => return Err(e),
                Ok(_) => {}
            }
        }
        self.stop_query(name, StopReason::User).await;
        let mut cat = self.catalog.lock().await;
        let Some(def) = cat.sink(name).cloned() else {
            return Ok(Output::Command(tag));
        };
        cat.sinks.retain(|s| s.name != name);
        cat.save(&self.data_dir)?;
        self.forget_problem(name);
        self.ctx
            .deregister_table(TableReference::bare(name.to_string()))?;
        self.registry.remove(name);
        // The streams' logs no longer keep rows for this query.
        for stream in &def.streams {
            if let Some(log) = self.table_log(stream)
                && let Ok(ck) = crate::checkpoint::Checkpoint::open(&def.checkpoint)
                && let Err(e) = log.remove_reader(&ck.id.to_string())
            {
                tracing::warn!(sink = %name, error = %e, "releasing the stream's log");
            }
        }
        if def.kind == QueryKind::MaterializedView {
            crate::sink::view::forget(&def.path);
        }
        // PURGE: the checkpoint goes wherever it is, and the sink's output too (its Delta
        // table or files, as DROP TABLE ... PURGE deletes a table's), so that a sink made
        // again starts from nothing. A MERGE sink's target is a table of its own, dropped
        // with DROP TABLE.
        if def.owns_checkpoint || purge {
            let _ = std::fs::remove_dir_all(&def.checkpoint);
            let _ = std::fs::remove_dir_all(spark_checkpoint(&def));
        }
        if purge && def.merge.is_none() && def.connector()?.has_path() {
            let lock = crate::sink::delta::table_lock(&def.path);
            let _write = lock.lock().await;
            match std::fs::remove_dir_all(&def.path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(Error::io(format!("removing {}", def.path.display()), e));
                }
                _ => {}
            }
        }
        Ok(Output::Command(tag))
    }

    /// Applies safe changes (trigger, rate limit) to a sink; a running sink restarts with
    /// them after its current batch.
    async fn alter_sink(
        &self,
        name: &str,
        options: crate::sql::options::Options,
        kind: QueryKind,
    ) -> Result<Output> {
        let table = match query_def(&*self.catalog.lock().await, name, kind)?.connector() {
            Ok(c) if kind == QueryKind::Sink => c.option_table(),
            _ => crate::catalog::option_table(kind),
        };
        options.check(table)?;
        let mut options = options;
        if let Some(moved) = self.engine_change(name, &mut options).await? {
            return moved;
        }
        if let Some(key) = options
            .0
            .keys()
            .find(|k| table.get(k).is_some_and(|o| !o.alterable))
        {
            let alterable: Vec<&str> = table
                .options
                .iter()
                .filter(|o| o.alterable)
                .map(|o| o.name)
                .collect();
            let noun = kind.noun();
            return Err(Error::Unsupported {
                message: format!("option \"{key}\" of a {noun} cannot be altered"),
                hint: Some(format!(
                    "ALTER {} changes {}. For other changes, drop the {noun} and create it \
                     again (with a new checkpoint_location if its checkpoint cannot serve the \
                     new definition).",
                    kind.keyword(),
                    alterable.join(", ")
                )),
            });
        }
        let trigger = options.get("trigger").map(Trigger::parse).transpose()?;
        options.positive_int("max_files_per_trigger")?;
        options.positive_int("max_rows_per_trigger")?;
        options.non_negative_int("auto_compact")?;
        let was_running = {
            let cat = self.catalog.lock().await;
            let Some(def) = cat.sink(name) else {
                return Err(Error::UndefinedObject {
                    kind: "sink",
                    name: name.to_string(),
                });
            };
            let connector = def.connector()?;
            if connector != SinkConnector::Delta && options.get("auto_compact").is_some() {
                return Err(Error::invalid_option(format!(
                    "auto_compact applies to Delta sinks, not to a {} sink",
                    connector.name()
                )));
            }
            self.is_running(name)
        };
        if was_running {
            self.stop_query(name, StopReason::User).await;
        }
        let mut cat = self.catalog.lock().await;
        let def = cat.sink_mut(name).ok_or_else(|| Error::UndefinedObject {
            kind: "sink",
            name: name.to_string(),
        })?;
        apply_altered(def, trigger, options);
        let def = def.clone();
        cat.save(&self.data_dir)?;
        if was_running && def.state == SinkState::Running {
            self.spawn(&cat, &def)?;
        }
        Ok(Output::Command(format!("ALTER {}", kind.keyword())))
    }

    /// `engine` in `ALTER SINK ... SET`: the same engine is no change (the key is taken
    /// out); a local sink moves to Spark ([`Self::move_to_spark`], the whole ALTER);
    /// back from Spark is refused. `from` goes only with a move.
    async fn engine_change(
        &self,
        name: &str,
        options: &mut crate::sql::options::Options,
    ) -> Result<Option<Result<Output>>> {
        let on_spark = {
            let cat = self.catalog.lock().await;
            cat.sink(name).is_some_and(SinkDef::runs_on_spark)
        };
        let wanted = options
            .get("engine")
            .map(|e| e.eq_ignore_ascii_case("spark"));
        if wanted.is_none_or(|w| w == on_spark) {
            options.0.remove("engine");
            if options.get("from").is_some() {
                return Err(Error::invalid_option(
                    "from applies only to ALTER SINK ... SET (engine = 'spark') on a local sink",
                ));
            }
            return Ok(None);
        }
        if on_spark {
            return Err(Error::Unsupported {
                message: format!("sink \"{name}\" runs on Spark and cannot move back"),
                hint: Some(
                    "Moving a sink from Spark to the local engine is not supported yet: \
                     create a local sink with a new checkpoint_location."
                        .into(),
                ),
            });
        }
        Ok(Some(self.move_to_spark(name, options.clone()).await))
    }

    /// `ALTER SINK s SET (engine = 'spark', ...)` on a stopped local sink: the sink's
    /// options changed as asked, the translation and the endpoint checked as at `CREATE`,
    /// Spark's checkpoint seeded from the local one ([`crate::spark::handover`]), and the
    /// query started on Spark where the local one stopped.
    async fn move_to_spark(
        &self,
        name: &str,
        mut options: crate::sql::options::Options,
    ) -> Result<Output> {
        use crate::spark::handover;
        let from_beginning = options
            .0
            .remove("from")
            .is_some_and(|f| f.eq_ignore_ascii_case("beginning"));
        let trigger = options.get("trigger").map(Trigger::parse).transpose()?;
        options.positive_int("max_files_per_trigger")?;
        options.positive_int("max_rows_per_trigger")?;
        if self.is_running(name) {
            return Err(Error::WrongState(format!(
                "sink \"{name}\" is running: STOP SINK {name} before moving it to Spark"
            )));
        }
        let mut cat = self.catalog.lock().await;
        let mut def = cat
            .sink(name)
            .cloned()
            .ok_or_else(|| Error::UndefinedObject {
                kind: "sink",
                name: name.to_string(),
            })?;
        apply_altered(&mut def, trigger, options);
        self.check_spark_sink(&cat, &mut def).await?;
        let point = handover::local_point(&def.checkpoint)?;
        let start = handover::decide(name, &point, from_beginning)?;
        if let handover::Start::Fresh { clear_output: true } = start {
            handover::check_output_clearable(&def)?;
        }
        let file_sources: Vec<bool> = sink_streams_of(&def, &cat)?
            .iter()
            .map(|s| s.connector() == "file")
            .collect();
        handover::seed(
            &def.checkpoint,
            &spark_checkpoint(&def),
            &start,
            &file_sources,
            def.state_partitions,
        )?;
        def.state = SinkState::Running;
        def.error = None;
        let slot = cat.sink_mut(name).ok_or_else(|| Error::UndefinedObject {
            kind: "sink",
            name: name.to_string(),
        })?;
        *slot = def.clone();
        cat.save(&self.data_dir)?;
        // With from = 'beginning', the old output goes before the statement returns, so
        // no read after it sees the local rows (the task clears it after a crash here).
        handover::clear_pending_output(&def, &spark_checkpoint(&def))?;
        tracing::info!(sink = %name, start = ?start, "moved to Spark");
        self.registry.update(name, |s| {
            s.engine = "spark";
            s.status = Status::Stopped;
        });
        self.spawn(&cat, &def)?;
        Ok(Output::Command("ALTER SINK".into()))
    }

    async fn stop_sink(&self, name: &str, kind: QueryKind) -> Result<Output> {
        query_def(&*self.catalog.lock().await, name, kind)?;
        self.set_sink_state(name, SinkState::Stopped, None).await?;
        self.stop_query(name, StopReason::User).await;
        self.registry.update(name, |s| s.status = Status::Stopped);
        Ok(Output::Command(format!("STOP {}", kind.keyword())))
    }

    async fn start_sink(&self, name: &str, kind: QueryKind) -> Result<Output> {
        let tag = format!("START {}", kind.keyword());
        let mut cat = self.catalog.lock().await;
        query_def(&cat, name, kind)?;
        let Some(def) = cat.sink_mut(name) else {
            return Err(Error::Internal(format!("{name} vanished")));
        };
        if self.is_running(name) {
            return Ok(Output::Command(tag));
        }
        def.state = SinkState::Running;
        def.error = None;
        let def = def.clone();
        cat.save(&self.data_dir)?;
        self.spawn(&cat, &def)?;
        Ok(Output::Command(tag))
    }

    fn is_running(&self, name: &str) -> bool {
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .is_some_and(|r| !r.done.is_finished())
    }

    /// Starts a sink's query task.
    fn spawn(&self, cat: &Catalog, def: &SinkDef) -> Result<()> {
        if self.shutting_down.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::WrongState("the server is shutting down".into()));
        }
        let streams: Vec<StreamDef> = sink_streams_of(def, cat)?.into_iter().cloned().collect();
        // A sink over a broken stream fails here, not later in its task, so the status is
        // `failed` as soon as the start returns (server start, START SINK).
        if let Some((s, b)) = streams
            .iter()
            .find_map(|s| s.broken.as_ref().map(|b| (s, b)))
        {
            return Err(b.error("stream", &s.name));
        }
        let table_logs = def
            .streams
            .iter()
            .filter_map(|n| self.table_log(n).map(|l| (n.clone(), l)))
            .collect();
        let (stop_tx, stop_rx) = watch::channel(None);
        let wake = Arc::new(Notify::new());
        let mut status = self
            .registry
            .get(&def.name)
            .unwrap_or_else(|| QueryStatus::new(&def.name, Status::Running));
        status.status = Status::Running;
        status.error = None;
        // Reset before the task runs, so a FLUSH right after START sees this run's counts.
        status.triggers = 0;
        status.last_drained_trigger = 0;
        self.registry.set(status);
        let task = QueryTask {
            def: def.clone(),
            streams,
            registry: self.registry.clone(),
            stop: stop_rx,
            wake: wake.clone(),
            table_logs,
            clock: self.clock.clone(),
            tables: cat.tables_of(def)?,
            side_tables: side_tables::SideTable::wanted_by(&def.options)
                .into_iter()
                .filter_map(|k| cat.table(&k.table(&def.name)).map(|t| (k, t.clone())))
                .collect(),
        };
        let engine = self.me.clone();
        let name = def.name.clone();
        let run: futures::future::BoxFuture<'static, Outcome> = if def.runs_on_spark() {
            let streams: Vec<&StreamDef> = task.streams.iter().collect();
            let plan = crate::spark::translate(def, &streams)?;
            let remote = crate::spark::connect::Remote::parse(
                def.options.get("spark_remote").unwrap_or(""),
            )?;
            Box::pin(spark_query::run(spark_query::SparkTask {
                def: task.def,
                plan,
                remote,
                registry: task.registry,
                stop: task.stop,
            }))
        } else {
            Box::pin(query::run(task))
        };
        let done = tokio::spawn(async move {
            // A panic is a bug; it fails this query, not the server.
            let outcome = match AssertUnwindSafe(run).catch_unwind().await {
                Ok(o) => o,
                Err(panic) => {
                    let msg = panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    tracing::error!(sink = %name, panic = %msg, "streaming query panicked");
                    Outcome::Failed(Error::Internal(format!("the query panicked: {msg}")))
                }
            };
            if let Some(engine) = engine.upgrade() {
                engine.on_query_end(&name, outcome).await;
            }
        });
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                def.name.clone(),
                RunningQuery {
                    stop: stop_tx,
                    wake,
                    done,
                },
            );
        Ok(())
    }

    async fn on_query_end(&self, name: &str, outcome: Outcome) {
        let (status, state, error) = match outcome {
            Outcome::Finished => (Status::Finished, Some(SinkState::Finished), None),
            Outcome::Stopped(_) => (Status::Stopped, None, None),
            Outcome::Failed(e) => (Status::Failed, Some(SinkState::Failed), Some(e.to_string())),
        };
        // Durable first: once FLUSH or SHOW QUERIES sees a query failed or finished, a
        // restart finds it so.
        if let Some(state) = state
            && let Err(e) = self.set_sink_state(name, state, error.clone()).await
        {
            tracing::error!(sink = %name, error = %e, "could not record the sink's state");
        }
        self.registry.update(name, |s| {
            s.status = status;
            s.error = error;
        });
    }

    async fn set_sink_state(
        &self,
        name: &str,
        state: SinkState,
        error: Option<String>,
    ) -> Result<()> {
        let mut cat = self.catalog.lock().await;
        let def = cat.sink_mut(name).ok_or_else(|| Error::UndefinedObject {
            kind: "sink",
            name: name.to_string(),
        })?;
        def.state = state;
        def.error = error;
        cat.save(&self.data_dir)
    }

    /// Asks a query to stop after its current batch and waits for it.
    async fn stop_query(&self, name: &str, reason: StopReason) {
        let running = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        if let Some(r) = running {
            let _ = r.stop.send(Some(reason));
            let _ = r.done.await;
        }
    }

    /// Stops every query gracefully; they resume on the next start.
    pub async fn shutdown(&self) {
        self.shutting_down
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let names: Vec<String> = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect();
        for n in names {
            self.stop_query(&n, StopReason::Shutdown).await;
        }
    }

    /// `FLUSH [SINK name]`: waits until the sink has run a trigger that found no new data
    /// after this call (what Spark's `processAllAvailable` does), or has finished.
    async fn flush(&self, sink: Option<&str>) -> Result<Output> {
        let names: Vec<String> = match sink {
            Some(n) => {
                let cat = self.catalog.lock().await;
                if cat.sink(n).is_none() {
                    return Err(Error::UndefinedObject {
                        kind: "sink",
                        name: n.to_string(),
                    });
                }
                vec![n.to_string()]
            }
            None => self
                .running
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .keys()
                .cloned()
                .collect(),
        };
        // One sink can read what another writes (a Delta stream over a sink's table), so
        // `FLUSH` alone goes round again while a round moved any sink: a chain of n sinks
        // settles within n + 1 rounds, and a source that never runs dry cannot hold it
        // longer than that.
        let max_rounds = if sink.is_some() { 1 } else { names.len() + 1 };
        let nouns: Vec<&str> = {
            let cat = self.catalog.lock().await;
            names
                .iter()
                .map(|n| cat.sink(n).map_or("sink", |d| d.kind.noun()))
                .collect()
        };
        for _ in 0..max_rounds {
            let before = self.last_batches(&names);
            for (n, noun) in names.iter().zip(&nouns) {
                self.wait_caught_up(n, noun, sink.is_some()).await?;
            }
            if self.last_batches(&names) == before {
                break;
            }
        }
        Ok(Output::Command("FLUSH".into()))
    }

    /// Each named query's last committed batch, to tell whether a `FLUSH` round moved any.
    fn last_batches(&self, names: &[String]) -> Vec<Option<BatchId>> {
        names
            .iter()
            .map(|n| self.registry.get(n).and_then(|s| s.last_batch_id))
            .collect()
    }

    async fn wait_caught_up(&self, name: &str, noun: &str, explicit: bool) -> Result<()> {
        let mut changes = self.registry.subscribe();
        let Some(start) = self.registry.get(name) else {
            return Ok(());
        };
        let wake = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .map(|r| r.wake.clone());
        if start.status != Status::Running || wake.is_none() {
            return match start.status {
                Status::Failed => Err(Error::WrongState(format!(
                    "{noun} \"{name}\" failed: {}",
                    start.error.unwrap_or_default()
                ))),
                Status::Stopped if explicit => Err(Error::WrongState(format!(
                    "{noun} \"{name}\" is not running"
                ))),
                _ => Ok(()),
            };
        }
        let wake = wake.expect("checked above");
        let asked_at = start.triggers;
        wake.notify_one();
        loop {
            let Some(s) = self.registry.get(name) else {
                return Ok(());
            };
            match s.status {
                Status::Failed => {
                    return Err(Error::WrongState(format!(
                        "{noun} \"{name}\" failed: {}",
                        s.error.unwrap_or_default()
                    )));
                }
                Status::Running if s.last_drained_trigger <= asked_at => {}
                _ => return Ok(()),
            }
            // A trigger may be sleeping; keep nudging it.
            if tokio::time::timeout(Duration::from_millis(200), changes.changed())
                .await
                .is_err()
            {
                wake.notify_one();
            }
        }
    }

    /// Waits until the named sinks are no longer running; errors if one failed.
    pub async fn wait_finished(&self, names: &[String]) -> Result<()> {
        let mut changes = self.registry.subscribe();
        loop {
            let mut all_done = true;
            for n in names {
                match self.registry.get(n).map(|s| (s.status, s.error)) {
                    Some((Status::Failed, e)) => {
                        return Err(Error::WrongState(format!(
                            "sink \"{n}\" failed: {}",
                            e.unwrap_or_default()
                        )));
                    }
                    Some((Status::Running, _)) => all_done = false,
                    _ => {}
                }
            }
            if all_done {
                return Ok(());
            }
            let _ = tokio::time::timeout(Duration::from_millis(500), changes.changed()).await;
        }
    }

    /// Every stream, sink, table and materialized view, as clients' catalog queries
    /// describe them.
    pub async fn relations(&self) -> Vec<crate::catalog::Relation> {
        let mut out = self.catalog.lock().await.relations();
        let problems = self.problems.lock().unwrap_or_else(|e| e.into_inner());
        for r in &mut out {
            if r.broken.is_none() {
                r.broken = problems.get(&r.name).cloned();
            }
        }
        out
    }

    /// The engine, shared (for parts of its session that need to call back into it).
    pub fn handle(&self) -> Weak<Engine> {
        self.me.clone()
    }

    /// The trigger of a sink, if it exists.
    pub async fn sink_trigger(&self, name: &str) -> Option<Trigger> {
        self.catalog.lock().await.sink(name).map(|s| s.trigger)
    }

    async fn show_streams(&self) -> Result<Output> {
        let cat = self.catalog.lock().await;
        let schema = streams_schema();
        let mut rows: Vec<[Option<String>; 6]> = Vec::new();
        let mut mfpt = Vec::new();
        for s in &cat.streams {
            let (format, path, limit) = match s.source() {
                Ok(StreamSource::File(f)) => (
                    Some(f.decoder.format.name().to_string()),
                    Some(f.path.display().to_string()),
                    f.max_files_per_trigger,
                ),
                Ok(StreamSource::Delta(d)) => (
                    None,
                    Some(d.path.display().to_string()),
                    Some(d.max_files_per_trigger),
                ),
                _ => (None, None, None),
            };
            rows.push([
                Some(s.name.clone()),
                Some(s.connector().into()),
                format,
                path,
                Some(
                    s.columns
                        .iter()
                        .map(|c| format!("{} {}", c.name, arrow_to_sql(&c.data_type)))
                        .collect::<Vec<_>>()
                        .join(", "),
                ),
                s.watermark
                    .as_ref()
                    .map(|w| format!("{} - {}", w.column, format_duration(w.delay()))),
            ]);
            mfpt.push(limit.map(|n| n as i64));
        }
        let mut cols = string_columns(&rows);
        cols.push(Arc::new(Int64Array::from(mfpt)));
        Ok(Output::Rows(
            schema.clone(),
            vec![RecordBatch::try_new(schema, cols)?],
        ))
    }

    /// `OPTIMIZE name [ZORDER BY (cols)]`: compacts a Delta sink's table, beside its
    /// running query (the two take turns on the table's lock). One row of Delta's
    /// OPTIMIZE metrics.
    async fn optimize(&self, name: &str, zorder: &[String]) -> Result<Output> {
        let (connector, path) = {
            let cat = self.catalog.lock().await;
            match (cat.table(name), cat.sink(name)) {
                (Some(t), _) => (SinkConnector::Delta, t.path.clone()),
                (None, Some(def)) => (def.connector()?, def.path.clone()),
                (None, None) => {
                    return Err(Error::UndefinedObject {
                        kind: "sink",
                        name: name.to_string(),
                    });
                }
            }
        };
        if !zorder.is_empty() {
            let columns = self.ctx.table_provider(name).await?.schema();
            if let Some(c) = zorder.iter().find(|c| columns.index_of(c).is_err()) {
                return Err(Error::UndefinedObject {
                    kind: "column",
                    name: c.clone(),
                });
            }
        }
        let r = connector.optimize(name, &path, zorder).await?;
        let schema = optimize_schema();
        let int = |v: u64| Arc::new(Int64Array::from(vec![v as i64])) as ArrayRef;
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from(vec![path.display().to_string()])),
                int(r.files_removed),
                int(r.files_added),
                int(r.bytes_removed),
                int(r.bytes_added),
                int(r.files_considered),
                int(r.files_skipped),
            ],
        )?;
        Ok(Output::Rows(schema, vec![batch]))
    }

    async fn show_sinks(&self) -> Result<Output> {
        let cat = self.catalog.lock().await;
        let schema = sinks_schema();
        let rows: Vec<[Option<String>; 8]> = cat
            .sinks
            .iter()
            .filter(|s| s.kind == QueryKind::Sink)
            .map(|s| {
                let status = self
                    .registry
                    .get(&s.name)
                    .map(|q| q.status.as_str().to_string())
                    .unwrap_or_else(|| s.state.as_str().to_string());
                [
                    Some(s.name.clone()),
                    Some(s.streams.join(", ")),
                    Some(s.options.get("connector").unwrap_or("delta").to_string()),
                    // A console, noop or kafka sink has no directory.
                    s.connector()
                        .is_ok_and(|c| c.has_path())
                        .then(|| s.path.display().to_string()),
                    Some(s.trigger.to_string()),
                    Some(s.output_mode.clone()),
                    Some(s.checkpoint.display().to_string()),
                    Some(status),
                ]
            })
            .collect();
        let cols = string_columns(&rows);
        Ok(Output::Rows(
            schema.clone(),
            vec![RecordBatch::try_new(schema, cols)?],
        ))
    }
}

impl Engine {
    /// `SHOW MATERIALIZED VIEWS`: each view's definition, status and what it holds.
    async fn show_views(&self) -> Result<Output> {
        let cat = self.catalog.lock().await;
        let schema = views_schema();
        let mut text: Vec<[Option<String>; 6]> = Vec::new();
        let mut rows = Vec::new();
        let mut batches = Vec::new();
        for s in cat
            .sinks
            .iter()
            .filter(|s| s.kind == QueryKind::MaterializedView)
        {
            let status = self
                .registry
                .get(&s.name)
                .map(|q| q.status.as_str().to_string())
                .unwrap_or_else(|| s.state.as_str().to_string());
            text.push([
                Some(s.name.clone()),
                Some(s.streams.join(", ")),
                Some(s.trigger.to_string()),
                Some(s.output_mode.clone()),
                Some(s.checkpoint.display().to_string()),
                Some(status),
            ]);
            let snap = self
                .ctx
                .table_provider(TableReference::bare(s.name.clone()))
                .await
                .ok()
                .and_then(|t| {
                    t.downcast_ref::<crate::sink::view::ViewTable>()
                        .map(|v| v.snapshot())
                });
            rows.push(snap.as_ref().map(|s| s.num_rows() as i64));
            batches.push(snap.and_then(|s| s.batch).map(|b| b.get() as i64));
        }
        let mut cols = string_columns(&text);
        cols.push(Arc::new(Int64Array::from(rows)));
        cols.push(Arc::new(Int64Array::from(batches)));
        Ok(Output::Rows(
            schema.clone(),
            vec![RecordBatch::try_new(schema, cols)?],
        ))
    }
}

/// The definition named `name`, if it is of `kind`: 42P01 when there is none, 42809 when
/// it is the other kind (`DROP SINK` on a view).
fn query_def<'a>(cat: &'a Catalog, name: &str, kind: QueryKind) -> Result<&'a SinkDef> {
    match cat.sink(name) {
        Some(def) if def.kind == kind => Ok(def),
        Some(def) => Err(Error::WrongObjectType(format!(
            "\"{name}\" is not a {}: it is a {}",
            kind.noun(),
            def.kind.noun()
        ))),
        None => Err(Error::UndefinedObject {
            kind: kind.noun(),
            name: name.to_string(),
        }),
    }
}

fn views_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("name", DataType::Utf8, false),
        Field::new("stream", DataType::Utf8, false),
        Field::new("trigger", DataType::Utf8, false),
        Field::new("output_mode", DataType::Utf8, false),
        Field::new("checkpoint_location", DataType::Utf8, false),
        Field::new("status", DataType::Utf8, false),
        Field::new("rows", DataType::Int64, true),
        Field::new("last_batch", DataType::Int64, true),
    ]))
}

/// A Delta stream's columns: the table's. Declaring them is refused.
async fn delta_columns(
    declared: &[crate::sql::parser::ColumnSpec],
    options: &crate::sql::options::Options,
) -> Result<Vec<crate::sql::parser::ColumnSpec>> {
    if !declared.is_empty() {
        return Err(Error::InvalidOption {
            message: "the columns of a delta stream come from its table".into(),
            hint: Some("Leave the column list out (a WATERMARK FOR clause may stay).".into()),
        });
    }
    // Bad options before the table is read.
    options.check(&crate::source::delta::OPTIONS)?;
    let path = crate::catalog::delta_path(options)?;
    let schema = crate::sink::delta::table_schema(&path).await?;
    schema
        .fields()
        .iter()
        .map(|f| {
            let sql_type = arrow_to_sql(f.data_type());
            Ok(crate::sql::parser::ColumnSpec {
                name: f.name().clone(),
                data_type: crate::sql::types::sql_to_arrow(&sql_type)?,
                sql_type,
                not_null: false,
            })
        })
        .collect()
}

/// The columns a statement returns, for the extended protocol's Describe; `None` for
/// statements that return a command tag.
pub fn result_schema(stmt: &TidemarkStatement) -> Option<SchemaRef> {
    match stmt {
        TidemarkStatement::ShowStreams => Some(streams_schema()),
        TidemarkStatement::ShowSinks => Some(sinks_schema()),
        TidemarkStatement::ShowViews => Some(views_schema()),
        TidemarkStatement::ShowQueries => Some(queries_schema()),
        TidemarkStatement::ShowProgress(_) => last_progress_batch(None).ok().map(|b| b.schema()),
        TidemarkStatement::ShowOptions => Some(options_schema()),
        TidemarkStatement::ExplainCreateSink(_) | TidemarkStatement::ExplainSparkCreateSink(_) => {
            Some(explain_schema())
        }
        TidemarkStatement::Optimize { .. } => Some(optimize_schema()),
        TidemarkStatement::ShowSetting(name) => settings::schema(name).ok(),
        _ => None,
    }
}

/// The row `OPTIMIZE` answers: Delta's OPTIMIZE metrics.
fn optimize_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("path", DataType::Utf8, false),
        Field::new("files_removed", DataType::Int64, false),
        Field::new("files_added", DataType::Int64, false),
        Field::new("bytes_removed", DataType::Int64, false),
        Field::new("bytes_added", DataType::Int64, false),
        Field::new("files_considered", DataType::Int64, false),
        Field::new("files_skipped", DataType::Int64, false),
    ]))
}

fn options_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("object", DataType::Utf8, false),
        // NULL for a materialized view, which has no connector.
        Field::new("connector", DataType::Utf8, true),
        Field::new("option", DataType::Utf8, false),
        Field::new("type", DataType::Utf8, false),
        Field::new("default", DataType::Utf8, true),
        Field::new("required", DataType::Boolean, false),
        Field::new("alterable", DataType::Boolean, false),
        Field::new("description", DataType::Utf8, false),
    ]))
}

/// One row per option of every connector, from the option tables.
fn options_batch(schema: &SchemaRef) -> Result<RecordBatch> {
    let rows: Vec<(
        &crate::sql::options::OptionTable,
        &crate::sql::options::OptionSpec,
    )> = crate::catalog::option_tables()
        .into_iter()
        .flat_map(|t| t.options.iter().map(move |o| (t, o)))
        .collect();
    let text = |f: &dyn Fn(
        &(
            &crate::sql::options::OptionTable,
            &crate::sql::options::OptionSpec,
        ),
    ) -> Option<String>|
     -> ArrayRef {
        Arc::new(StringArray::from(rows.iter().map(f).collect::<Vec<_>>()))
    };
    let flag = |f: &dyn Fn(&crate::sql::options::OptionSpec) -> bool| -> ArrayRef {
        Arc::new(datafusion::arrow::array::BooleanArray::from(
            rows.iter().map(|(_, o)| f(o)).collect::<Vec<_>>(),
        ))
    };
    Ok(RecordBatch::try_new(
        schema.clone(),
        vec![
            text(&|(t, _)| Some(t.object.to_string())),
            text(&|(t, _)| Some(t.connector.to_string()).filter(|c| !c.is_empty())),
            text(&|(_, o)| Some(o.name.to_string())),
            text(&|(_, o)| Some(o.ty.describe())),
            text(&|(_, o)| o.default.map(str::to_string)),
            flag(&|o| o.required),
            flag(&|o| o.alterable),
            text(&|(_, o)| Some(o.doc.to_string())),
        ],
    )?)
}

fn streams_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("name", DataType::Utf8, false),
        Field::new("connector", DataType::Utf8, false),
        Field::new("format", DataType::Utf8, true),
        Field::new("path", DataType::Utf8, true),
        Field::new("columns", DataType::Utf8, false),
        Field::new("watermark", DataType::Utf8, true),
        Field::new("max_files_per_trigger", DataType::Int64, true),
    ]))
}

fn sinks_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("name", DataType::Utf8, false),
        Field::new("stream", DataType::Utf8, false),
        Field::new("connector", DataType::Utf8, false),
        Field::new("path", DataType::Utf8, false),
        Field::new("trigger", DataType::Utf8, false),
        Field::new("output_mode", DataType::Utf8, false),
        Field::new("checkpoint_location", DataType::Utf8, false),
        Field::new("status", DataType::Utf8, false),
    ]))
}

fn explain_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new("plan", DataType::Utf8, false)]))
}

/// Gives columns the types of `schema` (casting where they differ) as one batch.
pub(crate) fn cast_to_schema(columns: &[ArrayRef], schema: &SchemaRef) -> Result<RecordBatch> {
    let columns = columns
        .iter()
        .zip(schema.fields())
        .map(|(c, f)| {
            if c.data_type() == f.data_type() {
                Ok(c.clone())
            } else {
                datafusion::arrow::compute::cast(c, f.data_type()).map_err(Error::from)
            }
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

fn string_columns<const N: usize>(rows: &[[Option<String>; N]]) -> Vec<ArrayRef> {
    (0..N)
        .map(|i| {
            Arc::new(StringArray::from(
                rows.iter().map(|r| r[i].clone()).collect::<Vec<_>>(),
            )) as ArrayRef
        })
        .collect()
}

fn absolute(p: &str) -> Result<PathBuf> {
    let path = PathBuf::from(p);
    if !path.is_absolute() {
        return Err(Error::invalid_option(format!(
            "path \"{p}\" must be absolute"
        )));
    }
    Ok(path)
}

/// The streams a sink's query reads, in the order it names them (its sources' order), and
/// the tables (`CREATE TABLE`) it joins them with.
fn sink_streams(query: &str, cat: &Catalog) -> Result<(Vec<String>, Vec<String>)> {
    use datafusion::sql::sqlparser::ast::{Statement, visit_relations};
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
    use datafusion::sql::sqlparser::parser::Parser;
    let stmts = Parser::parse_sql(&PostgreSqlDialect {}, query)?;
    let mut names = Vec::new();
    for s in &stmts {
        let _ = visit_relations(s, |rel| {
            let parts: Vec<String> = rel
                .0
                .iter()
                .filter_map(|p| p.as_ident().map(crate::sql::parser::normalize_ident))
                .collect();
            // `public.name` is the name itself (dbt writes names so).
            let parts = match parts.as_slice() {
                [schema, name] if schema == "public" => vec![name.clone()],
                _ => parts,
            };
            if let Some(name) = parts.last() {
                names.push((parts.len(), name.clone()));
            }
            std::ops::ControlFlow::<()>::Continue(())
        });
        if !matches!(s, Statement::Query(_)) {
            return Err(Error::Syntax("a sink's body must be a query".into()));
        }
    }
    let mut streams: Vec<String> = Vec::new();
    let mut tables: Vec<String> = Vec::new();
    for (parts, n) in names {
        if parts == 1 && cat.stream(&n).is_some() {
            if !streams.contains(&n) {
                streams.push(n);
            }
        } else if parts == 1 && cat.table(&n).is_some() {
            if !tables.contains(&n) {
                tables.push(n);
            }
        } else if cat.sink(&n).is_some() || parts > 1 {
            return Err(Error::unsupported(format!(
                "a sink's query reads streams and tables; \"{n}\" is neither (a sink's or view's \
                 output is read as a stream with connector = 'delta')"
            )));
        } else {
            return Err(Error::UndefinedObject {
                kind: "stream",
                name: n,
            });
        }
    }
    if streams.is_empty() {
        return Err(Error::InvalidOption {
            message: "a sink's query must read a stream".into(),
            hint: Some("Add FROM <stream>.".into()),
        });
    }
    Ok((streams, tables))
}

/// The definitions of the streams a sink reads, in its sources' order.
/// The changes of an `ALTER SINK ... SET`, made to `def`.
fn apply_altered(
    def: &mut SinkDef,
    trigger: Option<Trigger>,
    options: crate::sql::options::Options,
) {
    if let Some(t) = trigger {
        def.trigger = t;
    }
    def.options.0.extend(options.0);
}

/// The checkpoint of a sink's query on Spark, beside Tidemark's (`spark::translate` names
/// it so in the plan).
fn spark_checkpoint(def: &SinkDef) -> PathBuf {
    PathBuf::from(format!("{}-spark", def.checkpoint.display()))
}

fn sink_streams_of<'a>(def: &SinkDef, cat: &'a Catalog) -> Result<Vec<&'a StreamDef>> {
    def.streams
        .iter()
        .map(|n| {
            cat.stream(n).ok_or_else(|| Error::UndefinedObject {
                kind: "stream",
                name: n.clone(),
            })
        })
        .collect()
}

fn state_config(def: &SinkDef) -> StateConfig {
    StateConfig {
        store: def.state_store.as_str().to_string(),
        partitions: def.state_partitions,
        // Checked when the sink was created.
        dedup: DedupMode::of(&def.options).unwrap_or_default(),
        per_batch: def.merge.is_some(),
        max_event_time_skew_us: side_tables::skew_of(&def.options).unwrap_or_default(),
    }
}
