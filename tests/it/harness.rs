//! A real `tidemark serve` process for tests: start on a data directory, connect over
//! pgwire, stop gracefully (SIGTERM) or crash it (SIGKILL), restart on the same directory.

use std::path::{Path, PathBuf};

use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio_postgres::{Client, NoTls};

/// How long a server may take to start or stop before the test fails.
pub const DEADLINE: Duration = Duration::from_secs(120);

/// A free loopback port (bound then released; the server reuses it).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind a free port")
        .local_addr()
        .expect("local addr")
        .port()
}

/// A running server process.
pub struct TestServer {
    child: Child,
    pub port: u16,
    /// The HTTP server's address (`--http 127.0.0.1:0` unless the test passes `--http`).
    pub http: Option<String>,
    log: PathBuf,
}

impl TestServer {
    /// Starts `tidemark serve` on `data_dir` and waits until it accepts connections. Port 0
    /// lets the server pick one; `port` then holds the one it bound (a restart passes it
    /// back to come up on the same port).
    pub async fn start(data_dir: &Path, port: u16, env: &[(&str, &str)]) -> TestServer {
        Self::start_as(data_dir, port, env, None).await
    }

    /// [`TestServer::start`], as user `uid` when given (a test running as root uses this to
    /// make file permissions bite).
    pub async fn start_as(
        data_dir: &Path,
        port: u16,
        env: &[(&str, &str)],
        uid: Option<u32>,
    ) -> TestServer {
        Self::spawn(data_dir, port, env, uid, &[]).await
    }

    /// [`TestServer::start`] with more `tidemark serve` flags (`--auth`, `--tls-cert`).
    pub async fn start_with(data_dir: &Path, env: &[(&str, &str)], args: &[&str]) -> TestServer {
        Self::spawn(data_dir, 0, env, None, args).await
    }

    async fn spawn(
        data_dir: &Path,
        port: u16,
        env: &[(&str, &str)],
        uid: Option<u32>,
        args: &[&str],
    ) -> TestServer {
        std::fs::create_dir_all(data_dir).expect("create data dir");
        let log = data_dir.with_extension("log");
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("open server log");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tidemark"));
        cmd.arg("serve");
        if !args.contains(&"--listen") {
            cmd.arg("--listen").arg(format!("127.0.0.1:{port}"));
        }
        if !args.contains(&"--http") {
            cmd.arg("--http").arg("127.0.0.1:0");
        }
        cmd.arg("--data-dir")
            .arg(data_dir)
            .args(args)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log_file))
            .kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        if let Some(uid) = uid {
            cmd.uid(uid).gid(uid);
        }
        let mut child = cmd.spawn().expect("spawn tidemark");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        // The server prints the address it bound: with port 0, that is how the port is read.
        let mut http = None;
        let ready = tokio::time::timeout(DEADLINE, async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(addr) = line.strip_prefix("http on ") {
                    http = Some(addr.to_string());
                }
                if let Some(addr) = line.strip_prefix("listening on ") {
                    return addr.rsplit(':').next().and_then(|p| p.parse::<u16>().ok());
                }
            }
            None
        })
        .await;
        let Ok(Some(port)) = ready else {
            let _ = child.kill().await;
            panic!(
                "tidemark did not start on port {port}; log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        };
        // Keep draining stdout so the child never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        TestServer {
            child,
            port,
            http,
            log,
        }
    }

    /// A client connected to this server.
    pub async fn connect(&self) -> Client {
        connect(self.port).await
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then wait for a clean exit.
    pub async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .arg("-TERM")
                .arg(pid.to_string())
                .status();
        }
        match tokio::time::timeout(DEADLINE, self.child.wait()).await {
            Ok(Ok(status)) => assert!(
                status.success(),
                "tidemark exited with {status}; log:\n{}",
                self.log()
            ),
            _ => panic!("tidemark did not stop within {DEADLINE:?}"),
        }
    }

    /// SIGKILL: no cleanup at all.
    pub async fn kill(mut self) {
        let _ = self.child.kill().await;
        let _ = self.child.wait().await;
    }

    /// Waits for the process to exit by itself.
    pub async fn wait_exit(&mut self) -> std::process::ExitStatus {
        tokio::time::timeout(DEADLINE, self.child.wait())
            .await
            .expect("tidemark did not exit in time")
            .expect("wait")
    }
}

/// A test that fails while its server is up prints how the server stands (still running,
/// or the status it exited with) and the end of its log: the server's side of a failure
/// is otherwise lost with the test's temporary directory.
impl Drop for TestServer {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let state = match self.child.try_wait() {
            Ok(Some(status)) => format!("exited with {status}"),
            Ok(None) => "still running".to_string(),
            Err(e) => format!("in an unknown state ({e})"),
        };
        eprintln!(
            "tidemark on port {} {state}; the last lines of its log:\n{}",
            self.port,
            log_tail(&self.log, 80)
        );
    }
}

/// The last `n` lines of the log file at `path` (empty if it cannot be read).
pub fn log_tail(path: &Path, n: usize) -> String {
    let log = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Connects to a server on `port`.
pub async fn connect(port: u16) -> Client {
    connect_as(port, "tidemark").await
}

/// Connects to a server on `port` as `user`, to the database of that name.
pub async fn connect_as(port: u16, user: &str) -> Client {
    let conn_str = format!("host=127.0.0.1 port={port} user={user} dbname={user}");
    let (client, connection) = tokio_postgres::connect(&conn_str, NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect to port {port} as {user}: {e}"));
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// Polls `probe` until it returns `Some`, failing after [`DEADLINE`].
pub async fn poll<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// xorshift64*: a small, seeded, reproducible generator for tests.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform-ish in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// What a Delta table's JSON commits hold, read straight from `_delta_log`.
pub struct DeltaLog {
    /// Batch id (the `txn` version) → number of commits carrying it.
    pub commits_per_batch: std::collections::BTreeMap<i64, usize>,
    /// Commits whose operation is OPTIMIZE.
    pub compactions: usize,
}

/// Reads every JSON commit of the Delta table at `table`.
pub fn read_delta_log(table: &Path) -> DeltaLog {
    let mut log = DeltaLog {
        commits_per_batch: Default::default(),
        compactions: 0,
    };
    for entry in std::fs::read_dir(table.join("_delta_log")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        for line in std::fs::read_to_string(&path).unwrap().lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            if let Some(txn) = v.get("txn") {
                *log.commits_per_batch
                    .entry(txn["version"].as_i64().unwrap())
                    .or_default() += 1;
            }
            log.compactions += (v["commitInfo"]["operation"] == "OPTIMIZE") as usize;
        }
    }
    log
}

/// A PostgreSQL cluster of its own (Debian's `postgresql` package), for tests that check
/// Tidemark's answers against Postgres's on the same statements. Stopped on drop.
pub struct Postgres {
    bin: PathBuf,
    data: PathBuf,
    pub port: u16,
}

impl Postgres {
    /// Starts a cluster in `dir`, or `None` when PostgreSQL is not installed outside CI
    /// (in CI, where `.ci/run` installs it, a missing server fails the test).
    pub fn start(dir: &Path) -> Option<Postgres> {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .ok()
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
            .filter(|b| b.join("initdb").exists())
            .max();
        let Some(bin) = bin else {
            assert!(
                std::env::var_os("CI").is_none(),
                "PostgreSQL is not installed: CI must install it (.ci/run does)"
            );
            eprintln!("PostgreSQL is not installed: skipping the side-by-side part");
            return None;
        };
        let data = dir.join("pg");
        std::fs::create_dir_all(&data).unwrap();
        // Postgres refuses to run as root: the cluster belongs to the `postgres` user then.
        let as_root = is_root();
        if as_root {
            let ok = std::process::Command::new("chown")
                .args(["-R", "postgres"])
                .arg(dir)
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "chown the cluster's directory to postgres");
        }
        let run = |program: &str, args: &[&str]| {
            let mut cmd = if as_root {
                let mut c = std::process::Command::new("runuser");
                c.args(["-u", "postgres", "--"]).arg(bin.join(program));
                c
            } else {
                std::process::Command::new(bin.join(program))
            };
            let out = cmd.args(args).output().expect("run a PostgreSQL program");
            assert!(
                out.status.success(),
                "{program} failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let cluster = data.join("data");
        let cluster_str = cluster.to_str().unwrap();
        run(
            "initdb",
            &[
                "-D",
                cluster_str,
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
            ],
        );
        let port = free_port();
        let options = format!(
            "-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories='' -c fsync=off"
        );
        let log = data.join("server.log");
        run(
            "pg_ctl",
            &[
                "-D",
                cluster_str,
                "-o",
                &options,
                "-l",
                log.to_str().unwrap(),
                "-w",
                "start",
            ],
        );
        Some(Postgres {
            bin,
            data: cluster,
            port,
        })
    }

    /// A client connected as `postgres`.
    pub async fn connect(&self) -> Client {
        connect_as(self.port, "postgres").await
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let pg_ctl = self.bin.join("pg_ctl");
        let mut cmd = if is_root() {
            let mut c = std::process::Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(pg_ctl);
            c
        } else {
            std::process::Command::new(pg_ctl)
        };
        let _ = cmd
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "stop"])
            .output();
    }
}

/// Whether the tests run as root (`id -u`).
fn is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0")
}

/// The rows of `sql` (simple protocol), as text; a failure fails the test.
pub async fn rows(client: &Client, sql: &str) -> Vec<Vec<Option<String>>> {
    client
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .into_iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => {
                Some((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect())
            }
            _ => None,
        })
        .collect()
}
