//! Sinks as Spark runs them (issue 40): `tidemark export-spark` writes the PySpark
//! program of a sink, and real PySpark (PyPI's `pyspark`, on Java; `.ci/run` installs
//! both) runs it over the same files to the same rows as the sink's local run.
//!
//! The Python that has pyspark: `$TIDEMARK_PYSPARK_PYTHON`, else `python3`. Missing
//! pyspark or Java fails the test in CI and skips it elsewhere, saying so.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::harness::{TestServer, rows};

fn python() -> String {
    std::env::var("TIDEMARK_PYSPARK_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn prerequisites() -> bool {
    let pyspark = Command::new(python())
        .args(["-c", "import pyspark"])
        .status()
        .is_ok_and(|s| s.success());
    let java = Command::new("java")
        .arg("-version")
        .output()
        .is_ok_and(|o| o.status.success());
    if pyspark && java {
        return true;
    }
    let missing = match (pyspark, java) {
        (false, false) => "pyspark and Java",
        (false, true) => "pyspark (pip install pyspark==4.3.0)",
        _ => "Java",
    };
    assert!(
        std::env::var_os("CI").is_none(),
        "{missing} not installed: CI must install it (.ci/run does)"
    );
    eprintln!("skipping: {missing} not installed");
    false
}

/// Copies the seed scenario's files into `dir`, each written under a hidden name and
/// renamed, oldest first.
fn land_seed(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("sql/data");
    for f in ["clicks-1.json", "clicks-2.json"] {
        let hidden = dir.join(format!(".{f}"));
        std::fs::copy(data.join(f), &hidden).unwrap();
        std::fs::rename(&hidden, dir.join(f)).unwrap();
        // Distinct modification times, so both runs take the files in this order.
        let t = std::time::SystemTime::now()
            - Duration::from_secs(if f.ends_with("1.json") { 60 } else { 30 });
        std::fs::File::options()
            .write(true)
            .open(dir.join(f))
            .unwrap()
            .set_modified(t)
            .unwrap();
    }
}

const COLUMNS: &str = "window_start TIMESTAMP, window_end TIMESTAMP, page TEXT, views BIGINT, \
                       total_duration_s DOUBLE PRECISION";

/// The seed pipeline (five-minute windows, ten-minute watermark, one file a batch) run
/// here and, exported, on PySpark: the same windows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exported_sink_runs_on_pyspark_to_the_same_rows() {
    if !prerequisites() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let landing = tmp.path().join("landing");
    land_seed(&landing);
    let data = tmp.path().join("data");
    let local = tmp.path().join("local");
    let server = TestServer::start(&data, 0, &[]).await;
    let c = server.connect().await;
    c.batch_execute(&format!(
        "CREATE STREAM clicks (user_id TEXT, page TEXT, event_time TIMESTAMP, duration_s DOUBLE \
         PRECISION) WITH (connector = 'file', format = 'json', path = '{}', \
         max_files_per_trigger = 1); \
         CREATE SINK page_views WITH (connector = 'parquet', path = '{}', watermark = \
         'event_time - 10 minutes', output_mode = 'append', trigger = 'available_now') AS \
         SELECT window.start AS window_start, window.end AS window_end, page, count(*) AS views, \
         sum(duration_s) AS total_duration_s FROM clicks GROUP BY window(event_time, '5 \
         minutes'), page; \
         FLUSH SINK page_views;",
        landing.display(),
        local.display()
    ))
    .await
    .unwrap();
    let order = "ORDER BY window_start, page";
    let want = rows(&c, &format!("SELECT * FROM page_views {order}")).await;
    assert!(want.len() >= 3, "{want:?}");

    // The program, as `tidemark export-spark` writes it.
    let spark_out = tmp.path().join("spark_out");
    let out = Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .arg("export-spark")
        .arg("page_views")
        .arg("--data-dir")
        .arg(&data)
        .arg("--path")
        .arg(&spark_out)
        .arg("--checkpoint-location")
        .arg(tmp.path().join("spark_ck"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "export-spark: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let program: PathBuf = tmp.path().join("page_views.py");
    std::fs::write(&program, &out.stdout).unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        text.contains(".option(\"maxFilesPerTrigger\", \"1\")"),
        "{text}"
    );
    assert!(
        text.contains("withWatermark(\"event_time\", \"10 minutes\")"),
        "{text}"
    );

    let run = Command::new(python())
        .arg(&program)
        .env(
            "PYSPARK_SUBMIT_ARGS",
            "--master local[2] --conf spark.driver.memory=1g pyspark-shell",
        )
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "the exported program failed:\n{}\n{}",
        program.display(),
        String::from_utf8_lossy(&run.stderr)
    );
    // Spark's output, read back through Tidemark (its file sink's manifest included).
    c.batch_execute(&format!(
        "CREATE STREAM spark_rows ({COLUMNS}) WITH (connector = 'file', format = 'parquet', \
         path = '{}')",
        spark_out.display()
    ))
    .await
    .unwrap();
    let got = rows(&c, &format!("SELECT * FROM spark_rows {order}")).await;
    assert_eq!(got, want, "Spark's rows, then Tidemark's");
    server.stop().await;
}
