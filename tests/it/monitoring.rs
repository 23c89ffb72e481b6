//! Watching a running pipeline (docs/monitoring.md): listener events and NOTIFY delivered
//! to idle drivers, `/metrics` through a Prometheus text-format parser, `/api/queries`,
//! the dashboard in a real headless Chromium, `SHOW PROGRESS` and the progress tables.
//! A missing client or browser fails the test (CI installs them).

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_postgres::Client;

use crate::harness::{TestServer, rows};
use crate::ingest::{run_client, script};

async fn one(client: &Client, sql: &str) -> String {
    rows(client, sql).await[0][0].clone().unwrap_or_default()
}

/// `GET path` from the server's HTTP address: the status and the body.
pub(crate) async fn http_get(addr: &str, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8_lossy(&buf).to_string();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP response");
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, body.to_string())
}

/// A table stream and a windowed materialized view over it with a watermark, fed three
/// statements (6 rows), each flushed through the view.
async fn pipeline(client: &Client) {
    client
        .batch_execute(
            "CREATE STREAM clicks (user_id TEXT, ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '5 seconds') \
               WITH (connector = 'table');
             CREATE MATERIALIZED VIEW per_minute AS
               SELECT window(ts, '1 minute') AS w, count(*) AS n FROM clicks GROUP BY window(ts, '1 minute');
             CREATE SINK raw_clicks AS SELECT user_id, ts FROM clicks;",
        )
        .await
        .unwrap();
    for values in [
        "('a', '2026-01-01 10:00:01'), ('b', '2026-01-01 10:00:02'), ('c', '2026-01-01 10:00:03')",
        "('a', '2026-01-01 10:01:01'), ('b', '2026-01-01 10:01:02')",
        "('a', '2026-01-01 10:02:30')",
    ] {
        client
            .batch_execute(&format!("INSERT INTO clicks VALUES {values}; FLUSH"))
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listeners_receive_events_and_notifications_while_idle() {
    let tmp = tempfile::tempdir().unwrap();
    let server = TestServer::start(&tmp.path().join("data"), 0, &[]).await;
    let client = server.connect().await;
    client
        .batch_execute(
            "CREATE STREAM visits (user_id TEXT) WITH (connector = 'table');
             CREATE MATERIALIZED VIEW visitors AS SELECT user_id, count(*) AS n FROM visits GROUP BY user_id;",
        )
        .await
        .unwrap();
    let port = server.port.to_string();
    for driver in ["psycopg", "psycopg2", "asyncpg"] {
        run_client(
            &format!("{driver} LISTEN (pip install 'psycopg[binary]' psycopg2-binary asyncpg)"),
            "python3",
            &[
                &script("listen_check.py"),
                driver,
                &port,
                "visitors",
                "visits",
            ],
        );
    }
    run_client(
        "pgjdbc LISTEN (apt-get install default-jre-headless libpostgresql-jdbc-java)",
        "java",
        &[
            "-cp",
            "/usr/share/java/postgresql.jar",
            &script("JdbcListen.java"),
            &format!("jdbc:postgresql://127.0.0.1:{port}/tidemark"),
            "visitors",
            "visits",
        ],
    );
    // tokio-postgres: started and terminated events, and NOTIFY inside the session itself.
    let (listener, mut connection) = tokio_postgres::connect(
        &format!("host=127.0.0.1 port={port} user=postgres dbname=tidemark"),
        tokio_postgres::NoTls,
    )
    .await
    .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        use futures::StreamExt;
        while let Some(Ok(m)) = messages.next().await {
            if let tokio_postgres::AsyncMessage::Notification(n) = m {
                let _ = tx.send((n.channel().to_string(), n.payload().to_string()));
            }
        }
    });
    listener
        .batch_execute("LISTEN tidemark_events; LISTEN self")
        .await
        .unwrap();
    client
        .batch_execute("STOP MATERIALIZED VIEW visitors; START MATERIALIZED VIEW visitors")
        .await
        .unwrap();
    listener.batch_execute("NOTIFY self, 'me'").await.unwrap();
    let mut kinds = Vec::new();
    let deadline = tokio::time::Instant::now() + crate::harness::DEADLINE;
    while !(kinds.contains(&"started".to_string()) && kinds.contains(&"self".to_string())) {
        let (channel, payload) = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .expect("notifications in time")
            .unwrap();
        if channel == "self" {
            assert_eq!(payload, "me");
            kinds.push("self".into());
            continue;
        }
        assert_eq!(channel, "tidemark_events");
        let event: serde_json::Value = serde_json::from_str(&payload).unwrap();
        assert_eq!(event["name"], "visitors", "{event}");
        kinds.push(event["event"].as_str().unwrap().to_string());
    }
    // Spark's order: the old run's terminated event, then the new run's started event.
    let at = |k: &str| kinds.iter().position(|x| x == k);
    assert!(at("terminated") < at("started"), "{kinds:?}");
    assert!(at("terminated").is_some(), "{kinds:?}");
    // NOTIFY outside a session's own statements needs a client: the engine refuses none of
    // these, and an unknown query's progress is 42704.
    let e = client
        .simple_query("SHOW PROGRESS nosuch")
        .await
        .unwrap_err();
    assert_eq!(e.code().unwrap().code(), "42704");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_api_and_progress_tables_agree_with_the_batches() {
    let tmp = tempfile::tempdir().unwrap();
    let server = TestServer::start(&tmp.path().join("data"), 0, &[]).await;
    let client = server.connect().await;
    pipeline(&client).await;
    // Statements that fail, counted by SQLSTATE: alone, and inside a message of several.
    assert!(client.simple_query("SELECT * FROM nowhere").await.is_err());
    assert!(
        client
            .batch_execute("SHOW PROGRESS nosuch; SELECT 1")
            .await
            .is_err()
    );
    let batches: u64 = one(
        &client,
        "SELECT count(*) FROM tidemark.progress WHERE name = 'per_minute'",
    )
    .await
    .parse()
    .unwrap();
    let input: u64 = one(
        &client,
        "SELECT sum(num_input_rows) FROM tidemark.progress WHERE name = 'per_minute'",
    )
    .await
    .parse()
    .unwrap();
    assert_eq!(input, 6, "the rows inserted");
    let state_rows = one(
        &client,
        "SELECT state_rows_total FROM tidemark.progress WHERE name = 'per_minute' ORDER BY batch_id DESC LIMIT 1",
    )
    .await;

    // /metrics, through a Prometheus text-format parser.
    let http = server.http.clone().expect("the HTTP server's address");
    let (status, body) = http_get(&http, "/metrics").await;
    assert_eq!(status, 200);
    let scrape = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
        .expect("/metrics parses as Prometheus text");
    let value = |name: &str, labels: &[(&str, &str)]| -> Option<f64> {
        scrape
            .samples
            .iter()
            .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                _ => f64::NAN,
            })
    };
    let q = [("query", "per_minute")];
    assert_eq!(
        value("tidemark_query_input_rows_total", &q),
        Some(input as f64)
    );
    assert_eq!(
        value("tidemark_query_batches_total", &q),
        Some(batches as f64)
    );
    assert_eq!(
        value("tidemark_query_state_rows", &q),
        Some(state_rows.parse().unwrap())
    );
    assert_eq!(value("tidemark_query_running", &q), Some(1.0));
    assert_eq!(value("tidemark_query_backlog_rows", &q), Some(0.0));
    assert!(value("tidemark_query_watermark_seconds", &q).unwrap() > 1.7e9);
    assert!(
        value(
            "tidemark_query_end_to_end_latency_seconds",
            &[("query", "per_minute"), ("quantile", "0.99")]
        )
        .is_some()
    );
    assert!(value("tidemark_connections", &[]).unwrap() >= 1.0);
    assert!(value("tidemark_statements_total", &[]).unwrap() >= 4.0);
    assert_eq!(
        value("tidemark_errors_total", &[("sqlstate", "42P01")]),
        Some(1.0)
    );
    assert_eq!(
        value("tidemark_errors_total", &[("sqlstate", "42704")]),
        Some(1.0)
    );
    // The batch-duration histogram, by phase: one observation per batch.
    let histogram = scrape
        .samples
        .iter()
        .find(|s| {
            s.metric == "tidemark_query_batch_duration_seconds"
                && s.labels.get("query") == Some("per_minute")
                && s.labels.get("phase") == Some("triggerExecution")
        })
        .expect("a batch-duration histogram for triggerExecution");
    match &histogram.value {
        prometheus_parse::Value::Histogram(buckets) => {
            assert_eq!(buckets.last().unwrap().count, batches as f64);
        }
        v => panic!("not a histogram: {v:?}"),
    }

    // /api/queries: the same batches.
    let (status, body) = http_get(&http, "/api/queries").await;
    assert_eq!(status, 200);
    let api: serde_json::Value = serde_json::from_str(&body).unwrap();
    let view = api["queries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["name"] == "per_minute")
        .unwrap();
    assert_eq!(view["status"], "running");
    assert_eq!(view["batches"].as_array().unwrap().len() as u64, batches);
    let api_input: u64 = view["batches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["numInputRows"].as_u64().unwrap())
        .sum();
    assert_eq!(api_input, input);
    assert!(view["checkpoint"].as_str().unwrap().ends_with("per_minute"));
    assert!(
        view["plan"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l.as_str().unwrap().contains("StatefulAggregate")),
        "{}",
        view["plan"]
    );
    let (status, _) = http_get(&http, "/api/queries/nosuch").await;
    assert_eq!(status, 404);
    // A normal run, with a Delta sink's first commit, logs no ERROR (a client's bad
    // statement is the client's error, not the server's).
    let log = server.log();
    assert!(
        !log.contains("ERROR"),
        "ERROR in a normal run's log:\n{log}"
    );

    // The progress tables and SHOW PROGRESS.
    let sources = rows(
        &client,
        "SELECT sum(num_input_rows), count(*), max(backlog_rows) FROM tidemark.sources WHERE name = 'per_minute'",
    )
    .await;
    assert_eq!(sources[0][0].as_deref(), Some("6"));
    assert_eq!(sources[0][1].as_deref(), Some(batches.to_string().as_str()));
    assert_eq!(sources[0][2].as_deref(), Some("0"));
    let operators = rows(
        &client,
        "SELECT operator_name, num_shuffle_partitions, num_state_store_instances FROM tidemark.state_operators \
         WHERE name = 'per_minute' ORDER BY batch_id DESC LIMIT 1",
    )
    .await;
    assert_eq!(operators[0][0].as_deref(), Some("stateStoreSave"));
    // Latency is measured on the batches that read rows, and only on them.
    let latency = rows(
        &client,
        "SELECT num_input_rows > 0, latency_p50_ms IS NOT NULL, latency_p50_ms <= latency_p99_ms \
         FROM tidemark.progress WHERE name = 'per_minute' ORDER BY batch_id",
    )
    .await;
    for r in &latency {
        assert_eq!(r[0], r[1], "latency only where rows were read: {latency:?}");
        if r[0].as_deref() == Some("t") {
            assert_eq!(r[2].as_deref(), Some("t"));
        }
    }
    let last = rows(&client, "SHOW PROGRESS per_minute").await;
    let last_id = one(
        &client,
        "SELECT max(batch_id) FROM tidemark.progress WHERE name = 'per_minute'",
    )
    .await;
    assert_eq!(last[0][0].as_deref(), Some("per_minute"));
    let report: serde_json::Value = serde_json::from_str(last[0][4].as_deref().unwrap()).unwrap();
    assert_eq!(report["batchId"].to_string(), last_id);
    assert_eq!(report["name"], "per_minute");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_the_pipeline_in_headless_chromium() {
    let tmp = tempfile::tempdir().unwrap();
    let server = TestServer::start(&tmp.path().join("data"), 0, &[]).await;
    let client = server.connect().await;
    pipeline(&client).await;
    let http = server.http.clone().expect("the HTTP server's address");
    let url = format!("http://{http}/#per_minute");
    let chromium = |extra: &[&str]| {
        let mut args = vec![
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--window-size=1400,1250",
            // Virtual time: the page's fetches and timers run; no wall-clock wait.
            "--virtual-time-budget=5000",
        ];
        args.extend_from_slice(extra);
        args.push(&url);
        let out = std::process::Command::new("chromium")
            .args(&args)
            .output()
            .expect("chromium must be installed (.ci/run installs Debian's chromium)");
        assert!(
            out.status.success(),
            "chromium failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let dom = chromium(&["--dump-dom"]);
    // The figures the page shows, which it writes on <body data-figures>.
    let figures = regex::Regex::new(r#"data-figures="([^"]*)""#)
        .unwrap()
        .captures(&dom)
        .unwrap_or_else(|| panic!("no figures in the page:\n{dom}"))[1]
        .replace("&quot;", "\"");
    let figures: serde_json::Value = serde_json::from_str(&figures).unwrap();
    let sql = rows(
        &client,
        "SELECT count(*), sum(num_input_rows), max(batch_id) FROM tidemark.progress WHERE name = 'per_minute'",
    )
    .await;
    assert_eq!(figures["query"], "per_minute");
    assert_eq!(figures["status"], "running");
    assert_eq!(figures["batches"].to_string(), sql[0][0].clone().unwrap());
    assert_eq!(figures["inputRows"].to_string(), sql[0][1].clone().unwrap());
    assert_eq!(
        figures["lastBatchId"].to_string(),
        sql[0][2].clone().unwrap()
    );
    // Every chart drawn (uPlot's canvas), each with a point per batch.
    for chart in ["rates", "duration", "rows", "lag", "state", "latency"] {
        let re = regex::Regex::new(&format!(
            r#"id="chart-{chart}" data-points="(\d+)"[^>]*data-rendered="1""#
        ))
        .unwrap();
        let points = re
            .captures(&dom)
            .unwrap_or_else(|| panic!("chart {chart} not drawn:\n{dom}"))[1]
            .to_string();
        assert_eq!(points, sql[0][0].clone().unwrap(), "chart {chart}");
    }
    assert!(dom.matches("<canvas").count() >= 6, "uPlot canvases");
    assert!(dom.contains("StatefulAggregate"), "the plan is shown");
    let shot = tmp.path().join("dashboard.png");
    chromium(&[&format!("--screenshot={}", shot.display())]);
    let png = std::fs::read(&shot).expect("a screenshot");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "a real screenshot"
    );
    if let Ok(to) = std::env::var("TIDEMARK_DASHBOARD_SCREENSHOT") {
        std::fs::copy(&shot, to).unwrap();
    }
    server.stop().await;
}
