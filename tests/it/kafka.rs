//! Kafka in and out, against real brokers the tests start:
//!
//! - **tansu 0.6** (the Rust Kafka broker now called nisshi, from crates.io; `.ci/run`
//!   builds it once and caches it): the source — several partitions, JSON decoding with
//!   malformed records, `max_offsets_per_trigger`, `topic_pattern` picking up a new topic,
//!   a restart after SIGTERM and after SIGKILL, a topic recreated under a running query
//!   (`fail_on_data_loss` both ways), the at-least-once sink. tansu 0.6 cannot run
//!   transactions with librdkafka (its EndTxn version is refused), so:
//! - **librdkafka's mock cluster** (`rdkafka::mocking::MockCluster`, inside this test
//!   process, so it outlives the Tidemark processes the test kills): the exactly-once sink
//!   — SIGKILL at every crash point of a Kafka → window → Kafka and a Kafka → Delta
//!   pipeline, then a `read_committed` consumer of another client (Python's
//!   confluent-kafka) must read exactly the records of an uninterrupted run; and
//!   retention deleting unread offsets (the mock keeps the last 5 MiB of a partition),
//!   `fail_on_data_loss` both ways.
//!
//! A missing broker or client fails the test in CI (`.ci/run` installs both) and skips it
//! elsewhere, saying so.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio_postgres::Client;

use super::harness::{TestServer, free_port, log_tail, poll, rows};

/// The tansu binary: `$TIDEMARK_TANSU`, the CI cache, or `tansu` on the PATH.
fn tansu_binary() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("TIDEMARK_TANSU").map(PathBuf::from),
        Some(PathBuf::from("/var/cache/tidemark-broker/bin/tansu")),
    ];
    if let Some(p) = candidates.into_iter().flatten().find(|p| p.exists()) {
        return Some(p);
    }
    Command::new("tansu")
        .arg("--help")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|_| PathBuf::from("tansu"))
}

fn python_client_ready() -> bool {
    Command::new("python3")
        .args(["-c", "import confluent_kafka, fastavro"])
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether the test can run here; in CI, a missing part fails it.
pub fn prerequisites(need_tansu: bool) -> bool {
    let mut missing = Vec::new();
    if need_tansu && tansu_binary().is_none() {
        missing.push("the tansu broker (cargo install tansu --version 0.6.0 --features dynostore)");
    }
    if !python_client_ready() {
        missing
            .push("Python's confluent-kafka and fastavro (pip install confluent-kafka fastavro)");
    }
    if missing.is_empty() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{} not installed: CI must install it (.ci/run does)",
        missing.join(" and ")
    );
    eprintln!("skipping: {} not installed", missing.join(" and "));
    false
}

/// A tansu broker on a loopback port, in memory; killed on drop.
pub struct Tansu {
    child: Child,
    pub bootstrap: String,
    log: PathBuf,
}

impl Tansu {
    pub fn start(dir: &Path) -> Tansu {
        let bin = tansu_binary().expect("tansu");
        let dir = dir.join("tansu");
        std::fs::create_dir_all(&dir).unwrap();
        // tansu advertises the address it is given, so it cannot pick its own port.
        let port = free_port();
        let url = format!("tcp://127.0.0.1:{port}");
        let log_path = dir.join("broker.log");
        let log = std::fs::File::create(&log_path).unwrap();
        let child = Command::new(bin)
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
            ])
            .args(["--storage-engine", "memory://tansu/"])
            .current_dir(&dir)
            .env_remove("RUST_LOG")
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start tansu");
        let bootstrap = format!("127.0.0.1:{port}");
        // Ready when it accepts connections.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(&bootstrap).is_err() {
            assert!(std::time::Instant::now() < deadline, "tansu did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Tansu {
            child,
            bootstrap,
            log: log_path,
        }
    }
}

impl Drop for Tansu {
    fn drop(&mut self) {
        // A failing test shows the broker's side too (as `TestServer` shows the server's).
        if std::thread::panicking() {
            eprintln!(
                "tansu at {}, the last lines of its log:\n{}",
                self.bootstrap,
                log_tail(&self.log, 40)
            );
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `kafka_client.py`; its standard output.
fn client(args: &[&str]) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/kafka_client.py");
    let out = Command::new("python3")
        .arg(script)
        .args(args)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "kafka_client.py {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Every record of `topic`, read_committed, as (key, value), sorted.
fn consume(bootstrap: &str, topic: &str) -> Vec<(Option<String>, Option<String>)> {
    let mut out: Vec<(Option<String>, Option<String>)> = client(&["consume", bootstrap, topic])
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["key"].as_str().map(String::from),
                v["value"].as_str().map(String::from),
            )
        })
        .collect();
    out.sort();
    out
}

async fn exec(client: &Client, sql: &str) {
    client
        .batch_execute(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
}

async fn count(client: &Client, sql: &str) -> i64 {
    rows(client, sql).await[0][0]
        .as_deref()
        .unwrap()
        .parse()
        .unwrap()
}

/// The source over several partitions: JSON values decoded into the declared columns (a
/// malformed one kept as NULLs and in the side table), Spark's Kafka columns beside them,
/// `max_offsets_per_trigger` cutting batches, `topic_pattern` reading a topic created while
/// it runs; every record exactly once across a SIGTERM and a SIGKILL restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_source_reads_every_partition_once_across_restarts() {
    if !prerequisites(true) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let broker = Tansu::start(tmp.path());
    let bs = broker.bootstrap.clone();
    client(&["produce", &bs, "events", "3", "0", "60"]);
    client(&["produce_text", &bs, "events", "1", "not json"]);
    let data = tmp.path().join("data");
    let server = TestServer::start(&data, 0, &[]).await;
    let c = server.connect().await;
    exec(
        &c,
        &format!(
            "CREATE STREAM ev (id BIGINT, \"user\" TEXT, ts TIMESTAMP) WITH (connector = \
             'kafka', bootstrap_servers = '{bs}', topic = 'events', starting_offsets = \
             'earliest', format = 'json', max_offsets_per_trigger = '25'); \
             CREATE SINK evs WITH (malformed_rows = 'table') AS SELECT id, \"user\", ts, \
             topic, partition, \"offset\", CAST(key AS TEXT) AS k FROM ev; \
             CREATE STREAM anyt WITH (connector = 'kafka', bootstrap_servers = '{bs}', \
             topic_pattern = 'logs-.*', starting_offsets = 'earliest'); \
             CREATE SINK logs AS SELECT topic, CAST(value AS TEXT) AS v FROM anyt; \
             FLUSH SINK evs;"
        ),
    )
    .await;
    assert_eq!(count(&c, "SELECT count(*) FROM evs").await, 61);
    assert_eq!(count(&c, "SELECT count(DISTINCT id) FROM evs").await, 60);
    assert_eq!(
        count(
            &c,
            "SELECT count(*) FROM evs WHERE k = CAST(id AS TEXT) AND partition = id % 3"
        )
        .await,
        60
    );
    // The malformed record: a row of NULLs, and its place in the side table.
    let bad = rows(
        &c,
        "SELECT path, line_number, record FROM evs_malformed_rows",
    )
    .await;
    assert_eq!(
        bad,
        vec![vec![
            Some("events-1".to_string()),
            Some("20".to_string()),
            Some("not json".to_string())
        ]]
    );
    // 61 records at most 25 a batch: at least 3 batches.
    assert!(
        count(
            &c,
            "SELECT count(*) FROM tidemark.progress WHERE name = 'evs' AND num_input_rows > 0"
        )
        .await
            >= 3
    );
    let lag = rows(&c, "SELECT source_latest_offset FROM tidemark.progress WHERE name = 'evs' ORDER BY batch_id DESC LIMIT 1").await;
    assert!(
        lag[0][0].as_deref().unwrap_or("").contains("\"events\""),
        "{lag:?}"
    );

    // A topic the pattern matches, made while the query runs.
    client(&["produce", &bs, "logs-a", "2", "0", "4"]);
    exec(&c, "FLUSH SINK logs").await;
    poll("the pattern's new topic", || async {
        (count(&c, "SELECT count(*) FROM logs WHERE topic = 'logs-a'").await == 4).then_some(())
    })
    .await;

    // SIGTERM, more records, restart: the new ones once.
    drop(c);
    let port = server.port;
    server.stop().await;
    client(&["produce", &bs, "events", "3", "60", "30"]);
    let server = TestServer::start(&data, port, &[]).await;
    let c = server.connect().await;
    exec(&c, "FLUSH SINK evs").await;
    assert_eq!(count(&c, "SELECT count(DISTINCT id) FROM evs").await, 90);
    assert_eq!(count(&c, "SELECT count(*) FROM evs").await, 91);

    // SIGKILL, more records, restart: the same.
    drop(c);
    server.kill().await;
    client(&["produce", &bs, "events", "3", "90", "30"]);
    let server = TestServer::start(&data, port, &[]).await;
    let c = server.connect().await;
    exec(&c, "FLUSH SINK evs").await;
    assert_eq!(count(&c, "SELECT count(DISTINCT id) FROM evs").await, 120);
    assert_eq!(count(&c, "SELECT count(*) FROM evs").await, 121);
    server.stop().await;
}

/// Avro values, encoded by another implementation (Python's fastavro): a stream without
/// declared columns takes the record's fields; one with declared columns takes the fields
/// of their names, behind Confluent's header; a value that is not a datum of the schema is
/// a row of NULLs and a row of the side table (PERMISSIVE) or fails the query (FAILFAST).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_avro_values_decode_into_columns() {
    if !prerequisites(true) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let broker = Tansu::start(tmp.path());
    let bs = broker.bootstrap.clone();
    let schema = r#"{"type": "record", "name": "click", "fields": [
        {"name": "id", "type": "long"},
        {"name": "page", "type": ["null", "string"]},
        {"name": "amount", "type": "double"},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "kind", "type": {"type": "enum", "name": "kind", "symbols": ["VIEW", "BUY"]}}]}"#;
    // 2024-01-01 00:00:00 UTC plus i seconds.
    let value = |i: i64, page: Option<&str>| {
        serde_json::json!({
            "id": i, "page": page, "amount": i as f64 * 1.5,
            "at": 1_704_067_200_000_000i64 + i * 1_000_000, "kind": if i % 2 == 0 { "VIEW" } else { "BUY" }
        })
        .to_string()
    };
    let mut raw: Vec<String> = (0..4).map(|i| value(i, Some("home"))).collect();
    raw.insert(2, r#"{"hex": "ffffffffffffffffffff"}"#.into());
    raw.push(value(4, None));
    let mut args = vec!["produce_avro", &bs, "clicks", schema, "raw"];
    args.extend(raw.iter().map(String::as_str));
    client(&args);
    let framed: Vec<String> = (10..13).map(|i| value(i, Some("cart"))).collect();
    let mut args = vec!["produce_avro", &bs, "framed", schema, "confluent"];
    args.extend(framed.iter().map(String::as_str));
    client(&args);

    let server = TestServer::start(&tmp.path().join("data"), 0, &[]).await;
    let c = server.connect().await;
    let quoted = schema.replace('\'', "''");
    exec(
        &c,
        &format!(
            "CREATE STREAM clicks WITH (connector = 'kafka', bootstrap_servers = '{bs}', topic \
             = 'clicks', starting_offsets = 'earliest', format = 'avro', avro_schema = \
             '{quoted}'); \
             CREATE SINK got WITH (malformed_rows = 'table') AS SELECT id, page, amount, at, \
             kind, \"offset\" FROM clicks; \
             CREATE STREAM framed (\"ID\" INT, page TEXT) WITH (connector = 'kafka', \
             bootstrap_servers = '{bs}', topic = 'framed', starting_offsets = 'earliest', \
             format = 'avro', avro_schema = '{quoted}', avro_framing = 'confluent'); \
             CREATE SINK got_framed AS SELECT \"ID\", page FROM framed; \
             FLUSH SINK got; FLUSH SINK got_framed;"
        ),
    )
    .await;
    // The derived columns, as the catalog shows them.
    let cols = rows(
        &c,
        "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = \
         'clicks' ORDER BY ordinal_position LIMIT 5",
    )
    .await;
    let cols: Vec<(String, String)> = cols
        .into_iter()
        .map(|r| (r[0].clone().unwrap(), r[1].clone().unwrap()))
        .collect();
    assert_eq!(
        cols.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["id", "page", "amount", "at", "kind"],
        "{cols:?}"
    );
    let got = rows(
        &c,
        "SELECT id, page, amount, at, kind, \"offset\" FROM got ORDER BY \"offset\"",
    )
    .await;
    let want: Vec<Vec<Option<String>>> = vec![
        vec!["0", "home", "0", "2024-01-01 00:00:00+00", "VIEW", "0"],
        vec!["1", "home", "1.5", "2024-01-01 00:00:01+00", "BUY", "1"],
        vec!["", "", "", "", "", "2"],
        vec!["2", "home", "3", "2024-01-01 00:00:02+00", "VIEW", "3"],
        vec!["3", "home", "4.5", "2024-01-01 00:00:03+00", "BUY", "4"],
        vec!["4", "", "6", "2024-01-01 00:00:04+00", "VIEW", "5"],
    ]
    .into_iter()
    .map(|r| {
        r.into_iter()
            .map(|v| (!v.is_empty()).then(|| v.to_string()))
            .collect()
    })
    .collect();
    assert_eq!(got, want);
    let bad = rows(
        &c,
        "SELECT path, line_number, record FROM got_malformed_rows",
    )
    .await;
    assert_eq!(
        bad,
        vec![vec![
            Some("clicks-0".to_string()),
            Some("2".to_string()),
            Some("\\xffffffffffffffffffff".to_string())
        ]]
    );
    let framed = rows(&c, "SELECT \"ID\", page FROM got_framed ORDER BY 1").await;
    assert_eq!(
        framed,
        (10..13)
            .map(|i| vec![Some(i.to_string()), Some("cart".to_string())])
            .collect::<Vec<_>>()
    );
    // FAILFAST: the query fails, naming the record.
    exec(
        &c,
        &format!(
            "CREATE STREAM strict WITH (connector = 'kafka', bootstrap_servers = '{bs}', topic \
             = 'clicks', starting_offsets = 'earliest', format = 'avro', avro_schema = \
             '{quoted}', mode = 'FAILFAST'); CREATE SINK s AS SELECT id FROM strict"
        ),
    )
    .await;
    let err = c.batch_execute("FLUSH SINK s").await.unwrap_err();
    let msg = err
        .as_db_error()
        .map(|e| e.message().to_string())
        .unwrap_or_default();
    assert!(
        msg.contains("malformed avro record in clicks-0 offset 2"),
        "{msg}"
    );
    // Bad declarations: 22023 with the reason.
    for (sql, text) in [
        (
            format!(
                "CREATE STREAM x WITH (connector = 'kafka', bootstrap_servers = '{bs}', topic = 'clicks', format = 'avro')"
            ),
            "needs the option \"avro_schema\"",
        ),
        (
            format!(
                "CREATE STREAM x (nope INT) WITH (connector = 'kafka', bootstrap_servers = '{bs}', topic = 'clicks', format = 'avro', avro_schema = '{quoted}')"
            ),
            "column \"nope\" is not a field of avro_schema",
        ),
        (
            format!(
                "CREATE STREAM x WITH (connector = 'kafka', bootstrap_servers = '{bs}', topic = 'clicks', format = 'avro', avro_schema = '{{\"type\": \"record\"')"
            ),
            "invalid avro_schema",
        ),
        (
            format!(
                "CREATE STREAM x (v TEXT) WITH (connector = 'kafka', bootstrap_servers = '{bs}', topic = 'clicks', format = 'raw', avro_schema = '{quoted}')"
            ),
            "applies only to format 'avro'",
        ),
    ] {
        let e = c.batch_execute(&sql).await.unwrap_err();
        let db = e.as_db_error().unwrap_or_else(|| panic!("{sql}: {e}"));
        assert_eq!(db.code().code(), "22023", "{sql}: {}", db.message());
        assert!(db.message().contains(text), "{sql}: {}", db.message());
    }
    server.stop().await;
}

/// Offsets that go away under a running query: the topic deleted and made again (its
/// offsets start over). With fail_on_data_loss (the default) the query fails saying so;
/// with false it goes on with the new records and counts the loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_data_loss_fails_the_query_unless_told_otherwise() {
    if !prerequisites(true) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let broker = Tansu::start(tmp.path());
    let bs = broker.bootstrap.clone();
    client(&["produce", &bs, "t", "1", "0", "10"]);
    let server = TestServer::start(&tmp.path().join("data"), 0, &[]).await;
    let c = server.connect().await;
    exec(
        &c,
        &format!(
            "CREATE STREAM strict WITH (connector = 'kafka', bootstrap_servers = '{bs}', topic = \
             't', starting_offsets = 'earliest'); \
             CREATE STREAM lenient WITH (connector = 'kafka', bootstrap_servers = '{bs}', topic \
             = 't', starting_offsets = 'earliest', fail_on_data_loss = 'false'); \
             CREATE SINK a AS SELECT \"offset\" FROM strict; \
             CREATE SINK b AS SELECT \"offset\", CAST(value AS TEXT) AS v FROM lenient; \
             FLUSH SINK a; FLUSH SINK b;"
        ),
    )
    .await;
    assert_eq!(count(&c, "SELECT count(*) FROM b").await, 10);
    // Stopped while the topic is remade, so that they see it only once it is back (a
    // query that runs meanwhile sees the partition gone, another data loss; and tansu's
    // answer to a fetch of the deleted topic crashes librdkafka, docs/kafka.md). STOP
    // returns once the queries' consumers are closed.
    exec(&c, "STOP SINK a; STOP SINK b").await;
    client(&["delete", &bs, "t"]);
    client(&["produce", &bs, "t", "1", "100", "3"]);
    exec(&c, "START SINK a; START SINK b").await;
    let err = c.batch_execute("FLUSH SINK a").await.unwrap_err();
    let msg = err
        .as_db_error()
        .map(|e| e.message().to_string())
        .unwrap_or_default();
    assert!(
        msg.contains("offset was changed from 10 to 3") && msg.contains("fail_on_data_loss"),
        "{msg}"
    );
    exec(&c, "FLUSH SINK b").await;
    // Offsets 3..10 of the old topic are gone; the new topic's offsets 0..3 were "before"
    // the old end, so the partition resumes at the new end: nothing read twice.
    assert_eq!(count(&c, "SELECT count(*) FROM b").await, 10);
    client(&["produce", &bs, "t", "1", "200", "2"]);
    exec(&c, "FLUSH SINK b").await;
    assert_eq!(count(&c, "SELECT count(*) FROM b").await, 12);
    server.stop().await;
}

/// `count` records of `size` bytes to partition 0 of `topic`, acknowledged.
fn produce_sized(bootstrap: &str, topic: &str, count: usize, size: usize) {
    use rdkafka::producer::{BaseRecord, Producer};
    let p: rdkafka::producer::BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "0")
        .create()
        .expect("a producer");
    let payload = "x".repeat(size);
    for _ in 0..count {
        p.send(
            BaseRecord::<(), String>::to(topic)
                .payload(&payload)
                .partition(0),
        )
        .expect("send");
        p.flush(Duration::from_secs(30)).expect("flush");
    }
}

/// The broker's (earliest, latest) offsets of partition 0 of `topic`.
fn watermarks(bootstrap: &str, topic: &str) -> (i64, i64) {
    use rdkafka::consumer::Consumer;
    let c: rdkafka::consumer::BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("a consumer");
    c.fetch_watermarks(topic, 0, Duration::from_secs(30))
        .expect("watermarks")
}

/// Retention deleting offsets that stopped queries had not read yet. librdkafka's mock
/// cluster keeps the last 5 MiB of a partition, as a broker's size-based retention does
/// (tansu 0.6 has no retention and its DeleteRecords panics). With fail_on_data_loss (the
/// default) the query fails naming the offsets; with false it reads what is left, once,
/// and counts the loss in progress.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_retention_behind_a_query_fails_it_unless_told_otherwise() {
    if !prerequisites(false) {
        return;
    }
    let mock = rdkafka::mocking::MockCluster::new(1).expect("mock cluster");
    mock.create_topic("r", 1, 1).unwrap();
    let bs = mock.bootstrap_servers();
    produce_sized(&bs, "r", 10, 10);
    let tmp = tempfile::tempdir().unwrap();
    let server = TestServer::start(&tmp.path().join("data"), 0, &[]).await;
    let c = server.connect().await;
    exec(
        &c,
        &format!(
            "CREATE STREAM strict WITH (connector = 'kafka', bootstrap_servers = '{bs}', topic = \
             'r', starting_offsets = 'earliest'); \
             CREATE STREAM lenient WITH (connector = 'kafka', bootstrap_servers = '{bs}', topic \
             = 'r', starting_offsets = 'earliest', fail_on_data_loss = 'false'); \
             CREATE SINK a AS SELECT \"offset\" FROM strict; \
             CREATE SINK b AS SELECT \"offset\" FROM lenient; \
             FLUSH SINK a; FLUSH SINK b; STOP SINK a; STOP SINK b;"
        ),
    )
    .await;
    assert_eq!(count(&c, "SELECT count(*) FROM b").await, 10);
    // 80 records of 100 KiB: 8 MB, more than the 5 MiB the partition keeps.
    produce_sized(&bs, "r", 80, 100 << 10);
    let (earliest, latest) = watermarks(&bs, "r");
    assert!(earliest > 10 && latest == 90, "{earliest}..{latest}");
    exec(&c, "START SINK a; START SINK b").await;
    let err = c.batch_execute("FLUSH SINK a").await.unwrap_err();
    let msg = err
        .as_db_error()
        .map(|e| e.message().to_string())
        .unwrap_or_default();
    assert!(
        msg.contains(&format!(
            "offsets 10 to {} of partition r-0 are no longer in Kafka",
            earliest - 1
        )) && msg.contains("fail_on_data_loss"),
        "{msg}"
    );
    exec(&c, "FLUSH SINK b").await;
    // What retention left, each once, after the first ten.
    let got = rows(&c, "SELECT count(*), count(DISTINCT \"offset\"), min(\"offset\") FROM b WHERE \"offset\" >= 10").await;
    assert_eq!(
        got,
        vec![vec![
            Some((latest - earliest).to_string()),
            Some((latest - earliest).to_string()),
            Some(earliest.to_string())
        ]]
    );
    let loss = rows(
        &c,
        "SELECT metrics FROM tidemark.sources WHERE name = 'b' AND num_input_rows > 0 ORDER BY \
         batch_id DESC LIMIT 1",
    )
    .await;
    let metrics = loss[0][0].clone().unwrap_or_default();
    assert!(
        metrics.contains(&format!("\"dataLoss\":\"{}\"", earliest - 10)),
        "{metrics}"
    );
    server.stop().await;
}

/// Bad input gets a clear error with Postgres's SQLSTATE, at once: an unknown option, a
/// missing one, an unreachable broker (within the request timeout), a sink whose topic
/// does not exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_bad_declarations_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let server = TestServer::start(&tmp.path().join("data"), 0, &[]).await;
    let c = server.connect().await;
    let dead = format!("127.0.0.1:{}", free_port());
    let cases = [
        (
            format!(
                "CREATE STREAM s WITH (connector = 'kafka', bootstrap_servers = '{dead}', topic = 't', colour = 'red')"
            ),
            "22023",
            "unknown option \"colour\"",
        ),
        (
            "CREATE STREAM s WITH (connector = 'kafka', topic = 't')".to_string(),
            "22023",
            "bootstrap_servers",
        ),
        (
            format!(
                "CREATE STREAM s WITH (connector = 'kafka', bootstrap_servers = '{dead}', topic = 't')"
            ),
            "08006",
            "cannot reach the brokers",
        ),
    ];
    for (sql, state, text) in cases {
        let t = std::time::Instant::now();
        let e = c.batch_execute(&sql).await.unwrap_err();
        let db = e.as_db_error().unwrap_or_else(|| panic!("{sql}: {e}"));
        assert_eq!(db.code().code(), state, "{sql}: {}", db.message());
        assert!(db.message().contains(text), "{sql}: {}", db.message());
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{sql} took {:?}",
            t.elapsed()
        );
    }
    server.stop().await;
}

/// The at-least-once sink (no transactions: tansu has none librdkafka accepts) and a sink
/// whose topic does not exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_sink_at_least_once_writes_every_row() {
    if !prerequisites(true) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let broker = Tansu::start(tmp.path());
    let bs = broker.bootstrap.clone();
    client(&["produce", &bs, "in", "2", "0", "20"]);
    client(&["create", &bs, "out", "2"]);
    let server = TestServer::start(&tmp.path().join("data"), 0, &[]).await;
    let c = server.connect().await;
    exec(
        &c,
        &format!(
            "CREATE STREAM ev (id BIGINT, \"user\" TEXT, ts TIMESTAMP) WITH (connector = \
             'kafka', bootstrap_servers = '{bs}', topic = 'in', starting_offsets = 'earliest', \
             format = 'json'); \
             CREATE SINK k WITH (connector = 'kafka', bootstrap_servers = '{bs}', topic = 'out', \
             delivery = 'at_least_once') AS SELECT CAST(id AS TEXT) AS key, \"user\" AS value \
             FROM ev WHERE id % 2 = 0; FLUSH SINK k;"
        ),
    )
    .await;
    let got = consume(&bs, "out");
    let mut want: Vec<(Option<String>, Option<String>)> = (0..20)
        .filter(|i| i % 2 == 0)
        .map(|i| (Some(i.to_string()), Some(format!("u{}", i % 5))))
        .collect();
    want.sort();
    assert_eq!(got, want);
    let e = c
        .batch_execute(&format!(
            "CREATE SINK k2 WITH (connector = 'kafka', bootstrap_servers = '{bs}', topic = \
             'nowhere') AS SELECT \"user\" AS value FROM ev"
        ))
        .await
        .unwrap_err();
    let db = e.as_db_error().unwrap();
    assert_eq!(db.code().code(), "22023");
    assert!(
        db.message().contains("\"nowhere\" does not exist"),
        "{}",
        db.message()
    );
    server.stop().await;
}

/// The crash points a micro-batch passes (src/testing.rs), each armed for its 3rd pass.
const CRASH_POINTS: [&str; 5] = [
    "after_offsets_write",
    "before_sink_commit",
    "sink_files_written",
    "after_sink_commit",
    "after_commit_log",
];

/// The stream over topic `in` of the mock cluster, and one of two pipelines over it:
/// Kafka → 1-minute windows → Kafka (`agg`, into topic `out`, exactly once), or Kafka →
/// Delta (`raw`). Made again after a crash cut their creation short (`IF NOT EXISTS`).
fn pipeline(bs: &str, sink: &str, out: &str) -> String {
    let stream = format!(
        "CREATE STREAM IF NOT EXISTS ev (id BIGINT, \"user\" TEXT, ts TIMESTAMP, \
         WATERMARK FOR ts AS ts - INTERVAL '1 minute') WITH (connector = 'kafka', \
         bootstrap_servers = '{bs}', topic = 'in', starting_offsets = 'earliest', format = \
         'json', max_offsets_per_trigger = '40');"
    );
    let sink = match sink {
        "agg" => format!(
            "CREATE SINK IF NOT EXISTS agg WITH (connector = 'kafka', bootstrap_servers = \
             '{bs}', topic = '{out}', format = 'json') AS SELECT window.start AS minute, \
             \"user\", count(*) AS n FROM ev GROUP BY window(ts, '1 minute'), \"user\";"
        ),
        _ => "CREATE SINK IF NOT EXISTS raw AS SELECT id, \"user\", ts, partition, \"offset\" \
              FROM ev;"
            .to_string(),
    };
    format!("{stream} {sink}")
}

/// Every crash point of each pipeline (one pipeline a run, so that the crash is its own):
/// a `read_committed` consumer reads exactly the records of an uninterrupted run, and the
/// Delta table holds every event once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_exactly_once_across_sigkill_at_every_crash_point() {
    if !prerequisites(false) {
        return;
    }
    let mock = rdkafka::mocking::MockCluster::new(1).expect("mock cluster");
    let bs = mock.bootstrap_servers();
    mock.create_topic("in", 3, 1).unwrap();
    for t in ["ref"].into_iter().chain(CRASH_POINTS) {
        mock.create_topic(&format!("out_{t}"), 1, 1).unwrap();
    }
    client(&["produce", &bs, "in", "3", "0", "200"]);
    let tmp = tempfile::tempdir().unwrap();

    // The uninterrupted run.
    let server = TestServer::start(&tmp.path().join("ref"), 0, &[]).await;
    let c = server.connect().await;
    exec(&c, &pipeline(&bs, "agg", "out_ref")).await;
    exec(&c, &pipeline(&bs, "raw", "")).await;
    exec(&c, "FLUSH SINK agg; FLUSH SINK raw").await;
    assert_eq!(count(&c, "SELECT count(DISTINCT id) FROM raw").await, 200);
    server.stop().await;
    let want = consume(&bs, "out_ref");
    // 200 events 7 s apart: 24 minutes; each (minute, user) once, all closed but the last
    // minute's (the watermark is 1 minute behind the last event).
    let total: i64 = want
        .iter()
        .map(|(_, v)| {
            let v: serde_json::Value = serde_json::from_str(v.as_deref().unwrap()).unwrap();
            v["n"].as_i64().unwrap()
        })
        .sum();
    assert!(
        total > 150 && total < 200,
        "{total} events in closed windows"
    );

    for point in CRASH_POINTS {
        for sink in ["agg", "raw"] {
            let out = format!("out_{point}");
            let data = tmp.path().join(format!("{sink}-{point}"));
            let spec = format!("{point}@3");
            let mut server = TestServer::start(&data, 0, &[("TIDEMARK_CRASH_AT", &spec)]).await;
            let port = server.port;
            let c = server.connect().await;
            // The crash may come before the statement ends: the next life makes the rest.
            let _ = c.batch_execute(&pipeline(&bs, sink, &out)).await;
            let status = server.wait_exit().await;
            assert!(
                !status.success(),
                "{sink}: the server should have aborted at {point}"
            );
            assert!(
                server
                    .log()
                    .contains(&format!("crash point {point} reached"))
            );
            drop(c);
            let server = TestServer::start(&data, port, &[]).await;
            let c = server.connect().await;
            exec(&c, &pipeline(&bs, sink, &out)).await;
            exec(&c, &format!("FLUSH SINK {sink}")).await;
            if sink == "raw" {
                assert_eq!(
                    count(&c, "SELECT count(*) FROM raw").await,
                    200,
                    "{point}: the Delta table holds every event once"
                );
                assert_eq!(count(&c, "SELECT count(DISTINCT id) FROM raw").await, 200);
            }
            let log = server.log();
            server.stop().await;
            if sink == "agg" {
                let got = consume(&bs, &out);
                assert_eq!(
                    got, want,
                    "{point}: read_committed reads the uninterrupted run's"
                );
                if point == "after_sink_commit" {
                    // The transaction was committed, the commit log not written: the replayed
                    // batch is found in Kafka (its marker) and skipped.
                    assert!(
                        log.contains("batch already in the table; skipped"),
                        "the replayed batch should have been skipped"
                    );
                }
            }
        }
    }
    drop(mock);
}

/// The broker goes away under a running pipeline and comes back: the query waits and
/// retries (the log says so), then goes on with every record once. On the mock cluster,
/// whose `broker_down` drops connections and refuses new ones while keeping the topics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_query_waits_for_a_broker_that_went_away() {
    if !prerequisites(false) {
        return;
    }
    let mock = rdkafka::mocking::MockCluster::new(1).expect("mock cluster");
    let bs = mock.bootstrap_servers();
    mock.create_topic("in", 2, 1).unwrap();
    client(&["produce", &bs, "in", "2", "0", "40"]);
    let tmp = tempfile::tempdir().unwrap();
    let server = TestServer::start(&tmp.path().join("data"), 0, &[]).await;
    let c = server.connect().await;
    exec(
        &c,
        &format!(
            "CREATE STREAM ev (id BIGINT, \"user\" TEXT, ts TIMESTAMP) WITH (connector = \
             'kafka', bootstrap_servers = '{bs}', topic = 'in', starting_offsets = 'earliest', \
             format = 'json'); \
             CREATE SINK raw AS SELECT id FROM ev; FLUSH SINK raw;"
        ),
    )
    .await;
    assert_eq!(count(&c, "SELECT count(*) FROM raw").await, 40);
    mock.broker_down(1).unwrap();
    poll("the log to say the broker is away", || async {
        server
            .log()
            .contains("kafka brokers are not answering; retrying")
            .then_some(())
    })
    .await;
    mock.broker_up(1).unwrap();
    client(&["produce", &bs, "in", "2", "40", "20"]);
    exec(&c, "FLUSH SINK raw").await;
    assert_eq!(count(&c, "SELECT count(*) FROM raw").await, 60);
    assert_eq!(count(&c, "SELECT count(DISTINCT id) FROM raw").await, 60);
    let status = rows(&c, "SELECT status FROM tidemark.queries WHERE name = 'raw'").await;
    assert_eq!(status[0][0].as_deref(), Some("running"));
    assert!(server.log().contains("kafka brokers answer again"));
    server.stop().await;
    drop(mock);
}
