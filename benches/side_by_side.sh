# Sourced by the benchmarks that run beside PostgreSQL 15 (ingest.sh, reads.sh): starts a
# release tidemark and a PostgreSQL 15 cluster of its own (initdb into $WORK/pg, fsync and
# synchronous_commit on, as shipped), both on free loopback ports, and stops both (and a
# background $WRITER, if the script set one) when the script exits.
# Needs ROOT, WORK and PGBIN; builds the binary unless SKIP_BUILD is set (BIN overrides).
# Sets BIN, TM_PORT, PG_PORT and TM_PID.
[ -n "${SKIP_BUILD:-}" ] || (cd "$ROOT" && cargo build --release --quiet)
BIN=${BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/tidemark}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
TM_PORT=$(free_port)
PG_PORT=$(free_port)
rm -rf "$WORK/tidemark-data" "$WORK/pg"
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
TM_PID=
WRITER=
cleanup() {
    [ -z "$WRITER" ] || kill "$WRITER" 2>/dev/null || true
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
