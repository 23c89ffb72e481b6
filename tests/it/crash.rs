//! Crash tests: kill a real `tidemark` process in the middle of an `available_now` sink,
//! restart it, let the sink finish, and check that the Delta table holds every input row
//! exactly once and that no batch id was committed twice.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, SystemTime};

use tokio_postgres::Client;

use crate::harness::{TestServer, free_port, poll};

const FILES: usize = 40;
const ROWS_PER_FILE: usize = 250;

/// Lands `FILES` JSON files with distinct, increasing modification times. Row ids are
/// unique across all files: id = file * ROWS_PER_FILE + row.
fn land_files(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let base = SystemTime::now() - Duration::from_secs(3600);
    for f in 0..FILES {
        let path = dir.join(format!("part-{f:04}.json"));
        let mut out = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        for r in 0..ROWS_PER_FILE {
            let id = f * ROWS_PER_FILE + r;
            writeln!(
                out,
                "{{\"id\":{id},\"page\":\"/p{}\",\"event_time\":\"2026-06-10T10:{:02}:{:02}Z\"}}",
                id % 7,
                (id / 60) % 60,
                id % 60
            )
            .unwrap();
        }
        drop(out);
        let file = std::fs::File::options().write(true).open(&path).unwrap();
        file.set_modified(base + Duration::from_secs(f as u64))
            .unwrap();
    }
}

/// The batch ids of a sink's `offsets/` or `commits/` log.
fn log_ids(data_dir: &Path, sink: &str, log: &str) -> Vec<u64> {
    let mut ids: Vec<u64> = std::fs::read_dir(data_dir.join("checkpoints").join(sink).join(log))
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_string_lossy().parse::<u64>().ok())
                .collect()
        })
        .unwrap_or_default();
    ids.sort_unstable();
    ids
}

/// The checkpoint protocol's order on disk, whatever the moment of a crash: the commit
/// log has no gap, and `offsets/N+1` exists only after `commits/N`, except for the newest
/// batch: `commits/N` is written while batch N + 1 runs, so `offsets/N+1` can be durable
/// first (a restart writes `commits/N` back). At most two batches are without their commit,
/// the newest two.
fn assert_logs_in_order(data_dir: &Path, sink: &str, what: &str) {
    let offsets = log_ids(data_dir, sink, "offsets");
    let commits = log_ids(data_dir, sink, "commits");
    let newest = offsets.last().copied();
    assert!(
        commits.windows(2).all(|w| w[1] == w[0] + 1),
        "{what}: a gap in the commit log {commits:?}"
    );
    for &n in offsets.iter().filter(|&&n| n > 0 && Some(n) != newest) {
        assert!(
            commits.contains(&(n - 1)),
            "{what}: offsets/{n} without commits/{} (offsets {offsets:?}, commits {commits:?})",
            n - 1
        );
    }
    let uncommitted: Vec<u64> = offsets
        .iter()
        .copied()
        .filter(|n| !commits.contains(n))
        .collect();
    assert!(
        uncommitted.len() <= 2 && uncommitted.iter().all(|&n| n + 1 >= newest.unwrap_or(0)),
        "{what}: offsets {offsets:?}, commits {commits:?}"
    );
    assert!(
        commits.iter().all(|n| offsets.contains(n)),
        "{what}: a commit without its offsets: offsets {offsets:?}, commits {commits:?}"
    );
}

/// How many batches a sink's checkpoint has committed (files in `commits/`).
/// Batches in a sink's commit log (0 before it exists).
pub(crate) fn committed_batches(data_dir: &Path, sink: &str) -> usize {
    std::fs::read_dir(data_dir.join("checkpoints").join(sink).join("commits"))
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().parse::<u64>().is_ok())
                .count()
        })
        .unwrap_or(0)
}

async fn create_pipeline(client: &Client, landing: &Path) {
    create_pipeline_into(client, landing, "delta").await
}

/// Delta sinks compact every `AUTO_COMPACT` files, so crashes land before, between and
/// after compactions.
const AUTO_COMPACT: usize = 4;

async fn create_pipeline_into(client: &Client, landing: &Path, connector: &str) {
    if connector == "merge" {
        return create_merge_pipeline(client, landing).await;
    }
    let compact = if connector == "delta" {
        format!(", auto_compact = {AUTO_COMPACT}")
    } else {
        String::new()
    };
    client
        .batch_execute(&format!(
            "CREATE STREAM events (id BIGINT, page TEXT, event_time TIMESTAMP) \
             WITH (connector = 'file', format = 'json', path = '{}', max_files_per_trigger = 1);
             CREATE SINK copied WITH (trigger = 'available_now', connector = '{connector}'\
             {compact}) AS \
             SELECT id, upper(page) AS page, event_time FROM events WHERE id >= 0",
            landing.display()
        ))
        .await
        .unwrap();
}

/// Where the MERGE pipeline's target lives: beside the landing folder.
fn merge_target(landing: &Path) -> std::path::PathBuf {
    landing.parent().unwrap().join("merged")
}

/// A MERGE sink named `copied` that adds each batch's count per page to a counter: a batch
/// merged twice would count its rows twice.
async fn create_merge_pipeline(client: &Client, landing: &Path) {
    client
        .batch_execute(&format!(
            "CREATE STREAM events (id BIGINT, page TEXT, event_time TIMESTAMP) \
             WITH (connector = 'file', format = 'json', path = '{}', max_files_per_trigger = 1);
             CREATE SINK copied WITH (trigger = 'available_now') AS \
             MERGE INTO delta.`{}` AS t \
             USING (SELECT page, count(*) AS n, max(id) AS last_id FROM events GROUP BY page) AS s \
             ON t.page = s.page \
             WHEN MATCHED THEN UPDATE SET n = t.n + s.n, last_id = greatest(t.last_id, s.last_id) \
             WHEN NOT MATCHED THEN INSERT *",
            landing.display(),
            merge_target(landing).display()
        ))
        .await
        .unwrap();
}

/// The MERGE pipeline's counters equal a count over every input row, and the Delta log has
/// one MERGE per batch id.
async fn check_merged_exactly_once(client: &Client, data_dir: &Path, target: &Path, point: &str) {
    let row = client
        .query_one(
            "SELECT (SELECT count(*) FROM (SELECT page, n, last_id FROM copied \
                     EXCEPT SELECT page, count(*), max(id) FROM events GROUP BY page)), \
                    (SELECT sum(n) FROM copied)",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        row.get::<_, i64>(0),
        0,
        "{point}: counters differ from the input"
    );
    assert_eq!(
        row.get::<_, i64>(1),
        (FILES * ROWS_PER_FILE) as i64,
        "{point}: rows counted"
    );
    let log = crate::harness::read_delta_log(target);
    assert_eq!(
        log.commits_per_batch.keys().copied().collect::<Vec<_>>(),
        (0..FILES as i64).collect::<Vec<_>>(),
        "{point}: batch ids merged"
    );
    for (batch, n) in &log.commits_per_batch {
        assert_eq!(*n, 1, "{point}: batch {batch} was merged {n} times");
    }
    assert_eq!(committed_batches(data_dir, "copied"), FILES, "{point}");
}

/// A MERGE sink killed at each crash point of batch 5: after the restart every batch is
/// merged exactly once (the replayed batch is skipped when its MERGE had committed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merge_sink_crash_at_each_point_is_exactly_once() {
    for point in [
        "after_offsets_write",
        "before_sink_commit",
        "after_sink_commit",
        "after_commit_log",
    ] {
        let (tmp, data_dir, server, client) = crash_then_finish(point, "merge").await;
        let target = merge_target(&tmp.path().join("landing"));
        check_merged_exactly_once(&client, &data_dir, &target, point).await;
        if point == "after_sink_commit" {
            assert!(
                server.log().contains("batch already in the table; skipped"),
                "the replayed batch should have been skipped by the Delta transaction check"
            );
        }
        server.stop().await;
    }
}

async fn status(client: &Client) -> Option<(String, Option<i64>)> {
    let row = client
        .query_opt(
            "SELECT status, last_batch_id FROM tidemark.queries WHERE name = 'copied'",
            &[],
        )
        .await
        .ok()??;
    Some((row.get(0), row.get(1)))
}

/// Restarts on the same data directory and waits until the sink has finished.
async fn finish(data_dir: &Path, port: u16) -> (TestServer, Client) {
    let server = TestServer::start(data_dir, port, &[]).await;
    let client = server.connect().await;
    poll("the sink to finish after the restart", || async {
        match status(&client).await {
            Some((s, _)) if s == "finished" => Some(()),
            Some((s, _)) if s == "failed" => panic!("sink failed:\n{}", server.log()),
            _ => None,
        }
    })
    .await;
    (server, client)
}

/// Every input row exactly once in the table; one Delta commit per batch id.
async fn check_exactly_once(client: &Client, data_dir: &Path) {
    let row = client
        .query_one(
            "SELECT count(*), count(DISTINCT id), min(id), max(id) FROM copied",
            &[],
        )
        .await
        .unwrap();
    let total = (FILES * ROWS_PER_FILE) as i64;
    assert_eq!(row.get::<_, i64>(0), total, "rows in the table");
    assert_eq!(row.get::<_, i64>(1), total, "distinct ids in the table");
    assert_eq!(row.get::<_, i64>(2), 0);
    assert_eq!(row.get::<_, i64>(3), total - 1);

    // Read the Delta log directly: every commit's txn version, by batch id.
    let crate::harness::DeltaLog {
        commits_per_batch,
        compactions,
    } = crate::harness::read_delta_log(&data_dir.join("tables/copied"));
    // max_files_per_trigger = 1: one batch per file, batch ids 0..FILES.
    assert_eq!(
        commits_per_batch.keys().copied().collect::<Vec<_>>(),
        (0..FILES as i64).collect::<Vec<_>>(),
        "batch ids committed to Delta"
    );
    for (batch, n) in &commits_per_batch {
        assert_eq!(*n, 1, "batch {batch} was committed {n} times");
    }
    // Auto-compaction ran: a restart may start its count again, so at least one fewer
    // than an uninterrupted run's FILES / AUTO_COMPACT.
    assert!(
        compactions >= FILES / AUTO_COMPACT - 2,
        "{compactions} compactions"
    );
    // The checkpoint's commit log agrees.
    assert_eq!(
        committed_batches(data_dir, "copied"),
        FILES,
        "entries in commits/"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_available_now_loses_and_duplicates_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let landing = tmp.path().join("landing");
    land_files(&landing);
    let data_dir = tmp.path().join("data");
    let server = TestServer::start(&data_dir, 0, &[]).await;
    let port = server.port;
    let client = server.connect().await;
    create_pipeline(&client, &landing).await;
    let killed_after = poll("a few batches", || async {
        match status(&client).await {
            Some((_, Some(b))) if b >= 3 => Some(b),
            Some((s, _)) if s == "finished" => panic!("finished before the kill"),
            _ => None,
        }
    })
    .await;
    server.kill().await;
    eprintln!("killed after batch {killed_after}");

    let (server, client) = finish(&data_dir, port).await;
    check_exactly_once(&client, &data_dir).await;
    // A finished available_now sink stays finished across a restart.
    drop(client);
    server.stop().await;
    let server = TestServer::start(&data_dir, port, &[]).await;
    let client = server.connect().await;
    assert_eq!(status(&client).await.unwrap().0, "finished");
    server.stop().await;
}

/// Lands the files, starts a server armed to die at `point` of batch 5, creates the
/// pipeline into `connector`, and waits for the crash; then restarts and lets it finish.
async fn crash_then_finish(
    point: &str,
    connector: &str,
) -> (tempfile::TempDir, std::path::PathBuf, TestServer, Client) {
    let tmp = tempfile::tempdir().unwrap();
    let landing = tmp.path().join("landing");
    land_files(&landing);
    let data_dir = tmp.path().join("data");
    // `point` alone is armed for batch 5 (the 6th pass); `point@n` for its n-th pass.
    let (point, spec) = match point.split_once('@') {
        Some((p, _)) => (p, point.to_string()),
        None => (point, format!("{point}@6")),
    };
    let mut server = TestServer::start(&data_dir, 0, &[("TIDEMARK_CRASH_AT", &spec)]).await;
    let port = server.port;
    let client = server.connect().await;
    create_pipeline_into(&client, &landing, connector).await;
    let status = server.wait_exit().await;
    assert!(
        !status.success(),
        "the server should have aborted at {point}"
    );
    assert!(
        server
            .log()
            .contains(&format!("crash point {point} reached"))
    );
    drop(client);
    let (server, client) = finish(&data_dir, port).await;
    (tmp, data_dir, server, client)
}

/// Dies at a named point of batch 5, restarts, finishes; the table is exactly once.
async fn crash_at(point: &str) {
    let (_tmp, data_dir, server, client) = crash_then_finish(point, "delta").await;
    check_exactly_once(&client, &data_dir).await;
    if point == "after_sink_commit" {
        assert!(
            server.log().contains("batch already in the table; skipped"),
            "the replayed batch should have been skipped by the Delta transaction check"
        );
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_offsets_write_replays_the_batch() {
    crash_at("after_offsets_write").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_before_sink_commit_replays_the_batch() {
    crash_at("before_sink_commit").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_sink_commit_skips_the_committed_batch() {
    crash_at("after_sink_commit").await;
}

/// The parquet sink at each crash point of batch 5: every row once through its manifest
/// (compacted at batches 9, 19, 29, 39), and the files of an uncommitted batch never read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parquet_sink_crash_at_each_point_is_exactly_once() {
    for point in [
        "after_offsets_write",
        "before_sink_commit",
        "sink_files_written",
        "after_sink_commit",
        "after_commit_log",
    ] {
        let (_tmp, data_dir, server, client) = crash_then_finish(point, "parquet").await;
        let row = client
            .query_one("SELECT count(*), count(DISTINCT id) FROM copied", &[])
            .await
            .unwrap();
        let total = (FILES * ROWS_PER_FILE) as i64;
        assert_eq!(
            (row.get::<_, i64>(0), row.get::<_, i64>(1)),
            (total, total),
            "{point}"
        );
        let table = data_dir.join("tables/copied");
        let mut manifest: Vec<_> = std::fs::read_dir(table.join("_spark_metadata"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        manifest.sort();
        // One manifest per batch, compacted every 10 (29.compact, 39.compact) and the
        // files before the previous compaction removed.
        let mut expected: Vec<String> = (30..FILES - 1).map(|i| i.to_string()).collect();
        expected.extend(["29.compact".to_string(), format!("{}.compact", FILES - 1)]);
        expected.sort();
        assert_eq!(manifest, expected, "{point}: manifest files");
        // Every batch's file is in the manifest once, and exists.
        let mut listed = std::collections::BTreeSet::new();
        for name in &manifest {
            let text = std::fs::read_to_string(table.join("_spark_metadata").join(name)).unwrap();
            for line in text.lines().skip(1) {
                let entry: serde_json::Value = serde_json::from_str(line).unwrap();
                let path = entry["path"].as_str().unwrap();
                listed.insert(path.rsplit('/').next().unwrap().to_string());
            }
        }
        assert_eq!(
            listed.len(),
            FILES,
            "{point}: parquet files in the manifest"
        );
        let on_disk: std::collections::BTreeSet<String> = std::fs::read_dir(&table)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".parquet"))
            .collect();
        assert!(
            listed.is_subset(&on_disk),
            "{point}: a listed file is missing"
        );
        // An orphan is a file of a batch that crashed before its manifest: batch 5's at
        // `sink_files_written`; at `after_commit_log` batch 6 may have written its file
        // already, since batch 5's commit-log entry is written while batch 6 runs.
        let orphans = on_disk.len() - listed.len();
        match point {
            "sink_files_written" => assert_eq!(orphans, 1, "{point}: orphan files"),
            "after_commit_log" => assert!(orphans <= 1, "{point}: {orphans} orphan files"),
            _ => assert_eq!(orphans, 0, "{point}: orphan files"),
        }
        assert_eq!(committed_batches(&data_dir, "copied"), FILES, "{point}");
        server.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_between_delta_files_and_log_entry_replays_the_batch() {
    crash_at("sink_files_written").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_commit_log_resumes_with_the_next_batch() {
    crash_at("after_commit_log").await;
}

/// A crash right after an auto-compaction's commit (batch 7's, the second compaction),
/// before the batch's entry in commits/: the replayed batch is skipped, nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_compaction_skips_the_committed_batch() {
    let (_tmp, data_dir, server, client) = crash_then_finish("after_compaction@2", "delta").await;
    check_exactly_once(&client, &data_dir).await;
    assert!(server.log().contains("batch already in the table; skipped"));
    server.stop().await;
}

/// The windowed pipeline over the `out_of_order` case's files (400 events, 6 files, rows up
/// to 9 minutes out of order), its state in `store`: create, then wait until the sink
/// finished. Memory-store snapshots every 2 versions, so a run crosses several.
/// What the windowed query writes into: a Delta sink in append mode, or a materialized
/// view in update mode (its default).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Target {
    /// The windowed count into a Delta sink.
    Sink,
    /// The windowed count as a materialized view.
    View,
    /// `DISTINCT ON (user_id, page)` within the watermark into a Delta sink: keys are
    /// added, expire and come back batch after batch.
    DedupSink,
    /// A stream-stream left outer join of the clicks with the same user's next clicks
    /// within two minutes: both sides' rows stored, matched, evicted, null rows emitted.
    JoinSink,
    /// The windowed count into a Delta sink with both side tables; every file has a
    /// malformed line, the third on a row dated hours before the others (dropped as late).
    SideTablesSink,
}

async fn windowed_run(
    data_dir: &Path,
    landing: &Path,
    port: u16,
    crash_at: Option<&str>,
    store: &str,
    target: Target,
) -> Option<TestServer> {
    let mut env = vec![("TIDEMARK_STATE_SNAPSHOT_INTERVAL", "2")];
    if let Some(spec) = crash_at {
        env.push(("TIDEMARK_CRASH_AT", spec));
    }
    let mut server = TestServer::start(data_dir, port, &env).await;
    let client = server.connect().await;
    let windowed = "SELECT window.start AS window_start, page, count(*) AS n, \
                    sum(duration_s) AS total FROM clicks \
                    GROUP BY window(event_time, '5 minutes'), page";
    let (kind, options, query) = match target {
        Target::Sink => ("SINK", "", windowed),
        Target::SideTablesSink => (
            "SINK",
            ", late_rows = 'table', malformed_rows = 'table'",
            windowed,
        ),
        Target::View => ("MATERIALIZED VIEW", "", windowed),
        Target::DedupSink => (
            "SINK",
            ", deduplicate = 'within_watermark'",
            "SELECT DISTINCT ON (user_id, page) user_id, page, event_time FROM clicks",
        ),
        Target::JoinSink => (
            "SINK",
            "",
            "SELECT a.user_id, a.page, a.event_time, b.page AS next_page, \
             b.event_time AS next_time FROM clicks a LEFT JOIN clicks b \
             ON b.user_id = a.user_id AND b.event_time > a.event_time \
             AND b.event_time <= a.event_time + INTERVAL '2 minutes'",
        ),
    };
    client
        .batch_execute(&format!(
            "CREATE STREAM IF NOT EXISTS clicks (user_id TEXT, page TEXT, event_time TIMESTAMP, \
             duration_s DOUBLE PRECISION, WATERMARK FOR event_time AS event_time - INTERVAL '10 minutes') \
             WITH (format = 'json', path = '{}', max_files_per_trigger = 1);
             CREATE {kind} IF NOT EXISTS views WITH (trigger = 'available_now', \
             state_store = '{store}'{options}) AS {query}",
            landing.display(),
        ))
        .await
        .unwrap();
    if let Some(spec) = crash_at {
        let status = server.wait_exit().await;
        assert!(!status.success(), "expected a crash at {spec}");
        let point = spec.split('@').next().unwrap();
        assert!(
            server
                .log()
                .contains(&format!("crash point {point} reached")),
            "{spec}: {}",
            server.log()
        );
        return None;
    }
    poll("the windowed sink to finish", || async {
        match status_of(&client, "views").await.as_deref() {
            Some("finished") => Some(()),
            Some("failed") => panic!("failed:\n{}", server.log()),
            _ => None,
        }
    })
    .await;
    Some(server)
}

/// The watermark in a sink's last commit-log entry.
pub fn final_watermark(data_dir: &Path, sink: &str) -> i64 {
    let n = committed_batches(data_dir, sink);
    let file = data_dir
        .join("checkpoints")
        .join(sink)
        .join("commits")
        .join((n - 1).to_string());
    let text = std::fs::read_to_string(file).unwrap();
    let json: serde_json::Value = serde_json::from_str(text.lines().nth(1).unwrap()).unwrap();
    json["nextBatchWatermarkMs"].as_i64().unwrap()
}

/// The sink's state at its last committed version, as stored bytes (a join's two sides
/// one after the other).
pub fn state_dump(data_dir: &Path, sink: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    let n = committed_batches(data_dir, sink) as u64;
    let dir = data_dir.join("checkpoints").join(sink).join("state/0");
    if dir.join("left").exists() {
        let mut both = tidemark::state::dump(&dir.join("left"), n).unwrap();
        both.extend(tidemark::state::dump(&dir.join("right"), n).unwrap());
        return both;
    }
    tidemark::state::dump(&dir, n).unwrap()
}

async fn status_of(client: &Client, name: &str) -> Option<String> {
    client
        .query_opt(
            "SELECT status FROM tidemark.queries WHERE name = $1",
            &[&name],
        )
        .await
        .ok()??
        .get(0)
}

async fn windowed_table(server: &TestServer, target: Target) -> Vec<String> {
    let client = server.connect().await;
    let sql = match target {
        Target::SideTablesSink => {
            "SELECT 'out ' || CAST(window_start AS TEXT) || ' ' || page || ' ' || CAST(n AS TEXT) \
             AS r FROM views UNION ALL \
             SELECT 'late ' || CAST(batch_id AS TEXT) || ' ' || operator || ' ' || reason || ' ' \
             || CAST(watermark AS TEXT) || ' ' || CAST(event_time AS TEXT) || ' ' || row \
             FROM views_late_rows UNION ALL \
             SELECT 'malformed ' || CAST(batch_id AS TEXT) || ' ' || stream || ' ' || path || ' ' \
             || CAST(line_number AS TEXT) || ' ' || record || ' ' || reason \
             FROM views_malformed_rows ORDER BY r"
        }
        Target::Sink | Target::View => {
            "SELECT CAST(window_start AS TEXT) || ' ' || page || ' ' || CAST(n AS TEXT) || ' ' || \
             CAST(round(total, 3) AS TEXT) AS r FROM views ORDER BY r"
        }
        Target::DedupSink => {
            "SELECT user_id || ' ' || page || ' ' || CAST(event_time AS TEXT) AS r FROM views \
             ORDER BY r"
        }
        Target::JoinSink => {
            "SELECT user_id || ' ' || page || ' ' || CAST(event_time AS TEXT) || ' ' || \
             coalesce(next_page, '-') || ' ' || coalesce(CAST(next_time AS TEXT), '-') AS r \
             FROM views ORDER BY r"
        }
    };
    client
        .query(sql, &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect()
}

/// The `out_of_order` case's files in `landing`; with `side_rows`, each has a malformed
/// line after its second line, and those from the third on a row dated hours before the
/// others: late, once the watermark has moved.
fn land_case(landing: &Path, side_rows: bool) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle/cases/out_of_order/run1");
    std::fs::create_dir_all(landing).unwrap();
    let mut names: Vec<_> = std::fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    let base = SystemTime::now() - Duration::from_secs(3600);
    for (i, p) in names.iter().enumerate() {
        let dst = landing.join(p.file_name().unwrap());
        std::fs::copy(p, &dst).unwrap();
        if side_rows {
            let text = std::fs::read_to_string(&dst).unwrap();
            let mut lines: Vec<&str> = text.lines().collect();
            let bad = format!("{{\"user_id\": \"broken {i}");
            lines.insert(2, &bad);
            let late = format!(
                r#"{{"user_id":"late{i}","page":"/home","event_time":"2026-06-10T0{i}:00:00Z","duration_s":1}}"#
            );
            if i >= 2 {
                lines.push(&late);
            }
            std::fs::write(&dst, lines.join("\n") + "\n").unwrap();
        }
        let f = std::fs::File::options().write(true).open(&dst).unwrap();
        f.set_modified(base + Duration::from_secs(i as u64))
            .unwrap();
    }
}

/// The state stores this build has.
pub fn stores() -> Vec<&'static str> {
    let mut s = vec!["memory"];
    if cfg!(feature = "rocksdb") {
        s.push("rocksdb");
    }
    s
}

/// A crash at every crash point of every batch gives the same final table, state, watermark
/// and batch count as an uninterrupted run.
async fn windowed_crash_everywhere(store: &str, target: Target) {
    let tmp = tempfile::tempdir().unwrap();
    let landing = tmp.path().join("landing");
    land_case(&landing, target == Target::SideTablesSink);
    let port = free_port();
    let ref_dir = tmp.path().join("ref");
    let reference = windowed_run(&ref_dir, &landing, port, None, store, target)
        .await
        .unwrap();
    let want = windowed_table(&reference, target).await;
    assert!(
        want.len() > 20,
        "the reference run emitted {} rows",
        want.len()
    );
    if target == Target::SideTablesSink {
        for (kind, n) in [("late ", 4), ("malformed ", 6)] {
            assert_eq!(
                want.iter().filter(|r| r.starts_with(kind)).count(),
                n,
                "the reference run kept few {kind}rows: {want:#?}"
            );
        }
    }
    reference.stop().await;
    // 6 data batches and one no-data batch: batch ids 0..=6, state versions 1..=7.
    let want_state = state_dump(&ref_dir, "views");
    let want_wm = final_watermark(&ref_dir, "views");
    assert!(!want_state.is_empty() && want_wm > 0);
    // Both stores snapshot every TIDEMARK_STATE_SNAPSHOT_INTERVAL = 2 versions: 2, 4, 6.
    let snapshot_hits = 3;
    let mut runs = 0;
    // The sink's own point (Delta data files written, no log entry yet) or the view's
    // (its log file written, not yet renamed; renamed, not yet in memory).
    let own: &[(&str, usize)] = match target {
        Target::Sink | Target::DedupSink | Target::JoinSink | Target::SideTablesSink => {
            &[("sink_files_written", 7)]
        }
        Target::View => &[("view_log_before_rename", 7), ("view_after_log", 7)],
    };
    let points = [
        ("after_source_log_write", 6),
        ("after_offsets_write", 7),
        ("before_sink_commit", 7),
        ("after_sink_commit", 7),
        ("after_commit_log", 7),
        ("mid_state_snapshot", snapshot_hits),
    ];
    for &(point, hits) in points.iter().chain(own) {
        for n in 1..=hits {
            let data_dir = tmp.path().join(format!("{point}-{n}"));
            let spec = format!("{point}@{n}");
            assert!(
                windowed_run(&data_dir, &landing, port, Some(&spec), store, target)
                    .await
                    .is_none()
            );
            assert_logs_in_order(&data_dir, "views", &format!("{store}, crash at {spec}"));
            let server = windowed_run(&data_dir, &landing, port, None, store, target)
                .await
                .unwrap();
            let got = windowed_table(&server, target).await;
            assert_eq!(
                got, want,
                "{store}, {target:?}, crash at {spec}: the final table differs"
            );
            server.stop().await;
            assert_eq!(
                committed_batches(&data_dir, "views"),
                7,
                "{store}, crash at {spec}: batches committed"
            );
            assert_eq!(
                state_dump(&data_dir, "views"),
                want_state,
                "{store}, crash at {spec}: the final state differs"
            );
            assert_eq!(
                final_watermark(&data_dir, "views"),
                want_wm,
                "{store}, crash at {spec}: the final watermark differs"
            );
            runs += 1;
        }
    }
    eprintln!("{store}, {target:?}: {runs} crash runs equal the uninterrupted run");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windowed_crash_everywhere_memory_store() {
    windowed_crash_everywhere("memory", Target::Sink).await;
}

#[cfg(feature = "rocksdb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windowed_crash_everywhere_rocksdb_store() {
    windowed_crash_everywhere("rocksdb", Target::Sink).await;
}

/// A materialized view holds after any crash exactly what it holds after an uninterrupted
/// run: its log, not the streams, brings it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn view_crash_everywhere_memory_store() {
    windowed_crash_everywhere("memory", Target::View).await;
}

#[cfg(feature = "rocksdb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn view_crash_everywhere_rocksdb_store() {
    windowed_crash_everywhere("rocksdb", Target::View).await;
}

/// A deduplication's state (keys added, expired and added again) and its sink after any
/// crash are those of an uninterrupted run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dedup_crash_everywhere_memory_store() {
    windowed_crash_everywhere("memory", Target::DedupSink).await;
}

#[cfg(feature = "rocksdb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dedup_crash_everywhere_rocksdb_store() {
    windowed_crash_everywhere("rocksdb", Target::DedupSink).await;
}

/// The side tables after any crash hold what they hold after an uninterrupted run: each
/// batch's late and malformed rows once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn side_tables_crash_everywhere_memory_store() {
    windowed_crash_everywhere("memory", Target::SideTablesSink).await;
}

/// A stream-stream join's two states (rows stored, matched, evicted with their null rows)
/// and its sink after any crash are those of an uninterrupted run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_crash_everywhere_memory_store() {
    windowed_crash_everywhere("memory", Target::JoinSink).await;
}

#[cfg(feature = "rocksdb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_crash_everywhere_rocksdb_store() {
    windowed_crash_everywhere("rocksdb", Target::JoinSink).await;
}
