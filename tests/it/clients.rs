//! The client matrix: drivers and tools not covered elsewhere, each run against one server
//! holding a table, a table stream and a materialized view. A missing client fails the
//! test (CI installs them), never a skip.

use crate::harness::{DEADLINE, TestServer, connect};
use crate::ingest::{run_client, script};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psycopg2_node_postgres_and_pgcli() {
    let tmp = tempfile::tempdir().unwrap();
    let server = TestServer::start(&tmp.path().join("data"), 0, &[]).await;
    connect(server.port)
        .await
        .batch_execute(
            "CREATE TABLE orders (id BIGINT PRIMARY KEY, amount DOUBLE PRECISION, note TEXT);
             INSERT INTO orders VALUES (1, 9.5, 'a'), (2, 20.0, NULL);
             CREATE STREAM clicks (user_id TEXT, event_time TIMESTAMP) WITH (connector = 'table');
             CREATE MATERIALIZED VIEW per_user AS SELECT user_id, count(*) AS n FROM clicks GROUP BY user_id;",
        )
        .await
        .unwrap();
    let port = server.port.to_string();
    run_client(
        "psycopg2 (pip install psycopg2-binary)",
        "python3",
        &[&script("psycopg2_check.py"), &port],
    );
    run_client(
        "pgcli (pip install pgcli)",
        "python3",
        &[&script("pgcli_check.py"), &port],
    );
    run_node("node_pg_check.js", &[&port]);
    psql_watch(server.port).await;
    server.stop().await;
}

/// Runs a node-postgres script, `pg` as npm installs it globally (`npm install -g pg`); a
/// missing node or a failure fails the test.
pub(crate) fn run_node(name: &str, args: &[&str]) {
    let global = std::process::Command::new("npm")
        .args(["root", "-g"])
        .output()
        .expect("npm must be installed (.ci/run installs nodejs and npm)");
    let node_path = String::from_utf8_lossy(&global.stdout).trim().to_string();
    let out = std::process::Command::new("node")
        .arg(script(name))
        .args(args)
        .env("NODE_PATH", node_path)
        .output()
        .expect("node must be installed (.ci/run installs nodejs)");
    assert!(
        out.status.success(),
        "node-postgres {name} failed (npm install -g pg):\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// psql's `\watch` runs its query again and again (until Ctrl-C): three answers are
/// awaited, then psql is stopped.
async fn psql_watch(port: u16) {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let mut child = tokio::process::Command::new("psql")
        .args([
            "-X",
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-d",
            "watch",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("psql must be installed (.ci/run installs postgresql-client)");
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(b"SELECT 42 AS answer \\watch 0.1\n")
        .await
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let answers = tokio::time::timeout(DEADLINE, async {
        let mut n = 0;
        while let Ok(Some(line)) = lines.next_line().await {
            if line.trim() == "42" {
                n += 1;
                if n == 3 {
                    break;
                }
            }
        }
        n
    })
    .await
    .expect("\\watch did not repeat its query");
    assert_eq!(answers, 3);
    child.kill().await.unwrap();
}
