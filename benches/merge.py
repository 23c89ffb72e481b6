#!/usr/bin/env python3
"""A MERGE sink's batch cost against the size of its target (issue 12, item 2).

    python3 benches/merge.py BIN [--sizes 1000,100000,1000000,10000000] [--batches 5]
                                 [--batch-rows 1000] [--work /tmp/merge-bench]

BIN is a release `tidemark`. For each size N, a fresh server (free port, fresh data
directory) gets a target table of N users, written by 20 INSERTs of contiguous ids (so 20
files, each holding a narrow range of ids), and the seed's upsert as a MERGE sink over a
table-fed stream:

    MERGE INTO target AS t USING (latest click per user of the batch) AS s
    ON t.user_id = s.user_id
    WHEN MATCHED AND s.event_time > t.event_time THEN UPDATE SET *
    WHEN NOT MATCHED THEN INSERT *

Each batch is one INSERT of BATCH_ROWS clicks, then FLUSH SINK. Two kinds of batch:

  narrow: the clicks' users are a contiguous run of ids (the newest users, half of them
          new): delta-rs prunes the target's files by the source's key range, and
          rewrites only the file(s) holding matched rows;
  wide:   users drawn from the whole range: every file holds a matched row.

Reported per size and kind, over BATCHES batches: the batch's addBatch time (the MERGE)
and its whole trigger time from tidemark.progress (median and max), and from the MERGE's
commit in the Delta log the target files scanned and skipped, and the rows updated and
inserted. Spark cannot run this side by side here: Delta's Spark jar is not reachable.
"""
import argparse
import datetime as dt
import glob
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import time

import psycopg

ap = argparse.ArgumentParser()
ap.add_argument("bin")
ap.add_argument("--sizes", default="1000,100000,1000000,10000000")
ap.add_argument("--batches", type=int, default=5)
ap.add_argument("--batch-rows", type=int, default=1000)
ap.add_argument("--work", default="/tmp/merge-bench")
args = ap.parse_args()

BASE = dt.datetime(2026, 6, 10, 10, 0, 0)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Server:
    def __init__(self, name):
        self.dir = os.path.join(args.work, name)
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        self.port = free_port()
        self.proc = subprocess.Popen(
            [args.bin, "serve", "--listen", f"127.0.0.1:{self.port}",
             "--data-dir", os.path.join(self.dir, "data")],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.dir, "log"), "w"),
            env={**os.environ, "RUST_LOG": "warn"})
        end = time.time() + 60
        while True:
            try:
                self.connect().close()
                return
            except psycopg.OperationalError:
                if time.time() > end or self.proc.poll() is not None:
                    raise SystemExit(f"the server did not start: {self.dir}/log")
                time.sleep(0.05)

    def connect(self):
        return psycopg.connect(f"host=127.0.0.1 port={self.port} user=bench dbname=bench",
                               autocommit=True)

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


FILES = 20


def live_files(table_dir):
    """The table's data files: added and not removed since, by its log."""
    live = set()
    for path in sorted(glob.glob(os.path.join(table_dir, "_delta_log", "*.json"))):
        for line in open(path):
            a = json.loads(line)
            if "add" in a:
                live.add(a["add"]["path"])
            if "remove" in a:
                live.discard(a["remove"]["path"])
    return len(live)


def merge_metrics(table_dir):
    """The operationMetrics of each MERGE commit in the table's log, by batch id."""
    out = {}
    for path in glob.glob(os.path.join(table_dir, "_delta_log", "*.json")):
        txn, info = None, None
        for line in open(path):
            a = json.loads(line)
            if "txn" in a:
                txn = a["txn"]["version"]
            if "commitInfo" in a:
                info = a["commitInfo"]
        if txn is not None and info is not None:
            out[txn] = info.get("operationMetrics", {})
    return out


def run(size):
    server = Server(f"n{size}")
    conn = server.connect()
    t0 = time.time()
    conn.execute("CREATE TABLE target (user_id BIGINT, page TEXT, event_time TIMESTAMP, "
                 "duration_s DOUBLE PRECISION)")
    # FILES inserts of contiguous ids: one file each, holding a narrow range of user ids.
    chunk = max(1, -(-size // FILES))
    for start in range(0, size, chunk):
        conn.execute(
            "INSERT INTO target SELECT value, '/p' || (value % 100), "
            "TIMESTAMP '2026-06-10 09:00:00', CAST(value % 7 AS DOUBLE) "
            f"FROM range({start}, {min(size, start + chunk)})")
    fill = time.time() - t0
    files = live_files(os.path.join(server.dir, "data/tables/target"))
    conn.execute("CREATE STREAM clicks (user_id BIGINT, page TEXT, event_time TIMESTAMP, "
                 "duration_s DOUBLE PRECISION)")
    conn.execute(
        "CREATE SINK upsert AS MERGE INTO target AS t "
        "USING (SELECT user_id, page, event_time, duration_s FROM ("
        "  SELECT *, row_number() OVER (PARTITION BY user_id ORDER BY event_time DESC) AS rn "
        "  FROM clicks) WHERE rn = 1) AS s "
        "ON t.user_id = s.user_id "
        "WHEN MATCHED AND s.event_time > t.event_time THEN UPDATE SET * "
        "WHEN NOT MATCHED THEN INSERT *")
    rng = random.Random(size)
    results = {}
    batch = 0
    for kind in ["narrow", "wide"]:
        ids = []
        for i in range(args.batches):
            if kind == "narrow":
                # The newest ids: half already in the target (the last file's, or the
                # previous batch's new ones), half new.
                half = args.batch_rows // 2
                start = size - half + i * half
                users = list(range(start, start + args.batch_rows))
            else:
                users = [rng.randrange(size) for _ in range(args.batch_rows)]
            when = BASE + dt.timedelta(minutes=batch + 1)
            with conn.cursor().copy("COPY clicks FROM STDIN") as cp:
                for u in users:
                    cp.write_row((u, f"/q{u % 50}", when, 1.0))
            conn.execute("FLUSH SINK upsert")
            ids.append(batch)
            batch += 1
        rows = conn.execute(
            "SELECT batch_id, duration_ms FROM tidemark.progress WHERE name = 'upsert'"
        ).fetchall()
        durations = {b: json.loads(d) for b, d in rows}
        metrics = merge_metrics(os.path.join(server.dir, "data/tables/target"))
        add = [durations[b]["addBatch"] for b in ids]
        trig = [durations[b]["triggerExecution"] for b in ids]
        m = [metrics.get(b, {}) for b in ids]
        results[kind] = dict(
            add_p50=statistics.median(add), add_max=max(add),
            trigger_p50=statistics.median(trig),
            scanned=statistics.median(x.get("num_target_files_scanned", 0) for x in m),
            skipped=statistics.median(x.get("num_target_files_skipped_during_scan", 0) for x in m),
            updated=statistics.median(x.get("num_target_rows_updated", 0) for x in m),
            inserted=statistics.median(x.get("num_target_rows_inserted", 0) for x in m),
        )
    count = conn.execute("SELECT count(*) FROM target").fetchone()[0]
    conn.close()
    server.stop()
    return fill, files, count, results


print(f"batch of {args.batch_rows} clicks, {args.batches} batches per kind; medians")
print(f"{'target rows':>12} {'files':>5} {'fill s':>7} {'kind':>6} {'addBatch ms':>11} "
      f"{'max':>6} {'trigger ms':>10} {'scanned':>7} {'skipped':>7} {'updated':>7} {'inserted':>8}")
for size in [int(s) for s in args.sizes.split(",")]:
    fill, files, count, results = run(size)
    for kind, r in results.items():
        print(f"{size:>12} {files:>5} {fill:>7.1f} {kind:>6} {r['add_p50']:>11} {r['add_max']:>6} "
              f"{r['trigger_p50']:>10} {r['scanned']:>7} {r['skipped']:>7} {r['updated']:>7} "
              f"{r['inserted']:>8}", flush=True)
    print(f"{'':>12} rows after: {count}")
