//! Crash points for crash tests.
//!
//! `TIDEMARK_CRASH_AT=<point>[@<n>]` makes the process abort (no cleanup, like SIGKILL) the
//! `n`-th time (default: first) execution reaches `crash_point("<point>")`. Points, in the
//! order a micro-batch reaches them (docs/guarantees.md says what each crash does):
//! `after_source_log_write`, `after_offsets_write`, `before_sink_commit` (after the state
//! commit), `sink_files_written` (data files written, no log entry yet; a Kafka sink's records
//! produced, its transaction not committed),
//! `view_log_before_rename` and `view_after_log` (a materialized view's log file written but
//! not renamed; renamed, not yet applied), `after_sink_commit`,
//! `after_commit_log`, `after_compaction` (a Delta sink's auto-compaction committed, after
//! the batch's own commit), and `mid_state_snapshot` (a snapshot or RocksDB checkpoint written but
//! not yet renamed into place).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

static ARMED: OnceLock<Option<(String, u64)>> = OnceLock::new();
static HITS: AtomicU64 = AtomicU64::new(0);

/// `<point>[@<n>]` from an environment variable.
fn parse_armed(var: &str) -> Option<(String, u64)> {
    let v = std::env::var(var).ok()?;
    Some(match v.split_once('@') {
        Some((p, n)) => (p.to_string(), n.parse().unwrap_or(1)),
        None => (v, 1),
    })
}

fn armed() -> &'static Option<(String, u64)> {
    ARMED.get_or_init(|| parse_armed("TIDEMARK_CRASH_AT"))
}

/// Aborts the process here if this point is armed and its hit count is reached.
pub fn crash_point(point: &str) {
    if let Some((p, n)) = armed()
        && p == point
        && HITS.fetch_add(1, Ordering::SeqCst) + 1 == *n
    {
        eprintln!("tidemark: crash point {point} reached; aborting");
        std::process::abort();
    }
}

static FAIL_ARMED: OnceLock<Option<(String, u64)>> = OnceLock::new();
static FAIL_HITS: AtomicU64 = AtomicU64::new(0);

/// `TIDEMARK_FAIL_AT=<point>[@<n>]` makes the `n`-th pass (default: first) through
/// `fail_point("<point>")` return an I/O error, as a full disk or a revoked permission
/// would: for tests of failure handling. Points: `sink_write:<sink name>`.
pub fn fail_point(point: &str) -> crate::error::Result<()> {
    let armed = FAIL_ARMED.get_or_init(|| parse_armed("TIDEMARK_FAIL_AT"));
    if let Some((p, n)) = armed
        && p == point
        && FAIL_HITS.fetch_add(1, Ordering::SeqCst) + 1 == *n
    {
        return Err(crate::error::Error::io(
            format!("writing at {point}"),
            std::io::Error::other("simulated write failure (TIDEMARK_FAIL_AT)"),
        ));
    }
    Ok(())
}

/// `TIDEMARK_PAUSE_AT=<point>` makes every pass through `pause_point("<point>")` wait
/// forever: a batch that never ends, for tests of what waits on one (`FLUSH` and its
/// cancel). Points: `batch_start`.
pub async fn pause_point(point: &str) {
    static PAUSE: OnceLock<Option<String>> = OnceLock::new();
    let armed = PAUSE.get_or_init(|| std::env::var("TIDEMARK_PAUSE_AT").ok());
    if armed.as_deref() == Some(point) {
        eprintln!("tidemark: pause point {point} reached; waiting forever");
        std::future::pending::<()>().await;
    }
}
