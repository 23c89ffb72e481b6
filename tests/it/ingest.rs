//! Streams fed over the wire, against a real server process: INSERT with parameters and
//! COPY through the extended protocol (tokio-postgres), psycopg's `executemany` and
//! `copy`, asyncpg's `copy_records_to_table` (binary COPY) and `executemany`, pgjdbc's
//! `executeBatch`, and SIGKILL while concurrent INSERT and COPY clients run.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use futures::SinkExt;
use tokio_postgres::Client;

use crate::harness::{Rng, TestServer, poll};

const STREAM: &str = "CREATE STREAM events (id BIGINT NOT NULL, ts TIMESTAMP, v DOUBLE PRECISION)";

/// `id`s of a table as a sorted list.
async fn ids(client: &Client, sql: &str) -> Vec<i64> {
    let mut out: Vec<i64> = client
        .query(sql, &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get::<_, i64>(0))
        .collect();
    out.sort_unstable();
    out
}

/// A file beside this test.
pub(crate) fn script(name: &str) -> String {
    format!("{}/tests/it/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// Runs a driver's client program; a missing program or a failure fails the test (CI
/// installs them), never a skip.
pub(crate) fn run_client(what: &str, program: &str, args: &[&str]) {
    let out = std::process::Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {program}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One COPY in text format through tokio-postgres (Parse/Bind/Execute, then CopyData).
async fn copy_rows(client: &Client, rows: &[i64]) -> Result<u64, tokio_postgres::Error> {
    let mut text = String::new();
    for id in rows {
        text.push_str(&format!("{id}\t2026-06-10 10:00:00\t{}\n", id % 7));
    }
    let sink = client.copy_in("COPY events FROM STDIN").await?;
    futures::pin_mut!(sink);
    sink.send(std::io::Cursor::new(text.into_bytes())).await?;
    sink.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insert_and_copy_through_the_extended_protocol_and_psycopg() {
    let tmp = tempfile::tempdir().unwrap();
    let server = TestServer::start(&tmp.path().join("data"), 0, &[]).await;
    let client = server.connect().await;
    client.batch_execute(STREAM).await.unwrap();

    // Parameter binding: tokio-postgres prepares every statement.
    let insert = client
        .prepare("INSERT INTO events VALUES ($1, $2, $3)")
        .await
        .unwrap();
    let ts =
        chrono::NaiveDateTime::parse_from_str("2026-06-10 10:00:00", "%Y-%m-%d %H:%M:%S").unwrap();
    for id in 0..20i64 {
        let n = client
            .execute(&insert, &[&id, &ts, &(id as f64 * 0.5)])
            .await
            .unwrap();
        assert_eq!(n, 1);
    }
    // A bad parameter is refused with Postgres's SQLSTATE, and appends nothing.
    let err = client
        .execute(&insert, &[&None::<i64>, &ts, &1.0f64])
        .await
        .unwrap_err();
    assert_eq!(err.code().unwrap().code(), "23502", "{err}");
    // Several rows of parameters in one statement, a column list, text parameters: the
    // fast path (rows built from the parameters); a bad value is 22P02 and appends nothing.
    let multi = client
        .prepare_typed(
            "INSERT INTO events (v, id, ts) VALUES ($1, $2, $3), ($4, $5, $3)",
            &[
                tokio_postgres::types::Type::FLOAT8,
                tokio_postgres::types::Type::INT4,
                tokio_postgres::types::Type::TEXT,
                tokio_postgres::types::Type::FLOAT8,
                tokio_postgres::types::Type::INT8,
            ],
        )
        .await
        .unwrap();
    let n = client
        .execute(
            &multi,
            &[&1.5f64, &20i32, &"2026-06-10 10:00:00", &2.5f64, &21i64],
        )
        .await
        .unwrap();
    assert_eq!(n, 2);
    let err = client
        .execute(&multi, &[&1.5f64, &22i32, &"not a time", &2.5f64, &23i64])
        .await
        .unwrap_err();
    assert_eq!(err.code().unwrap().code(), "22007", "{err}");
    // The fast path's message, as Postgres's INSERT writes it.
    let db = err.as_db_error().unwrap().message().to_string();
    assert_eq!(
        db,
        "invalid input syntax for type timestamp: \"not a time\""
    );
    // A literal among the values: DataFusion's path, same result.
    let mixed = client
        .prepare("INSERT INTO events VALUES ($1, '2026-06-10 10:00:00', 0.25)")
        .await
        .unwrap();
    assert_eq!(client.execute(&mixed, &[&24i64]).await.unwrap(), 1);
    let got: Vec<(i64, f64)> = client
        .query(
            "SELECT id, v FROM events WHERE id BETWEEN 20 AND 24 ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(got, vec![(20, 1.5), (21, 2.5), (24, 0.25)]);

    // COPY in the extended protocol.
    let n = copy_rows(&client, &(100..150).collect::<Vec<_>>())
        .await
        .unwrap();
    assert_eq!(n, 50);
    // A COPY with a bad line appends nothing, and the connection stays usable.
    let sink = client.copy_in("COPY events FROM STDIN").await.unwrap();
    futures::pin_mut!(sink);
    sink.send(std::io::Cursor::new(
        b"200\t2026-06-10 10:00:00\t1\n201\tnope\t1\n".to_vec(),
    ))
    .await
    .unwrap();
    let err = sink.finish().await.unwrap_err();
    // A timestamp that does not parse: 22007, as Postgres (checked side by side in errors.rs).
    assert_eq!(err.code().unwrap().code(), "22007", "{err}");

    let want: Vec<i64> = (0..22).chain([24]).chain(100..150).collect();
    assert_eq!(ids(&client, "SELECT id FROM events").await, want);

    // psycopg 3: executemany and cursor.copy (CI installs it; elsewhere it must be there
    // too, or this test fails rather than skipping).
    run_client(
        "psycopg ingest (is psycopg installed? pip install 'psycopg[binary]')",
        "python3",
        &[&script("psycopg_ingest.py"), &server.port.to_string()],
    );
    let want: Vec<i64> = (0..22)
        .chain([24])
        .chain(100..150)
        .chain(1000..1100)
        .chain(2000..2300)
        .collect();
    assert_eq!(ids(&client, "SELECT id FROM events").await, want);

    // asyncpg: copy_records_to_table (binary COPY) over every column type, and
    // executemany; the script checks the rows read back (CI installs asyncpg).
    run_client(
        "asyncpg ingest (is asyncpg installed? pip install asyncpg)",
        "python3",
        &[&script("asyncpg_ingest.py"), &server.port.to_string()],
    );

    // pgjdbc: a batch of prepared INSERTs, each with update count 1 (CI installs Java and
    // Debian's libpostgresql-jdbc-java).
    run_client(
        "pgjdbc ingest (apt-get install default-jre-headless libpostgresql-jdbc-java)",
        "java",
        &[
            "-cp",
            "/usr/share/java/postgresql.jar",
            &script("JdbcIngest.java"),
            &server.port.to_string(),
        ],
    );
    let want: Vec<i64> = want.into_iter().chain(5000..5100).collect();
    assert_eq!(ids(&client, "SELECT id FROM events").await, want);
    server.stop().await;
}

/// What the writer clients sent: per statement, its ids and whether it was acknowledged.
#[derive(Default)]
struct Sent {
    statements: BTreeMap<(u32, u32), (Vec<i64>, bool)>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_during_concurrent_inserts_and_copies_loses_and_duplicates_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let data_dir = tmp.path().join("data");
    let server = TestServer::start(&data_dir, 0, &[]).await;
    let port = server.port;
    let admin = server.connect().await;
    admin.batch_execute(STREAM).await.unwrap();
    // Two queries over the stream: a stateless copy and a per-id count.
    admin
        .batch_execute(
            "CREATE SINK copied AS SELECT id, ts, v FROM events;
             CREATE SINK counted WITH (output_mode = 'update') AS
                 SELECT id, count(*) AS n FROM events GROUP BY id",
        )
        .await
        .unwrap();
    let sent = Arc::new(Mutex::new(Sent::default()));
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    eprintln!("ingest crash seed {seed}");
    // Four INSERT clients and two COPY clients, each until the server dies.
    let mut writers = Vec::new();
    for w in 0..6u32 {
        let sent = sent.clone();
        let client = crate::harness::connect(port).await;
        let mut rng = Rng(seed ^ ((u64::from(w) + 1) * 0x9e37_79b9));
        writers.push(tokio::spawn(async move {
            for s in 0..100_000u32 {
                let rows = 1 + rng.below(if w < 4 { 5 } else { 200 }) as i64;
                let base = (i64::from(w) << 40) | (i64::from(s) << 16);
                let ids: Vec<i64> = (0..rows).map(|r| base | r).collect();
                sent.lock()
                    .unwrap()
                    .statements
                    .insert((w, s), (ids.clone(), false));
                let ok = if w < 4 {
                    let values: Vec<String> = ids
                        .iter()
                        .map(|id| format!("({id}, '2026-06-10 10:00:00', {})", id % 7))
                        .collect();
                    client
                        .execute(
                            format!("INSERT INTO events VALUES {}", values.join(", ")).as_str(),
                            &[],
                        )
                        .await
                        .is_ok()
                } else {
                    copy_rows(&client, &ids).await.is_ok()
                };
                if !ok {
                    return;
                }
                sent.lock().unwrap().statements.get_mut(&(w, s)).unwrap().1 = true;
            }
        }));
    }
    // Kill once a few hundred statements are acknowledged, while the writers still run.
    poll("acknowledged statements", || {
        let sent = sent.clone();
        async move {
            let acked = sent
                .lock()
                .unwrap()
                .statements
                .values()
                .filter(|s| s.1)
                .count();
            (acked >= 300).then_some(())
        }
    })
    .await;
    server.kill().await;
    for w in writers {
        w.await.unwrap();
    }

    let server = TestServer::start(&data_dir, port, &[]).await;
    let client = server.connect().await;
    client.batch_execute("FLUSH").await.unwrap();
    let stream = ids(&client, "SELECT id FROM events").await;
    let copied = ids(&client, "SELECT id FROM copied").await;
    let counted: BTreeMap<i64, i64> = client
        .query("SELECT id, n FROM counted", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get::<_, i64>(0), r.get::<_, i64>(1)))
        .collect();

    let sent = std::mem::take(&mut *sent.lock().unwrap());
    let in_stream: BTreeSet<i64> = stream.iter().copied().collect();
    assert_eq!(in_stream.len(), stream.len(), "no row twice in the stream");
    let mut expected = Vec::new();
    let (mut acked, mut unacked_present, mut unacked_absent) = (0, 0, 0);
    for ((w, s), (ids, ok)) in &sent.statements {
        let present = ids.iter().filter(|id| in_stream.contains(id)).count();
        if *ok {
            acked += 1;
            assert_eq!(
                present,
                ids.len(),
                "acknowledged statement {w}/{s} lost rows"
            );
        } else {
            assert!(
                present == 0 || present == ids.len(),
                "unacknowledged statement {w}/{s} is partly there ({present} of {})",
                ids.len()
            );
            if present == 0 {
                unacked_absent += 1;
            } else {
                unacked_present += 1;
            }
        }
        if present > 0 {
            expected.extend(ids.iter().copied());
        }
    }
    expected.sort_unstable();
    assert_eq!(
        stream, expected,
        "the stream holds exactly the statements that landed"
    );
    assert_eq!(copied, stream, "the copy sink read every row exactly once");
    assert_eq!(counted.len(), stream.len());
    assert!(
        counted.values().all(|&n| n == 1),
        "the aggregate counted every row exactly once"
    );
    eprintln!(
        "ingest crash: {acked} statements acknowledged, {} rows; unacknowledged: {unacked_present} landed, {unacked_absent} absent",
        stream.len()
    );
    assert!(acked >= 300);
    server.stop().await;
}
