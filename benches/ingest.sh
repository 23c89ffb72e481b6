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
[ -n "${SKIP_BUILD:-}" ] || (cd "$ROOT" && cargo build --release --quiet)
BIN=${BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/tidemark}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
TM_PORT=$(free_port)
PG_PORT=$(free_port)
rm -rf "$WORK/tidemark-data" "$WORK/pg"
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
TM_PID=
cleanup() {
    [ -z "$TM_PID" ] || kill "$TM_PID" 2>/dev/null || true
    as_pg "$PGBIN/pg_ctl" -D "$WORK/pg/data" -m fast stop > /dev/null 2>&1 || true
}
trap cleanup EXIT
RUST_LOG=warn "$BIN" serve --listen "127.0.0.1:$TM_PORT" --data-dir "$WORK/tidemark-data" \
    > /dev/null 2> "$WORK/tidemark.log" &
TM_PID=$!
mkdir -p "$WORK/pg" && { [ "$(id -u)" != 0 ] || chown postgres "$WORK/pg"; }
as_pg "$PGBIN/initdb" -D "$WORK/pg/data" -U postgres --auth=trust > "$WORK/pg/initdb.log"
as_pg "$PGBIN/pg_ctl" -D "$WORK/pg/data" -o "-p $PG_PORT -k /tmp -c listen_addresses=127.0.0.1" \
    -l "$WORK/pg/server.log" -w start > /dev/null
for _ in $(seq 100); do
    psql -X -q -h 127.0.0.1 -p "$TM_PORT" -U tidemark -c 'SELECT 1' > /dev/null 2>&1 && break
    sleep 0.1
done
python3 "$ROOT/benches/ingest.py" "$TM_PORT" "$TM_PID" "$PG_PORT" "$CSV" "$ROWS"
