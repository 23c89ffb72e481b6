//! Fidelity against real Spark: every case under `tests/oracle/cases/` holds input files
//! per run and Spark's outputs, made by `shared/oracle-tools/run_case.py` (see
//! `tests/oracle/README.md`). Each case is replayed against a real `tidemark` server, one
//! server start per run (Spark runs a new process per run), and compared batch by batch:
//!
//! - `batches.csv`: batch ids, input rows, the watermark in force, event-time min/max,
//!   state rows total/updated/removed, and whether rows were dropped as late (Spark counts
//!   late *groups*, Tidemark late *input rows*, so only zero vs non-zero is compared);
//! - `changelog.csv`: how many rows each batch emitted;
//! - `output.csv`: the sink's table (append: cumulative; complete: the last snapshot;
//!   update: the last emitted value of every group, which is what a MERGE keeps).
//!
//! The same query runs beside the sink as a materialized view, which must pass the same
//! checks: its progress batch by batch, and its rows equal to the sink's table.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use tokio_postgres::Client;

use crate::harness::{TestServer, free_port, rows};

#[derive(Debug)]
pub(crate) struct Variant {
    pub(crate) mode: String,
    window: String,
    duration: String,
    slide: String,
    gap: String,
    watermark: String,
    max_files: u32,
    trigger: String,
}

fn parse_variant(args: &[String]) -> Variant {
    let mut v = Variant {
        mode: "append".into(),
        window: "tumbling".into(),
        duration: "5 minutes".into(),
        slide: "1 minute".into(),
        gap: "5 minutes".into(),
        watermark: "10 minutes".into(),
        max_files: 1,
        trigger: "available_now".into(),
    };
    let mut it = args.iter();
    while let Some(k) = it.next() {
        let val = it.next().cloned().unwrap_or_default();
        match k.as_str() {
            "--mode" => v.mode = val,
            "--window" => v.window = val,
            "--window-duration" => v.duration = val,
            "--slide" => v.slide = val,
            "--gap" => v.gap = val,
            "--watermark" => v.watermark = val,
            "--max-files-per-trigger" => v.max_files = val.parse().unwrap(),
            // Spark's sink for the run; Tidemark writes Delta in every case.
            "--sink" => {}
            "--trigger" => {
                v.trigger = match val.as_str() {
                    "once" => "once".into(),
                    _ => "available_now".into(),
                }
            }
            other => panic!("variant argument {other} is not supported by the oracle test"),
        }
    }
    v
}

/// `2026-06-10 10:00:00.500000` → `2026-06-10T10:00:00.5Z` (the oracle's canonical form).
fn iso(ts: &str) -> String {
    let ts = ts.trim_end_matches("+00");
    let (date_time, frac) = ts.split_once('.').unwrap_or((ts, ""));
    let frac = frac.trim_end_matches('0');
    let mut s = date_time.replace(' ', "T");
    if !frac.is_empty() {
        s.push('.');
        s.push_str(frac);
    }
    s.push('Z');
    s
}

/// `2026-06-10 10:20:00.000000+00` → `2026-06-10T10:20:00.000Z` (Spark's progress form).
fn progress_ts(ts: &str) -> String {
    let ts = ts.trim_end_matches("+00");
    let (date_time, frac) = ts.split_once('.').unwrap_or((ts, "000"));
    format!("{}.{:0<3.3}Z", date_time.replace(' ', "T"), frac)
}

/// A query's rows as the `spark_multi.py`/`spark_dedup.py` CSVs write them, sorted: NULL
/// empty, timestamps without the zone and without a zero fraction.
async fn sorted_rows(client: &Client, sql: &str) -> Vec<Vec<String>> {
    let mut out: Vec<Vec<String>> = rows(client, sql)
        .await
        .into_iter()
        .map(|r| {
            r.into_iter()
                .map(|v| {
                    let v = v.unwrap_or_default();
                    let v = v.trim_end_matches("+00");
                    v.strip_suffix(".000000").unwrap_or(v).to_string()
                })
                .collect()
        })
        .collect();
    out.sort();
    out
}

fn read_csv(path: &Path) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .skip(1)
        .filter(|l| !l.is_empty())
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect()
}

async fn table_rows(client: &Client, table: &str) -> Vec<Vec<String>> {
    let mut out: Vec<Vec<String>> = rows(
        client,
        &format!("SELECT window_start, window_end, page, views, total_duration_s FROM {table}"),
    )
    .await
    .into_iter()
    .map(|r| {
        let total: f64 = r[4].as_deref().unwrap().parse().unwrap();
        vec![
            iso(r[0].as_deref().unwrap()),
            iso(r[1].as_deref().unwrap()),
            r[2].clone().unwrap_or_default(),
            r[3].clone().unwrap(),
            format!("{total:.3}"),
        ]
    })
    .collect();
    out.sort();
    out
}

fn land(run_dir: &Path, landing: &Path, mtime: &mut SystemTime) {
    let mut names: Vec<PathBuf> = std::fs::read_dir(run_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    for src in names {
        let dst = landing.join(src.file_name().unwrap());
        std::fs::copy(&src, &dst).unwrap();
        *mtime += Duration::from_secs(1);
        std::fs::File::options()
            .write(true)
            .open(&dst)
            .unwrap()
            .set_modified(*mtime)
            .unwrap();
    }
}

/// Replays `variant` of `case` run by run and checks each run against Spark's outputs: a
/// local sink and a materialized view, or, with `spark` (a Spark Connect endpoint), a
/// Parquet sink on Spark (`engine = 'spark'`), whose rows and batches must be the ones
/// Spark made when the oracle ran (its file sink reports no output row count, so the rows
/// emitted per batch are checked through the table only).
pub(crate) async fn check_variant(
    case: &Path,
    runs: &[String],
    variant: &str,
    v: &Variant,
    spark: Option<&str>,
) {
    let tmp = tempfile::tempdir().unwrap();
    let landing = tmp.path().join("landing");
    std::fs::create_dir_all(&landing).unwrap();
    let data_dir = tmp.path().join("data");
    let port = free_port();
    let mut mtime = SystemTime::now() - Duration::from_secs(86_400);
    let window = match v.window.as_str() {
        "tumbling" => format!("window(event_time, '{}')", v.duration),
        "sliding" => format!("window(event_time, '{}', '{}')", v.duration, v.slide),
        "session" => format!("session_window(event_time, '{}')", v.gap),
        other => panic!("window {other} is not supported yet"),
    };
    let mut last_per_key: BTreeMap<(String, String, String), Vec<String>> = BTreeMap::new();
    for (k, run) in runs.iter().enumerate() {
        let what = format!("{} / {variant} / run{}", case.display(), k + 1);
        land(&case.join(run), &landing, &mut mtime);
        let server = TestServer::start(&data_dir, port, &[]).await;
        let client = server.connect().await;
        if k == 0 {
            // The same query as a Delta sink and as a materialized view.
            let query = format!(
                "SELECT {w}.start AS window_start, {w}.end AS window_end, page, \
                 count(*) AS views, sum(duration_s) AS total_duration_s \
                 FROM clicks GROUP BY {window}, page",
                w = if v.window == "session" {
                    "session_window"
                } else {
                    "window"
                },
            );
            let with = format!(
                "watermark = 'event_time - {}', output_mode = '{}', trigger = '{}'",
                v.watermark, v.mode, v.trigger
            );
            let objects = match spark {
                None => format!(
                    "CREATE SINK out WITH ({with}) AS {query};
                     CREATE MATERIALIZED VIEW view_out WITH ({with}) AS {query}"
                ),
                Some(remote) => format!(
                    "CREATE SINK out WITH (engine = 'spark', spark_remote = '{remote}', \
                     connector = 'parquet', path = '{}', {with}) AS {query}",
                    tmp.path().join("out").display()
                ),
            };
            client
                .batch_execute(&format!(
                    "CREATE STREAM clicks (user_id TEXT, page TEXT, event_time TIMESTAMP, \
                     duration_s DOUBLE PRECISION) WITH (format = 'json', path = '{}', \
                     max_files_per_trigger = {});
                     {objects}",
                    landing.display(),
                    v.max_files,
                ))
                .await
                .unwrap_or_else(|e| panic!("{what}: {e}"));
        } else if spark.is_none() {
            client
                .batch_execute("START SINK out; START MATERIALIZED VIEW view_out")
                .await
                .unwrap();
        } else {
            client.batch_execute("START SINK out").await.unwrap();
        }
        if spark.is_none() {
            client
                .batch_execute("FLUSH SINK out; FLUSH MATERIALIZED VIEW view_out")
                .await
                .unwrap_or_else(|e| panic!("{what}: {e}\n{}", server.log()));
        } else {
            // The run on Spark ends by itself (available_now, once): awaited by its run id,
            // since the status of the run before may still read finished.
            wait_spark_run(&client, &what).await;
        }
        let expected = case
            .join("expected")
            .join(variant)
            .join(format!("run{}", k + 1));

        // output.csv: the sink's table, and the view.
        let changelog = read_csv(&expected.join("changelog.csv"));
        let want_table: Vec<Vec<String>> = match v.mode.as_str() {
            "update" => {
                let mut rows_in_order = changelog.clone();
                rows_in_order.sort_by_key(|r| r[0].parse::<u64>().unwrap());
                for r in rows_in_order {
                    last_per_key
                        .insert((r[1].clone(), r[2].clone(), r[3].clone()), r[1..].to_vec());
                }
                last_per_key.values().cloned().collect()
            }
            _ => read_csv(&expected.join("output.csv")),
        };
        let queries: &[&str] = if spark.is_none() {
            &["out", "view_out"]
        } else {
            &["out"]
        };
        for &query in queries {
            let what = format!("{what} / {query}");
            // batches.csv
            let got: Vec<Vec<String>> = rows(
                &client,
                &format!("SELECT batch_id, num_input_rows, watermark, event_time_min, event_time_max, \
                 rows_dropped_by_watermark, state_rows_total, state_rows_updated, \
                 state_rows_removed, sink_output_rows FROM tidemark.progress WHERE name = '{query}' ORDER BY batch_id"),
            )
            .await
            .into_iter()
            .map(|r| {
                let s = |i: usize| r[i].clone().unwrap_or_default();
                let ts = |i: usize| r[i].as_deref().map(progress_ts).unwrap_or_default();
                let dropped = if s(5) == "0" { "0" } else { ">0" };
                vec![
                    s(0),
                    s(1),
                    ts(2),
                    ts(3),
                    ts(4),
                    dropped.into(),
                    s(6),
                    s(7),
                    s(8),
                ]
            })
            .collect();
            let want: Vec<Vec<String>> = read_csv(&expected.join("batches.csv"))
                .into_iter()
                .map(|r| {
                    let dropped = if r[5] == "0" { "0" } else { ">0" };
                    vec![
                        r[0].clone(),
                        r[1].clone(),
                        r[2].clone(),
                        r[3].clone(),
                        r[4].clone(),
                        dropped.into(),
                        r[6].clone(),
                        r[7].clone(),
                        r[8].clone(),
                    ]
                })
                .collect();
            assert_eq!(
                got, want,
                "{what}: batches (id, rows, watermark, min, max, dropped, state total/updated/removed)"
            );
            // The progress JSON: every field of Spark's report, with the same JSON type.
            let spark_reports = expected.join("progress.json");
            if spark_reports.exists() {
                let spark: Vec<serde_json::Value> =
                    serde_json::from_str(&std::fs::read_to_string(&spark_reports).unwrap())
                        .unwrap();
                let ours = rows(
                    &client,
                    &format!("SELECT batch_id, progress FROM tidemark.progress WHERE name = '{query}' ORDER BY batch_id"),
                )
                .await;
                let mut compared = 0;
                for r in &ours {
                    let batch: u64 = r[0].as_deref().unwrap().parse().unwrap();
                    let Some(theirs) = spark.iter().find(|p| p["batchId"] == batch) else {
                        continue;
                    };
                    let mine: serde_json::Value =
                        serde_json::from_str(r[1].as_deref().unwrap()).unwrap();
                    let mut missing = Vec::new();
                    same_shape(theirs, &mine, "", &mut missing);
                    assert!(
                        missing.is_empty(),
                        "{what}: batch {batch}'s progress differs from Spark's in {missing:?}\nSpark: {theirs}\nours: {mine}"
                    );
                    compared += 1;
                }
                assert!(
                    compared > 0,
                    "{what}: no progress report compared with Spark's"
                );
            }

            let table = table_rows(&client, query).await;
            assert_eq!(table, want_table, "{what}: the rows");
            if spark.is_some() {
                continue;
            }
            // changelog.csv: rows emitted per batch.
            let mut per_batch: BTreeMap<String, u64> = BTreeMap::new();
            for r in &changelog {
                *per_batch.entry(r[0].clone()).or_default() += 1;
            }
            let got_out: Vec<(String, u64)> = rows(
                &client,
                &format!("SELECT batch_id, sink_output_rows FROM tidemark.progress WHERE name = '{query}' ORDER BY batch_id"),
            )
            .await
            .into_iter()
            .map(|r| {
                (
                    r[0].clone().unwrap(),
                    r[1].as_deref().unwrap().parse().unwrap(),
                )
            })
            .collect();
            let want_out: Vec<(String, u64)> = got_out
                .iter()
                .map(|(b, _)| (b.clone(), per_batch.get(b).copied().unwrap_or(0)))
                .collect();
            assert_eq!(got_out, want_out, "{what}: rows emitted per batch");
        }
        drop(client);
        server.stop().await;
    }
}

/// Waits for the run of sink `out` on Spark that this server started to finish: a
/// finished status with a run id this server's registry got from Spark.
async fn wait_spark_run(client: &Client, what: &str) {
    crate::harness::poll(&format!("{what}: the run on Spark"), || async {
        let r = rows(
            client,
            "SELECT status, run_id, error FROM tidemark.queries WHERE name = 'out'",
        )
        .await;
        let (status, run) = (r[0][0].as_deref(), r[0][1].as_deref());
        assert_ne!(status, Some("failed"), "{what}: {:?}", r[0][2]);
        let reported = rows(
            client,
            &format!(
                "SELECT count(*) FROM tidemark.progress WHERE name = 'out' AND run_id = '{}'",
                run.unwrap_or("")
            ),
        )
        .await;
        (status == Some("finished") && reported[0][0].as_deref() != Some("0")).then_some(())
    })
    .await;
}

/// Adds to `differences` each field of Spark's report `spark` that `ours` lacks or holds
/// with another JSON type (fields of ours that Spark lacks are Tidemark's additions). Spark's
/// `customMetrics` depend on its state store provider (spec §12.1) and are not compared.
fn same_shape(
    spark: &serde_json::Value,
    ours: &serde_json::Value,
    path: &str,
    differences: &mut Vec<String>,
) {
    use serde_json::Value;
    let kind = |v: &Value| match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    if kind(spark) != kind(ours) {
        differences.push(format!(
            "{path}: Spark's {} is our {}",
            kind(spark),
            kind(ours)
        ));
        return;
    }
    match (spark, ours) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                if k == "customMetrics" {
                    continue;
                }
                match b.get(k) {
                    Some(w) => same_shape(v, w, &format!("{path}.{k}"), differences),
                    None => differences.push(format!("{path}.{k}: missing")),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            if a.len() != b.len() {
                differences.push(format!("{path}: {} entries, ours {}", a.len(), b.len()));
            }
            for (i, (v, w)) in a.iter().zip(b).enumerate() {
                same_shape(v, w, &format!("{path}[{i}]"), differences);
            }
        }
        _ => {}
    }
}

fn cases() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle/cases");
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("expected").is_dir())
        .collect();
    out.sort();
    out
}

/// Every variant of every case: the case, its runs, the variant's name and settings.
pub(crate) fn variants() -> Vec<(PathBuf, Vec<String>, String, Variant)> {
    let mut out = Vec::new();
    for case in cases() {
        let spec: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(case.join("case.json")).unwrap())
                .unwrap();
        let runs: Vec<String> = spec["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_str().unwrap().to_string())
            .collect();
        for (variant, args) in spec["variants"].as_object().unwrap() {
            let args: Vec<String> = args
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap().to_string())
                .collect();
            out.push((
                case.clone(),
                runs.clone(),
                variant.clone(),
                parse_variant(&args),
            ));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spark_cases_match() {
    let filter = std::env::var("TIDEMARK_ORACLE").unwrap_or_default();
    let variants = variants();
    assert!(
        !variants.is_empty(),
        "no oracle cases with expected outputs"
    );
    for (case, runs, variant, v) in variants
        .iter()
        .filter(|(c, ..)| c.to_string_lossy().contains(&filter))
    {
        eprintln!("oracle case {} / {variant}", case.display());
        check_variant(case, runs, variant, v, None).await;
    }
}

/// Spark's `rate-micro-batch` source (`tests/oracle/rate_micro_batch/`, made by the script
/// beside the golden files): the same options give the same values, timestamps and offsets,
/// batch by batch. Each `START SINK` of a `once` sink runs exactly one batch, as in Spark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_micro_batch_matches_spark() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle/rate_micro_batch");
    let expected: Vec<(i64, i64, i64)> = read_csv(&dir.join("expected.csv"))
        .into_iter()
        .map(|r| {
            (
                r[0].parse().unwrap(),
                r[1].parse().unwrap(),
                r[2].parse().unwrap(),
            )
        })
        .collect();
    let offsets: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("offsets.json")).unwrap()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let server = TestServer::start(&tmp.path().join("data"), 0, &[]).await;
    let client = server.connect().await;
    client
        .batch_execute(
            "CREATE STREAM r WITH (connector = 'rate_micro_batch', rows_per_batch = 7,
                 num_partitions = 2, start_timestamp = 1781085600000,
                 advance_millis_per_batch = 1500);
             CREATE SINK out WITH (trigger = 'once') AS SELECT value, timestamp FROM r",
        )
        .await
        .unwrap();
    for batch in 0..4 {
        if batch > 0 {
            client.batch_execute("START SINK out").await.unwrap();
        }
        crate::harness::poll("the once run to finish", || async {
            let s = rows(
                &client,
                "SELECT status, last_batch_id FROM tidemark.queries",
            )
            .await;
            (s[0][0].as_deref() == Some("finished")
                && s[0][1].as_deref() == Some(batch.to_string().as_str()))
            .then_some(())
        })
        .await;
    }
    let epoch = chrono::NaiveDate::from_ymd_opt(1970, 1, 1)
        .unwrap()
        .and_hms_opt(0, 0, 0)
        .unwrap();
    let mut got: Vec<(i64, i64, i64)> = client
        .query("SELECT value, timestamp FROM out", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| {
            let ts: chrono::NaiveDateTime = r.get(1);
            let ms = (ts - epoch).num_milliseconds();
            // Every row of batch k carries the timestamp start + k * advance (spec §13.2).
            ((ms - 1781085600000) / 1500, r.get::<_, i64>(0), ms)
        })
        .collect();
    got.sort();
    assert_eq!(got, expected, "values and timestamps per batch, as Spark's");
    let progress = rows(
        &client,
        "SELECT batch_id, source_start_offset, source_end_offset, num_input_rows, progress \
         FROM tidemark.progress ORDER BY batch_id",
    )
    .await;
    for spark in offsets.as_array().unwrap() {
        let b = spark["batchId"].as_u64().unwrap() as usize;
        let ours = &progress[b];
        let json = |s: &str| -> serde_json::Value { serde_json::from_str(s).unwrap() };
        let spark_start = spark["startOffset"].as_str().unwrap();
        match ours[1].as_deref() {
            None => assert_eq!(spark_start, "null", "batch {b}"),
            Some(o) => assert_eq!(json(o), json(spark_start), "batch {b} start"),
        }
        assert_eq!(
            json(ours[2].as_deref().unwrap()),
            json(spark["endOffset"].as_str().unwrap()),
            "batch {b} end"
        );
        assert_eq!(
            ours[3].as_deref().unwrap(),
            spark["numInputRows"].to_string(),
            "batch {b} rows"
        );
        let report = json(ours[4].as_deref().unwrap());
        assert_eq!(
            report["sources"][0]["description"], spark["description"],
            "batch {b} description"
        );
    }
    server.stop().await;
}

/// Plans with several stateful operators and several watermarks (`tests/oracle/multi/`,
/// made by `spark_multi.py` beside the input files): a 10-minute count per page chained
/// into a 1-hour window over `window_time`, and a window count over the `UNION ALL` of two
/// streams with their own watermarks (policies min and max). Batch by batch, as Spark: input rows, the
/// watermark in force, rows emitted; and every emitted row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chained_aggregations_and_unions_match_spark() {
    let case = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle/multi");
    let tmp = tempfile::tempdir().unwrap();
    let mut mtime = SystemTime::now() - Duration::from_secs(86_400);
    let mut landing = BTreeMap::new();
    for name in ["clicks", "a", "b"] {
        let dir = tmp.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        land(&case.join(name), &dir, &mut mtime);
        landing.insert(name, dir.display().to_string());
    }
    let server = TestServer::start(&tmp.path().join("data"), 0, &[]).await;
    let client = server.connect().await;
    let stream = |name: &str, delay: &str| {
        format!(
            "CREATE STREAM {name} (event_time TIMESTAMP, page TEXT, WATERMARK FOR event_time \
             AS event_time - INTERVAL '{delay}') WITH (format = 'json', path = '{}', \
             max_files_per_trigger = 1);",
            landing[name]
        )
    };
    client
        .batch_execute(&format!(
            "{}{}{}
             CREATE SINK chained WITH (trigger = 'available_now') AS
               SELECT window.start AS hour, sum(n) AS clicks, count(*) AS windows
               FROM (SELECT window(event_time, '10 minutes') AS w, page, count(*) AS n
                     FROM clicks GROUP BY window(event_time, '10 minutes'), page)
               GROUP BY window(window_time(w), '1 hour');
             CREATE SINK unioned WITH (trigger = 'available_now') AS
               SELECT window.start AS ws, count(*) AS n
               FROM (SELECT event_time, page FROM a UNION ALL SELECT event_time, page FROM b)
               GROUP BY window(event_time, '10 minutes');
             CREATE SINK unioned_max WITH (trigger = 'available_now',
               multiple_watermark_policy = 'max') AS
               SELECT window.start AS ws, count(*) AS n
               FROM (SELECT event_time, page FROM a UNION ALL SELECT event_time, page FROM b)
               GROUP BY window(event_time, '10 minutes')",
            stream("clicks", "10 minutes"),
            stream("a", "5 minutes"),
            stream("b", "20 minutes"),
        ))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", server.log()));
    for (sink, shape, columns) in [
        ("chained", "chained", "hour, clicks, windows"),
        ("unioned", "union", "ws, n"),
        ("unioned_max", "union_max", "ws, n"),
    ] {
        crate::harness::poll("the available_now run to finish", || async {
            let s = rows(
                &client,
                &format!("SELECT status FROM tidemark.queries WHERE name = '{sink}'"),
            )
            .await;
            (s[0][0].as_deref() == Some("finished")).then_some(())
        })
        .await;
        let got: Vec<Vec<String>> = rows(
            &client,
            &format!(
                "SELECT batch_id, num_input_rows, watermark, sink_output_rows \
                 FROM tidemark.progress WHERE name = '{sink}' ORDER BY batch_id"
            ),
        )
        .await
        .into_iter()
        .map(|r| {
            vec![
                r[0].clone().unwrap(),
                r[1].clone().unwrap(),
                progress_ts(r[2].as_deref().unwrap()),
                r[3].clone().unwrap(),
            ]
        })
        .collect();
        let want = read_csv(&case.join(shape).join("batches.csv"));
        assert_eq!(
            got,
            want,
            "{sink}: batches (id, input rows, watermark, rows emitted)\n{}",
            server.log()
        );
        let table = sorted_rows(&client, &format!("SELECT {columns} FROM {sink}")).await;
        assert_eq!(
            table,
            read_csv(&case.join(shape).join("output.csv")),
            "{sink}: every row emitted"
        );
    }
    drop(client);
    server.stop().await;
}

/// Deduplication against Spark (`tests/oracle/dedup/`, made by `spark_dedup.py` beside the
/// input files): `DISTINCT ON` with and without the event time among the keys, within the
/// watermark, `row_number() = 1`, `SELECT DISTINCT` over columns without the event time, a
/// deduplication below a window count, and one keyed by a window computed below it. Batch
/// by batch, as Spark: input rows, the watermark in force, rows emitted, and per stateful
/// operator (top of the plan first) its name, state rows total, updated and removed, rows
/// dropped as late and as duplicates; then every emitted row. Each query also runs as a
/// materialized view in append mode, whose rows must equal the sink's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deduplication_matches_spark() {
    let case = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle/dedup");
    let tmp = tempfile::tempdir().unwrap();
    let mut mtime = SystemTime::now() - Duration::from_secs(86_400);
    let landing = tmp.path().join("clicks");
    std::fs::create_dir_all(&landing).unwrap();
    land(&case.join("clicks"), &landing, &mut mtime);
    let server = TestServer::start(&tmp.path().join("data"), 0, &[]).await;
    let client = server.connect().await;
    // (sink name, Spark's shape, options, query, columns)
    let shapes: [(&str, &str, &str, &str, &str); 7] = [
        (
            "exact",
            "exact",
            "",
            "SELECT DISTINCT ON (user_id, event_time) user_id, page, event_time FROM clicks",
            "user_id, page, event_time",
        ),
        (
            "by_user",
            "by_user",
            "",
            "SELECT DISTINCT ON (user_id) * FROM clicks",
            "user_id, page, event_time",
        ),
        (
            "within",
            "within",
            ", deduplicate = 'within_watermark'",
            "SELECT DISTINCT ON (user_id) * FROM clicks",
            "user_id, page, event_time",
        ),
        (
            "distinct",
            "distinct",
            "",
            "SELECT DISTINCT user_id, page FROM clicks",
            "user_id, page",
        ),
        (
            "by_user_rn",
            "by_user",
            "",
            "SELECT user_id, page, event_time FROM (SELECT *, row_number() OVER \
             (PARTITION BY user_id ORDER BY event_time) AS rn FROM clicks) WHERE rn = 1",
            "user_id, page, event_time",
        ),
        (
            "counted",
            "counted",
            "",
            "SELECT window.start AS window_start, page, count(*) AS n \
             FROM (SELECT DISTINCT ON (user_id, event_time) * FROM clicks) \
             GROUP BY window(event_time, '10 minutes'), page",
            "window_start, page, n",
        ),
        (
            "by_window",
            "by_window",
            "",
            "SELECT user_id, w.start AS window_start FROM (SELECT DISTINCT ON (user_id, w) \
             user_id, w FROM (SELECT user_id, window(event_time, '10 minutes') AS w \
             FROM clicks))",
            "user_id, window_start",
        ),
    ];
    let mut sql = format!(
        "CREATE STREAM clicks (user_id TEXT, page TEXT, event_time TIMESTAMP, WATERMARK FOR \
         event_time AS event_time - INTERVAL '10 minutes') WITH (format = 'json', path = '{}', \
         max_files_per_trigger = 1);",
        landing.display()
    );
    for (name, _, options, query, _) in &shapes {
        sql.push_str(&format!(
            "CREATE SINK {name} WITH (trigger = 'available_now'{options}) AS {query};
             CREATE MATERIALIZED VIEW {name}_view WITH (trigger = 'available_now', \
             output_mode = 'append'{options}) AS {query};"
        ));
    }
    client
        .batch_execute(&sql)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", server.log()));
    for (sink, shape, _, _, columns) in &shapes {
        for name in [sink.to_string(), format!("{sink}_view")] {
            crate::harness::poll("the available_now run to finish", || async {
                let s = rows(
                    &client,
                    &format!("SELECT status FROM tidemark.queries WHERE name = '{name}'"),
                )
                .await;
                (s[0][0].as_deref() == Some("finished")).then_some(())
            })
            .await;
        }
        let got = batches_with_operators(&client, sink).await;
        let want = read_csv(&case.join(shape).join("batches.csv"));
        assert_eq!(
            got,
            want,
            "{sink}: batches (id, input rows, watermark, rows emitted, operators, state rows \
             total/updated/removed, dropped late, dropped duplicates)\n{}",
            server.log()
        );
        let table = sorted_rows(&client, &format!("SELECT {columns} FROM {sink}")).await;
        assert_eq!(
            table,
            read_csv(&case.join(shape).join("output.csv")),
            "{sink}: every row emitted"
        );
        let view = sorted_rows(&client, &format!("SELECT {columns} FROM {sink}_view")).await;
        assert_eq!(view, table, "{sink}: the view holds the sink's rows");
    }
    drop(client);
    server.stop().await;
}

/// A query's batches as `spark_dedup.py`'s `batches.csv` has them: batch id, input rows,
/// the watermark in force, rows emitted, then per stateful operator (top of the plan
/// first) joined with `;`: its name, state rows total, updated and removed, rows dropped
/// as late, and `numDroppedDuplicateRows` where it has it.
async fn batches_with_operators(client: &Client, sink: &str) -> Vec<Vec<String>> {
    rows(
        client,
        &format!(
            "SELECT batch_id, num_input_rows, watermark, sink_output_rows, progress \
             FROM tidemark.progress WHERE name = '{sink}' ORDER BY batch_id"
        ),
    )
    .await
    .into_iter()
    .map(|r| {
        let p: serde_json::Value = serde_json::from_str(r[4].as_deref().unwrap()).unwrap();
        let ops = p["stateOperators"].as_array().cloned().unwrap_or_default();
        let each = |f: &dyn Fn(&serde_json::Value) -> String| {
            ops.iter().map(f).collect::<Vec<_>>().join(";")
        };
        vec![
            r[0].clone().unwrap(),
            r[1].clone().unwrap(),
            progress_ts(r[2].as_deref().unwrap()),
            r[3].clone().unwrap(),
            each(&|o| o["operatorName"].as_str().unwrap().to_string()),
            each(&|o| o["numRowsTotal"].to_string()),
            each(&|o| o["numRowsUpdated"].to_string()),
            each(&|o| o["numRowsRemoved"].to_string()),
            each(&|o| o["numRowsDroppedByWatermark"].to_string()),
            each(&|o| match &o["customMetrics"]["numDroppedDuplicateRows"] {
                serde_json::Value::Null => String::new(),
                v => v.to_string(),
            }),
        ]
    })
    .collect()
}

/// Waits until the `available_now` query `name` has finished.
async fn wait_finished(client: &Client, name: &str) {
    crate::harness::poll("the available_now run to finish", || async {
        let s = rows(
            client,
            &format!("SELECT status FROM tidemark.queries WHERE name = '{name}'"),
        )
        .await;
        (s[0][0].as_deref() == Some("finished")).then_some(())
    })
    .await;
}

/// Clicks as `spark_extra.py` writes them, sorted: `sql` selects user_id, page, event_time
/// (ISO, Z), duration_s (3 decimals), then any text columns; NULL is empty.
async fn click_rows(client: &Client, sql: &str) -> Vec<Vec<String>> {
    let mut out: Vec<Vec<String>> = rows(client, sql)
        .await
        .into_iter()
        .map(|r| {
            r.into_iter()
                .enumerate()
                .map(|(i, v)| match (i, v) {
                    (2, Some(ts)) => iso(&ts),
                    (3, Some(d)) => format!("{:.3}", d.parse::<f64>().unwrap()),
                    (_, v) => v.unwrap_or_default(),
                })
                .collect()
        })
        .collect();
    out.sort();
    out
}

/// The seed's Step 6 as a MERGE sink against Spark's foreachBatch (`tests/oracle/merge/`,
/// made by `make_expected.sh`): the latest click per user by `row_number()` over each batch,
/// merged so that a late click never overwrites a later one. Batch by batch, as Spark: input
/// rows, source rows after `rn = 1`, target rows inserted and updated (from the MERGE's
/// commit in the Delta log, found by its transaction's batch id); then the target's rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merge_sink_matches_spark() {
    let case = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle/merge");
    let tmp = tempfile::tempdir().unwrap();
    let mut mtime = SystemTime::now() - Duration::from_secs(86_400);
    let landing = tmp.path().join("clicks");
    std::fs::create_dir_all(&landing).unwrap();
    land(&case.join("clicks"), &landing, &mut mtime);
    let data_dir = tmp.path().join("data");
    let server = TestServer::start(&data_dir, 0, &[]).await;
    let client = server.connect().await;
    client
        .batch_execute(&format!(
            "CREATE STREAM clicks (user_id TEXT, page TEXT, event_time TIMESTAMP, \
             duration_s DOUBLE PRECISION) WITH (format = 'json', path = '{}', \
             max_files_per_trigger = 1);
             CREATE TABLE user_last_page (user_id TEXT, page TEXT, event_time TIMESTAMP, \
             duration_s DOUBLE PRECISION);
             CREATE SINK latest WITH (trigger = 'available_now') AS
                 MERGE INTO user_last_page AS t
                 USING (SELECT user_id, page, event_time, duration_s FROM (
                          SELECT *, row_number() OVER (PARTITION BY user_id
                                                       ORDER BY event_time DESC) AS rn
                          FROM clicks) WHERE rn = 1) AS s
                 ON t.user_id = s.user_id
                 WHEN MATCHED AND s.event_time > t.event_time THEN UPDATE SET *
                 WHEN NOT MATCHED THEN INSERT *",
            landing.display()
        ))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", server.log()));
    wait_finished(&client, "latest").await;

    // Each MERGE's counts, by the batch id of its transaction.
    let mut merged: BTreeMap<i64, serde_json::Value> = BTreeMap::new();
    let log = data_dir.join("tables/user_last_page/_delta_log");
    for entry in std::fs::read_dir(&log).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let actions: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let txn = actions.iter().find_map(|a| a["txn"]["version"].as_i64());
        let info = actions.iter().find(|a| a.get("commitInfo").is_some());
        if let (Some(batch), Some(info)) = (txn, info) {
            assert!(
                merged
                    .insert(batch, info["commitInfo"]["operationMetrics"].clone())
                    .is_none(),
                "batch {batch} merged twice"
            );
        }
    }
    let progress: BTreeMap<i64, String> = rows(
        &client,
        "SELECT batch_id, num_input_rows FROM tidemark.progress WHERE name = 'latest'",
    )
    .await
    .into_iter()
    .map(|r| {
        (
            r[0].as_deref().unwrap().parse().unwrap(),
            r[1].clone().unwrap(),
        )
    })
    .collect();
    let metric = |m: &serde_json::Value, k: &str| match &m[k] {
        serde_json::Value::Null => "0".to_string(),
        v => v.to_string(),
    };
    // Spark: batch_id, num_input_rows, num_source_rows, inserted, updated (and more).
    let want: Vec<Vec<String>> = read_csv(&case.join("expected/batches.csv"))
        .into_iter()
        .map(|r| r[..5].to_vec())
        .collect();
    let got: Vec<Vec<String>> = progress
        .iter()
        .map(|(batch, input)| {
            let m = merged.get(batch).cloned().unwrap_or_default();
            vec![
                batch.to_string(),
                input.clone(),
                metric(&m, "num_source_rows"),
                metric(&m, "num_target_rows_inserted"),
                metric(&m, "num_target_rows_updated"),
            ]
        })
        .collect();
    assert_eq!(got, want, "batch by batch\n{}", server.log());

    let target = click_rows(
        &client,
        "SELECT user_id, page, event_time, duration_s FROM user_last_page",
    )
    .await;
    let mut want = read_csv(&case.join("expected/output.csv"));
    want.sort();
    assert_eq!(target, want, "the target after the run");
    server.stop().await;
}

/// Stream-static joins against Spark (`tests/oracle/static_join/`, made by
/// `make_expected.sh`): the merge case's clicks joined with a static pages table `USING
/// (page)`, inner and left outer. Batch by batch: input rows and rows written; then every
/// row written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_static_joins_match_spark() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle");
    let case = root.join("static_join");
    let tmp = tempfile::tempdir().unwrap();
    let mut mtime = SystemTime::now() - Duration::from_secs(86_400);
    let landing = tmp.path().join("clicks");
    std::fs::create_dir_all(&landing).unwrap();
    land(&root.join("merge/clicks"), &landing, &mut mtime);
    let server = TestServer::start(&tmp.path().join("data"), 0, &[]).await;
    let client = server.connect().await;
    // The static table holds pages.csv's rows; an empty CSV field is NULL, as Spark reads it.
    let pages: Vec<String> = read_csv(&case.join("pages.csv"))
        .into_iter()
        .map(|r| {
            let section = r.get(1).filter(|s| !s.is_empty());
            format!(
                "('{}', {})",
                r[0],
                section.map_or("NULL".to_string(), |s| format!("'{s}'"))
            )
        })
        .collect();
    let mut sql = format!(
        "CREATE STREAM clicks (user_id TEXT, page TEXT, event_time TIMESTAMP, \
         duration_s DOUBLE PRECISION) WITH (format = 'json', path = '{}', \
         max_files_per_trigger = 1);
         CREATE TABLE pages (page TEXT, section TEXT);
         INSERT INTO pages VALUES {};",
        landing.display(),
        pages.join(", ")
    );
    for (join, keyword) in [("inner", "JOIN"), ("left_outer", "LEFT JOIN")] {
        sql.push_str(&format!(
            "CREATE SINK {join} WITH (trigger = 'available_now') AS \
             SELECT c.user_id, c.page, c.event_time, c.duration_s, p.section \
             FROM clicks c {keyword} pages p ON c.page = p.page;"
        ));
    }
    client
        .batch_execute(&sql)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", server.log()));
    for join in ["inner", "left_outer"] {
        wait_finished(&client, join).await;
        let expected = case.join("expected").join(join);
        let mut per_batch: BTreeMap<String, u64> = BTreeMap::new();
        for r in read_csv(&expected.join("changelog.csv")) {
            *per_batch.entry(r[0].clone()).or_default() += 1;
        }
        let want: Vec<(String, String, u64)> = read_csv(&expected.join("batches.csv"))
            .into_iter()
            .map(|r| {
                let n = per_batch.get(&r[0]).copied().unwrap_or(0);
                (r[0].clone(), r[1].clone(), n)
            })
            .collect();
        let got: Vec<(String, String, u64)> = rows(
            &client,
            &format!(
                "SELECT batch_id, num_input_rows, sink_output_rows FROM tidemark.progress \
                 WHERE name = '{join}' ORDER BY batch_id"
            ),
        )
        .await
        .into_iter()
        .map(|r| {
            (
                r[0].clone().unwrap(),
                r[1].clone().unwrap(),
                r[2].as_deref().unwrap().parse().unwrap(),
            )
        })
        .collect();
        assert_eq!(got, want, "{join}: batches (id, input rows, rows written)");
        let table = click_rows(
            &client,
            &format!("SELECT user_id, page, event_time, duration_s, section FROM {join}"),
        )
        .await;
        let mut want_rows = read_csv(&expected.join("output.csv"));
        want_rows.sort();
        assert_eq!(table, want_rows, "{join}: the rows");
    }
    server.stop().await;
}

/// Stream-stream joins against Spark (`tests/oracle/stream_join/`, made by
/// `make_expected.sh`): Spark's documented ad example, impressions (watermark 10 minutes)
/// joined with clicks (20 minutes) on the ad and a one-hour range, inner, left, right and
/// full outer, one file of each stream per batch. Batch by batch, as Spark: input rows, the
/// watermark in force, rows dropped as late, the join's state rows total/updated/removed and
/// rows written (outer rows come out only once the watermark passes them); then every row.
/// Lands `case`'s impressions/ and ad_clicks/ under `tmp`: the statements that declare
/// them as Spark's documented ad example does (impressions watermark 10 minutes, clicks
/// 20 minutes), one file per batch.
fn ad_streams(case: &Path, tmp: &Path) -> String {
    let mut mtime = SystemTime::now() - Duration::from_secs(86_400);
    let mut landing = BTreeMap::new();
    for side in ["impressions", "ad_clicks"] {
        let dir = tmp.join(side);
        std::fs::create_dir_all(&dir).unwrap();
        land(&case.join(side), &dir, &mut mtime);
        landing.insert(side, dir.display().to_string());
    }
    format!(
        "CREATE STREAM impressions (ad_id TEXT, impression_time TIMESTAMP, WATERMARK FOR \
         impression_time AS impression_time - INTERVAL '10 minutes') WITH (format = 'json', \
         path = '{}', max_files_per_trigger = 1);
         CREATE STREAM ad_clicks (ad_id TEXT, click_time TIMESTAMP, WATERMARK FOR click_time \
         AS click_time - INTERVAL '20 minutes') WITH (format = 'json', path = '{}', \
         max_files_per_trigger = 1);",
        landing["impressions"], landing["ad_clicks"]
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_stream_joins_match_spark() {
    let case = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle/stream_join");
    let tmp = tempfile::tempdir().unwrap();
    let server = TestServer::start(&tmp.path().join("data"), 0, &[]).await;
    let client = server.connect().await;
    let mut sql = ad_streams(&case, tmp.path());
    let joins = [
        ("inner", "inner", "JOIN"),
        ("left_outer", "leftOuter", "LEFT OUTER JOIN"),
        ("right_outer", "rightOuter", "RIGHT OUTER JOIN"),
        ("full_outer", "fullOuter", "FULL OUTER JOIN"),
    ];
    for (name, _, keyword) in joins {
        sql.push_str(&format!(
            "CREATE SINK {name} WITH (trigger = 'available_now') AS
               SELECT i.ad_id AS impression_ad_id, i.impression_time,
                      c.ad_id AS click_ad_id, c.click_time
               FROM impressions i {keyword} ad_clicks c
                 ON c.ad_id = i.ad_id AND c.click_time >= i.impression_time
                AND c.click_time <= i.impression_time + INTERVAL '1 hour';"
        ));
    }
    client
        .batch_execute(&sql)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", server.log()));
    for (name, spark, _) in joins {
        wait_finished(&client, name).await;
        let expected = case.join("expected").join(spark);
        let mut per_batch: BTreeMap<String, u64> = BTreeMap::new();
        for r in read_csv(&expected.join("changelog.csv")) {
            *per_batch.entry(r[0].clone()).or_default() += 1;
        }
        // batch_id, num_input_rows, (per source), watermark, min, max, dropped, total,
        // updated, removed, operators, ...
        let want: Vec<Vec<String>> = read_csv(&expected.join("batches.csv"))
            .into_iter()
            .map(|r| {
                let n = per_batch.get(&r[0]).copied().unwrap_or(0);
                vec![
                    r[0].clone(),
                    r[1].clone(),
                    r[4].clone(),
                    r[7].clone(),
                    r[8].clone(),
                    r[9].clone(),
                    r[10].clone(),
                    r[11].clone(),
                    n.to_string(),
                ]
            })
            .collect();
        let got: Vec<Vec<String>> = rows(
            &client,
            &format!(
                "SELECT batch_id, num_input_rows, watermark, sink_output_rows, progress \
                 FROM tidemark.progress WHERE name = '{name}' ORDER BY batch_id"
            ),
        )
        .await
        .into_iter()
        .map(|r| {
            let p: serde_json::Value = serde_json::from_str(r[4].as_deref().unwrap()).unwrap();
            let op = &p["stateOperators"][0];
            vec![
                r[0].clone().unwrap(),
                r[1].clone().unwrap(),
                progress_ts(r[2].as_deref().unwrap()),
                op["numRowsDroppedByWatermark"].to_string(),
                op["numRowsTotal"].to_string(),
                op["numRowsUpdated"].to_string(),
                op["numRowsRemoved"].to_string(),
                op["operatorName"].as_str().unwrap_or_default().to_string(),
                r[3].clone().unwrap(),
            ]
        })
        .collect();
        assert_eq!(
            got,
            want,
            "{name}: batches (id, input rows, watermark, dropped late, state rows \
             total/updated/removed, operator, rows written)\n{}",
            server.log()
        );
        let mut table: Vec<Vec<String>> = rows(
            &client,
            &format!(
                "SELECT impression_ad_id, impression_time, click_ad_id, click_time FROM {name}"
            ),
        )
        .await
        .into_iter()
        .map(|r| {
            r.into_iter()
                .enumerate()
                .map(|(i, v)| match (i, v) {
                    (1 | 3, Some(ts)) => iso(&ts),
                    (_, v) => v.unwrap_or_default(),
                })
                .collect()
        })
        .collect();
        table.sort();
        let mut want_rows = read_csv(&expected.join("output.csv"));
        want_rows.sort();
        assert_eq!(table, want_rows, "{name}: every row written");
    }
    server.stop().await;
}

/// The ad streams joined on the ad and each side's 1-hour window (its only marked column:
/// the times go through as epoch seconds), as `spark_join_more.py` writes it.
fn windowed_join(keyword: &str) -> String {
    format!(
        "SELECT i.ad_id AS impression_ad_id, i.w.start AS ws, i.s AS impression_s, \
         c.s AS click_s \
         FROM (SELECT ad_id, CAST(date_part('epoch', impression_time) AS BIGINT) AS s, \
               window(impression_time, '1 hour') AS w FROM impressions) i \
         {keyword} (SELECT ad_id, CAST(date_part('epoch', click_time) AS BIGINT) AS s, \
               window(click_time, '1 hour') AS w FROM ad_clicks) c \
         ON c.ad_id = i.ad_id AND c.w = i.w"
    )
}

/// The clicks per ad and hour (an aggregation) joined back to the impressions of that ad
/// and hour: Nexmark q5's and q7's shape. The aggregation is the join's right side, or its
/// left with `agg_first`.
fn join_after_aggregation(keyword: &str, agg_first: bool) -> String {
    let impressions = "(SELECT ad_id, CAST(date_part('epoch', impression_time) AS BIGINT) AS s, \
                       window(impression_time, '1 hour') AS w FROM impressions) i";
    let clicks = "(SELECT ad_id, w, count(*) AS clicks \
                  FROM (SELECT ad_id, window(click_time, '1 hour') AS w FROM ad_clicks) \
                  GROUP BY ad_id, w) c";
    let (left, right) = if agg_first {
        (clicks, impressions)
    } else {
        (impressions, clicks)
    };
    format!(
        "SELECT i.ad_id AS impression_ad_id, i.w.start AS ws, i.s AS impression_s, c.clicks \
         FROM {left} {keyword} {right} ON c.ad_id = i.ad_id AND c.w = i.w"
    )
}

/// A left semi join, an aggregation over an inner join's rows, inner and left outer joins
/// keyed by a window, and inner and left outer joins over an aggregation, against Spark
/// (`tests/oracle/stream_join/expected/{leftSemi,aggAfterJoin,windowInner,windowLeftOuter,
/// joinAfterAgg,leftJoinAfterAgg,aggLeftOfJoin}`, made by `spark_join_more.py`): batch by batch the input
/// rows, the watermark in force, rows emitted and each stateful operator's state rows and
/// late rows (the aggregation runs on the join's output watermark, the window-keyed joins
/// evict by the state key watermark, a join over an aggregation gets each window's row when
/// the watermark closes it); then every emitted row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_stream_stream_joins_match_spark() {
    let case = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle/stream_join");
    let tmp = tempfile::tempdir().unwrap();
    let server = TestServer::start(&tmp.path().join("data"), 0, &[]).await;
    let client = server.connect().await;
    let on = "ON c.ad_id = i.ad_id AND c.click_time >= i.impression_time \
              AND c.click_time <= i.impression_time + INTERVAL '1 hour'";
    // (sink, Spark's shape, query, columns)
    let shapes = [
        (
            "semi",
            "leftSemi",
            format!(
                "SELECT i.ad_id AS impression_ad_id, i.impression_time \
                 FROM impressions i LEFT SEMI JOIN ad_clicks c {on}"
            ),
            "impression_ad_id, impression_time",
        ),
        (
            "agg_after_join",
            "aggAfterJoin",
            format!(
                "SELECT window.start AS ws, count(*) AS clicks, max(c.click_time) AS last_click \
                 FROM impressions i JOIN ad_clicks c {on} \
                 GROUP BY window(i.impression_time, '30 minutes')"
            ),
            "ws, clicks, last_click",
        ),
        (
            "window_inner",
            "windowInner",
            windowed_join("JOIN"),
            "impression_ad_id, ws, impression_s, click_s",
        ),
        (
            "window_left_outer",
            "windowLeftOuter",
            windowed_join("LEFT OUTER JOIN"),
            "impression_ad_id, ws, impression_s, click_s",
        ),
        (
            "join_after_agg",
            "joinAfterAgg",
            join_after_aggregation("JOIN", false),
            "impression_ad_id, ws, impression_s, clicks",
        ),
        (
            "left_join_after_agg",
            "leftJoinAfterAgg",
            join_after_aggregation("LEFT OUTER JOIN", false),
            "impression_ad_id, ws, impression_s, clicks",
        ),
        (
            "agg_left_of_join",
            "aggLeftOfJoin",
            join_after_aggregation("JOIN", true),
            "impression_ad_id, ws, impression_s, clicks",
        ),
    ];
    let mut sql = ad_streams(&case, tmp.path());
    for (name, _, query, _) in &shapes {
        sql.push_str(&format!(
            "CREATE SINK {name} WITH (trigger = 'available_now') AS {query};"
        ));
    }
    client
        .batch_execute(&sql)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", server.log()));
    for (name, shape, _, columns) in &shapes {
        wait_finished(&client, name).await;
        let expected = case.join("expected").join(shape);
        assert_eq!(
            batches_with_operators(&client, name).await,
            read_csv(&expected.join("batches.csv")),
            "{name}: batches (id, input rows, watermark, rows emitted, operators, state rows \
             total/updated/removed, dropped late, dropped duplicates)\n{}",
            server.log()
        );
        assert_eq!(
            sorted_rows(&client, &format!("SELECT {columns} FROM {name}")).await,
            read_csv(&expected.join("output.csv")),
            "{name}: every row emitted"
        );
    }
    server.stop().await;
}
