//! `tidemark run FILE.sql`: a script in-process, exiting once its bounded sinks finished.

use std::path::Path;
use std::process::{Command, Output};

fn run(script: &Path, data_dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .arg("run")
        .arg(script)
        .arg("--data-dir")
        .arg(data_dir)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run tidemark")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn run_processes_what_is_new_and_exits() {
    let tmp = tempfile::tempdir().unwrap();
    let landing = tmp.path().join("landing");
    std::fs::create_dir_all(&landing).unwrap();
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("sql/data");
    std::fs::copy(data.join("clicks-1.json"), landing.join("1.json")).unwrap();
    let script = tmp.path().join("job.sql");
    std::fs::write(
        &script,
        format!(
            "CREATE STREAM IF NOT EXISTS clicks (user_id TEXT, page TEXT, event_time TIMESTAMP, \
             duration_s DOUBLE PRECISION) WITH (format = 'json', path = '{}');
             CREATE SINK IF NOT EXISTS copy WITH (trigger = 'available_now') AS
               SELECT user_id, duration_s FROM clicks;
             START SINK copy;
             SELECT count(*) AS n, sum(duration_s) AS total FROM copy;",
            landing.display()
        ),
    )
    .unwrap();
    let data_dir = tmp.path().join("data");
    let out = run(&script, &data_dir);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    // 16 rows summing to 290.25 (python3 over sql/data/clicks-1.json).
    assert!(stdout.contains("| 16 | 290.25 |"), "stdout:\n{stdout}");

    // A second run reads only the file that landed since.
    std::fs::copy(data.join("clicks-2.json"), landing.join("2.json")).unwrap();
    let out = run(&script, &data_dir);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("| 18 | 326.25 |"), "stdout:\n{stdout}");
}

/// Off a terminal, `tidemark run` reports progress as log lines; with `--log-format json`
/// each line of stderr is one JSON object, with the query and batch as fields.
#[test]
fn run_logs_progress_as_json_lines() {
    let tmp = tempfile::tempdir().unwrap();
    let landing = tmp.path().join("landing");
    std::fs::create_dir_all(&landing).unwrap();
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("sql/data");
    std::fs::copy(data.join("clicks-1.json"), landing.join("1.json")).unwrap();
    std::fs::copy(data.join("clicks-2.json"), landing.join("2.json")).unwrap();
    let script = tmp.path().join("job.sql");
    std::fs::write(
        &script,
        format!(
            "CREATE STREAM clicks (user_id TEXT, page TEXT, event_time TIMESTAMP, \
             duration_s DOUBLE PRECISION) WITH (format = 'json', path = '{}', max_files_per_trigger = 1);
             CREATE SINK copy WITH (trigger = 'available_now') AS SELECT user_id FROM clicks;",
            landing.display()
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .arg("run")
        .arg(&script)
        .arg("--data-dir")
        .arg(tmp.path().join("data"))
        .args(["--log-format", "json"])
        .env_remove("RUST_LOG")
        .output()
        .expect("run tidemark");
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let lines: Vec<serde_json::Value> = text(&out.stderr)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    // One progress line per batch: two files, one a batch; the second leaves none.
    let progress: Vec<(u64, u64)> = lines
        .iter()
        .filter(|l| {
            l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("progress:"))
        })
        .map(|l| {
            assert_eq!(l["fields"]["query"], "copy", "{l}");
            (
                l["fields"]["done"].as_u64().unwrap(),
                l["fields"]["left"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(progress, vec![(1, 1), (2, 0)]);
    assert!(
        lines.iter().all(|l| l["level"] != "ERROR"),
        "a normal run logs no ERROR: {lines:?}"
    );
}

#[test]
fn run_exits_non_zero_with_the_error() {
    let tmp = tempfile::tempdir().unwrap();
    let landing = tmp.path().join("landing");
    std::fs::create_dir_all(&landing).unwrap();
    std::fs::write(landing.join("bad.json"), "{\"a\": 1}\n{not json\n").unwrap();
    let script = tmp.path().join("job.sql");
    std::fs::write(
        &script,
        format!(
            "CREATE STREAM s (a BIGINT) WITH (format = 'json', path = '{}', mode = 'FAILFAST');
             CREATE SINK k WITH (trigger = 'once') AS SELECT a FROM s;",
            landing.display()
        ),
    )
    .unwrap();
    let out = run(&script, &tmp.path().join("data"));
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("sink \"k\" failed"), "stderr:\n{stderr}");
    assert!(
        stderr.contains("bad.json line 2"),
        "the error names the file and line:\n{stderr}"
    );

    std::fs::write(&script, "CREATE STREAM (").unwrap();
    let out = run(&script, &tmp.path().join("data"));
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("ERROR 42601"),
        "{}",
        text(&out.stderr)
    );
}
