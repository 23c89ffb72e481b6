//! Randomized soak: SIGKILL a real `tidemark` process at random moments of a windowed
//! pipeline, restart it each time, and check that the result equals both an independent
//! computation and an uninterrupted run: no event lost, none counted twice, no batch id
//! committed twice, the same state and watermark.
//!
//! Seeded and printed; the defaults (200 000 events, 20 kills, per state store) run in CI.
//! The long variant (see docs/guarantees.md):
//!
//! ```text
//! TIDEMARK_SOAK_EVENTS=2000000 TIDEMARK_SOAK_KILLS=200 TIDEMARK_SOAK_SEED=7 \
//!   cargo test --features rocksdb --test it soak -- --nocapture
//! ```

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use crate::crash::{final_watermark, state_dump, stores};
use crate::harness::{Rng, TestServer, free_port, poll};

const FILES: usize = 40;
const PAGES: u64 = 50;
/// Seconds between consecutive events' base times; rows are up to ±299 s off it, less than
/// the 10-minute watermark delay, so no row is late and every event must be counted.
const STEP_S: f64 = 0.5;
/// 2026-06-10T00:00:00Z.
const BASE_S: i64 = 1_781_049_600;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Writes the events as `FILES` JSON files with increasing modification times, and
/// returns the expected table: (window start s, page) → (count, sum of durations).
fn land(dir: &Path, events: u64, rng: &mut Rng) -> BTreeMap<(i64, String), (i64, i64)> {
    std::fs::create_dir_all(dir).unwrap();
    let mut expected: BTreeMap<(i64, String), (i64, i64)> = BTreeMap::new();
    let per_file = events.div_ceil(FILES as u64);
    let mtime = SystemTime::now() - Duration::from_secs(3600);
    for f in 0..FILES as u64 {
        let path = dir.join(format!("part-{f:04}.json"));
        let mut out = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        for i in f * per_file..((f + 1) * per_file).min(events) {
            let jitter = rng.below(599) as i64 - 299;
            let t = BASE_S + (i as f64 * STEP_S) as i64 + jitter;
            let page = format!("/p{}", rng.below(PAGES));
            let duration = rng.below(100) as i64;
            let e = expected
                .entry((t - t.rem_euclid(300), page.clone()))
                .or_default();
            e.0 += 1;
            e.1 += duration;
            let ts = chrono::DateTime::from_timestamp(t, 0).unwrap();
            writeln!(
                out,
                "{{\"page\":\"{page}\",\"event_time\":\"{}\",\"duration_s\":{duration}}}",
                ts.format("%Y-%m-%dT%H:%M:%SZ")
            )
            .unwrap();
        }
        drop(out);
        let file = std::fs::File::options().write(true).open(&path).unwrap();
        file.set_modified(mtime + Duration::from_secs(f)).unwrap();
    }
    expected
}

/// The latest event time (s) in the landed files.
fn expected_max_t(dir: &Path) -> i64 {
    let mut max = i64::MIN;
    for e in std::fs::read_dir(dir).unwrap() {
        for line in std::fs::read_to_string(e.unwrap().path()).unwrap().lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let t = chrono::DateTime::parse_from_rfc3339(v["event_time"].as_str().unwrap())
                .unwrap()
                .timestamp();
            max = max.max(t);
        }
    }
    max
}

fn committed(data_dir: &Path) -> usize {
    crate::crash::committed_batches(data_dir, "views")
}

async fn start(data_dir: &Path, landing: &Path, port: u16, store: &str) -> TestServer {
    let server = TestServer::start(data_dir, port, &[]).await;
    let client = server.connect().await;
    client
        .batch_execute(&format!(
            "CREATE STREAM IF NOT EXISTS clicks (page TEXT, event_time TIMESTAMP, duration_s BIGINT, \
             WATERMARK FOR event_time AS event_time - INTERVAL '10 minutes') \
             WITH (format = 'json', path = '{}', max_files_per_trigger = 1);
             CREATE SINK IF NOT EXISTS views WITH (trigger = 'available_now', state_store = '{store}') AS \
             SELECT window.start AS window_start, page, count(*) AS n, sum(duration_s) AS total \
             FROM clicks GROUP BY window(event_time, '5 minutes'), page",
            landing.display()
        ))
        .await
        .unwrap();
    server
}

async fn finish(data_dir: &Path, landing: &Path, port: u16, store: &str) -> TestServer {
    let server = start(data_dir, landing, port, store).await;
    let client = server.connect().await;
    poll("the soak sink to finish", || async {
        let row = client
            .query_opt(
                "SELECT status FROM tidemark.queries WHERE name = 'views'",
                &[],
            )
            .await
            .ok()??;
        match row.get::<_, String>(0).as_str() {
            "finished" => Some(()),
            "failed" => panic!("the sink failed:\n{}", server.log()),
            _ => None,
        }
    })
    .await;
    server
}

async fn table(server: &TestServer) -> BTreeMap<(i64, String), (i64, i64)> {
    let client = server.connect().await;
    let rows = client
        .query(
            "SELECT CAST(extract(epoch FROM window_start) AS BIGINT), page, n, total FROM views",
            &[],
        )
        .await
        .unwrap();
    let mut out = BTreeMap::new();
    for r in rows {
        let key = (r.get::<_, i64>(0), r.get::<_, String>(1));
        let prev = out.insert(key.clone(), (r.get::<_, i64>(2), r.get::<_, i64>(3)));
        assert!(prev.is_none(), "window {key:?} appears twice in the table");
    }
    out
}

/// Batch id → number of Delta commits carrying it.
fn delta_commits(data_dir: &Path) -> BTreeMap<i64, usize> {
    crate::harness::read_delta_log(&data_dir.join("tables/views")).commits_per_batch
}

async fn soak(store: &str) {
    let seed = env_or(
        "TIDEMARK_SOAK_SEED",
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    )
    .max(1);
    let events = env_or("TIDEMARK_SOAK_EVENTS", 200_000);
    let kills = env_or("TIDEMARK_SOAK_KILLS", 20) as usize;
    eprintln!(
        "soak[{store}]: seed {seed} (TIDEMARK_SOAK_SEED={seed} replays it), {events} events, {kills} kills"
    );
    let mut rng = Rng(seed);
    let tmp = tempfile::tempdir().unwrap();
    let landing = tmp.path().join("landing");
    let expected = land(&landing, events, &mut rng);
    let port = free_port();

    // The uninterrupted run.
    let ref_dir = tmp.path().join("ref");
    let reference = finish(&ref_dir, &landing, port, store).await;
    let want = table(&reference).await;
    reference.stop().await;
    let batches = committed(&ref_dir);
    // One batch per file and a final no-data batch.
    assert_eq!(batches, FILES + 1, "batches of the uninterrupted run");

    // The killed runs: each dies once the commit log reaches a random batch, a random
    // moment later (0-40 ms: somewhere inside the next batch, or between two).
    let data_dir = tmp.path().join("soak");
    let mut targets: Vec<usize> = (0..kills)
        .map(|_| rng.below(batches as u64) as usize)
        .collect();
    targets.sort();
    let started = Instant::now();
    let mut killed_at = Vec::new();
    for target in targets {
        let server = start(&data_dir, &landing, port, store).await;
        poll("the commit log to reach the kill target", || async {
            (committed(&data_dir) >= target).then_some(())
        })
        .await;
        tokio::time::sleep(Duration::from_millis(rng.below(40))).await;
        server.kill().await;
        killed_at.push(committed(&data_dir));
    }
    let server = finish(&data_dir, &landing, port, store).await;
    let got = table(&server).await;
    server.stop().await;

    // Append mode emits the windows the final watermark (latest event - 10 minutes) closed;
    // the others stay in state.
    let max_t = expected_max_t(&landing);
    let final_wm = (max_t - 600) * 1000;
    let (expected, open_windows): (BTreeMap<_, _>, BTreeMap<_, _>) = expected
        .into_iter()
        .partition(|((start, _), _)| (start + 300) * 1000 <= final_wm);
    // Lost and duplicated events, against the independent computation.
    let count = |t: &BTreeMap<(i64, String), (i64, i64)>| t.values().map(|v| v.0).sum::<i64>();
    let lost: i64 = expected
        .iter()
        .map(|(k, e)| (e.0 - got.get(k).map_or(0, |g| g.0)).max(0))
        .sum();
    let duplicated: i64 = got
        .iter()
        .map(|(k, g)| (g.0 - expected.get(k).map_or(0, |e| e.0)).max(0))
        .sum();
    let commits = delta_commits(&data_dir);
    let twice: Vec<_> = commits.iter().filter(|(_, n)| **n > 1).collect();
    let state_rows = state_dump(&data_dir, "views").len();
    eprintln!(
        "soak[{store}]: seed {seed}: {} kills (commit log at {killed_at:?}); {events} events: \
         {} in {} closed windows (expected {}), {state_rows} open windows in state (expected \
         {}); lost {lost}, duplicated {duplicated}; {} batches, batch ids committed twice: {}; \
         {:.1} s",
        killed_at.len(),
        count(&got),
        got.len(),
        count(&expected),
        open_windows.len(),
        committed(&data_dir),
        twice.len(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(count(&expected) + count(&open_windows), events as i64);
    assert_eq!(
        final_watermark(&ref_dir, "views"),
        final_wm,
        "the watermark"
    );
    assert_eq!(
        state_dump(&ref_dir, "views").len(),
        open_windows.len(),
        "windows left in state"
    );
    assert_eq!((lost, duplicated), (0, 0), "seed {seed}: lost, duplicated");
    assert_eq!(
        got, expected,
        "seed {seed}: the table differs from the independent computation"
    );
    assert_eq!(
        got, want,
        "seed {seed}: the table differs from the uninterrupted run"
    );
    assert!(
        twice.is_empty(),
        "seed {seed}: batch ids committed twice: {twice:?}"
    );
    assert_eq!(
        commits.keys().copied().collect::<Vec<_>>(),
        (0..batches as i64).collect::<Vec<_>>(),
        "seed {seed}: batch ids in the Delta log"
    );
    assert_eq!(committed(&data_dir), batches, "seed {seed}: commit log");
    assert_eq!(
        state_dump(&data_dir, "views"),
        state_dump(&ref_dir, "views"),
        "seed {seed}: the final state differs from the uninterrupted run"
    );
    assert_eq!(
        final_watermark(&data_dir, "views"),
        final_watermark(&ref_dir, "views"),
        "seed {seed}: the final watermark differs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_random_kills_memory_store() {
    assert!(stores().contains(&"memory"));
    soak("memory").await;
}

#[cfg(feature = "rocksdb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_random_kills_rocksdb_store() {
    soak("rocksdb").await;
}
