//! The Postgres wire server. The only module that knows pgwire.
//!
//! Every query string is split into statements ([`crate::sql::split`]); Tidemark's own
//! statements are executed by the [`Engine`], the rest are passed, as the client wrote them,
//! to datafusion-postgres's `DfSessionService`, which brings pg_catalog emulation (psql's
//! `\d`), `SET`/`SHOW`, transactions and Arrow-to-wire encoding. Both the simple and the
//! extended protocol go through here. A read-only query without parameters is planned here
//! instead, and its plan kept for the next run of the same text ([`plans`]).

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::logical_expr::{ColumnarValue, LogicalPlan, ScalarUDF, Volatility, create_udf};
use datafusion::scalar::ScalarValue;
use datafusion::sql::sqlparser::ast::Statement as SqlStatement;
use datafusion_postgres::DfSessionService;
use datafusion_postgres::arrow_pg::datatypes::arrow_schema_to_pg_fields;
use datafusion_postgres::datafusion_pg_catalog::pg_catalog::context::EmptyContextProvider;
use datafusion_postgres::datafusion_pg_catalog::setup_pg_catalog;
use datafusion_postgres::pgwire;
use futures::Sink;
use futures::SinkExt;
use pgwire::api::cancel::DefaultCancelHandler;
use pgwire::api::portal::{Format, Portal};
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::results::{FieldInfo, QueryResponse, Response, Tag};
use pgwire::api::stmt::QueryParser;
use pgwire::api::store::Entry;
use pgwire::api::store::PortalStore;
use pgwire::api::{ClientInfo, ClientPortalStore, ConnectionManager, Type};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::PgWireBackendMessage;
use pgwire::messages::data::{DataRow, NoData, ParameterDescription};
use pgwire::messages::extendedquery::{Describe, TARGET_TYPE_BYTE_STATEMENT};
use pgwire::messages::response::TransactionStatus;
use pgwire::tokio::TlsAcceptor;
use pgwire::types::format::FormatOptions;
use tokio::net::TcpListener;

mod activity;
mod catalog;
mod conn;
mod constraints;
mod copy;
mod explain;
mod information_schema;
mod insert;
mod interrupt;
mod login;
mod lookup;
mod notify;
mod pgtext;
mod plans;
mod rewrite;
mod roles_catalog;
mod session;

use crate::auth::{AuthMethod, RoleDef};
use crate::engine::{Engine, Output};
use crate::error::{Error, postgres_error};
use crate::sql::parser::SavepointCommand;
use crate::sql::{Piece, parse_tidemark, split};

/// The string `SELECT version()` returns. Clients parse the leading "PostgreSQL <n>".
pub const VERSION_STRING: &str = concat!(
    "PostgreSQL 17.6 (Tidemark ",
    env!("CARGO_PKG_VERSION"),
    ", a streaming database on Apache DataFusion)"
);

/// Prepares the engine's session for Postgres clients: pg_catalog, `version()`.
pub fn prepare_session(engine: &Engine) -> crate::error::Result<()> {
    let ctx = engine.context();
    setup_pg_catalog(ctx, "datafusion", EmptyContextProvider).map_err(|e| Error::DataFusion(*e))?;
    catalog::install(engine, "datafusion")?;
    information_schema::install(engine, "datafusion")?;
    ctx.register_udf(version_udf());
    ctx.register_udf(session::current_setting_udf());
    ctx.register_udf(notify::pg_notify_udf());
    Ok(())
}

fn version_udf() -> ScalarUDF {
    create_udf(
        "version",
        vec![],
        DataType::Utf8,
        Volatility::Immutable,
        Arc::new(|_args: &[ColumnarValue]| {
            Ok(ColumnarValue::Scalar(ScalarValue::Utf8(Some(
                VERSION_STRING.to_string(),
            ))))
        }),
    )
}

/// How the server meets its clients: `tidemark serve`'s flags.
#[derive(Clone, Default)]
pub struct ServerOptions {
    /// `--auth`; `None` is the default: trust for loopback clients, SCRAM-SHA-256 for others.
    pub auth: Option<AuthMethod>,
    /// `--tls-cert` and `--tls-key`: clients may ask for TLS (`sslmode=require`).
    pub tls: Option<TlsAcceptor>,
    /// `--max-connections`; 0 is no limit.
    pub max_connections: usize,
    /// `--idle-session-timeout`: a session idle this long outside a transaction is closed.
    pub idle_session_timeout: Option<std::time::Duration>,
}

/// The TLS acceptor of a certificate chain and its private key, both PEM files.
pub fn tls_acceptor(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> crate::error::Result<TlsAcceptor> {
    use pgwire::tokio::tokio_rustls::rustls::{self, ServerConfig};
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let read = |path: &std::path::Path| {
        std::fs::read(path).map_err(|e| Error::io(format!("reading {}", path.display()), e))
    };
    let bad = |path: &std::path::Path, e: String| Error::InvalidOption {
        message: format!("{}: {e}", path.display()),
        hint: Some("--tls-cert takes a PEM certificate chain, --tls-key a PEM private key.".into()),
    };
    let cert_pem = read(cert)?;
    let certs = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(cert, e.to_string()))?;
    if certs.is_empty() {
        return Err(bad(cert, "no certificate found".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(&read(key)?).map_err(|e| bad(key, e.to_string()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_no_client_auth().with_single_cert(certs, key))
        .map_err(|e| bad(cert, e.to_string()))?;
    // Postgres 17's direct TLS negotiation names this protocol.
    config.alpn_protocols = vec![b"postgresql".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Says what each of the wire's metrics means (`tidemark_connections`, ...), for the
/// Prometheus exposition; call after installing the recorder.
pub fn describe_metrics() {
    metrics::describe_gauge!("tidemark_connections", "Open client connections");
    metrics::describe_counter!(
        "tidemark_connections_total",
        "Client connections accepted since the server started"
    );
    metrics::describe_counter!(
        "tidemark_statements_total",
        "Statements run (each Query message and each Execute)"
    );
    metrics::describe_counter!(
        "tidemark_errors_total",
        "Errors sent to clients, by SQLSTATE"
    );
    metrics::describe_counter!(
        "tidemark_view_key_lookups_total",
        "Queries answered by reading a view's row by its whole key, without planning"
    );
}

/// Accepts connections until `shutdown` completes. Each connection gets its own task.
pub async fn run(
    listener: TcpListener,
    engine: Arc<Engine>,
    options: ServerOptions,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let events = notify::forward_events(engine.registry());
    let handlers = Arc::new(Handlers::new(engine, options));
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => {
                events.abort();
                return Ok(());
            }
            accepted = listener.accept() => {
                match accepted {
                    Ok((socket, addr)) => {
                        let handlers = handlers.clone();
                        metrics::counter!("tidemark_connections_total").increment(1);
                        tokio::spawn(async move {
                            let open = metrics::gauge!("tidemark_connections");
                            open.increment(1.0);
                            if let Err(e) = conn::serve(socket, handlers).await {
                                tracing::debug!(%addr, error = %e, "connection ended with an error");
                            }
                            open.decrement(1.0);
                        });
                    }
                    Err(e) => tracing::warn!(error = %e, "accept failed"),
                }
            }
        }
    }
}

/// The handlers of every connection ([`conn`] calls them).
pub struct Handlers {
    service: Arc<TidemarkService>,
    startup: Arc<login::Startup>,
    cancel: Arc<DefaultCancelHandler>,
    tls: Option<TlsAcceptor>,
    idle_session_timeout: Option<std::time::Duration>,
}

impl Handlers {
    pub fn new(engine: Arc<Engine>, options: ServerOptions) -> Handlers {
        let connections = Arc::new(ConnectionManager::new());
        let inner = Arc::new(DfSessionService::new(Arc::new(engine.context().clone())));
        let parser = Arc::new(TidemarkParser {
            inner: inner.query_parser(),
            engine: engine.clone(),
        });
        Handlers {
            startup: Arc::new(login::Startup::new(
                engine.clone(),
                connections.clone(),
                options.auth,
                options.max_connections,
            )),
            service: Arc::new(TidemarkService {
                engine,
                inner,
                parser,
                plans: plans::PlanCache::default(),
            }),
            cancel: Arc::new(DefaultCancelHandler::new(connections)),
            tls: options.tls,
            idle_session_timeout: options.idle_session_timeout,
        }
    }
}

/// Turns a Tidemark error into the wire's ErrorResponse.
pub fn to_pg_error(e: &Error) -> PgWireError {
    PgWireError::UserError(Box::new(error_info(e)))
}

fn error_info(e: &Error) -> ErrorInfo {
    let mut info = ErrorInfo::new("ERROR".into(), e.sqlstate().code().into(), e.to_string());
    info.hint = e.hint();
    info.where_context = e.context();
    info
}

/// Gives errors from datafusion-postgres a proper SQLSTATE (it sends XX000 for all).
fn classify_pg_error(e: PgWireError) -> PgWireError {
    match e {
        PgWireError::ApiError(inner) => {
            if let Some(df) = inner.downcast_ref::<datafusion::error::DataFusionError>() {
                let worded = postgres_error(df);
                let mut info =
                    ErrorInfo::new("ERROR".into(), worded.state.code().into(), worded.message);
                info.hint = worded.hint;
                return PgWireError::UserError(Box::new(info));
            }
            if let Some(pe) =
                inner.downcast_ref::<datafusion::sql::sqlparser::parser::ParserError>()
            {
                return to_pg_error(&Error::from(pe.clone()));
            }
            PgWireError::UserError(Box::new(ErrorInfo::new(
                "ERROR".into(),
                "XX000".into(),
                inner.to_string(),
            )))
        }
        other => other,
    }
}

/// The query handler of every connection.
pub struct TidemarkService {
    engine: Arc<Engine>,
    inner: Arc<DfSessionService>,
    parser: Arc<TidemarkParser>,
    /// Read-only queries' plans, kept for their next run.
    plans: plans::PlanCache,
}

/// Whether the statement `sql` begins with `keyword`, in any case, after leading blanks
/// (comments are not skipped: a false "no" only costs kept plans).
fn starts_with_keyword(sql: &str, keyword: &str) -> bool {
    let t = sql.trim_start();
    t.len() > keyword.len()
        && t.is_char_boundary(keyword.len())
        && t[..keyword.len()].eq_ignore_ascii_case(keyword)
        && t[keyword.len()..].starts_with(|c: char| c.is_whitespace())
}

/// The command tag Postgres answers a DDL statement DataFusion runs (`CREATE VIEW`,
/// `DROP SCHEMA`): DataFusion answers those with an empty result, which psql would print
/// as a table of no columns.
fn ddl_tag(sql: &str) -> Option<String> {
    let words: Vec<String> = sql
        .split_whitespace()
        .take(6)
        .map(str::to_ascii_uppercase)
        .collect();
    let verb = words.first()?;
    if !matches!(verb.as_str(), "CREATE" | "DROP" | "ALTER") {
        return None;
    }
    let object = words[1..]
        .iter()
        .find(|w| !matches!(w.as_str(), "OR" | "REPLACE" | "TEMP" | "TEMPORARY"))?;
    let object: String = object
        .chars()
        .take_while(|c| c.is_ascii_alphabetic())
        .collect();
    (!object.is_empty()).then(|| format!("{verb} {object}"))
}

/// Runs a planned query, its rows encoded for the wire as they come.
fn encode_plan<C: ClientInfo>(
    client: &C,
    ready: plans::Ready,
    format: &Format,
    stop: interrupt::Stop,
) -> PgWireResult<Response> {
    use datafusion_postgres::arrow_pg::datatypes::encode_recordbatch;
    use futures::StreamExt;
    let options = Arc::new(FormatOptions::from_client_metadata(client.metadata()));
    let fields = Arc::new(arrow_schema_to_pg_fields(
        &ready.schema,
        format,
        Some(options),
    )?);
    let batches = datafusion::physical_plan::execute_stream(ready.plan, ready.task)
        .map_err(|e| classify_pg_error(PgWireError::ApiError(Box::new(e))))?;
    let encode = fields.clone();
    let rows = batches
        .map(move |batch| {
            let rows: Box<dyn Iterator<Item = PgWireResult<DataRow>> + Send + Sync> = match batch {
                Ok(b) => encode_recordbatch(encode.clone(), pgtext::to_postgres_text(b, &encode)),
                Err(e) => Box::new(std::iter::once(Err(classify_pg_error(
                    PgWireError::ApiError(Box::new(e)),
                )))),
            };
            futures::stream::iter(rows)
        })
        .flatten();
    Ok(Response::Query(QueryResponse::new(
        fields,
        interrupt::rows_until(rows, stop),
    )))
}

/// What answers a read-only query.
enum Answer {
    /// A plan to run.
    Plan(plans::Ready),
    /// The rows, already read (a view's key lookup).
    Rows(datafusion::arrow::datatypes::SchemaRef, RecordBatch),
}

/// `rows` for the wire, as [`encode_plan`] encodes a plan's.
fn encode_rows<C: ClientInfo>(
    client: &C,
    schema: &datafusion::arrow::datatypes::Schema,
    rows: RecordBatch,
    format: &Format,
) -> PgWireResult<Response> {
    use datafusion_postgres::arrow_pg::datatypes::encode_recordbatch;
    let options = Arc::new(FormatOptions::from_client_metadata(client.metadata()));
    let fields = Arc::new(arrow_schema_to_pg_fields(schema, format, Some(options))?);
    let rows: Vec<PgWireResult<DataRow>> =
        encode_recordbatch(fields.clone(), pgtext::to_postgres_text(rows, &fields)).collect();
    Ok(Response::Query(QueryResponse::new(
        fields,
        futures::stream::iter(rows),
    )))
}

/// Encodes an engine result for the wire.
async fn encode_output(
    _engine: &Engine,
    output: Output,
    format: &Format,
) -> PgWireResult<Response> {
    use datafusion_postgres::arrow_pg::datatypes::encode_recordbatch;
    match output {
        Output::Command(tag) => Ok(Response::Execution(Tag::new(&tag))),
        // `run_tidemark` sends the notice; here only the output is left.
        Output::Notice(_, then) => Box::pin(encode_output(_engine, *then, format)).await,
        Output::Rows(schema, batches) => {
            let fields = Arc::new(arrow_schema_to_pg_fields(&schema, format, None)?);
            let encode = fields.clone();
            let rows = batches.into_iter().flat_map(move |b| {
                encode_recordbatch(encode.clone(), pgtext::to_postgres_text(b, &encode))
            });
            Ok(Response::Query(QueryResponse::new(
                fields,
                futures::stream::iter(rows),
            )))
        }
    }
}

impl TidemarkService {
    /// Runs `sql` if it is one read-only query, through its kept plan if it has one
    /// ([`plans`]). `planned` is its logical plan if the caller has it (the extended
    /// protocol's statement); otherwise `sql` is parsed here. `None` if it is not such a
    /// query, or is in a failed transaction block: the caller runs it as any other
    /// statement (which also reports a syntax error).
    async fn read<C: ClientInfo + Unpin + Send + Sync>(
        &self,
        client: &C,
        sql: &str,
        planned: Option<&LogicalPlan>,
        format: &Format,
    ) -> Option<PgWireResult<Response>> {
        if client.transaction_status() == TransactionStatus::Error {
            return None;
        }
        let ctx = self.engine.context();
        let planned = async {
            if let Some(ready) = self.plans.get(ctx, sql).await? {
                return Ok(Some(Answer::Plan(ready)));
            }
            let plan = match planned {
                Some(plan) => plan.clone(),
                None => match self.parser.inner.parse_sql(client, sql, &[]).await {
                    Ok(Some((_, Some((SqlStatement::Query(_), plan))))) => plan,
                    _ => return Ok(None),
                },
            };
            self.answer(Some(sql), plan).await
        };
        self.respond(client, planned, format).await
    }

    /// A read-only query of the extended protocol with parameters: bound as
    /// datafusion-postgres binds them, then run as [`TidemarkService::read`] runs a query
    /// (its values in PostgreSQL's text, a view's key lookup without planning), never
    /// kept. `None` for anything else, or parameters whose types the plan does not give
    /// (datafusion-postgres infers more): the caller hands those to datafusion-postgres.
    async fn read_bound<C: ClientInfo + Unpin + Send + Sync>(
        &self,
        client: &C,
        portal: &Portal<ExtStatement>,
    ) -> Option<PgWireResult<Response>> {
        use datafusion_postgres::arrow_pg::datatypes::df::deserialize_parameters_with_server_types;
        let (_, Some((SqlStatement::Query(_), plan))) = &portal.statement.statement else {
            return None;
        };
        if client.transaction_status() == TransactionStatus::Error {
            return None;
        }
        let types = plan.get_parameter_types().ok()?;
        let mut inferred: Vec<Option<DataType>> = vec![None; types.len()];
        for (id, ty) in types {
            let n: usize = id.strip_prefix('$')?.parse().ok()?;
            *inferred.get_mut(n.checked_sub(1)?)? = Some(ty?);
        }
        let server = match self
            .parser
            .inner
            .get_parameter_types(&portal.statement.statement)
        {
            Ok(t) => t,
            Err(e) => return Some(Err(classify_pg_error(e))),
        };
        let inferred: Vec<Option<&DataType>> = inferred.iter().map(Option::as_ref).collect();
        let server: Vec<Option<&Type>> = server.iter().map(Some).collect();
        let bound = deserialize_parameters_with_server_types(portal, &inferred, &server).and_then(
            |values| {
                plan.clone()
                    .replace_params_with_values(&values)
                    .map_err(|e| PgWireError::ApiError(Box::new(e)))
            },
        );
        let plan = match bound {
            Ok(plan) => plan,
            Err(e) => return Some(Err(classify_pg_error(e))),
        };
        self.respond(
            client,
            self.answer(None, plan),
            &portal.result_column_format,
        )
        .await
    }

    /// How `plan` (of the query `sql`, or with bound parameters) is answered: a key lookup
    /// in a view, else a plan, kept under `sql` if it may be. `None`: not a read-only query.
    async fn answer(
        &self,
        sql: Option<&str>,
        plan: LogicalPlan,
    ) -> datafusion::error::Result<Option<Answer>> {
        if let Some(lookup) = lookup::Lookup::analyze(&plan) {
            let schema = lookup.schema.clone();
            let found = lookup
                .run()
                .await
                .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?;
            if let Some(rows) = found {
                metrics::counter!("tidemark_view_key_lookups_total").increment(1);
                return Ok(Some(Answer::Rows(schema, rows)));
            }
        }
        let ready = self.plans.plan(self.engine.context(), sql, plan).await?;
        Ok(ready.map(Answer::Plan))
    }

    /// Runs `planned` unless the client cancels or the statement times out first, and
    /// encodes its rows. `None` when it is not a read-only query.
    async fn respond<C: ClientInfo + Unpin + Send + Sync>(
        &self,
        client: &C,
        planned: impl Future<Output = datafusion::error::Result<Option<Answer>>>,
        format: &Format,
    ) -> Option<PgWireResult<Response>> {
        let stop = interrupt::watch(client).await;
        let planned = tokio::select! {
            p = planned => p,
            why = stop.clone() => return Some(Err(why.error())),
        };
        match planned {
            Ok(Some(Answer::Plan(ready))) => {
                tracing::trace!(kept = ready.kept, "read-only query");
                Some(encode_plan(client, ready, format, stop))
            }
            Ok(Some(Answer::Rows(schema, rows))) => {
                tracing::trace!("view key lookup");
                Some(encode_rows(client, &schema, rows, format))
            }
            Ok(None) => None,
            Err(e) => Some(Err(classify_pg_error(PgWireError::ApiError(Box::new(e))))),
        }
    }

    async fn run_tidemark<C>(
        &self,
        client: &mut C,
        text: &str,
        format: &Format,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let stmt = parse_tidemark(text).map_err(|e| to_pg_error(&e))?;
        match stmt {
            crate::sql::TidemarkStatement::ShowSetting(name) => {
                return session::show(&self.engine, client, &name, format).await;
            }
            crate::sql::TidemarkStatement::Discard(what) => {
                return session::discard(client, &what);
            }
            crate::sql::TidemarkStatement::CopyFrom(c) => {
                return copy::start(&self.engine, client, c);
            }
            crate::sql::TidemarkStatement::Savepoint(c) => {
                return savepoint(client.transaction_status(), &c);
            }
            crate::sql::TidemarkStatement::Listen(channel) => {
                if let Some(r) = client.session_extensions().get::<activity::Registered>() {
                    r.0.mailbox.listen(&channel);
                }
                return Ok(Response::Execution(Tag::new("LISTEN")));
            }
            crate::sql::TidemarkStatement::Unlisten(channel) => {
                if let Some(r) = client.session_extensions().get::<activity::Registered>() {
                    r.0.mailbox.unlisten(channel.as_deref());
                }
                return Ok(Response::Execution(Tag::new("UNLISTEN")));
            }
            crate::sql::TidemarkStatement::Notify { channel, payload } => {
                notify::check_payload(&payload).map_err(|e| to_pg_error(&e))?;
                notify::notify(client.pid_and_secret_key().0, &channel, &payload);
                return Ok(Response::Execution(Tag::new("NOTIFY")));
            }
            _ => {}
        }
        // FLUSH only waits: a cancel or statement_timeout may stop it.
        let waits = matches!(stmt, crate::sql::TidemarkStatement::Flush { .. });
        let work = async { self.engine.execute(stmt).await.map_err(|e| to_pg_error(&e)) };
        let mut output = if waits {
            interrupt::race(work, interrupt::watch(client).await).await?
        } else {
            work.await?
        };
        while let Output::Notice(notice, then) = output {
            let info = ErrorInfo::new("NOTICE".into(), "00000".into(), notice);
            client
                .feed(PgWireBackendMessage::NoticeResponse(info.into()))
                .await?;
            output = *then;
        }
        encode_output(&self.engine, output, format).await
    }

    /// `EXPLAIN query`, as Postgres prints it ([`explain`]).
    async fn explain<C: ClientInfo>(&self, client: &C, query: &str) -> PgWireResult<Response> {
        let rewritten = rewrite::rewrite_client_query(query, &session_facts(client));
        let query = rewritten.as_deref().unwrap_or(query);
        let lines = async {
            let df = self.engine.context().sql(query).await?;
            let plan = df.create_physical_plan().await?;
            explain::lines(&plan)
        };
        let lines = lines
            .await
            .map_err(|e| classify_pg_error(PgWireError::ApiError(Box::new(e))))?;
        let schema = Arc::new(datafusion::arrow::datatypes::Schema::new(vec![
            datafusion::arrow::datatypes::Field::new(
                "QUERY PLAN",
                datafusion::arrow::datatypes::DataType::Utf8,
                false,
            ),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(datafusion::arrow::array::StringArray::from(lines))],
        )
        .map_err(|e| to_pg_error(&Error::from(e)))?;
        encode_output(
            &self.engine,
            Output::Rows(schema, vec![batch]),
            &Format::UnifiedText,
        )
        .await
    }

    /// Refuses `piece` with 42501 when the connection's role may not run it. Superusers,
    /// and trusted users that are no role, may run anything.
    async fn check_privileges<C: ClientInfo>(&self, client: &C, piece: &Piece) -> PgWireResult<()> {
        let Some(role) = self.role_to_check(client) else {
            return Ok(());
        };
        let needs = match piece {
            Piece::Tidemark(text) => match parse_tidemark(text) {
                Ok(stmt) => crate::sql::privilege::of_tidemark(&stmt),
                // Running it reports the syntax error.
                Err(_) => return Ok(()),
            },
            Piece::Other(text) => {
                let relations: std::collections::HashSet<String> = self
                    .engine
                    .relations()
                    .await
                    .into_iter()
                    .map(|r| r.name)
                    .collect();
                crate::sql::privilege::of_sql(text, &|name| relations.contains(name))
            }
        };
        match needs.iter().find(|n| !role.has(n.privilege)) {
            Some(need) => Err(to_pg_error(&need.refusal(piece.text()))),
            None => Ok(()),
        }
    }

    /// The role whose privileges `client`'s statements are checked against, or `None`
    /// when they need no check.
    fn role_to_check<C: ClientInfo>(&self, client: &C) -> Option<RoleDef> {
        let login = client.session_extensions().get::<login::Login>()?;
        match self.engine.role(&login.user) {
            Some(role) if role.superuser => None,
            Some(role) => Some(role),
            None if login.trusted => None,
            // Dropped since it logged in: it may do nothing.
            None => Some(RoleDef::new(login.user.clone())),
        }
    }
}

#[async_trait]
impl SimpleQueryHandler for TidemarkService {
    async fn do_query<C>(&self, client: &mut C, query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let pieces = split(query);
        if let Some(e) = rewrite::refuse_unplannable(query) {
            return Err(to_pg_error(&e));
        }
        if pieces.iter().all(|p| matches!(p, Piece::Other(_))) {
            for piece in &pieces {
                self.check_privileges(client, piece).await?;
            }
            if pieces.len() == 1
                && let Some(inner) = explain::plain_explain(query)
            {
                return Ok(vec![self.explain(client, inner).await?]);
            }
            // Postgres's arity rules for INSERT ... VALUES (and its NULLs for the columns
            // left out). Of several statements, an INSERT is only completed: its error
            // comes when it runs, after the statements before it.
            let mut texts: Vec<Option<String>> = Vec::with_capacity(pieces.len());
            for p in &pieces {
                texts.push(if starts_with_keyword(p.text(), "INSERT") {
                    match insert::check_values_arity(&self.engine, p.text()).await {
                        Ok(fixed) => fixed,
                        Err(e) if pieces.len() == 1 => return Err(to_pg_error(&e)),
                        Err(_) => None,
                    }
                } else {
                    None
                });
            }
            let text = |i: usize| texts[i].as_deref().unwrap_or(pieces[i].text());
            let single = (pieces.len() == 1).then(|| texts[0].clone()).flatten();
            let query = single.as_deref().unwrap_or(query);
            let facts = session_facts(client);
            let rewritten = match pieces.as_slice() {
                [_] => rewrite::rewrite_client_query(query, &facts),
                // Each statement of several (Npgsql's type load sends four in one message).
                _ => {
                    let each: Vec<Option<String>> = (0..pieces.len())
                        .map(|i| rewrite::rewrite_client_query(text(i), &facts))
                        .collect();
                    (each.iter().any(Option::is_some) || texts.iter().any(Option::is_some)).then(
                        || {
                            let all: Vec<&str> = each
                                .iter()
                                .enumerate()
                                .map(|(i, r)| r.as_deref().unwrap_or(text(i)))
                                .collect();
                            all.join(";\n")
                        },
                    )
                }
            };
            let query = rewritten.as_deref().unwrap_or(query);
            if pieces.len() == 1
                && let Some(response) = self.read(client, query, None, &Format::UnifiedText).await
            {
                return Ok(vec![response?]);
            }
            let stop = interrupt::watch(client).await;
            let out = SimpleQueryHandler::do_query(self.inner.as_ref(), client, query)
                .await
                .map_err(classify_pg_error)
                .map(|responses| {
                    let aligned = responses.len() == pieces.len();
                    responses
                        .into_iter()
                        .enumerate()
                        .map(|(i, r)| match (aligned, r) {
                            (true, Response::Query(q)) if q.row_schema.is_empty() => {
                                match ddl_tag(pieces[i].text()) {
                                    Some(tag) => Response::Execution(Tag::new(&tag)),
                                    None => Response::Query(q),
                                }
                            }
                            (_, r) => r,
                        })
                        .map(|r| interrupt::response_until(r, stop.clone()))
                        .collect::<Vec<_>>()
                });
            // It may have changed the session or the catalog (an INSERT changes rows only,
            // which kept plans read afresh: a writer beside a dashboard keeps its plans).
            if !(pieces.len() == 1 && starts_with_keyword(query, "INSERT")) {
                self.plans.invalidate();
            }
            if let Ok(responses) = &out {
                count_errors(responses);
            }
            return out;
        }
        // A mix: run in order, stop at the first error (as Postgres does).
        let mut results = Vec::new();
        for piece in pieces {
            if let Err(e) = self.check_privileges(client, &piece).await {
                results.push(Response::Error(Box::new(into_error_info(e))));
                break;
            }
            let outcome = match &piece {
                Piece::Tidemark(text) => self
                    .run_tidemark(client, text, &Format::UnifiedText)
                    .await
                    .map(|r| vec![r]),
                Piece::Other(text) => {
                    let fixed = if starts_with_keyword(text, "INSERT") {
                        insert::check_values_arity(&self.engine, text).await
                    } else {
                        Ok(None)
                    };
                    match fixed {
                        Err(e) => Err(to_pg_error(&e)),
                        Ok(fixed) => SimpleQueryHandler::do_query(
                            self.inner.as_ref(),
                            client,
                            fixed.as_deref().unwrap_or(text),
                        )
                        .await
                        .map_err(classify_pg_error),
                    }
                }
            };
            match outcome {
                Ok(mut r) => results.append(&mut r),
                Err(e) => {
                    results.push(Response::Error(Box::new(into_error_info(e))));
                    break;
                }
            }
        }
        self.plans.invalidate();
        count_errors(&results);
        Ok(results)
    }
}

/// Counts the errors answered inside a multi-statement message's responses (an error
/// that fails the whole message is counted by the connection loop).
fn count_errors(responses: &[Response]) {
    for r in responses {
        if let Response::Error(e) = r {
            metrics::counter!("tidemark_errors_total", "sqlstate" => e.code.clone()).increment(1);
        }
    }
}

/// A savepoint statement in a session in `status`: allowed in a transaction block, as in
/// Postgres, with nothing to undo. After an error in the block only `ROLLBACK TO` is; it
/// answers, but pgwire keeps the block failed until `ROLLBACK` (it has no way to return a
/// block to the in-transaction state).
fn savepoint(status: TransactionStatus, c: &SavepointCommand) -> PgWireResult<Response> {
    let error = |code: &str, message: String| {
        Err(PgWireError::UserError(Box::new(ErrorInfo::new(
            "ERROR".into(),
            code.into(),
            message,
        ))))
    };
    match (status, c) {
        (TransactionStatus::Idle, _) => error(
            "25P01",
            format!("{} can only be used in transaction blocks", c.statement()),
        ),
        (TransactionStatus::Error, SavepointCommand::Set(_) | SavepointCommand::Release(_)) => {
            error(
                "25P02",
                "current transaction is aborted, commands ignored until end of transaction block"
                    .into(),
            )
        }
        _ => Ok(Response::Execution(Tag::new(c.tag()))),
    }
}

/// What statement rewrites need of a connection: its database (Postgres's default is
/// the user's name) and its pid.
fn session_facts<C: ClientInfo + ?Sized>(client: &C) -> rewrite::SessionFacts {
    rewrite::SessionFacts {
        database: session::connected_database(client),
        pid: client.pid_and_secret_key().0,
        user: client
            .metadata()
            .get(pgwire::api::METADATA_USER)
            .cloned()
            .unwrap_or_default(),
    }
}

fn into_error_info(e: PgWireError) -> ErrorInfo {
    match e {
        PgWireError::UserError(info) => *info,
        other => ErrorInfo::new("ERROR".into(), "XX000".into(), other.to_string()),
    }
}

/// The statement type of the extended protocol: datafusion-postgres's. Tidemark's own
/// statements are stored with no plan and recognised again by their text.
type ExtStatement = <DfSessionService as ExtendedQueryHandler>::Statement;

fn tidemark_text(stmt: &ExtStatement) -> Option<&str> {
    match stmt {
        (text, None) => match split(text).as_slice() {
            [Piece::Tidemark(_)] => Some(text.as_str()),
            _ => None,
        },
        _ => None,
    }
}

/// The extended protocol's parser: ours first, then datafusion-postgres's.
pub struct TidemarkParser {
    inner: Arc<<DfSessionService as ExtendedQueryHandler>::QueryParser>,
    /// For the tables an INSERT's arity is checked against.
    engine: Arc<Engine>,
}

#[async_trait]
impl QueryParser for TidemarkParser {
    type Statement = ExtStatement;

    async fn parse_sql<C>(
        &self,
        client: &C,
        sql: &str,
        types: &[Option<Type>],
    ) -> PgWireResult<Option<Self::Statement>>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        let pieces = split(sql);
        if pieces.len() > 1 {
            return Err(to_pg_error(&Error::Syntax(
                "cannot insert multiple commands into a prepared statement".into(),
            )));
        }
        if let [Piece::Tidemark(text)] = pieces.as_slice() {
            // Parse now so syntax errors surface at Parse time, as in Postgres.
            parse_tidemark(text).map_err(|e| to_pg_error(&e))?;
            return Ok(Some((text.clone(), None)));
        }
        if let Some(e) = rewrite::refuse_unplannable(sql) {
            return Err(to_pg_error(&e));
        }
        let arity = if starts_with_keyword(sql, "INSERT") {
            insert::check_values_arity(&self.engine, sql)
                .await
                .map_err(|e| to_pg_error(&e))?
        } else {
            None
        };
        let sql = arity.as_deref().unwrap_or(sql);
        let rewritten = rewrite::rewrite_client_query(sql, &session_facts(client));
        let sql = rewritten.as_deref().unwrap_or(sql);
        self.inner
            .parse_sql(client, sql, types)
            .await
            .map_err(classify_pg_error)
    }

    fn get_parameter_types(&self, stmt: &Self::Statement) -> PgWireResult<Vec<Type>> {
        if tidemark_text(stmt).is_some() {
            return Ok(vec![]);
        }
        self.inner.get_parameter_types(stmt)
    }

    fn get_result_schema(
        &self,
        stmt: &Self::Statement,
        column_format: Option<&Format>,
    ) -> PgWireResult<Vec<FieldInfo>> {
        if let Some(text) = tidemark_text(stmt) {
            let format = column_format.unwrap_or(&Format::UnifiedText);
            let schema = match parse_tidemark(text) {
                Ok(s) => match crate::engine::result_schema(&s) {
                    Some(schema) => schema,
                    None => return Ok(vec![]),
                },
                Err(_) => return Ok(vec![]),
            };
            return arrow_schema_to_pg_fields(&schema, format, None);
        }
        // An INSERT returns no rows (Postgres answers Describe with NoData); DataFusion's
        // plan has a `count` column, which made pgjdbc read a batch's update counts as 0.
        if let (_, Some((datafusion::sql::sqlparser::ast::Statement::Insert(i), _))) = stmt
            && i.returning.is_none()
        {
            return Ok(vec![]);
        }
        self.inner.get_result_schema(stmt, column_format)
    }
}

#[async_trait]
impl ExtendedQueryHandler for TidemarkService {
    type Statement = ExtStatement;
    type QueryParser = TidemarkParser;

    fn query_parser(&self) -> Arc<Self::QueryParser> {
        self.parser.clone()
    }

    /// As pgwire's, except that a statement with parameters and no result columns (an
    /// `INSERT … VALUES ($1, …)`) answers ParameterDescription then NoData, as Postgres
    /// does. pgwire sends an empty RowDescription there, which made pgjdbc read every
    /// batch update count as 0.
    async fn on_describe<C>(&self, client: &mut C, message: Describe) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        if message.target_type == TARGET_TYPE_BYTE_STATEMENT {
            let name = message.name.as_deref().unwrap_or("");
            if let Some(Entry::Value(stmt)) = client.portal_store().get_statement(name) {
                let d = self.do_describe_statement(client, &stmt).await?;
                if d.fields.is_empty() && !d.parameters.is_empty() {
                    let oids = d.parameters.iter().map(|t| t.oid()).collect();
                    client
                        .send(PgWireBackendMessage::ParameterDescription(
                            ParameterDescription::new(oids),
                        ))
                        .await?;
                    client
                        .send(PgWireBackendMessage::NoData(NoData::new()))
                        .await?;
                    return Ok(());
                }
                return pgwire::api::query::send_describe_response(client, &d).await;
            }
        }
        self._on_describe(client, message).await
    }

    async fn do_query<C>(
        &self,
        client: &mut C,
        portal: &Portal<Self::Statement>,
        max_rows: usize,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        if self.role_to_check(client).is_some() {
            let piece = match tidemark_text(&portal.statement.statement) {
                Some(text) => Piece::Tidemark(text.to_string()),
                None => Piece::Other(portal.statement.statement.0.clone()),
            };
            self.check_privileges(client, &piece).await?;
        }
        if let Some(text) = tidemark_text(&portal.statement.statement) {
            let out = self
                .run_tidemark(client, text, &portal.result_column_format)
                .await;
            self.plans.invalidate();
            return out;
        }
        if let (_, Some((stmt, _))) = &portal.statement.statement
            && let Some(fast) =
                insert::FastInsert::analyze(&self.engine, stmt, &portal.statement.parameter_types)
        {
            let rows = fast.execute(portal).await.map_err(|e| to_pg_error(&e))?;
            return Ok(Response::Execution(
                Tag::new("INSERT").with_oid(0).with_rows(rows as usize),
            ));
        }
        // A query without parameters (a BI tool's, its values written into the text).
        if let (text, Some((SqlStatement::Query(_), plan))) = &portal.statement.statement
            && portal.statement.parameter_types.is_empty()
            && portal.parameters.is_empty()
            && let Some(response) = self
                .read(client, text, Some(plan), &portal.result_column_format)
                .await
        {
            return response;
        }
        if let Some(response) = self.read_bound(client, portal).await {
            return response;
        }
        let stop = interrupt::watch(client).await;
        let out = ExtendedQueryHandler::do_query(self.inner.as_ref(), client, portal, max_rows)
            .await
            .map_err(classify_pg_error)
            .map(|r| interrupt::response_until(r, stop));
        // Anything but a query or an INSERT may have changed the session or the catalog.
        if !matches!(
            &portal.statement.statement,
            (
                _,
                Some((SqlStatement::Query(_) | SqlStatement::Insert(_), _))
            )
        ) {
            self.plans.invalidate();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::ddl_tag;

    #[test]
    fn ddl_answers_postgres_command_tags() {
        assert_eq!(
            ddl_tag("CREATE VIEW v AS SELECT 1").as_deref(),
            Some("CREATE VIEW")
        );
        assert_eq!(
            ddl_tag("create or replace temp view v as select 1").as_deref(),
            Some("CREATE VIEW")
        );
        assert_eq!(
            ddl_tag("DROP VIEW IF EXISTS v").as_deref(),
            Some("DROP VIEW")
        );
        assert_eq!(ddl_tag("drop schema s;").as_deref(), Some("DROP SCHEMA"));
        assert_eq!(ddl_tag("SELECT 1"), None);
        assert_eq!(ddl_tag("CREATE"), None);
    }
}
