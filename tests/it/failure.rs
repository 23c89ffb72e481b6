//! Failing queries: a sink whose writes fail (a simulated write failure, a read-only table
//! folder) stops with status `failed` and its error, the other sinks keep running, nothing
//! committed is lost, and `START SINK` retries from the checkpoint without duplicates.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use tokio_postgres::Client;

use crate::harness::{TestServer, poll};

fn land(dir: &Path, name: &str, ids: std::ops::Range<i64>) {
    let text: String = ids.map(|i| format!("{{\"id\":{i}}}\n")).collect();
    // Written beside, then renamed: the source never sees half a file.
    let tmp = dir.join(format!(".{name}"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::rename(&tmp, dir.join(name)).unwrap();
}

async fn status(client: &Client, sink: &str) -> (String, Option<String>) {
    let row = client
        .query_one(
            "SELECT status, error FROM tidemark.queries WHERE name = $1",
            &[&sink],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

async fn wait_failed(client: &Client, sink: &str) -> String {
    poll("the sink to fail", || async {
        match status(client, sink).await {
            (s, Some(e)) if s == "failed" => Some(e),
            _ => None,
        }
    })
    .await
}

/// `(rows, distinct ids)` of a sink's table.
async fn counts(client: &Client, sink: &str) -> (i64, i64) {
    let row = client
        .query_one(
            &format!("SELECT count(*), count(DISTINCT id) FROM {sink}"),
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

async fn setup(client: &Client, landing: &Path, copy_path: &Path) {
    client
        .batch_execute(&format!(
            "CREATE STREAM ids (id BIGINT) WITH (format = 'json', path = '{}');
             CREATE SINK copy WITH (path = '{}') AS SELECT id FROM ids;
             CREATE SINK other AS SELECT id FROM ids;",
            landing.display(),
            copy_path.display()
        ))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_simulated_write_failure_fails_one_sink_and_start_retries() {
    let tmp = tempfile::tempdir().unwrap();
    let landing = tmp.path().join("in");
    std::fs::create_dir_all(&landing).unwrap();
    let data_dir = tmp.path().join("data");
    let server =
        TestServer::start(&data_dir, 0, &[("TIDEMARK_FAIL_AT", "sink_write:copy@2")]).await;
    let client = server.connect().await;
    setup(&client, &landing, &tmp.path().join("copy")).await;
    land(&landing, "1.json", 0..100);
    client.batch_execute("FLUSH SINK copy").await.unwrap();
    // The second batch of `copy` fails to write.
    land(&landing, "2.json", 100..250);
    let error = wait_failed(&client, "copy").await;
    assert!(error.contains("simulated write failure"), "{error}");
    let shown = client.simple_query("SHOW QUERIES").await.unwrap();
    assert!(
        format!("{shown:?}").contains("simulated write failure"),
        "SHOW QUERIES shows the error"
    );
    // What was committed is there; the other sink goes on.
    assert_eq!(counts(&client, "copy").await, (100, 100));
    land(&landing, "3.json", 250..300);
    client.batch_execute("FLUSH SINK other").await.unwrap();
    assert_eq!(status(&client, "other").await.0, "running");
    assert_eq!(counts(&client, "other").await, (300, 300));
    client
        .batch_execute("START SINK copy; FLUSH SINK copy")
        .await
        .unwrap();
    assert_eq!(counts(&client, "copy").await, (300, 300));
    assert_eq!(status(&client, "copy").await, ("running".into(), None));
    server.stop().await;
}

/// As root, permissions do not bite: the server then runs as `nobody`.
fn server_uid() -> Option<u32> {
    let probe = tempfile::tempdir().unwrap();
    std::fs::set_permissions(probe.path(), std::fs::Permissions::from_mode(0o555)).unwrap();
    let writable = std::fs::write(probe.path().join("x"), "x").is_ok();
    std::fs::set_permissions(probe.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    writable.then_some(65534)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_table_folder_fails_one_sink_and_start_retries() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let landing = tmp.path().join("in");
    let table = tmp.path().join("copy");
    let data_dir = tmp.path().join("data");
    for d in [&landing, &table, &data_dir] {
        std::fs::create_dir_all(d).unwrap();
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let server = TestServer::start_as(&data_dir, 0, &[], server_uid()).await;
    let client = server.connect().await;
    setup(&client, &landing, &table).await;
    land(&landing, "1.json", 0..100);
    client.batch_execute("FLUSH SINK copy").await.unwrap();

    std::fs::set_permissions(&table, std::fs::Permissions::from_mode(0o555)).unwrap();
    land(&landing, "2.json", 100..250);
    let error = wait_failed(&client, "copy").await;
    assert!(
        error.to_lowercase().contains("permission denied"),
        "{error}"
    );
    assert_eq!(counts(&client, "copy").await, (100, 100));
    client.batch_execute("FLUSH SINK other").await.unwrap();
    assert_eq!(counts(&client, "other").await, (250, 250));

    // START SINK while still read-only fails again, losing nothing.
    client.batch_execute("START SINK copy").await.unwrap();
    wait_failed(&client, "copy").await;
    std::fs::set_permissions(&table, std::fs::Permissions::from_mode(0o777)).unwrap();
    client
        .batch_execute("START SINK copy; FLUSH SINK copy")
        .await
        .unwrap();
    assert_eq!(counts(&client, "copy").await, (250, 250));
    server.stop().await;
}
