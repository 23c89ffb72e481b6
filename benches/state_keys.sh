#!/usr/bin/env bash
# Peak memory for large state: one window holding KEYS distinct group keys, with the
# memory store and with the RocksDB store.
#
#   benches/state_keys.sh [KEYS] [STORE]     (defaults: 10000000 rocksdb; STORE = memory|rocksdb)
#
# KEYS events with distinct user ids, one day of event times, in 20 JSON files, are
# aggregated by (1-day window, user_id) in append mode with a 1-day watermark delay: no
# window closes, so the state ends with KEYS rows and the sink writes nothing. The run is
# `tidemark run` (available_now, 2 files per batch); prints wall time, peak RSS, the state
# rows of the last batch and the state's size on disk. Needs the rocksdb feature (built
# here unless SKIP_BUILD is set). Environment: BENCH_DIR (default /tmp/state-bench), FILES
# (default 20), MFPT (2).
set -euo pipefail
KEYS=${1:-10000000}
STORE=${2:-rocksdb}
FILES=${FILES:-20}
MFPT=${MFPT:-2}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${BENCH_DIR:-/tmp/state-bench}
LANDING=$WORK/landing-$KEYS-$FILES
if [ ! -d "$LANDING" ]; then
    mkdir -p "$LANDING.tmp"
    python3 - "$LANDING.tmp" "$KEYS" "$FILES" <<'PY'
import os, sys, time
out, keys, files = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
per = -(-keys // files)
base = 1781049600  # 2026-06-10T00:00:00Z
now = time.time() - 3600
stamps = [time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(base + s)) for s in range(86400)]
os.makedirs(out, exist_ok=True)
for f in range(files):
    path = os.path.join(out, "part-%04d.json" % f)
    with open(path, "w") as fh:
        fh.writelines('{"user_id":"u%d","event_time":"%s","amount":%d}\n' % (
            i, stamps[(i * 7919) % 86400], i % 100)
            for i in range(f * per, min((f + 1) * per, keys)))
    os.utime(path, (now + f, now + f))
PY
    mv "$LANDING.tmp" "$LANDING"
fi
[ -n "${SKIP_BUILD:-}" ] || (cd "$ROOT" && cargo build --release --features rocksdb --quiet)
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/tidemark
RUN=$WORK/tidemark-$KEYS-$STORE-$FILES-$MFPT
rm -rf "$RUN" && mkdir -p "$RUN"
cat > "$RUN/pipeline.sql" <<SQL
CREATE STREAM events (user_id TEXT, event_time TIMESTAMP, amount BIGINT,
    WATERMARK FOR event_time AS event_time - INTERVAL '1 day')
WITH (format = 'json', path = '$LANDING', max_files_per_trigger = $MFPT);
CREATE SINK per_user WITH (path = '$RUN/sink', trigger = 'available_now', state_store = '$STORE') AS
SELECT window.start AS day, user_id, count(*) AS n, sum(amount) AS total
FROM events GROUP BY window(event_time, '1 day'), user_id;
COPY (SELECT batch_id, batch_duration_ms, num_input_rows, state_rows_total
      FROM tidemark.progress ORDER BY batch_id) TO '$RUN/progress.csv' STORED AS CSV;
SQL
RUST_LOG=warn /usr/bin/time -v "$BIN" run "$RUN/pipeline.sql" --data-dir "$RUN/data" \
    > "$RUN/out.txt" 2> "$RUN/time.txt"
python3 - "$RUN" "$KEYS" "$STORE" "$ROOT/benches" <<'PY'
import csv, subprocess, sys
run, keys, store = sys.argv[1], int(sys.argv[2]), sys.argv[3]
sys.path.insert(0, sys.argv[4])
from timed import wall_and_rss
secs, rss = wall_and_rss(run + "/time.txt")
rows = list(csv.DictReader(open(run + "/progress.csv")))
state = int(rows[-1]["state_rows_total"])
disk = subprocess.run(["du", "-sm", run + "/data/checkpoints"], capture_output=True,
                      text=True).stdout.split()[0]
print(f"store={store} keys={keys} state_rows={state} batches={len(rows)} wall={secs:.1f}s "
      f"peak_rss={rss/1024:.0f} MiB checkpoint_on_disk={disk} MiB")
assert state == keys, f"state holds {state} keys, expected {keys}"
PY
