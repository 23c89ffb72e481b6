//! The `tidemark` binary: `serve` (the default) or `run FILE.sql`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tidemark::auth::{AuthMethod, is_loopback};
use tidemark::engine::{Engine, Output};
use tidemark::error::Error;
use tidemark::server::ServerOptions;
use tidemark::sql::{Piece, TidemarkStatement, parse_tidemark, split};
use tokio::net::TcpListener;

#[derive(Parser)]
#[command(
    name = "tidemark",
    version,
    about = "A SQL-first streaming database over the Postgres wire"
)]
struct Cli {
    /// Where catalog, checkpoints and default sink tables live.
    #[arg(long, global = true, default_value = "./tidemark-data")]
    data_dir: PathBuf,
    /// The address the Postgres wire server listens on.
    #[arg(long, global = true, default_value = "127.0.0.1:5433")]
    listen: String,
    /// How clients prove who they are. By default clients on this machine (loopback) are
    /// trusted and any other client needs a password (SCRAM-SHA-256).
    #[arg(long, global = true, value_parser = ["trust", "scram-sha-256", "md5"])]
    auth: Option<String>,
    /// Allow `--auth trust` on an address other machines can reach.
    #[arg(long, global = true)]
    insecure: bool,
    /// A PEM certificate chain: clients may then connect with TLS (with --tls-key).
    #[arg(long, global = true, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, global = true, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// At most this many client connections at once (0: no limit).
    #[arg(long, global = true, default_value_t = 100)]
    max_connections: usize,
    /// Close a session idle (outside a transaction) this many seconds (0: never).
    #[arg(long, global = true, default_value_t = 0)]
    idle_session_timeout: u64,
    /// The address of the HTTP server (metrics, API, dashboard), or `off`
    /// [default: 127.0.0.1:8433; if that port is taken, the server starts without it].
    #[arg(long, global = true)]
    http: Option<String>,
    /// How log lines are written: `text` for people, `json` (one object a line) for log
    /// shippers.
    #[arg(long, global = true, default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
    /// The Spark Connect endpoint (`sc://host:port`) of sinks created with
    /// `engine = 'spark'` and no `spark_remote` of their own (docs/scale-out.md).
    #[arg(long, global = true)]
    spark_remote: Option<String>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Start the server (the default).
    Serve,
    /// Run a SQL script in-process and exit once its available_now and once sinks finish.
    Run {
        /// The script.
        file: PathBuf,
    },
    /// Print sink NAME as a PySpark program (Spark Structured Streaming) for spark-submit.
    ExportSpark {
        /// The sink.
        name: String,
        /// Where the Spark query writes instead of the sink's own path.
        #[arg(long)]
        path: Option<PathBuf>,
        /// Spark's checkpoint [default: the sink's checkpoint directory with `-spark` added].
        #[arg(long)]
        checkpoint_location: Option<PathBuf>,
    },
}

/// Tidemark at INFO; the libraries under it only when something is wrong.
const DEFAULT_LOG_FILTER: &str =
    "info,buoyant_kernel=warn,delta_kernel=warn,deltalake_core=warn,datafusion=warn,pgwire=warn";

/// With the RocksDB store, jemalloc serves every allocation of the process, RocksDB's
/// included (its `malloc` is unprefixed). glibc's per-thread arenas kept about 300 MiB of
/// freed block-cache and memtable memory beside a 10 M-group view (docs/benchmarks.md).
#[cfg(feature = "rocksdb")]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if cli.log_format == "json" {
        logs.json().with_current_span(false).init();
    } else {
        logs.init();
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            None | Some(Command::Serve) => match server_options(&cli) {
                Ok(options) => {
                    serve(
                        &cli.data_dir,
                        &cli.listen,
                        cli.http.as_deref(),
                        options,
                        cli.insecure,
                        cli.spark_remote.as_deref(),
                    )
                    .await
                }
                Err(e) => Err(e),
            },
            Some(Command::Run { file }) => run_script(&cli.data_dir, &file).await,
            Some(Command::ExportSpark {
                name,
                path,
                checkpoint_location,
            }) => tidemark::spark::export(
                &cli.data_dir,
                &name,
                path.as_deref(),
                checkpoint_location.as_deref(),
            )
            .map(|program| print!("{program}")),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ERROR {}: {e}", e.sqlstate().code());
            if let Some(h) = e.hint() {
                eprintln!("HINT: {h}");
            }
            ExitCode::FAILURE
        }
    }
}

/// The server's options from the command line.
fn server_options(cli: &Cli) -> Result<ServerOptions, Error> {
    let auth = cli.auth.as_deref().and_then(AuthMethod::from_name);
    let tls = match (&cli.tls_cert, &cli.tls_key) {
        (Some(cert), Some(key)) => Some(tidemark::server::tls_acceptor(cert, key)?),
        _ => None,
    };
    Ok(ServerOptions {
        auth,
        tls,
        max_connections: cli.max_connections,
        idle_session_timeout: (cli.idle_session_timeout > 0)
            .then(|| std::time::Duration::from_secs(cli.idle_session_timeout)),
    })
}

/// The HTTP server's address when `--http` is not given.
const DEFAULT_HTTP: &str = "127.0.0.1:8433";

async fn serve(
    data_dir: &Path,
    listen: &str,
    http: Option<&str>,
    options: ServerOptions,
    insecure: bool,
    spark_remote: Option<&str>,
) -> Result<(), Error> {
    // The recorder first, so that every metric from the start is kept.
    tidemark::http::recorder();
    tidemark::server::describe_metrics();
    let engine = Engine::open(data_dir).await?;
    if let Some(remote) = spark_remote {
        engine.set_spark_remote(remote)?;
    }
    tidemark::server::prepare_session(&engine)?;
    let http = match http {
        Some("off") => None,
        Some(addr) => Some(
            tidemark::http::bind(addr)
                .await
                .map_err(|e| Error::io(format!("listening for HTTP on {addr}"), e))?,
        ),
        None => match tidemark::http::bind(DEFAULT_HTTP).await {
            Ok(bound) => Some(bound),
            Err(e) => {
                tracing::warn!(addr = DEFAULT_HTTP, error = %e,
                    "the HTTP server (metrics, dashboard) is off: its default address is taken; pass --http ADDR");
                None
            }
        },
    };
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|e| Error::io(format!("listening on {listen}"), e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::io("reading the listen address", e))?;
    AuthMethod::check_listen(options.auth, addr.ip(), insecure).map_err(|message| {
        Error::InvalidOption {
            message,
            hint: None,
        }
    })?;
    if !is_loopback(addr.ip())
        && options.auth != Some(AuthMethod::Trust)
        && !engine
            .roles()
            .iter()
            .any(|r| r.login && r.password.is_some())
    {
        tracing::warn!(
            %addr,
            "no role has a password, so clients off this machine cannot log in: connect \
             from this machine and CREATE ROLE name LOGIN PASSWORD '...'"
        );
    }
    engine.start_sinks().await;
    let (stop_http, http_stopped) = tokio::sync::oneshot::channel::<()>();
    if let Some((listener, http_addr)) = http {
        tracing::info!(addr = %http_addr, "dashboard and metrics at http://{http_addr}/");
        // Tests read this line to learn the HTTP port when it is 0.
        println!("http on {http_addr}");
        let engine = engine.clone();
        tokio::spawn(async move {
            let stopped = async move {
                let _ = http_stopped.await;
            };
            if let Err(e) = tidemark::http::serve(listener, engine, stopped).await {
                tracing::warn!(error = %e, "the HTTP server stopped");
            }
        });
    }
    let shutdown = shutdown_signal();
    tracing::info!(%addr, data_dir = %engine.data_dir().display(), "tidemark is ready");
    // Tests read this line to learn the port when listening on port 0.
    println!("listening on {addr}");
    tidemark::server::run(listener, engine.clone(), options, shutdown)
        .await
        .map_err(|e| Error::io("serving", e))?;
    let _ = stop_http.send(());
    tracing::info!("shutting down: stopping streaming queries after their current batch");
    engine.shutdown().await;
    Ok(())
}

/// Resolves at SIGTERM or SIGINT. SIGTERM's handler is installed when this is called, not
/// when the future is first polled: a SIGTERM right after "listening on" (a test, a
/// supervisor) is then a graceful shutdown, not the default action's kill.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    async move {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        if let Some(mut term) = term {
            tokio::select! {
                _ = ctrl_c => {}
                _ = term.recv() => {}
            }
            return;
        }
        let _ = ctrl_c.await;
    }
}

async fn run_script(data_dir: &Path, file: &Path) -> Result<(), Error> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| Error::io(format!("reading {}", file.display()), e))?;
    let engine = Engine::open(data_dir).await?;
    let result = run_statements(&engine, &text).await;
    engine.shutdown().await;
    result
}

/// Shows the progress of `tidemark run`'s bounded sinks until dropped: on a terminal, a
/// bar per sink (what it has read out of what it has read plus its backlog, the rate, the
/// time left, the batch and the watermark); otherwise a plain line per batch.
fn show_progress(
    engine: &Engine,
    mut finished: tokio::sync::oneshot::Receiver<()>,
) -> tokio::task::JoinHandle<()> {
    use std::collections::BTreeMap;
    use std::io::IsTerminal;
    use tidemark::engine::progress::ListenerEvent;
    let mut events = engine.registry().events();
    let tty = std::io::stderr().is_terminal();
    tokio::spawn(async move {
        let bars = indicatif::MultiProgress::new();
        let style = indicatif::ProgressStyle::with_template(
            "{prefix:>12} [{bar:30}] {pos}/{len} {msg} ({rate}, {eta} left)",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .with_key(
            "rate",
            |s: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = write!(w, "{:.1}/s", s.per_sec());
            },
        )
        .progress_chars("=> ");
        // Per sink: its bar, and what it has read so far (files, rows).
        let mut sinks: BTreeMap<String, (indicatif::ProgressBar, u64, u64)> = BTreeMap::new();
        let mut draining = false;
        loop {
            use tokio::sync::broadcast::error::{RecvError, TryRecvError};
            // Once the script is done, what was posted before is still shown.
            let event = if draining {
                match events.try_recv() {
                    Ok(e) => e,
                    Err(TryRecvError::Lagged(_)) => continue,
                    Err(_) => return,
                }
            } else {
                tokio::select! {
                    e = events.recv() => match e {
                        Ok(e) => e,
                        Err(RecvError::Lagged(_)) => continue,
                        Err(_) => return,
                    },
                    _ = &mut finished => {
                        draining = true;
                        continue;
                    }
                }
            };
            let ListenerEvent::Progress(p) = event else {
                if let ListenerEvent::Terminated { name, .. } = &event
                    && let Some((bar, _, _)) = sinks.get(name)
                {
                    bar.finish();
                }
                continue;
            };
            let (bar, files, rows) = sinks.entry(p.name.clone()).or_insert_with(|| {
                let bar = bars.add(indicatif::ProgressBar::new(0));
                bar.set_style(style.clone());
                bar.set_prefix(p.name.clone());
                if !tty {
                    bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
                }
                (bar, 0, 0)
            });
            *files += p.source_metric_sum("numFilesRead").unwrap_or(0) as u64;
            *rows += p.num_input_rows;
            let watermark = p
                .event_time
                .as_ref()
                .map(|e| {
                    format!(
                        ", watermark {}",
                        tidemark::engine::progress::format_ts(e.watermark)
                    )
                })
                .unwrap_or_default();
            let (done, left, unit) = match (
                p.source_metric_sum("numFilesOutstanding"),
                p.source_metric_sum("numRowsOutstanding"),
            ) {
                (Some(f), _) => (*files, f as u64, "files"),
                (None, Some(r)) => (*rows, r as u64, "rows"),
                (None, None) => (*rows, 0, "rows"),
            };
            let message = format!("{unit}, batch {}{watermark}", p.batch_id.get());
            if tty {
                bar.set_length(done + left);
                bar.set_position(done);
                bar.set_message(message);
            } else {
                // A log line, so that `--log-format json` keeps stderr one object a line.
                tracing::info!(
                    query = %p.name,
                    batch = p.batch_id.get(),
                    rows = p.num_input_rows,
                    done,
                    left,
                    unit,
                    "progress: {done} {unit} read, {left} left{watermark}"
                );
            }
        }
    })
}

async fn run_statements(engine: &Engine, text: &str) -> Result<(), Error> {
    let (finished, done) = tokio::sync::oneshot::channel();
    let progress = show_progress(engine, done);
    let result = run_statements_inner(engine, text).await;
    let _ = finished.send(());
    let _ = progress.await;
    result
}

async fn run_statements_inner(engine: &Engine, text: &str) -> Result<(), Error> {
    let mut bounded = Vec::new();
    for piece in split(text) {
        match piece {
            Piece::Tidemark(t) => {
                let stmt = parse_tidemark(&t)?;
                let started = match &stmt {
                    TidemarkStatement::CreateSink(cs) => Some(cs.name.clone()),
                    TidemarkStatement::StartSink { name, .. } => Some(name.clone()),
                    _ => None,
                };
                print_output(engine.execute(stmt).await?)?;
                if let Some(name) = started
                    && engine
                        .sink_trigger(&name)
                        .await
                        .is_some_and(|t| t.is_bounded())
                {
                    bounded.push(name);
                }
            }
            Piece::Other(t) => {
                // Sinks started above may still be writing: wait before reading.
                engine.wait_finished(&bounded).await?;
                let df = engine.context().sql(&t).await?;
                let schema = df.schema().as_arrow().clone();
                let batches = df.collect().await?;
                if !schema.fields().is_empty() {
                    print_output(Output::Rows(std::sync::Arc::new(schema), batches))?;
                }
            }
        }
    }
    engine.wait_finished(&bounded).await
}

fn print_output(output: Output) -> Result<(), Error> {
    match output {
        Output::Command(tag) => println!("{tag}"),
        Output::Notice(notice, then) => {
            eprintln!("NOTICE:  {notice}");
            return print_output(*then);
        }
        Output::Rows(schema, batches) => {
            let batches = if batches.is_empty() {
                vec![datafusion::arrow::record_batch::RecordBatch::new_empty(
                    schema,
                )]
            } else {
                batches
            };
            println!(
                "{}",
                datafusion::arrow::util::pretty::pretty_format_batches(&batches)?
            );
        }
    }
    Ok(())
}
