//! Runs every `sql/slt/*.slt` file against a real `tidemark` server over pgwire.
//!
//! Each file gets its own server process and data directory. Besides SQL, a file may use
//! two harness statements, which are never sent to the server:
//!
//! - `statement ok` / `HARNESS RESTART`: SIGTERM the server, start it on the same data
//!   directory and port, reconnect;
//! - `statement ok` / `HARNESS CRASH`: the same with SIGKILL.
//!
//! Errors are shown as `ERROR <sqlstate>: <message>`, so `statement error` lines can match
//! either the code (`statement error (42P01)`) or the text.
//! `TIDEMARK_SLT=<substring>` runs only the files whose name contains it. `system` commands
//! can reach the file's server as `psql -h 127.0.0.1 -p $TIDEMARK_PORT` (psql must be
//! installed; `.ci/run` installs it). A file whose name starts with `kafka` gets a Kafka
//! broker of its own (tansu, as `tests/it/kafka.rs` starts it) at `$KAFKA_BOOTSTRAP`.
//! A build with the `rocksdb` feature runs with the label `rocksdb` (`onlyif rocksdb`,
//! `skipif rocksdb`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use sqllogictest::{AsyncDB, DBOutput, DefaultColumnType, Runner};
use tokio::sync::Mutex;
use tokio_postgres::{Client, SimpleQueryMessage};

use crate::harness::{TestServer, connect};

/// The server of one slt file, shared by its connections.
struct Shared {
    server: Option<TestServer>,
    data_dir: PathBuf,
    port: u16,
}

struct SltDb {
    shared: Arc<Mutex<Shared>>,
    client: Client,
}

#[derive(Debug)]
struct DbError {
    code: Option<String>,
    message: String,
}

impl std::fmt::Display for DbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.code {
            Some(c) => write!(f, "ERROR {c}: {}", self.message),
            None => write!(f, "ERROR: {}", self.message),
        }
    }
}

impl std::error::Error for DbError {}

impl From<tokio_postgres::Error> for DbError {
    fn from(e: tokio_postgres::Error) -> Self {
        match e.as_db_error() {
            Some(db) => DbError {
                code: Some(db.code().code().to_string()),
                message: db.message().to_string(),
            },
            None => DbError {
                code: None,
                message: e.to_string(),
            },
        }
    }
}

impl SltDb {
    async fn harness(&mut self, command: &str) -> Result<(), DbError> {
        let mut shared = self.shared.lock().await;
        let server = shared.server.take().expect("server is running");
        match command {
            "RESTART" => server.stop().await,
            "CRASH" => server.kill().await,
            other => {
                return Err(DbError {
                    code: None,
                    message: format!("unknown harness command {other}"),
                });
            }
        }
        let server = TestServer::start(&shared.data_dir, shared.port, &[]).await;
        self.client = server.connect().await;
        shared.server = Some(server);
        Ok(())
    }
}

#[async_trait]
impl AsyncDB for SltDb {
    type Error = DbError;
    type ColumnType = DefaultColumnType;

    async fn run(&mut self, sql: &str) -> Result<DBOutput<Self::ColumnType>, Self::Error> {
        if let Some(cmd) = sql.trim().strip_prefix("HARNESS ") {
            self.harness(cmd.trim().trim_end_matches(';').trim())
                .await?;
            return Ok(DBOutput::StatementComplete(0));
        }
        let messages = self.client.simple_query(sql).await?;
        let mut rows = Vec::new();
        let mut columns = None;
        let mut affected = 0;
        for m in messages {
            match m {
                SimpleQueryMessage::RowDescription(cols) => columns = Some(cols.len()),
                SimpleQueryMessage::Row(row) => {
                    columns = Some(row.len());
                    rows.push(
                        (0..row.len())
                            .map(|i| match row.get(i) {
                                None => "NULL".to_string(),
                                Some("") => "(empty)".to_string(),
                                Some(v) => v.to_string(),
                            })
                            .collect(),
                    );
                }
                SimpleQueryMessage::CommandComplete(n) => affected = n,
                _ => {}
            }
        }
        Ok(match columns {
            Some(n) => DBOutput::Rows {
                types: vec![DefaultColumnType::Any; n],
                rows,
            },
            None => DBOutput::StatementComplete(affected),
        })
    }

    async fn shutdown(&mut self) {}

    fn engine_name(&self) -> &str {
        "tidemark"
    }

    fn error_sql_state(err: &Self::Error) -> Option<String> {
        err.code.clone()
    }

    async fn run_command(command: std::process::Command) -> std::io::Result<std::process::Output> {
        tokio::process::Command::from(command).output().await
    }
}

async fn run_file(path: &Path) -> Result<(), String> {
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let kafka_file = path
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with("kafka"));
    if kafka_file && !crate::kafka::prerequisites(true) {
        return Ok(());
    }
    let broker = kafka_file.then(|| crate::kafka::Tansu::start(tmp.path()));
    // Started here on port 0, so the port is known before the file runs.
    let data_dir = tmp.path().join("data");
    let server = TestServer::start(&data_dir, 0, &[]).await;
    let port = server.port;
    let shared = Arc::new(Mutex::new(Shared {
        server: Some(server),
        data_dir,
        port,
    }));
    let for_conn = shared.clone();
    let mut runner = Runner::new(move || {
        let shared = for_conn.clone();
        async move {
            let mut s = shared.lock().await;
            if s.server.is_none() {
                let server = TestServer::start(&s.data_dir, s.port, &[]).await;
                s.server = Some(server);
            }
            let client = connect(s.port).await;
            drop(s);
            Ok::<_, DbError>(SltDb { shared, client })
        }
    });
    // `onlyif rocksdb` / `skipif rocksdb`: what a build with the rocksdb feature does.
    if cfg!(feature = "rocksdb") {
        runner.add_label("rocksdb");
    }
    // `$TIDEMARK_PORT` in `system` commands: psql's \copy against this file's server.
    runner.set_var("TIDEMARK_PORT".into(), port.to_string());
    if let Some(b) = &broker {
        runner.set_var("KAFKA_BOOTSTRAP".into(), b.bootstrap.clone());
    }
    let result = runner.run_file_async(path).await;
    let server = shared.lock().await.server.take();
    let log = server.as_ref().map(|s| s.log()).unwrap_or_default();
    if let Some(s) = server {
        s.stop().await;
    }
    result.map_err(|e| {
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        format!(
            "{}\n--- server log (last lines) ---\n{}",
            e.display(true),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        )
    })
}

fn slt_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("sql/slt");
    let filter = std::env::var("TIDEMARK_SLT").unwrap_or_default();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("sql/slt exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "slt"))
        .filter(|p| p.to_string_lossy().contains(&filter))
        .collect();
    files.sort();
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slt_files_pass_over_pgwire() {
    let files = slt_files();
    assert!(!files.is_empty(), "no .slt files found");
    // Two files at a time: each runs a server process, and CI has two cores.
    let results: Vec<(PathBuf, Result<(), String>)> = futures::stream::iter(files)
        .map(|f| async move {
            let r = run_file(&f).await;
            (f, r)
        })
        .buffer_unordered(2)
        .collect()
        .await;
    let mut failures = Vec::new();
    for (f, r) in &results {
        match r {
            Ok(()) => eprintln!("slt ok: {}", f.display()),
            Err(e) => failures.push(format!("{}:\n{e}", f.display())),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} slt files failed:\n\n{}",
        failures.len(),
        results.len(),
        failures.join("\n\n")
    );
}

use futures::StreamExt;
