//! A Delta source over a table whose early commits were cleaned up: it starts from the
//! newest checkpoint (written here by delta-rs itself), then reads the JSON commits after
//! it; a stream that needs the removed changes fails with the reason.

use tokio_postgres::Client;

use crate::harness::TestServer;

async fn ids(client: &Client, sql: &str) -> Vec<i64> {
    let mut out: Vec<i64> = client
        .query(sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .iter()
        .map(|r| r.get::<_, i64>(0))
        .collect();
    out.sort_unstable();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delta_stream_starts_from_a_checkpoint_when_the_log_was_cleaned() {
    let tmp = tempfile::tempdir().unwrap();
    let bronze = tmp.path().join("bronze");
    let server = TestServer::start(&tmp.path().join("data"), 0, &[]).await;
    let client = server.connect().await;
    client
        .batch_execute(&format!(
            "CREATE STREAM src (id BIGINT, v DOUBLE PRECISION);
             CREATE SINK bronze WITH (path = '{}') AS SELECT id, v FROM src",
            bronze.display()
        ))
        .await
        .unwrap();
    for k in 0..3i64 {
        client
            .batch_execute(&format!(
                "INSERT INTO src VALUES ({}, 1.0), ({}, 2.0); FLUSH SINK bronze",
                k * 10,
                k * 10 + 1
            ))
            .await
            .unwrap();
    }
    client.batch_execute("STOP SINK bronze").await.unwrap();
    // delta-rs writes a checkpoint of the latest version; the JSON commits before it go,
    // as Delta's log cleanup removes them.
    let url = url::Url::from_directory_path(&bronze).unwrap();
    let table = deltalake::open_table(url).await.unwrap();
    let version = table.version().unwrap() as u64;
    deltalake::checkpoints::create_checkpoint(&table, None)
        .await
        .unwrap();
    let log = bronze.join("_delta_log");
    assert!(
        log.join(format!("{version:020}.checkpoint.parquet"))
            .exists(),
        "delta-rs wrote no checkpoint"
    );
    for v in 0..version {
        std::fs::remove_file(log.join(format!("{v:020}.json"))).unwrap();
    }
    client
        .batch_execute(&format!(
            "CREATE STREAM bronze_s WITH (connector = 'delta', path = '{b}');
             CREATE SINK silver AS SELECT id, v FROM bronze_s;
             FLUSH SINK silver",
            b = bronze.display()
        ))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", server.log()));
    let want = ids(&client, "SELECT id FROM src").await;
    assert_eq!(want.len(), 6);
    assert_eq!(ids(&client, "SELECT id FROM silver").await, want);
    // Commits after the checkpoint are read from their JSON.
    client
        .batch_execute(
            "START SINK bronze; INSERT INTO src VALUES (100, 3.0); FLUSH SINK bronze; \
             FLUSH SINK silver",
        )
        .await
        .unwrap();
    let want = ids(&client, "SELECT id FROM src").await;
    assert_eq!(want.len(), 7);
    assert_eq!(ids(&client, "SELECT id FROM silver").await, want);
    // A stream that needs the cleaned-up changes fails, saying why.
    client
        .batch_execute(&format!(
            "CREATE STREAM old_s WITH (connector = 'delta', path = '{}', starting_version = 1);
             CREATE SINK old AS SELECT id FROM old_s",
            bronze.display()
        ))
        .await
        .unwrap();
    let err = client.batch_execute("FLUSH SINK old").await.unwrap_err();
    let msg = err
        .as_db_error()
        .map(|e| e.message().to_string())
        .unwrap_or_default();
    assert!(msg.contains("older commits were cleaned up"), "{err}");
    drop(client);
    server.stop().await;
}

/// OPTIMIZE over and over while the sink commits a batch per INSERT and auto-compacts
/// every 3 files: the two take turns on the table, so every row is in the table exactly
/// once, every batch id is committed once, and a Delta stream over the table reads each
/// row once despite the rewrites.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optimize_beside_a_committing_sink_loses_and_duplicates_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let lake = tmp.path().join("lake");
    let server = TestServer::start(&tmp.path().join("data"), 0, &[]).await;
    let client = server.connect().await;
    client
        .batch_execute(&format!(
            "CREATE STREAM src (id BIGINT, v DOUBLE PRECISION);
             CREATE SINK t WITH (path = '{0}', auto_compact = 3) AS SELECT id, v FROM src;
             CREATE STREAM t_s WITH (connector = 'delta', path = '{0}');
             CREATE SINK t_copy WITH (path = '{1}') AS SELECT id, v FROM t_s",
            lake.display(),
            tmp.path().join("copy").display()
        ))
        .await
        .unwrap();
    let optimizer = {
        let port = server.port;
        tokio::spawn(async move {
            let c = crate::harness::connect(port).await;
            let mut rewritten = 0i64;
            // Over the extended protocol (tokio-postgres prepares it): the Describe must
            // name OPTIMIZE's columns.
            for _ in 0..40 {
                let row = c.query_one("OPTIMIZE t", &[]).await.unwrap();
                rewritten += row.get::<_, i64>("files_removed");
            }
            rewritten
        })
    };
    const INSERTS: i64 = 60;
    for k in 0..INSERTS {
        client
            .batch_execute(&format!(
                "INSERT INTO src VALUES ({}, 1.0), ({}, 2.0); FLUSH SINK t",
                k * 2,
                k * 2 + 1
            ))
            .await
            .unwrap();
    }
    let rewritten = optimizer.await.unwrap();
    client.batch_execute("FLUSH SINK t").await.unwrap();
    client.batch_execute("FLUSH SINK t_copy").await.unwrap();
    let want: Vec<i64> = (0..INSERTS * 2).collect();
    assert_eq!(ids(&client, "SELECT id FROM t").await, want);
    assert_eq!(ids(&client, "SELECT id FROM t_copy").await, want);
    // The Delta log: each batch id once, and compactions happened.
    let crate::harness::DeltaLog {
        commits_per_batch: batches,
        compactions,
    } = crate::harness::read_delta_log(&lake);
    assert!(batches.values().all(|&n| n == 1), "{batches:?}");
    assert_eq!(
        batches.len() as i64,
        INSERTS,
        "one batch per flushed INSERT"
    );
    assert!(compactions >= 2, "{compactions} compactions");
    eprintln!(
        "{} batches, {compactions} compactions, {rewritten} files rewritten by OPTIMIZE",
        batches.len()
    );
    server.stop().await;
}
