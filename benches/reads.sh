#!/usr/bin/env bash
# Reads under load: dashboards querying a sink table while its sink keeps committing, side
# by side with PostgreSQL 15 holding the same rows.
#
#   benches/reads.sh [ROWS] [SECONDS]        (default 70000 rows, 20 seconds)
#
# Tidemark: a table stream `clicks (page INT, x DOUBLE PRECISION)`, ROWS rows by COPY,
# a Delta sink `clicks_sink` with `trigger = 'processing_time 1 second'`, and a writer
# that INSERTs 10 rows every 0.2 s, so the sink commits a new table version every
# second. PostgreSQL 15: a table `clicks_sink` with the same rows and the same writer.
# Then pgbench, 16 clients for SECONDS, half the transactions a point aggregate
# (`SELECT count(*), avg(x) FROM clicks_sink WHERE page = :p`), half a top 3
# (`SELECT page, count(*) ... GROUP BY page ORDER BY n DESC LIMIT 3`); prints queries/s
# and latency p50/p99 per query and overall, from pgbench's per-transaction logs.
# Starts a release tidemark (SKIP_BUILD: use the binary as built) and a PostgreSQL 15
# cluster of its own, as benches/ingest.sh does. Needs psql and pgbench.
set -euo pipefail
ROWS=${1:-70000}
SECS=${2:-20}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${BENCH_DIR:-/tmp/reads-bench}
PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
mkdir -p "$WORK"
CSV=$WORK/rows-$ROWS.csv
python3 - "$CSV" "$ROWS" <<'PY'
import random, sys
random.seed(5)
with open(sys.argv[1], "w") as f:
    for i in range(int(sys.argv[2])):
        f.write(f"{random.randrange(100)},{random.random() * 100:.3f}\n")
PY
rm -rf "$WORK"/log-*
source "$ROOT/benches/side_by_side.sh"
TM="psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p $TM_PORT -U tidemark"
PG="psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p $PG_PORT -U postgres"
$TM -c "CREATE STREAM clicks (page INT, x DOUBLE PRECISION)"
$TM -c "CREATE SINK clicks_sink WITH (trigger = 'processing_time 1 second') AS SELECT page, x FROM clicks"
$TM -c "\\copy clicks FROM '$CSV' WITH (FORMAT csv)"
$TM -c "FLUSH SINK clicks_sink"
$PG -c "CREATE TABLE clicks_sink (page INT, x DOUBLE PRECISION)"
$PG -c "\\copy clicks_sink FROM '$CSV' WITH (FORMAT csv)"
$PG -c "ANALYZE clicks_sink"
cat > "$WORK/point.sql" <<'SQL'
\set p random(0, 99)
SELECT count(*), avg(x) FROM clicks_sink WHERE page = :p;
SQL
cat > "$WORK/top3.sql" <<'SQL'
SELECT page, count(*) AS n FROM clicks_sink GROUP BY page ORDER BY n DESC LIMIT 3;
SQL
run() {  # name, psql command for the writer's INSERTs, pgbench connection options
    local name=$1 insert=$2
    shift 2
    (while true; do
        $insert -c "INSERT INTO $INTO VALUES (1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 5.0), \
            (6, 6.0), (7, 7.0), (8, 8.0), (9, 9.0), (10, 10.0)" > /dev/null 2>&1 || true
        sleep 0.2
    done) &
    WRITER=$!
    (cd "$WORK" && pgbench -n -M simple -c 16 -j 2 -T "$SECS" -f point.sql -f top3.sql \
        -l --log-prefix="log-$name" "$@" > "$WORK/pgbench-$name.txt" 2>&1)
    kill "$WRITER"; wait "$WRITER" 2>/dev/null || true
    WRITER=
    python3 - "$name" "$SECS" "$WORK"/log-"$name".* <<'PY'
import sys
name, secs, files = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
lat = {0: [], 1: []}
for f in files:
    for line in open(f):
        parts = line.split()
        lat[int(parts[3])].append(int(parts[2]) / 1000)
def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")
total = lat[0] + lat[1]
print(f"{name:9} queries/s={len(total) / secs:7.0f}  all p50={pct(total, .5):6.1f} ms p99={pct(total, .99):6.1f} ms"
      f"  point p50={pct(lat[0], .5):6.1f} p99={pct(lat[0], .99):6.1f}"
      f"  top3 p50={pct(lat[1], .5):6.1f} p99={pct(lat[1], .99):6.1f}")
PY
}
INTO=clicks run tidemark "$TM" -h 127.0.0.1 -p "$TM_PORT" -U tidemark
$TM -c "SELECT count(*) AS tidemark_rows_at_end FROM clicks_sink"
INTO=clicks_sink run postgres "$PG" -h 127.0.0.1 -p "$PG_PORT" -U postgres postgres
