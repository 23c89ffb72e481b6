#!/usr/bin/env bash
# End-to-end benchmark of a stateless available_now sink: JSON files -> filter/project -> Delta.
#
#   benches/stateless.sh [EVENTS] [FILES]        (defaults: 1000000 events in 100 files)
#
# Lands the files once with the oracle's clickstream generator (the same files Spark's
# bench.py uses), builds the release binary, then times `tidemark run` from process start
# to exit under /usr/bin/time -v and prints wall time, events/s and peak RSS.
# Environment: BENCH_DIR (default /tmp/tidemark-bench), MFPT (max_files_per_trigger,
# default 10), GEN_CLICKS (path of gen_clicks.py), SKIP_BUILD (use the binary as built).
set -euo pipefail
EVENTS=${1:-1000000}
FILES=${2:-100}
MFPT=${MFPT:-10}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${BENCH_DIR:-/tmp/tidemark-bench}
GEN=${GEN_CLICKS:-$ROOT/../shared/oracle-tools/gen_clicks.py}
LANDING=$WORK/landing-$EVENTS-$FILES

mkdir -p "$WORK"
if [ ! -d "$LANDING" ]; then
    python3 "$GEN" --out "$LANDING" --events "$EVENTS" --files "$FILES" --seed 1 --quiet
fi
[ -n "${SKIP_BUILD:-}" ] || (cd "$ROOT" && cargo build --release --quiet)
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/tidemark

rm -rf "$WORK/data" "$WORK/sink"
cat > "$WORK/pipeline.sql" <<SQL
CREATE STREAM clicks (user_id TEXT, page TEXT, event_time TIMESTAMP, duration_s DOUBLE PRECISION)
WITH (connector = 'file', format = 'json', path = '$LANDING', max_files_per_trigger = $MFPT);
CREATE SINK clicks_clean WITH (path = '$WORK/sink', trigger = 'available_now') AS
SELECT user_id, upper(page) AS page, event_time, duration_s, duration_s > 30 AS long_view
FROM clicks WHERE duration_s >= 0;
SELECT count(*) AS rows_in_sink FROM clicks_clean;
SQL

RUST_LOG=warn /usr/bin/time -v "$BIN" run "$WORK/pipeline.sql" --data-dir "$WORK/data" \
    > "$WORK/out.txt" 2> "$WORK/time.txt"
cat "$WORK/out.txt"
read -r SECS RSS_KB < <(python3 "$ROOT/benches/timed.py" "$WORK/time.txt")
python3 - <<PY
events, secs, rss = $EVENTS, $SECS, $RSS_KB
cores = 2
print(f"events={events} files=$FILES max_files_per_trigger=$MFPT")
print(f"wall={secs:.2f}s events/s={events/secs:,.0f} events/s/core={events/secs/cores:,.0f} peak_rss={rss/1024:.0f} MiB")
PY
