//! Sinks as Spark runs them (issue 40): `tidemark export-spark` writes the PySpark
//! program of a sink, and real PySpark (PyPI's `pyspark`, on Java; `.ci/run` installs
//! both) runs it over the same files to the same rows as the sink's local run.
//!
//! The Python that has pyspark: `$TIDEMARK_PYSPARK_PYTHON`, else `python3`. Missing
//! pyspark or Java fails the test in CI and skips it elsewhere, saying so.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::harness::{TestServer, rows};

fn python() -> String {
    std::env::var("TIDEMARK_PYSPARK_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn prerequisites() -> bool {
    let pyspark = Command::new(python())
        .args(["-c", "import pyspark"])
        .status()
        .is_ok_and(|s| s.success());
    let java = Command::new("java")
        .arg("-version")
        .output()
        .is_ok_and(|o| o.status.success());
    if pyspark && java {
        return true;
    }
    let missing = match (pyspark, java) {
        (false, false) => "pyspark and Java",
        (false, true) => "pyspark (pip install pyspark==4.3.0)",
        _ => "Java",
    };
    assert!(
        std::env::var_os("CI").is_none(),
        "{missing} not installed: CI must install it (.ci/run does)"
    );
    eprintln!("skipping: {missing} not installed");
    false
}

/// Copies the seed scenario's files into `dir`, each written under a hidden name and
/// renamed, oldest first.
fn land_seed(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("sql/data");
    for f in ["clicks-1.json", "clicks-2.json"] {
        let hidden = dir.join(format!(".{f}"));
        std::fs::copy(data.join(f), &hidden).unwrap();
        std::fs::rename(&hidden, dir.join(f)).unwrap();
        // Distinct modification times, so both runs take the files in this order.
        let t = std::time::SystemTime::now()
            - Duration::from_secs(if f.ends_with("1.json") { 60 } else { 30 });
        std::fs::File::options()
            .write(true)
            .open(dir.join(f))
            .unwrap()
            .set_modified(t)
            .unwrap();
    }
}

const COLUMNS: &str = "window_start TIMESTAMP, window_end TIMESTAMP, page TEXT, views BIGINT, \
                       total_duration_s DOUBLE PRECISION";

/// The seed pipeline (five-minute windows, ten-minute watermark, one file a batch) run
/// here and, exported, on PySpark: the same windows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exported_sink_runs_on_pyspark_to_the_same_rows() {
    if !prerequisites() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let landing = tmp.path().join("landing");
    land_seed(&landing);
    let data = tmp.path().join("data");
    let local = tmp.path().join("local");
    let server = TestServer::start(&data, 0, &[]).await;
    let c = server.connect().await;
    c.batch_execute(&format!(
        "CREATE STREAM clicks (user_id TEXT, page TEXT, event_time TIMESTAMP, duration_s DOUBLE \
         PRECISION) WITH (connector = 'file', format = 'json', path = '{}', \
         max_files_per_trigger = 1); \
         CREATE SINK page_views WITH (connector = 'parquet', path = '{}', watermark = \
         'event_time - 10 minutes', output_mode = 'append', trigger = 'available_now') AS \
         SELECT window.start AS window_start, window.end AS window_end, page, count(*) AS views, \
         sum(duration_s) AS total_duration_s FROM clicks GROUP BY window(event_time, '5 \
         minutes'), page; \
         FLUSH SINK page_views;",
        landing.display(),
        local.display()
    ))
    .await
    .unwrap();
    let order = "ORDER BY window_start, page";
    let want = rows(&c, &format!("SELECT * FROM page_views {order}")).await;
    assert!(want.len() >= 3, "{want:?}");

    // The program, as `tidemark export-spark` writes it.
    let spark_out = tmp.path().join("spark_out");
    let out = Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .arg("export-spark")
        .arg("page_views")
        .arg("--data-dir")
        .arg(&data)
        .arg("--path")
        .arg(&spark_out)
        .arg("--checkpoint-location")
        .arg(tmp.path().join("spark_ck"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "export-spark: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let program: PathBuf = tmp.path().join("page_views.py");
    std::fs::write(&program, &out.stdout).unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        text.contains(".option(\"maxFilesPerTrigger\", \"1\")"),
        "{text}"
    );
    assert!(
        text.contains("withWatermark(\"event_time\", \"10 minutes\")"),
        "{text}"
    );

    let run = Command::new(python())
        .arg(&program)
        .env(
            "PYSPARK_SUBMIT_ARGS",
            "--master local[2] --conf spark.driver.memory=1g pyspark-shell",
        )
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "the exported program failed:\n{}\n{}",
        program.display(),
        String::from_utf8_lossy(&run.stderr)
    );
    // Spark's output, read back through Tidemark (its file sink's manifest included).
    c.batch_execute(&format!(
        "CREATE STREAM spark_rows ({COLUMNS}) WITH (connector = 'file', format = 'parquet', \
         path = '{}')",
        spark_out.display()
    ))
    .await
    .unwrap();
    let got = rows(&c, &format!("SELECT * FROM spark_rows {order}")).await;
    assert_eq!(got, want, "Spark's rows, then Tidemark's");
    server.stop().await;
}

/// A Spark Connect server (`spark-submit --class ...SparkConnectServer`, from the pyspark
/// wheel's jars) on a loopback port, killed with the test.
struct ConnectServer {
    child: std::process::Child,
    port: u16,
    log: PathBuf,
}

impl ConnectServer {
    /// Starts a server on `port` (0: any; the port it bound is read from its log).
    fn start(dir: &Path, port: u16) -> ConnectServer {
        let home = Command::new(python())
            .args([
                "-c",
                "import os, pyspark; print(os.path.dirname(pyspark.__file__))",
            ])
            .output()
            .expect("run python");
        let home = PathBuf::from(String::from_utf8_lossy(&home.stdout).trim());
        std::fs::create_dir_all(dir).unwrap();
        let log = dir.join(format!(
            "connect-{}.log",
            std::time::UNIX_EPOCH.elapsed().unwrap().as_nanos()
        ));
        let child = Command::new(home.join("bin/spark-submit"))
            .env("SPARK_HOME", &home)
            .args([
                "--class",
                "org.apache.spark.sql.connect.service.SparkConnectServer",
                "--name",
                "tidemark-test-connect",
                "--master",
                "local[2]",
                "--conf",
                "spark.driver.memory=1g",
                "--conf",
                "spark.ui.enabled=false",
                "--conf",
                "spark.connect.grpc.binding.address=127.0.0.1",
                "--conf",
            ])
            .arg(format!("spark.connect.grpc.binding.port={port}"))
            .arg("--conf")
            .arg(format!("spark.local.dir={}", dir.display()))
            .stdin(std::process::Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::options().append(true).open(&log).unwrap())
            .spawn()
            .expect("spawn spark-submit");
        let mut server = ConnectServer { child, port, log };
        let start = std::time::Instant::now();
        loop {
            let text = std::fs::read_to_string(&server.log).unwrap_or_default();
            if let Some(at) = text.split("Spark Connect server started at: ").nth(1) {
                let addr = at.lines().next().unwrap_or("");
                server.port = addr.rsplit(':').next().unwrap().trim().parse().unwrap();
                return server;
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("the Connect server exited with {status}:\n{text}");
            }
            assert!(
                start.elapsed() < Duration::from_secs(180),
                "the Connect server did not start:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn remote(&self) -> String {
        format!("sc://127.0.0.1:{}", self.port)
    }

    /// SIGKILL (the child is the JVM: spark-submit execs it).
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ConnectServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Writes `lines` as `dir/name`, under a hidden name first, with modification time `age`
/// seconds ago (so the file source takes files in the order they are written).
fn land(dir: &Path, name: &str, lines: &[String], age: u64) {
    std::fs::create_dir_all(dir).unwrap();
    let hidden = dir.join(format!(".{name}"));
    std::fs::write(&hidden, lines.join("\n") + "\n").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&hidden)
        .unwrap()
        .set_modified(std::time::SystemTime::now() - Duration::from_secs(age))
        .unwrap();
    std::fs::rename(&hidden, dir.join(name)).unwrap();
}

/// A query's batches as `tidemark.progress` has them: id, input rows, watermark, and
/// whether rows were dropped as late (Spark counts late groups, Tidemark late rows).
async fn batches(c: &tokio_postgres::Client, name: &str) -> Vec<Vec<Option<String>>> {
    rows(
        c,
        &format!(
            "SELECT batch_id, num_input_rows, watermark, rows_dropped_by_watermark > 0 \
             FROM tidemark.progress WHERE name = '{name}' ORDER BY batch_id"
        ),
    )
    .await
}

async fn status(
    c: &tokio_postgres::Client,
    name: &str,
) -> (String, String, String, Option<String>) {
    let r = rows(
        c,
        &format!(
            "SELECT status, engine, run_id, error FROM tidemark.queries WHERE name = '{name}'"
        ),
    )
    .await;
    let r = &r[0];
    (
        r[0].clone().unwrap(),
        r[1].clone().unwrap(),
        r[2].clone().unwrap_or_default(),
        r[3].clone(),
    )
}

async fn wait_status(c: &tokio_postgres::Client, name: &str, want: &str) {
    super::harness::poll(&format!("{name} {want}"), || async {
        let (s, ..) = status(c, name).await;
        (s == want).then_some(())
    })
    .await;
}

/// Each query over the seed files (and a third with a late row), as a local sink and as a
/// sink on Spark through Spark Connect: the same rows, and batch by batch the same input
/// rows, watermark and late drops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spark_connect_sinks_match_local_runs() {
    if !prerequisites() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let connect = ConnectServer::start(&tmp.path().join("spark"), 0);
    let landing = tmp.path().join("landing");
    land_seed(&landing);
    land(
        &landing,
        "clicks-3.json",
        &[
            r#"{"user_id":"u9","page":"/home","event_time":"2026-06-10T10:03:00Z","duration_s":1.0}"#.into(),
            r#"{"user_id":"u9","page":"/docs","event_time":"2026-06-10T10:41:00Z","duration_s":5.0}"#.into(),
        ],
        10,
    );
    let server = TestServer::start(&tmp.path().join("data"), 0, &[]).await;
    let c = server.connect().await;
    // LISTEN on the events of the Spark sinks.
    let (listener, mut connection) = tokio_postgres::connect(
        &format!(
            "host=127.0.0.1 port={} user=postgres dbname=tidemark",
            server.port
        ),
        tokio_postgres::NoTls,
    )
    .await
    .unwrap();
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        use futures::StreamExt;
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(m)) = messages.next().await {
            if let tokio_postgres::AsyncMessage::Notification(n) = m {
                let _ = tx.send(n.payload().to_string());
            }
        }
    });
    listener
        .batch_execute("LISTEN tidemark_events_tumbling_spark")
        .await
        .unwrap();
    c.batch_execute(&format!(
        "CREATE STREAM clicks (user_id TEXT, page TEXT, event_time TIMESTAMP, duration_s DOUBLE \
         PRECISION) WITH (connector = 'file', format = 'json', path = '{}', \
         max_files_per_trigger = 1)",
        landing.display()
    ))
    .await
    .unwrap();
    let queries = [
        (
            "tumbling",
            "watermark = 'event_time - 10 minutes'",
            "SELECT window.start AS window_start, window.end AS window_end, page, count(*) AS \
             views, sum(duration_s) AS total_duration_s FROM clicks GROUP BY \
             window(event_time, '5 minutes'), page",
            "ORDER BY window_start, page",
        ),
        (
            "sliding",
            "watermark = 'event_time - 5 minutes'",
            "SELECT window.start AS window_start, page, count(*) AS views FROM clicks GROUP BY \
             window(event_time, '10 minutes', '5 minutes'), page",
            "ORDER BY window_start, page",
        ),
        (
            // No WHERE: Spark pushes a filter into its JSON reader and counts the rows
            // that pass as the batch's input, Tidemark counts the rows read (a known
            // difference of the local engine's progress, not of the rows).
            "projected",
            "watermark = 'event_time - 5 minutes'",
            "SELECT user_id, upper(page) AS page, duration_s * 2 AS twice FROM clicks",
            "ORDER BY user_id, page, twice",
        ),
    ];
    for (name, wm, query, order) in queries {
        for (suffix, engine) in [
            ("local", String::new()),
            (
                "spark",
                format!("engine = 'spark', spark_remote = '{}', ", connect.remote()),
            ),
        ] {
            c.batch_execute(&format!(
                "CREATE SINK {name}_{suffix} WITH ({engine}connector = 'parquet', path = '{}', \
                 {wm}, trigger = 'available_now') AS {query}",
                tmp.path().join(format!("out_{name}_{suffix}")).display()
            ))
            .await
            .unwrap_or_else(|e| panic!("{name}_{suffix}: {e:?}"));
        }
        wait_status(&c, &format!("{name}_local"), "finished").await;
        wait_status(&c, &format!("{name}_spark"), "finished").await;
        let (_, engine, ..) = status(&c, &format!("{name}_spark")).await;
        assert_eq!(engine, "spark");
        let local = rows(&c, &format!("SELECT * FROM {name}_local {order}")).await;
        let spark = rows(&c, &format!("SELECT * FROM {name}_spark {order}")).await;
        assert!(!local.is_empty(), "{name}");
        assert_eq!(spark, local, "{name}: Spark's rows, then Tidemark's");
        let lb = batches(&c, &format!("{name}_local")).await;
        let sb = batches(&c, &format!("{name}_spark")).await;
        assert!(lb.len() >= 3, "{name}: {lb:?}");
        assert_eq!(sb, lb, "{name}: Spark's batches, then Tidemark's");
    }
    // A query that fails on Spark (a malformed record under FAILFAST) is failed, with
    // Spark's error.
    let bad = tmp.path().join("bad");
    land(
        &bad,
        "bad.json",
        &["{\"a\": 1}".into(), "{not json".into()],
        5,
    );
    c.batch_execute(&format!(
        "CREATE STREAM strict (a INT) WITH (connector = 'file', format = 'json', path = '{}', \
         mode = 'FAILFAST'); \
         CREATE SINK strict_spark WITH (engine = 'spark', spark_remote = '{}', connector = \
         'parquet', path = '{}') AS SELECT a FROM strict",
        bad.display(),
        connect.remote(),
        tmp.path().join("out_strict").display()
    ))
    .await
    .unwrap();
    wait_status(&c, "strict_spark", "failed").await;
    let (_, _, _, error) = status(&c, "strict_spark").await;
    let error = error.unwrap();
    assert!(
        error.starts_with("the query failed on Spark: [STREAM_FAILED]")
            && error.contains("bad.json"),
        "{error}"
    );
    let sinks = rows(
        &c,
        "SELECT name FROM tidemark.queries WHERE status = 'failed'",
    )
    .await;
    assert_eq!(sinks, vec![vec![Some("strict_spark".to_string())]]);

    // The other surfaces: LISTEN events, /metrics and the dashboard's API.
    let mut kinds = Vec::new();
    while !kinds.contains(&"terminated".to_string()) {
        let payload = tokio::time::timeout(super::harness::DEADLINE, events.recv())
            .await
            .expect("listener events")
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(&payload).unwrap();
        kinds.push(v["event"].as_str().unwrap().to_string());
    }
    let progress = kinds.iter().filter(|k| *k == "progress").count();
    assert_eq!(
        kinds.first().map(String::as_str),
        Some("started"),
        "{kinds:?}"
    );
    let reports = batches(&c, "tumbling_spark").await.len();
    assert_eq!(progress, reports, "one per batch: {kinds:?}");
    let http = server.http.clone().expect("the HTTP server");
    let (code, metrics) = super::monitoring::http_get(&http, "/metrics").await;
    assert_eq!(code, 200);
    assert!(
        metrics.contains("tidemark_query_watermark_seconds{query=\"tumbling_spark\"}"),
        "{metrics}"
    );
    let (code, api) = super::monitoring::http_get(&http, "/api/queries/tumbling_spark").await;
    assert_eq!(code, 200, "{api}");
    let api: serde_json::Value = serde_json::from_str(&api).unwrap();
    assert_eq!(api["engine"], "spark");
    assert_eq!(api["batches"].as_array().unwrap().len(), reports);
    server.stop().await;
}

/// File `i` of the fault test: `ROWS` rows with ids unique across files.
fn fault_file(dir: &Path, i: usize) {
    const ROWS: usize = 5;
    let lines: Vec<String> = (0..ROWS)
        .map(|j| {
            format!(
                r#"{{"id":"f{i}-r{j}","page":"/p{j}","event_time":"2026-06-10T10:{:02}:00Z"}}"#,
                i % 60
            )
        })
        .collect();
    // Older files first: the source takes files oldest first.
    land(dir, &format!("part-{i:03}.json"), &lines, (100 - i) as u64);
}

/// How many rows, and how many distinct ids, the sink's table holds.
async fn counted(c: &tokio_postgres::Client, sink: &str) -> (i64, i64) {
    let r = rows(
        c,
        &format!("SELECT count(*), count(DISTINCT id) FROM {sink}"),
    )
    .await;
    (
        r[0][0].as_deref().unwrap().parse().unwrap(),
        r[0][1].as_deref().unwrap().parse().unwrap(),
    )
}

async fn wait_rows(c: &tokio_postgres::Client, sink: &str, want: i64) {
    super::harness::poll(&format!("{sink} to hold {want} rows"), || async {
        let (n, _) = counted(c, sink).await;
        assert!(
            n <= want,
            "{sink} holds {n} rows, more than the {want} landed"
        );
        (n == want).then_some(())
    })
    .await;
    let (n, distinct) = counted(c, sink).await;
    assert_eq!((n, distinct), (want, want), "rows lost or duplicated");
}

/// A sink on Spark through the faults it must survive: the Connect server killed and
/// started again (the query resumes from its Spark checkpoint), Tidemark killed with
/// SIGKILL and stopped with SIGTERM (the running query is found again), STOP and START.
/// After each, every landed row is in the sink exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spark_sink_survives_connect_and_tidemark_restarts() {
    if !prerequisites() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let spark_dir = tmp.path().join("spark");
    let mut connect = ConnectServer::start(&spark_dir, 0);
    let landing = tmp.path().join("landing");
    std::fs::create_dir_all(&landing).unwrap();
    let data = tmp.path().join("data");
    let mut server = TestServer::start(&data, 0, &[]).await;
    let c = server.connect().await;
    c.batch_execute(&format!(
        "CREATE STREAM events (id TEXT, page TEXT, event_time TIMESTAMP) WITH (connector = \
         'file', format = 'json', path = '{}', max_files_per_trigger = 1); \
         CREATE SINK copied WITH (engine = 'spark', spark_remote = '{}', connector = 'parquet', \
         path = '{}', trigger = 'processing_time 500 milliseconds') AS \
         SELECT id, page, event_time FROM events",
        landing.display(),
        connect.remote(),
        tmp.path().join("out").display()
    ))
    .await
    .unwrap();
    let mut files = 0;
    let mut land_more = |n: usize| {
        for _ in 0..n {
            fault_file(&landing, files);
            files += 1;
        }
        (files * 5) as i64
    };
    let want = land_more(3);
    wait_rows(&c, "copied", want).await;
    let (_, engine, first_run, _) = status(&c, "copied").await;
    assert_eq!(engine, "spark");

    // 1. The Connect server dies; files land meanwhile; it comes back on its port.
    let port = connect.port;
    connect.kill();
    let want = land_more(2);
    super::harness::poll("the lost server noticed", || async {
        let (_, _, _, error) = status(&c, "copied").await;
        error.filter(|e| e.contains("reconnecting"))
    })
    .await;
    connect = ConnectServer::start(&spark_dir, port);
    wait_rows(&c, "copied", want).await;
    let (state, _, second_run, error) = status(&c, "copied").await;
    assert_eq!((state.as_str(), error), ("running", None));
    assert_ne!(
        second_run, first_run,
        "started again from its checkpoint: a new run"
    );

    // 2. Tidemark is killed; on restart it finds the same run on Spark.
    server.kill().await;
    let want = land_more(2);
    server = TestServer::start(&data, 0, &[]).await;
    let c = server.connect().await;
    wait_rows(&c, "copied", want).await;
    let (state, _, run, _) = status(&c, "copied").await;
    assert_eq!(
        (state.as_str(), run.as_str()),
        ("running", second_run.as_str())
    );

    // 3. SIGTERM leaves the query running on Spark; the restart finds it again.
    server.stop().await;
    let want = land_more(1);
    server = TestServer::start(&data, 0, &[]).await;
    let c = server.connect().await;
    wait_rows(&c, "copied", want).await;
    let (_, _, run, _) = status(&c, "copied").await;
    assert_eq!(run, second_run);

    // 4. STOP stops it on Spark, START starts it from its checkpoint.
    c.batch_execute("STOP SINK copied").await.unwrap();
    wait_status(&c, "copied", "stopped").await;
    let stopped_at = counted(&c, "copied").await;
    let want = land_more(1);
    // A stopped sink on Spark stays stopped across a restart, with its engine and ids.
    server.stop().await;
    server = TestServer::start(&data, 0, &[]).await;
    let c = server.connect().await;
    let (state, engine, run, _) = status(&c, "copied").await;
    assert_eq!(
        (state.as_str(), engine.as_str(), run.as_str()),
        ("stopped", "spark", second_run.as_str())
    );
    assert_eq!(
        counted(&c, "copied").await,
        stopped_at,
        "nothing ran while stopped"
    );
    c.batch_execute("START SINK copied").await.unwrap();
    wait_rows(&c, "copied", want).await;
    assert!(stopped_at.0 < want);
    let (_, _, third_run, _) = status(&c, "copied").await;
    assert_ne!(third_run, second_run);
    // The run's reports reach tidemark.progress (up to a poll after its commit).
    super::harness::poll("the restarted run's reports", || async {
        let b = batches(&c, "copied").await;
        (!b.is_empty()).then_some(())
    })
    .await;

    c.batch_execute("DROP SINK copied").await.unwrap();
    server.stop().await;
    drop(connect);
}

/// An endpoint that refuses connections, and one that accepts them and never answers:
/// `CREATE` fails with 08006 within a bounded time, never hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_spark_connect_fails_create_in_bounded_time() {
    let tmp = tempfile::tempdir().unwrap();
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    // Accepted and held, never answered.
    let held = std::thread::spawn(move || {
        let conns: Vec<_> = silent.incoming().take(4).collect();
        conns
    });
    let refused = super::harness::free_port();
    std::fs::create_dir_all(tmp.path().join("in")).unwrap();
    let server = TestServer::start(&tmp.path().join("data"), 0, &[]).await;
    let c = server.connect().await;
    c.batch_execute(&format!(
        "CREATE STREAM s (a INT) WITH (connector = 'file', format = 'json', path = '{}')",
        tmp.path().join("in").display()
    ))
    .await
    .unwrap();
    for port in [refused, silent_port] {
        let started = std::time::Instant::now();
        let e = c
            .batch_execute(&format!(
                "CREATE SINK k WITH (engine = 'spark', spark_remote = 'sc://127.0.0.1:{port}', \
                 connector = 'parquet', path = '{}') AS SELECT a FROM s",
                tmp.path().join("out").display()
            ))
            .await
            .unwrap_err();
        let db = e.as_db_error().expect("a server error");
        assert_eq!(db.code().code(), "08006", "{db:?}");
        assert!(
            db.message().contains(&format!("127.0.0.1:{port}")),
            "{db:?}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "took {:?}",
            started.elapsed()
        );
    }
    // Nothing was made.
    assert!(
        rows(&c, "SELECT name FROM tidemark.queries WHERE name = 'k'")
            .await
            .is_empty()
    );
    server.stop().await;

    // The server's --spark-remote stands in for a sink's spark_remote.
    let remote = format!("sc://127.0.0.1:{refused}");
    let server =
        TestServer::start_with(&tmp.path().join("data"), &[], &["--spark-remote", &remote]).await;
    let c = server.connect().await;
    let e = c
        .batch_execute(&format!(
            "CREATE SINK k WITH (engine = 'spark', connector = 'parquet', path = '{}') AS \
             SELECT a FROM s",
            tmp.path().join("out").display()
        ))
        .await
        .unwrap_err();
    let db = e.as_db_error().expect("a server error");
    assert_eq!(db.code().code(), "08006", "{db:?}");
    assert!(db.message().contains(&remote), "{db:?}");
    server.stop().await;
    drop(held);
}

/// One click a line: `(user, kind, "HH:MM")` on 2026-06-10.
fn events(rows: &[(&str, &str, &str)]) -> Vec<String> {
    rows.iter()
        .map(|(u, k, t)| {
            format!(r#"{{"user_id":"{u}","kind":"{k}","event_time":"2026-06-10T{t}:00Z"}}"#)
        })
        .collect()
}

/// Input rows of the batches of `name` from batch `from` on.
async fn inputs_from(
    c: &tokio_postgres::Client,
    name: &str,
    from: i64,
) -> Vec<Vec<Option<String>>> {
    rows(
        c,
        &format!(
            "SELECT batch_id, num_input_rows FROM tidemark.progress WHERE name = '{name}' \
             AND batch_id >= {from} ORDER BY batch_id"
        ),
    )
    .await
}

/// Waits until `sink` holds `want` rows, failing if it ever holds more.
async fn wait_count(c: &tokio_postgres::Client, sink: &str, want: i64) {
    super::harness::poll(&format!("{sink} to hold {want} rows"), || async {
        let n = rows(c, &format!("SELECT count(*) FROM {sink}")).await[0][0].clone();
        let n: i64 = n.unwrap().parse().unwrap();
        assert!(n <= want, "{sink} holds {n} rows");
        (n == want).then_some(())
    })
    .await;
}

async fn alter_error(c: &tokio_postgres::Client, sql: &str) -> (String, String) {
    let e = c.batch_execute(sql).await.expect_err(sql);
    let db = e.as_db_error().expect("a server error");
    (db.code().code().to_string(), db.message().to_string())
}

/// `ALTER SINK s SET (engine = 'spark')` moves a stopped local sink to Spark where its
/// checkpoint stopped: the files already taken are not read again, a stateful sink moves
/// at a clean point, one with open state is refused or moved with `from = 'beginning'`;
/// the result equals a local run over every file, and the moved sinks stay on Spark
/// across a Tidemark restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_sinks_move_to_spark_where_they_stopped() {
    if !prerequisites() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let connect = ConnectServer::start(&tmp.path().join("spark"), 0);
    let (landing, landing2) = (tmp.path().join("landing"), tmp.path().join("landing2"));
    let data = tmp.path().join("data");
    let mut server = TestServer::start(&data, 0, &[]).await;
    let c = server.connect().await;
    // f1, f2 before the move; f3, f4 after. Ticks move the watermark and are left out.
    land(
        &landing,
        "f1.json",
        &events(&[
            ("u1", "click", "10:00"),
            ("u2", "click", "10:01"),
            ("u1", "click", "10:03"),
        ]),
        60,
    );
    land(&landing, "f2.json", &events(&[("u0", "tick", "10:30")]), 50);
    std::fs::create_dir_all(&landing2).unwrap();
    for (name, dir) in [("ev", &landing), ("ev2", &landing2)] {
        c.batch_execute(&format!(
            "CREATE STREAM {name} (user_id TEXT, kind TEXT, event_time TIMESTAMP) WITH \
             (connector = 'file', format = 'json', path = '{}', max_files_per_trigger = 1)",
            dir.display()
        ))
        .await
        .unwrap();
    }
    let projected = "SELECT user_id, kind, event_time FROM ev WHERE kind <> 'tick'";
    // The ticks must reach the watermark, so the filter names the event time (a filter
    // that does not is pushed below the watermark, by Spark and by Tidemark alike).
    let windowed = "SELECT window.start AS window_start, user_id, count(*) AS n FROM ev WHERE \
                    kind <> 'tick' OR event_time IS NULL GROUP BY window(event_time, \
                    '5 minutes'), user_id";
    let out = |n: &str| tmp.path().join(format!("out_{n}")).display().to_string();
    for (name, query) in [("proj", projected), ("win", windowed)] {
        c.batch_execute(&format!(
            "CREATE SINK {name} WITH (connector = 'parquet', path = '{}', watermark = \
             'event_time - 1 minute', trigger = 'available_now') AS {query}",
            out(name)
        ))
        .await
        .unwrap();
        wait_status(&c, name, "finished").await;
    }
    let local_batches = inputs_from(&c, "win", 0).await;
    assert_eq!(
        local_batches.len(),
        3,
        "two files and the batch that closes the windows"
    );

    land(
        &landing,
        "f3.json",
        &events(&[("u1", "click", "10:40"), ("u3", "click", "10:41")]),
        40,
    );
    land(&landing, "f4.json", &events(&[("u0", "tick", "11:10")]), 30);
    for name in ["proj", "win"] {
        c.batch_execute(&format!(
            "ALTER SINK {name} SET (engine = 'spark', spark_remote = '{}')",
            connect.remote()
        ))
        .await
        .unwrap_or_else(|e| panic!("{name}: {e:?}"));
        let (_, engine, ..) = status(&c, name).await;
        assert_eq!(engine, "spark", "{name}");
        wait_status(&c, name, "finished").await;
    }
    // Spark went on from the local checkpoint: batch ids continue, and its first batch
    // read f3's rows only (f1 and f2 were not taken again).
    let proj_spark = inputs_from(&c, "proj", 2).await;
    let s = |v: &str| Some(v.to_string());
    assert_eq!(proj_spark[0], vec![s("2"), s("2")], "{proj_spark:?}");
    // (Spark counts f4's tick after the pushed-down filter: 0 rows.)
    assert_eq!(proj_spark.len(), 2, "{proj_spark:?}");
    assert_eq!(proj_spark[1][0], s("3"), "{proj_spark:?}");
    let win_spark = inputs_from(&c, "win", 3).await;
    assert_eq!(win_spark[0], vec![s("3"), s("2")], "{win_spark:?}");

    // The same queries run locally over all four files.
    for (name, query) in [("proj", projected), ("win", windowed)] {
        c.batch_execute(&format!(
            "CREATE SINK {name}_ref WITH (connector = 'parquet', path = '{}', watermark = \
             'event_time - 1 minute', trigger = 'available_now') AS {query}",
            out(&format!("{name}_ref"))
        ))
        .await
        .unwrap();
        wait_status(&c, &format!("{name}_ref"), "finished").await;
        let order = "ORDER BY 1, 2, 3";
        let moved = rows(&c, &format!("SELECT * FROM {name} {order}")).await;
        let reference = rows(&c, &format!("SELECT * FROM {name}_ref {order}")).await;
        assert_eq!(moved.len(), if name == "proj" { 5 } else { 4 }, "{moved:?}");
        assert_eq!(moved, reference, "{name}: moved, then all local");
    }

    // A sink with open windows: refused while running, refused stopped (state does not
    // transfer), moved with from = 'beginning' (its output rebuilt on Spark).
    land(
        &landing2,
        "g1.json",
        &events(&[("u1", "click", "10:00"), ("u2", "click", "10:01")]),
        60,
    );
    land(
        &landing2,
        "g2.json",
        &events(&[("u1", "click", "10:40")]),
        50,
    );
    c.batch_execute(&format!(
        "CREATE SINK open_win WITH (connector = 'parquet', path = '{}', watermark = \
         'event_time - 20 minutes') AS SELECT window.start AS window_start, user_id, count(*) \
         AS n FROM ev2 GROUP BY window(event_time, '5 minutes'), user_id",
        out("open_win")
    ))
    .await
    .unwrap();
    c.batch_execute("FLUSH SINK open_win").await.unwrap();
    let local = rows(&c, "SELECT * FROM open_win ORDER BY 1, 2").await;
    assert_eq!(
        local.len(),
        2,
        "the 10:00 windows closed, 10:40 open: {local:?}"
    );
    let move_sql = format!(
        "ALTER SINK open_win SET (engine = 'spark', spark_remote = '{}')",
        connect.remote()
    );
    let (code, msg) = alter_error(&c, &move_sql).await;
    assert_eq!(code, "55000", "{msg}");
    assert!(msg.contains("STOP SINK open_win"), "{msg}");
    c.batch_execute("STOP SINK open_win").await.unwrap();
    let (code, msg) = alter_error(&c, &move_sql).await;
    assert_eq!(code, "55000", "{msg}");
    assert!(msg.contains("hold 1 row(s) of state"), "{msg}");
    let (_, engine, ..) = status(&c, "open_win").await;
    assert_eq!(engine, "tidemark", "a refused move leaves the sink local");
    c.batch_execute(&move_sql.replace(")", ", from = 'beginning')"))
        .await
        .unwrap();
    wait_count(&c, "open_win", 2).await;
    assert_eq!(
        rows(&c, "SELECT * FROM open_win ORDER BY 1, 2").await,
        local
    );
    // Spark's run started from scratch: its reports begin at batch 0 (the local run's
    // batches 0-2 stay in tidemark.progress under the local ids).
    let (_, _, spark_run, _) = status(&c, "open_win").await;
    let first = super::harness::poll("the Spark run's reports", || async {
        let r = rows(
            &c,
            &format!(
                "SELECT min(batch_id), max(batch_id) FROM tidemark.progress WHERE name = \
                 'open_win' AND run_id = '{spark_run}'"
            ),
        )
        .await;
        let last = r[0][1].as_deref().and_then(|v| v.parse::<i64>().ok());
        last.is_some_and(|b| b >= 2).then(|| r[0][0].clone())
    })
    .await;
    assert_eq!(first, s("0"), "Spark started from scratch");

    // The moves outlive Tidemark, killed (SIGKILL) or stopped (SIGTERM) and started
    // again: the sinks are on Spark, and the rebuilt sink goes on taking new files there.
    for (round, kill) in [(3, true), (4, false)] {
        if kill {
            // Reports are shown before they are marked announced on disk (a crash in
            // between repeats them, never loses them): wait for the mark of batch 2.
            let session = data.join("checkpoints/open_win/spark-session.json");
            super::harness::poll("batch 2 marked announced", || async {
                let text = std::fs::read_to_string(&session).ok()?;
                let file: serde_json::Value = serde_json::from_str(&text).ok()?;
                (file["announced"]["at"][0].as_i64()? >= 2).then_some(())
            })
            .await;
            server.kill().await;
        } else {
            server.stop().await;
        }
        server = TestServer::start(&data, 0, &[]).await;
        let c = server.connect().await;
        for name in ["proj", "win", "open_win"] {
            let (_, engine, ..) = status(&c, name).await;
            assert_eq!(engine, "spark", "{name} after restart {round}");
        }
        // A click an hour on: the 10:40 window closes.
        land(
            &landing2,
            &format!("g{round}.json"),
            &events(&[("u1", "click", &format!("1{}:40", round - 2))]),
            40 - round * 5,
        );
        let want = round as i64;
        wait_count(&c, "open_win", want).await;
        if kill {
            // Spark's recent reports fill tidemark.progress again (batches 0-2 of the
            // rebuilt run), but only those made after the restart are announced again.
            // The rows are read from Spark's output, which can be ahead of the reports
            // polled from Spark: wait for the report of a batch after the restart.
            let (_, _, run, _) = status(&c, "open_win").await;
            let r = super::harness::poll("a report made after the restart", || async {
                let r = rows(
                    &c,
                    &format!(
                        "SELECT count(DISTINCT batch_id) FILTER (WHERE batch_id <= 2), \
                         max(batch_id) FROM tidemark.progress WHERE name = 'open_win' AND \
                         run_id = '{run}'"
                    ),
                )
                .await;
                let newest = r[0][1].as_deref().and_then(|v| v.parse::<i64>().ok());
                newest.is_some_and(|b| b >= 3).then_some(r)
            })
            .await;
            assert_eq!(r[0][0], s("3"), "the earlier reports: {r:?}");
            let newest: i64 = r[0][1].as_deref().unwrap().parse().unwrap();
            let http = server.http.clone().expect("the HTTP server");
            let (_, metrics) = super::monitoring::http_get(&http, "/metrics").await;
            let announced: i64 = metrics
                .lines()
                .find_map(|l| l.strip_prefix("tidemark_query_batches_total{query=\"open_win\"} "))
                .expect("open_win's batch counter")
                .trim()
                .parse()
                .unwrap();
            assert!(
                (1..=newest - 2).contains(&announced),
                "{announced} batches announced after the restart, newest batch {newest}"
            );
        }
    }
    let c = server.connect().await;
    let after = rows(&c, "SELECT * FROM open_win ORDER BY 1, 2").await;
    assert_eq!(after[..2], local[..], "{after:?}");
    server.stop().await;
}

/// The oracle cases (`tests/oracle/cases`: input files run by run, and what Spark made of
/// them when the oracle ran) on Spark through Spark Connect: each append-mode variant as a
/// Parquet sink with `engine = 'spark'`, run after run (Tidemark restarted between runs,
/// the sink started again), must give Spark's recorded rows and batches. Complete and
/// update variants need a sink Spark's file sinks are not (the oracle used foreachBatch);
/// `oracle::spark_cases_match` runs them locally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oracle_cases_match_on_spark_connect() {
    if !prerequisites() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let connect = ConnectServer::start(&tmp.path().join("spark"), 0);
    let mut checked = Vec::new();
    for (case, runs, variant, v) in super::oracle::variants() {
        if v.mode != "append" {
            eprintln!(
                "{} / {variant}: {} mode has no Spark file sink",
                case.display(),
                v.mode
            );
            continue;
        }
        eprintln!("oracle case {} / {variant} on Spark", case.display());
        super::oracle::check_variant(&case, &runs, &variant, &v, Some(&connect.remote())).await;
        checked.push(case);
    }
    assert!(checked.len() >= 7, "append variants checked: {checked:?}");
}
