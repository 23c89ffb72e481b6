#!/usr/bin/env bash
# The seed query end to end, and side by side with Spark on the same files:
#   five-minute page-view windows, ten-minute watermark, append, available_now.
#
#   benches/windowed.sh [EVENTS]            (default 1000000; 100 files, FILES to change)
#
# Files: /tmp/oracle-bench/landing-<EVENTS>, made exactly as shared/oracle-tools/bench.py
# makes them (gen_clicks.py --files 100 --users 10000 --pages 10 --span 24h
# --late-fraction 0.05 --lateness-max 9m --seed 7), so Spark's bench.py reads the same
# files. Prints wall time, events/s, events/s per core and peak RSS, and, when Spark's
# output for the same files is given in SPARK_CSV, whether the results are identical.
# Environment: MFPT (max_files_per_trigger, default 10), BENCH_DIR, SPARK_CSV, STORE
# (state_store, default memory; rocksdb needs a binary built with --features rocksdb),
# SKIP_BUILD (use the binary as built), READ_AHEAD (the stream's read_ahead, default true),
# FILES (how many files the events are in, default 100; other counts land in
# landing-<EVENTS>-f<FILES>; bench.py --files <FILES> makes the same files in its own
# --workdir), MODE (output_mode, default append), TARGET (sink, the default: a Delta sink;
# view: a materialized view, whose rows are copied out at the end). With MODE=update and
# SPARK_CSV from Spark's memory sink (bench.py --extra "--sink memory --mode update"),
# Spark's changelog is reduced to each window's last row (the largest count) first.
set -euo pipefail
EVENTS=${1:-1000000}
MFPT=${MFPT:-10}
FILES=${FILES:-100}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${BENCH_DIR:-/tmp/oracle-bench}
LANDING=$WORK/landing-$EVENTS
[ "$FILES" = 100 ] || LANDING=$LANDING-f$FILES
GEN=${GEN_CLICKS:-$ROOT/../shared/oracle-tools/gen_clicks.py}
if [ ! -d "$LANDING" ]; then
    python3 "$GEN" --out "$LANDING" --events "$EVENTS" --files "$FILES" --users 10000 --pages 10 \
        --span 24h --late-fraction 0.05 --lateness-max 9m --seed 7 --quiet
fi
[ -n "${SKIP_BUILD:-}" ] || (cd "$ROOT" && cargo build --release --quiet)
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/tidemark
RUN=$WORK/tidemark-$EVENTS
rm -rf "$RUN" && mkdir -p "$RUN"
case "${TARGET:-sink}" in
    sink) TARGET_SQL="CREATE SINK page_views_5m"; PATH_OPTION="path = '$RUN/sink'," ;;
    view) TARGET_SQL="CREATE MATERIALIZED VIEW page_views_5m"; PATH_OPTION="" ;;
    *) echo "TARGET is sink or view" >&2; exit 2 ;;
esac
cat > "$RUN/pipeline.sql" <<SQL
CREATE STREAM clicks (user_id TEXT, page TEXT, event_time TIMESTAMP, duration_s DOUBLE PRECISION)
WITH (connector = 'file', format = 'json', path = '$LANDING', max_files_per_trigger = $MFPT,
    read_ahead = ${READ_AHEAD:-true});
$TARGET_SQL WITH ($PATH_OPTION watermark = 'event_time - 10 minutes',
    output_mode = '${MODE:-append}', trigger = 'available_now', state_store = '${STORE:-memory}') AS
SELECT window.start AS window_start, window.end AS window_end, page,
       count(*) AS views, sum(duration_s) AS total_duration_s
FROM clicks GROUP BY window(event_time, '5 minutes'), page;
COPY (SELECT * FROM page_views_5m) TO '$RUN/output.csv' STORED AS CSV;
SQL
RUST_LOG=warn /usr/bin/time -v "$BIN" run "$RUN/pipeline.sql" --data-dir "$RUN/data" \
    > "$RUN/out.txt" 2> "$RUN/time.txt"
python3 - "$RUN" "$EVENTS" "${SPARK_CSV:-}" "$ROOT/benches" "${MODE:-append}" <<'PY'
import csv, re, sys
run, events, spark_csv, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[5]
sys.path.insert(0, sys.argv[4])
from timed import wall_and_rss
secs, rss = wall_and_rss(run + "/time.txt")
def iso(s):
    s = s.replace(" ", "T")
    s = re.sub(r"\.0+$", "", s.replace("Z", ""))
    return s + "Z"
rows = []
with open(run + "/output.csv") as f:
    for r in csv.DictReader(f):
        rows.append([iso(r["window_start"]), iso(r["window_end"]), r["page"], int(r["views"]),
                     "%.3f" % float(r["total_duration_s"])])
rows.sort()
with open(run + "/canonical.csv", "w", newline="") as f:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(["window_start", "window_end", "page", "views", "total_duration_s"])
    w.writerows(rows)
print(f"events={events} wall={secs:.2f}s events/s={events/secs:,.0f} "
      f"events/s/core={events/secs/2:,.0f} peak_rss={rss/1024:.0f} MiB windows={len(rows)}")
if spark_csv:
    want = open(spark_csv).read()
    if mode == "update":
        # Spark's memory sink holds every emitted row; a window's last has its largest count.
        last = {}
        with open(spark_csv) as f:
            for r in csv.DictReader(f):
                key = (r["window_start"], r["window_end"], r["page"])
                if key not in last or int(r["views"]) > int(last[key]["views"]):
                    last[key] = r
        lines = ["window_start,window_end,page,views,total_duration_s"]
        lines += [",".join(r[k] for k in ["window_start", "window_end", "page", "views",
                                           "total_duration_s"]) for _, r in sorted(last.items())]
        want = "\n".join(lines) + "\n"
    same = want == open(run + "/canonical.csv").read()
    print("identical to Spark's output:", same)
PY
