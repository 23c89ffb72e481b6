//! Engine-wide settings in one place: how many threads a batch uses, how often idle
//! triggers look for new data, how many log entries a checkpoint keeps.

use std::time::Duration;

/// How often the default trigger looks for new files when idle. Sources that announce
/// arrivals (INSERT-fed streams) wake the trigger at once instead.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// The number of threads a batch uses to read files and execute.
pub fn parallelism() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
}

/// How many batches of logs and state versions are kept (Spark's `minBatchesToRetain`).
pub const MIN_BATCHES_TO_RETAIN: u64 = 100;

/// Bytes of decoded rows that Delta tables (sink tables, Delta streams) keep in memory
/// between queries, all tables together: a table that fits is scanned from memory, its new
/// commits decoded once; one that does not reads its Parquet files per query.
pub const READ_CACHE_BYTES: u64 = 512 << 20;

/// Bytes of files a file stream decodes ahead for its next batch while the current one runs
/// (the files' sizes on disk; their decoded rows take about as much again).
pub const READ_AHEAD_BYTES: u64 = 256 << 20;
