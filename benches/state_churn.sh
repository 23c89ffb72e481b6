#!/usr/bin/env bash
# State churn: many keys enter and leave the state every batch.
#
#   benches/state_churn.sh [STORE]        (STORE = memory | rocksdb; default memory)
#
# 5 M events in 100 JSON files (one per batch), in event-time order over one day, with user
# ids drawn from 1 M (seeded), aggregated by (10-minute window, user_id) in append mode with
# a 1-minute watermark delay: each batch adds ~50 k keys and evicts a closed window's
# 34–68 k keys. Prints wall time, peak RSS, batch times, and the closed windows with their
# events (the last windows stay open; both stores must print the same).
# The sink does not auto-compact (Spark's parquet sink beside it does not either; the cost of
# auto-compaction here is in docs/benchmarks.md).
# Environment: BENCH_DIR (default /tmp/state-churn), SKIP_BUILD (use the binary as built),
# READ_AHEAD (the stream's read_ahead, default true).
set -euo pipefail
STORE=${1:-memory}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${BENCH_DIR:-/tmp/state-churn}
# The files (made once): benches/flink.py's churn_files, which its --query churn reads too.
LANDING=$(python3 -c "import sys; sys.path.insert(0, '$ROOT/benches'); import flink; \
print(flink.churn_files('$WORK', 'landing'))")
[ -n "${SKIP_BUILD:-}" ] || (cd "$ROOT" && cargo build --release --features rocksdb --quiet)
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/tidemark
RUN=$WORK/tidemark-$STORE
rm -rf "$RUN" && mkdir -p "$RUN"
cat > "$RUN/pipeline.sql" <<SQL
CREATE STREAM events (user_id TEXT, event_time TIMESTAMP, amount BIGINT,
    WATERMARK FOR event_time AS event_time - INTERVAL '1 minute')
WITH (format = 'json', path = '$LANDING', max_files_per_trigger = 1, read_ahead = ${READ_AHEAD:-true});
CREATE SINK per_user WITH (path = '$RUN/sink', trigger = 'available_now', state_store = '$STORE',
    auto_compact = 0) AS
SELECT window.start AS w, user_id, count(*) AS n, sum(amount) AS total
FROM events GROUP BY window(event_time, '10 minutes'), user_id;
COPY (SELECT batch_id, batch_duration_ms, state_rows_total, state_rows_removed
      FROM tidemark.progress ORDER BY batch_id) TO '$RUN/progress.csv' STORED AS CSV;
COPY (SELECT count(*) AS windows, sum(n) AS events FROM per_user) TO '$RUN/result.csv' STORED AS CSV;
SQL
RUST_LOG=warn /usr/bin/time -v "$BIN" run "$RUN/pipeline.sql" --data-dir "$RUN/data" \
    > "$RUN/out.txt" 2> "$RUN/time.txt"
python3 - "$RUN" "$STORE" "$ROOT/benches" <<'PY'
import csv, sys
run, store = sys.argv[1], sys.argv[2]
sys.path.insert(0, sys.argv[3])
from timed import wall_and_rss
secs, rss = wall_and_rss(run + "/time.txt")
batches = list(csv.DictReader(open(run + "/progress.csv")))
ms = sorted(int(b["batch_duration_ms"]) for b in batches)
result = next(csv.DictReader(open(run + "/result.csv")))
print(f"store={store} batches={len(batches)} wall={secs:.1f}s peak_rss={rss/1024:.0f} MiB "
      f"batch_ms_median={ms[len(ms)//2]} batch_ms_max={ms[-1]} "
      f"closed_windows={result['windows']} events_in_closed_windows={result['events']}")
PY
