//! JSON decoding alone, on one core: the fast path (`format::json`) against arrow-json
//! (the decoder it stands in front of) and against `memcpy` of the same bytes, the
//! physical limit. The batches of the two decoders are compared, not only timed.
//!
//! ```text
//! cargo bench --bench json_decode -- DIR [REPEATS] [ONLY]
//! ```
//!
//! DIR holds the seed query's files (`python3 benches/flink.py` makes
//! /tmp/oracle-bench/landing-5000000); every `*.json` in it is read into memory first,
//! and each decoder runs over all of them REPEATS times (default 5). Printed: the best
//! and median time of each, GB/s and rows/s per core, and the ratio to memcpy. ONLY
//! (`memcpy`, `arrow-json` or `fast`) times that one alone, for a profiler.

use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use tidemark::format::json::FlatJson;

const BATCH: usize = 8192;

fn seed_schema() -> SchemaRef {
    // `CREATE STREAM clicks (user_id TEXT, page TEXT, event_time TIMESTAMP,
    // duration_s DOUBLE PRECISION)`, as the file source declares it to the decoder.
    Arc::new(Schema::new(vec![
        Field::new("user_id", DataType::Utf8, true),
        Field::new("page", DataType::Utf8, true),
        Field::new(
            "event_time",
            DataType::Timestamp(TimeUnit::Microsecond, None),
            true,
        ),
        Field::new("duration_s", DataType::Float64, true),
    ]))
}

fn arrow_json(schema: &SchemaRef, text: &[u8]) -> Vec<RecordBatch> {
    datafusion::arrow::json::ReaderBuilder::new(schema.clone())
        .with_batch_size(BATCH)
        .with_coerce_primitive(true)
        .build(text)
        .expect("reader")
        .collect::<Result<Vec<_>, _>>()
        .expect("arrow-json decodes the seed files")
}

/// Runs `f` over every file `repeats` times; the time of each pass.
fn timed(files: &[Vec<u8>], repeats: usize, mut f: impl FnMut(&[u8]) -> usize) -> Vec<Duration> {
    (0..repeats)
        .map(|_| {
            let start = Instant::now();
            let mut rows = 0;
            for text in files {
                rows += f(text);
            }
            std::hint::black_box(rows);
            start.elapsed()
        })
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let Some(dir) = args.first() else {
        eprintln!("usage: cargo bench --bench json_decode -- DIR [REPEATS]");
        std::process::exit(2);
    };
    let repeats: usize = args.get(1).map_or(5, |r| r.parse().expect("REPEATS"));
    let only = args.get(2).cloned();
    let runs = |name: &str| only.as_deref().is_none_or(|o| name.starts_with(o));
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .expect("DIR")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    paths.sort();
    let files: Vec<Vec<u8>> = paths
        .iter()
        .map(|p| std::fs::read(p).expect("read"))
        .collect();
    let bytes: usize = files.iter().map(Vec::len).sum();
    let schema = seed_schema();
    let fast = FlatJson::new(&schema).expect("the seed schema is flat");

    // The answers first: the same batches from both decoders, file by file.
    let mut rows = 0;
    for (path, text) in paths.iter().zip(&files) {
        let ours = fast
            .decode(text, BATCH)
            .unwrap_or_else(|| panic!("the fast path declined {}", path.display()));
        assert_eq!(ours, arrow_json(&schema, text), "{}", path.display());
        rows += ours.iter().map(RecordBatch::num_rows).sum::<usize>();
    }
    println!(
        "{} files, {rows} rows, {:.1} MB; both decoders give the same batches",
        files.len(),
        bytes as f64 / 1e6
    );

    let mut sink = vec![0u8; files.iter().map(Vec::len).max().unwrap_or(0)];
    let results: Vec<(&str, Vec<Duration>)> = vec![
        (
            "memcpy",
            timed(&files, if runs("memcpy") { repeats } else { 1 }, |t| {
                sink[..t.len()].copy_from_slice(t);
                std::hint::black_box(&sink);
                0
            }),
        ),
        (
            "arrow-json",
            timed(&files, if runs("arrow-json") { repeats } else { 0 }, |t| {
                arrow_json(&schema, t)
                    .iter()
                    .map(RecordBatch::num_rows)
                    .sum()
            }),
        ),
        (
            "tidemark fast path",
            timed(
                &files,
                if runs("tidemark") || runs("fast") {
                    repeats
                } else {
                    0
                },
                |t| {
                    fast.decode(t, BATCH)
                        .expect("taken")
                        .iter()
                        .map(RecordBatch::num_rows)
                        .sum()
                },
            ),
        ),
    ];
    let best_memcpy = results[0].1.iter().min().copied().unwrap_or_default();
    println!(
        "{:<20} {:>9} {:>9} {:>9} {:>12} {:>10}",
        "decoder", "best s", "median s", "GB/s", "M rows/s", "× memcpy"
    );
    for (name, mut times) in results {
        if times.is_empty() {
            continue;
        }
        times.sort();
        let best = times[0];
        let median = times[times.len() / 2];
        println!(
            "{:<20} {:>9.3} {:>9.3} {:>9.2} {:>12.2} {:>10.1}",
            name,
            best.as_secs_f64(),
            median.as_secs_f64(),
            bytes as f64 / best.as_secs_f64() / 1e9,
            rows as f64 / best.as_secs_f64() / 1e6,
            best.as_secs_f64() / best_memcpy.as_secs_f64()
        );
    }
}
