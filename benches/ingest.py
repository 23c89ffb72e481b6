"""Ingest side by side: Tidemark (a table stream) and PostgreSQL 15 (a table), same rows,
same client (psql for COPY, psycopg 3 for INSERT), both with fsync on.

    python3 benches/ingest.py TIDEMARK_PORT TIDEMARK_PID PG_PORT CSV ROWS

Prints one line per measurement:
  copy        rows/s, MB/s, peak RSS of the server process (VmHWM)
  insert-1    single-row INSERTs from 1 connection: statements/s, p50, p99 (ms)
  insert-16   the same from 16 connections
  visible     Tidemark: INSERT acknowledged -> row readable in a Delta sink (default
              trigger), p50/p99 over 200 rows, probed by a reader's SELECT and by the
              sink's committed offset; PostgreSQL: INSERT -> SELECT sees it
"""
import datetime
import os
import statistics
import subprocess
import sys
import threading
import time

import psycopg

tm_port, tm_pid, pg_port, csv_path, rows = sys.argv[1:6]
rows = int(rows)
TS = datetime.datetime(2026, 6, 10, 10, 0, 0)


def dsn(port, db="tidemark", user="tidemark"):
    return f"host=127.0.0.1 port={port} user={user} dbname={db}"


SYSTEMS = [("tidemark", dsn(tm_port)), ("postgres", dsn(pg_port, "postgres", "postgres"))]


def hwm_kib(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (FileNotFoundError, TypeError):
        return None


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def setup(name, conn_str):
    with psycopg.connect(conn_str, autocommit=True) as c:
        if name == "postgres":
            for t in ("events", "single", "vis"):
                c.execute(f"DROP TABLE IF EXISTS {t}")
                c.execute(f"CREATE TABLE {t} (id BIGINT NOT NULL, ts TIMESTAMP, v DOUBLE PRECISION)")
        else:
            for t in ("events", "single", "vis"):
                c.execute(f"CREATE STREAM {t} (id BIGINT NOT NULL, ts TIMESTAMP, v DOUBLE PRECISION)")
            c.execute("CREATE SINK vis_sink AS SELECT id, ts, v FROM vis")


def copy(name, conn_str):
    size = os.path.getsize(csv_path)
    port = tm_port if name == "tidemark" else pg_port
    user, db = ("tidemark", "tidemark") if name == "tidemark" else ("postgres", "postgres")
    t = time.monotonic()
    subprocess.run(["psql", "-X", "-q", "-h", "127.0.0.1", "-p", port, "-U", user, "-d", db, "-c",
                    f"\\copy events FROM '{csv_path}' WITH (FORMAT csv)"], check=True)
    secs = time.monotonic() - t
    with psycopg.connect(conn_str, autocommit=True) as c:
        n = c.execute("SELECT count(*) FROM events").fetchone()[0]
    assert n == rows, (name, n)
    # PostgreSQL copies in a backend process that is gone by now: no RSS for it.
    rss = f"server peak RSS {hwm_kib(tm_pid) / 1024:.0f} MiB" if name == "tidemark" else ""
    print(f"copy {name}: {rows} rows in {secs:.2f} s = {rows / secs / 1e6:.2f} M rows/s, "
          f"{size / secs / 1e6:.0f} MB/s {rss}", flush=True)


def inserts(name, conn_str, clients, per_client):
    lat = []
    lock = threading.Lock()
    barrier = threading.Barrier(clients)

    def run(k):
        mine = []
        with psycopg.connect(conn_str, autocommit=True) as c:
            cur = c.cursor()
            barrier.wait()
            for i in range(per_client):
                t = time.perf_counter()
                cur.execute("INSERT INTO single VALUES (%s, %s, %s)", (k * 10_000_000 + i, TS, 1.0))
                mine.append(time.perf_counter() - t)
        with lock:
            lat.extend(mine)

    t = time.monotonic()
    threads = [threading.Thread(target=run, args=(k,)) for k in range(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    secs = time.monotonic() - t
    print(f"insert-{clients} {name}: {len(lat)} statements in {secs:.2f} s = {len(lat) / secs:.0f}/s, "
          f"p50 {pct(lat, 50) * 1000:.2f} ms, p99 {pct(lat, 99) * 1000:.2f} ms", flush=True)


def visible(name, conn_str, n=200, probe="select"):
    """INSERT acknowledged -> the row is visible. probe "select": a reader polls the sink's
    table (for Tidemark each poll opens the Delta table); "progress": polls the sink's
    last committed offset in tidemark.progress (written after the Delta commit)."""
    lat = []
    with psycopg.connect(conn_str, autocommit=True) as w, psycopg.connect(conn_str, autocommit=True) as r:
        target = "vis_sink" if name == "tidemark" else "vis"
        base = r.execute("SELECT count(*) FROM vis").fetchone()[0]
        for i in range(n):
            row_id = base + i
            w.execute("INSERT INTO vis VALUES (%s, %s, %s)", (row_id, TS, 1.0))
            t = time.perf_counter()
            if probe == "select":
                while r.execute(f"SELECT count(*) FROM {target} WHERE id = %s", (row_id,)).fetchone()[0] == 0:
                    pass
            else:
                q = ("SELECT max(CAST(source_end_offset AS BIGINT)) FROM tidemark.progress "
                     "WHERE name = 'vis_sink'")
                while (r.execute(q).fetchone()[0] or 0) <= row_id:
                    pass
            lat.append(time.perf_counter() - t)
    what = {("tidemark", "select"): "INSERT acknowledged -> a reader's SELECT on the Delta sink sees it",
            ("tidemark", "progress"): "INSERT acknowledged -> committed to the Delta sink (progress polled)",
            ("postgres", "select"): "INSERT acknowledged -> visible to SELECT"}[(name, probe)]
    print(f"visible {name}: {what}: p50 {pct(lat, 50) * 1000:.1f} ms, p99 {pct(lat, 99) * 1000:.1f} ms "
          f"(mean {statistics.mean(lat) * 1000:.1f} ms, {n} rows)", flush=True)


for name, conn_str in SYSTEMS:
    setup(name, conn_str)
for name, conn_str in SYSTEMS:
    copy(name, conn_str)
for clients, per in ((1, 2000), (16, 500)):
    for name, conn_str in SYSTEMS:
        inserts(name, conn_str, clients, per)
for name, conn_str in SYSTEMS:
    visible(name, conn_str)
visible(*SYSTEMS[0], probe="progress")
