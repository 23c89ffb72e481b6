#!/usr/bin/env bash
# Ingest, side by side with PostgreSQL 15 on the same machine and the same rows:
# COPY of ROWS rows (default 10 M), single-row INSERT from 1 and 16 connections, and
# INSERT -> row visible in a Delta sink with the default trigger.
#
#   benches/ingest.sh [ROWS]
#
# Starts a release tidemark (SKIP_BUILD: use the binary as built) and a PostgreSQL 15
# cluster of its own (Debian's postgresql-15, initdb into BENCH_DIR, fsync and
# synchronous_commit on, as shipped), both on loopback ports, and stops both at the end.
# Needs psql and psycopg 3 (`pip install 'psycopg[binary]'`).
set -euo pipefail
ROWS=${1:-10000000}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${BENCH_DIR:-/tmp/ingest-bench}
PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
mkdir -p "$WORK"
CSV=$WORK/rows-$ROWS.csv
if [ ! -f "$CSV" ]; then
    python3 - "$CSV.tmp" "$ROWS" <<'PY'
import random, sys
out, n = sys.argv[1], int(sys.argv[2])
random.seed(11)
base = 1781085600  # 2026-06-10T10:00:00Z
import time
with open(out, "w") as f:
    for i in range(n):
        t = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(base + i // 1000))
        f.write(f"{i},{t},{random.random() * 100:.3f}\n")
PY
    mv "$CSV.tmp" "$CSV"
fi
source "$ROOT/benches/side_by_side.sh"
python3 "$ROOT/benches/ingest.py" "$TM_PORT" "$TM_PID" "$PG_PORT" "$CSV" "$ROWS"
