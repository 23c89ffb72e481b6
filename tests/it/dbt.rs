//! dbt through the adapter in `clients/dbt-tidemark`, against real servers: dbt Labs' own
//! adapter suites (`dbt-tests-adapter`, run by pytest from `clients/dbt-tidemark/tests`),
//! and the example project (`examples/dbt`) run, tested, changed and re-run across a
//! graceful restart and a crash.
//!
//! The Python with dbt and the adapter: `$TIDEMARK_DBT_PYTHON`, else `python3`. Missing, it
//! fails the test in CI and skips it elsewhere, saying so (`.ci/run` installs it).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::harness::{TestServer, rows};

fn python() -> String {
    std::env::var("TIDEMARK_DBT_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn prerequisites() -> bool {
    let ok = Command::new(python())
        .args([
            "-c",
            "import dbt.adapters.tidemark, dbt.tests.adapter, pytest",
        ])
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "dbt-tidemark with dbt-tests-adapter not installed: CI must install it (.ci/run does)"
    );
    eprintln!(
        "skipping: dbt not installed (pip install ./clients/dbt-tidemark[test], or set \
         TIDEMARK_DBT_PYTHON)"
    );
    false
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn dbt_adapter_suites_pass() {
    if !prerequisites() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(python())
        .args(["-m", "pytest", "-p", "no:cacheprovider", "-rs", "-q"])
        .arg(repo().join("clients/dbt-tidemark/tests"))
        .env("TIDEMARK_BIN", env!("CARGO_BIN_EXE_tidemark"))
        .current_dir(tmp.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "dbt's adapter suites failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Every suite ran or was skipped with its reason: none is absent.
    let summary = stdout.lines().last().unwrap_or_default();
    assert!(summary.contains(" passed"), "{summary}");
}

/// Runs `dbt <args>` on the example project against the server on `port`.
fn dbt(project: &Path, port: u16, landing: &Path, args: &[&str]) -> String {
    let vars = format!("{{landing: '{}'}}", landing.display());
    let mut all: Vec<&str> = args.to_vec();
    if !args.contains(&"--vars") {
        all.extend(["--vars", &vars]);
    }
    let out = Command::new(python())
        .args(["-m", "dbt.cli.main"])
        .args(&all)
        .args(["--profiles-dir", ".", "--target-path"])
        .arg(project.join("target"))
        .args(["--log-path"])
        .arg(project.join("logs"))
        .current_dir(repo().join("examples/dbt"))
        .env("TIDEMARK_PORT", port.to_string())
        .env("DBT_SEND_ANONYMOUS_USAGE_STATS", "false")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "dbt {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn land(landing: &Path, file: &str) {
    std::fs::create_dir_all(landing).unwrap();
    let hidden = landing.join(format!(".{file}"));
    std::fs::copy(repo().join("sql/data").join(file), &hidden).unwrap();
    std::fs::rename(&hidden, landing.join(file)).unwrap();
}

/// The seed's first run as Spark 4.x wrote it
/// (shared/oracle-tools/cases/seed_two_runs/expected/append/run1/output.csv): the eight
/// windows a ten-minute watermark closes after `clicks-1.json`.
const SPARK_RUN1: [&str; 8] = [
    "2026-06-10 10:00:00|/home|1",
    "2026-06-10 10:00:00|/pricing|2",
    "2026-06-10 10:05:00|/home|1",
    "2026-06-10 10:05:00|/pricing|1",
    "2026-06-10 10:10:00|/home|2",
    "2026-06-10 10:10:00|/pricing|1",
    "2026-06-10 10:15:00|/home|1",
    "2026-06-10 10:15:00|/pricing|1",
];

/// What Spark's second run adds (expected/append/run2/output.csv): the late 10:03 click
/// is dropped, the 10:40 click closes 10:20 and 10:25.
const SPARK_RUN2_ADDS: [&str; 4] = [
    "2026-06-10 10:20:00|/home|2",
    "2026-06-10 10:20:00|/pricing|1",
    "2026-06-10 10:25:00|/home|1",
    "2026-06-10 10:25:00|/pricing|1",
];

/// Spark started fresh on both files (one file per trigger, or both in one): the 10:03
/// click is counted, since the watermark that drops late rows is the one before the
/// batch and no batch came between the files. Spark's output, from shared/oracle-tools:
///   spark_windowed.py --landing <both files> --mode append [--max-files-per-trigger 100]
const SPARK_FRESH_BOTH_FILES: [&str; 12] = [
    "2026-06-10 10:00:00|/home|2",
    "2026-06-10 10:00:00|/pricing|2",
    "2026-06-10 10:05:00|/home|1",
    "2026-06-10 10:05:00|/pricing|1",
    "2026-06-10 10:10:00|/home|2",
    "2026-06-10 10:10:00|/pricing|1",
    "2026-06-10 10:15:00|/home|1",
    "2026-06-10 10:15:00|/pricing|1",
    "2026-06-10 10:20:00|/home|2",
    "2026-06-10 10:20:00|/pricing|1",
    "2026-06-10 10:25:00|/home|1",
    "2026-06-10 10:25:00|/pricing|1",
];

/// Spark's run 1, then what its run 2 adds.
fn spark_run1_then_run2() -> Vec<String> {
    SPARK_RUN1
        .iter()
        .chain(SPARK_RUN2_ADDS.iter())
        .map(|s| s.to_string())
        .collect()
}

async fn windows(c: &tokio_postgres::Client) -> Vec<String> {
    rows(
        c,
        "SELECT window_start, page, views FROM page_views_5m ORDER BY window_start, page",
    )
    .await
    .into_iter()
    .map(|r| {
        r.into_iter()
            .map(Option::unwrap_or_default)
            .collect::<Vec<_>>()
            .join("|")
    })
    .collect()
}

/// The latest page of each user in the given files, computed here from the JSON (the
/// second, independent computation of what the MERGE sink holds).
fn latest_pages(files: &[&str]) -> Vec<String> {
    let mut latest: std::collections::BTreeMap<String, (String, String)> = Default::default();
    for f in files {
        let text = std::fs::read_to_string(repo().join("sql/data").join(f)).unwrap();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let user = v["user_id"].as_str().unwrap().to_string();
            let time = v["event_time"].as_str().unwrap().to_string();
            let page = v["page"].as_str().unwrap().to_string();
            if latest.get(&user).is_none_or(|(t, _)| time > *t) {
                latest.insert(user, (time, page));
            }
        }
    }
    latest
        .into_iter()
        .map(|(user, (_, page))| format!("{user}|{page}"))
        .collect()
}

/// A sink's trigger, from `SHOW SINKS` (name, streams, connector, path, trigger, ...).
async fn trigger_of(c: &tokio_postgres::Client, sink: &str) -> String {
    rows(c, "SHOW SINKS")
        .await
        .into_iter()
        .find(|r| r[0].as_deref() == Some(sink))
        .and_then(|r| r[4].clone())
        .unwrap_or_else(|| panic!("no sink {sink}"))
}

async fn last_pages(c: &tokio_postgres::Client) -> Vec<String> {
    rows(
        c,
        "SELECT user_id, page FROM user_last_page ORDER BY user_id",
    )
    .await
    .into_iter()
    .map(|r| format!("{}|{}", r[0].clone().unwrap(), r[1].clone().unwrap()))
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_project_runs_and_reruns_across_restarts() {
    if !prerequisites() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (data, landing, project) = (
        tmp.path().join("data"),
        tmp.path().join("landing"),
        tmp.path().join("dbt"),
    );
    land(&landing, "clicks-1.json");
    let server = TestServer::start(&data, 0, &[]).await;
    let port = server.port;
    dbt(&project, port, &landing, &["seed"]);
    dbt(&project, port, &landing, &["run"]);
    dbt(&project, port, &landing, &["test"]);
    let c = server.connect().await;
    assert_eq!(windows(&c).await, SPARK_RUN1);
    assert_eq!(last_pages(&c).await, latest_pages(&["clicks-1.json"]));
    let kinds = rows(
        &c,
        "SELECT name, kind FROM tidemark.relations ORDER BY name",
    )
    .await;
    let kinds: Vec<String> = kinds
        .into_iter()
        .map(|r| format!("{}={}", r[0].clone().unwrap(), r[1].clone().unwrap()))
        .collect();
    for want in [
        "clicks=stream",
        "page_views_5m=sink",
        "user_last_page=sink",
        "user_last_page_table=table",
        "views_per_page=materialized view",
        "pages=table",
    ] {
        assert!(kinds.contains(&want.to_string()), "{want} not in {kinds:?}");
    }

    // Unchanged models leave the running queries alone; a new trigger is applied in place.
    const RUNS: &str = "SELECT name, run_id FROM tidemark.queries ORDER BY name";
    let before = rows(&c, RUNS).await;
    let log = dbt(&project, port, &landing, &["run"]);
    // The server's NOTICE says what CREATE OR REPLACE did, and dbt logs it.
    assert!(
        log.contains("sink \"page_views_5m\" is unchanged: it keeps running"),
        "{log}"
    );
    assert_eq!(
        rows(&c, RUNS).await,
        before,
        "an unchanged run restarted a query"
    );
    let vars = format!(
        "{{landing: '{}', page_views_trigger: 'processing_time 1 second'}}",
        landing.display()
    );
    let log = dbt(&project, port, &landing, &["run", "--vars", &vars]);
    assert!(
        log.contains(
            "sink \"page_views_5m\" altered in place: SET (trigger = 'processing_time 1 second')"
        ),
        "{log}"
    );
    assert_eq!(
        trigger_of(&c, "page_views_5m").await,
        "processing_time 1 second"
    );
    dbt(&project, port, &landing, &["test", "--vars", &vars]);
    assert_eq!(
        windows(&c).await,
        SPARK_RUN1,
        "the altered sink wrote again"
    );

    // A graceful restart, then a crash: what dbt made is all there, and runs on.
    server.stop().await;
    let server = TestServer::start(&data, port, &[]).await;
    server.kill().await;
    let server = TestServer::start(&data, port, &[]).await;
    land(&landing, "clicks-2.json");
    dbt(&project, port, &landing, &["run", "--vars", &vars]);
    dbt(&project, port, &landing, &["test", "--vars", &vars]);
    let c = server.connect().await;
    assert_eq!(
        trigger_of(&c, "page_views_5m").await,
        "processing_time 1 second"
    );
    assert_eq!(
        last_pages(&c).await,
        latest_pages(&["clicks-1.json", "clicks-2.json"])
    );
    assert_eq!(windows(&c).await, spark_run1_then_run2());

    // A full refresh starts the sinks over with both files there.
    dbt(
        &project,
        port,
        &landing,
        &["run", "--full-refresh", "--vars", &vars],
    );
    assert_eq!(windows(&c).await, SPARK_FRESH_BOTH_FILES);
    assert_eq!(
        last_pages(&c).await,
        latest_pages(&["clicks-1.json", "clicks-2.json"])
    );
    server.stop().await;
}
