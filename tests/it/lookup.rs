//! Key lookups in materialized views over the extended protocol: the path that answers them
//! without planning (`src/server/lookup.rs`) must give what planning gives, for rows that
//! are there and rows that are not, in memory and in RocksDB, before and after a SIGKILL.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio_postgres::Client;

use crate::harness::TestServer;
use crate::monitoring::http_get;

/// 2026-01-01 00:00:00 UTC.
const BASE_S: u64 = 1_767_225_600;

/// The rows inserted: (user, page, seconds after BASE_S, duration).
fn clicks() -> Vec<(String, String, u64, f64)> {
    (0..300u64)
        .map(|i| {
            (
                format!("u{}", i * 7 % 23),
                format!("/p{}", i * 5 % 9),
                i * 7,
                (i % 13) as f64 / 4.0,
            )
        })
        .collect()
}

fn at(seconds: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(BASE_S + seconds)
}

/// The server's count of lookups answered without planning.
async fn fast_lookups(server: &TestServer) -> f64 {
    let http = server.http.clone().expect("the HTTP server's address");
    let (status, body) = http_get(&http, "/metrics").await;
    assert_eq!(status, 200);
    let scrape = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
        .expect("/metrics parses as Prometheus text");
    scrape
        .samples
        .iter()
        .find(|s| s.metric == "tidemark_view_key_lookups_total")
        .map_or(0.0, |s| match s.value {
            prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Untyped(v) => v,
            _ => panic!("a counter"),
        })
}

/// Creates the stream, the views (`page_views_<store>`, `user_totals_<store>`) and
/// inserts the rows.
async fn create(client: &Client, stores: &[&str]) {
    client
        .batch_execute(
            "CREATE STREAM clicks (user_id TEXT, page TEXT, event_time TIMESTAMP, \
             duration_s DOUBLE PRECISION, WATERMARK FOR event_time AS event_time - INTERVAL '1 hour')",
        )
        .await
        .unwrap();
    for store in stores {
        client
            .batch_execute(&format!(
                "CREATE MATERIALIZED VIEW page_views_{store} WITH (state_store = '{store}') AS \
                 SELECT window.start AS window_start, window.end AS window_end, page, count(*) AS views \
                 FROM clicks GROUP BY window(event_time, '5 minutes'), page; \
                 CREATE MATERIALIZED VIEW user_totals_{store} WITH (state_store = '{store}') AS \
                 SELECT user_id, count(*) AS n, sum(duration_s) AS total FROM clicks GROUP BY user_id"
            ))
            .await
            .unwrap();
    }
    let insert = client
        .prepare("INSERT INTO clicks VALUES ($1, $2, $3, $4)")
        .await
        .unwrap();
    for (user, page, s, d) in clicks() {
        client
            .execute(&insert, &[&user, &page, &at(s), &d])
            .await
            .unwrap();
    }
    for store in stores {
        client
            .batch_execute(&format!(
                "FLUSH MATERIALIZED VIEW page_views_{store}; FLUSH MATERIALIZED VIEW user_totals_{store}"
            ))
            .await
            .unwrap();
    }
}

/// The (page, views) rows of `statement` run with `args`.
async fn page_rows(
    client: &Client,
    statement: &tokio_postgres::Statement,
    args: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Vec<(String, i64)> {
    client
        .query(statement, args)
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// Looks up every key of the views (and keys that are not there) by the path without
/// planning and by DataFusion's, checks both against the rows inserted and that the first
/// path was the one taken.
async fn check(server: &TestServer, stores: &[&str]) {
    let client = server.connect().await;
    let rows = clicks();
    // The expected rows, computed from the inserts.
    let mut windows: BTreeMap<(u64, String), i64> = BTreeMap::new();
    let mut users: BTreeMap<String, (i64, f64)> = BTreeMap::new();
    for (user, page, s, d) in &rows {
        *windows.entry((s / 300 * 300, page.clone())).or_default() += 1;
        let u = users.entry(user.clone()).or_default();
        u.0 += 1;
        u.1 += d;
    }
    for store in stores {
        let fast = client
            .prepare(&format!(
                "SELECT page, views FROM page_views_{store} \
                 WHERE window_start = $1 AND window_end = $2 AND page = $3"
            ))
            .await
            .unwrap();
        // The same rows, through DataFusion: a filter on a non-key column is not a lookup.
        let planned = client
            .prepare(&format!(
                "SELECT page, views FROM page_views_{store} \
                 WHERE window_start = $1 AND window_end = $2 AND page = $3 AND views > -1"
            ))
            .await
            .unwrap();
        let before = fast_lookups(server).await;
        let mut asked = 0;
        let mut keys: Vec<(u64, String, Option<i64>)> = windows
            .iter()
            .map(|((w, p), n)| (*w, p.clone(), Some(*n)))
            .collect();
        keys.push((0, "/nowhere".into(), None));
        keys.push((60, "/p1".into(), None)); // not a window's start
        keys.push((300 * 40, "/p1".into(), None)); // after the last window
        for (w, page, expected) in &keys {
            let args: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
                [&at(*w), &at(*w + 300), page];
            let got = page_rows(&client, &fast, &args).await;
            let via_plan = page_rows(&client, &planned, &args).await;
            assert_eq!(got, via_plan, "{store}: window {w}, {page}");
            let expected: Vec<(String, i64)> =
                expected.iter().map(|n| (page.clone(), *n)).collect();
            assert_eq!(got, expected, "{store}: window {w}, {page}");
            asked += 1;
        }
        // A NULL key matches nothing, as `=` with NULL does.
        let none: Option<&str> = None;
        assert!(
            client
                .query(&fast, &[&at(0), &at(300), &none])
                .await
                .unwrap()
                .is_empty()
        );
        asked += 1;
        // Renamed columns, a table alias, a key of one column.
        let by_user = client
            .prepare(&format!(
                "SELECT total, u.user_id AS who, n FROM user_totals_{store} u WHERE u.user_id = $1"
            ))
            .await
            .unwrap();
        assert_eq!(by_user.columns()[1].name(), "who");
        for (user, (n, total)) in &users {
            let r = client.query(&by_user, &[user]).await.unwrap();
            assert_eq!(r.len(), 1, "{store}: {user}");
            assert_eq!(r[0].get::<_, &str>(1), user);
            assert_eq!(r[0].get::<_, i64>(2), *n);
            assert_eq!(r[0].get::<_, f64>(0), *total, "{store}: {user}");
            asked += 1;
        }
        let after = fast_lookups(server).await;
        assert_eq!(
            after - before,
            asked as f64,
            "{store}: every lookup without planning"
        );
        // Part of a key: planned, and still right.
        let page_only = client
            .query(
                &format!("SELECT count(*) FROM page_views_{store} WHERE page = $1"),
                &[&"/p1"],
            )
            .await
            .unwrap();
        let expected = windows.keys().filter(|(_, p)| p == "/p1").count() as i64;
        assert_eq!(page_only[0].get::<_, i64>(0), expected);
        assert_eq!(
            fast_lookups(server).await,
            after,
            "{store}: a partial key is planned"
        );
    }
}

#[tokio::test]
async fn view_key_lookups_answer_as_planning_does_across_a_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let stores: &[&str] = if cfg!(feature = "rocksdb") {
        &["memory", "rocksdb"]
    } else {
        &["memory"]
    };
    let server = TestServer::start(&data, 0, &[]).await;
    create(&server.connect().await, stores).await;
    check(&server, stores).await;
    server.kill().await;
    let server = TestServer::start(&data, 0, &[]).await;
    check(&server, stores).await;
    server.stop().await;
}
