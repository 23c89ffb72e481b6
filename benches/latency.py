#!/usr/bin/env python3
"""Latency under a steady load: files keep landing, a processing_time '1 second' trigger
keeps up, and we measure how long each batch takes and how long each file waits.

    python3 benches/latency.py BIN [--rate 100000] [--fps 10] [--seconds 60]
                                   [--warmup 15] [--spark PYTHON] [--work DIR]

The feed: RATE events per second landing as FPS JSON files per second (the seed's
columns: user_id, page, event_time, duration_s), for SECONDS. Files are generated before
the run and hard-linked into the landing folder on schedule, so landing costs no CPU
and each file appears whole. Event time advances 10 s per second of feed, so the
10-minute watermark closes 5-minute windows during a minute-long run.

The query: the seed's (5-minute windows per page, count and sum, 10-minute watermark,
append mode) into a parquet sink, `trigger = 'processing_time 1 second'`, no file limit
per trigger. Tidemark runs it in `tidemark serve`; with --spark, Spark 4.3 (`local[2]`,
benches/spark_latency.py) runs the same query on the same files, one engine after the
other on the same machine.

Per engine it prints: batch duration p50/p99/max (Tidemark: tidemark.progress's
batch_duration_ms; Spark: durationMs.triggerExecution), and the end-to-end lag of every
file: from the moment it was linked into the folder to the moment the batch that read
it wrote its commits/N file (both engines keep Spark's checkpoint layout, so this is read
the same way from sources/0/* and commits/*). It checks that every file was read once. The first WARMUP seconds of the feed are fed
but not counted (files landed then, batches committed then), so a JVM's warm-up is not
held against it.
"""
import argparse
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time

ap = argparse.ArgumentParser()
ap.add_argument("bin")
ap.add_argument("--rate", type=int, default=100_000)
ap.add_argument("--fps", type=int, default=10)
ap.add_argument("--seconds", type=int, default=60)
ap.add_argument("--warmup", type=int, default=15)
ap.add_argument("--spark", help="a python with pyspark 4.3")
ap.add_argument("--work", default="/tmp/latency-bench")
args = ap.parse_args()
HERE = os.path.dirname(os.path.abspath(__file__))
work = args.work
n_files = args.seconds * args.fps
per_file = args.rate // args.fps
staging = os.path.join(work, f"staging-{args.rate}-{args.fps}-{args.seconds}")


def generate():
    """The feed's files, made once per shape: deterministic (seed 11)."""
    if os.path.exists(os.path.join(staging, "done")):
        return
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    rnd = random.Random(11)
    base = 1781085600.0  # 2026-06-10 10:00:00 UTC
    pages = [f"/p{i}" for i in range(10)]
    for i in range(n_files):
        lines = []
        t0 = base + i * 10.0 / args.fps
        for _ in range(per_file):
            t = t0 + rnd.random() * 10.0 / args.fps - (rnd.random() < 0.05) * rnd.random() * 300
            ms = int(t * 1000)
            lines.append('{"user_id":"u%d","page":"%s","event_time":"%s.%03dZ","duration_s":%.2f}'
                         % (rnd.randrange(10000), rnd.choice(pages),
                            time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)),
                            ms % 1000, rnd.random() * 60))
        with open(os.path.join(staging, f"clicks-{i:05}.json"), "w") as f:
            f.write("\n".join(lines) + "\n")
    open(os.path.join(staging, "done"), "w").close()


def feed(landing, landed):
    """Links the files into `landing` on schedule; records when each appeared."""
    start = time.time()
    landed["_start"] = start
    for i in range(n_files):
        due = start + i / args.fps
        delay = due - time.time()
        if delay > 0:
            time.sleep(delay)
        name = f"clicks-{i:05}.json"
        os.link(os.path.join(staging, name), os.path.join(landing, name))
        landed[name] = time.time()


def pct(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")


def checkpoint_lags(ckpt, landed):
    """(lag seconds per file landed after the warm-up, files read more than once, counted
    batch ids) from Spark's checkpoint layout."""
    commit_time = {}
    for f in os.listdir(os.path.join(ckpt, "commits")):
        if f.isdigit():
            commit_time[int(f)] = os.stat(os.path.join(ckpt, "commits", f)).st_mtime
    # Every batch a file was read in (Spark's compacted log files, `N.compact`, repeat the
    # earlier batches' entries with their batch ids).
    batches_of = {}
    src = os.path.join(ckpt, "sources", "0")
    for f in os.listdir(src):
        if not f.split(".")[0].isdigit():
            continue
        for line in open(os.path.join(src, f)).read().splitlines()[1:]:
            e = json.loads(line)
            batches_of.setdefault(os.path.basename(e["path"]), set()).add(e["batchId"])
    twice = sum(len(b) > 1 for b in batches_of.values())
    read_in = {name: min(b) for name, b in batches_of.items()}
    lags = []
    counted_from = landed["_start"] + args.warmup
    for name, t in landed.items():
        if name == "_start":
            continue
        b = read_in.get(name)
        if b is None or b not in commit_time:
            raise SystemExit(f"{name} was not committed ({ckpt})")
        if t >= counted_from:
            lags.append(commit_time[b] - t)
    counted = {b for b, t in commit_time.items() if t >= counted_from}
    return lags, twice, counted


def wait_committed(ckpt, deadline_s=120):
    """Until every landed file is in a committed batch (or the deadline passes)."""
    end = time.time() + deadline_s
    while time.time() < end:
        try:
            checkpoint_lags(ckpt, LANDED)
            return
        except (SystemExit, FileNotFoundError):
            time.sleep(0.2)
    raise SystemExit(f"files still not committed after {deadline_s} s ({ckpt})")


def report(name, durations, lags, twice):
    print(f"{name:8} batches={len(durations):3}  batch ms p50={pct(durations, .5):6.0f} "
          f"p99={pct(durations, .99):6.0f} max={max(durations):6.0f}   "
          f"lag s p50={pct(lags, .5):5.2f} p99={pct(lags, .99):5.2f} max={max(lags):5.2f}"
          f"   files={len(lags)} read twice={twice}")


generate()
print(f"feed: {args.rate:,} events/s as {args.fps} files/s of {per_file:,} events, "
      f"{args.seconds} s ({n_files} files); the first {args.warmup} s not counted")

# Tidemark.
tm = os.path.join(work, "tidemark")
shutil.rmtree(tm, ignore_errors=True)
landing = os.path.join(tm, "landing")
os.makedirs(landing)
s = socket.socket()
s.bind(("127.0.0.1", 0))
port = s.getsockname()[1]
s.close()
server = subprocess.Popen([args.bin, "serve", "--listen", f"127.0.0.1:{port}",
                           "--data-dir", os.path.join(tm, "data")],
                          stdout=subprocess.DEVNULL, stderr=open(os.path.join(tm, "log"), "w"),
                          env={**os.environ, "RUST_LOG": "warn"})


def psql(sql):
    return subprocess.run(["psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h",
                           "127.0.0.1", "-p", str(port), "-U", "tidemark", "-c", sql],
                          check=True, capture_output=True, text=True).stdout


end = time.time() + 30
while True:
    try:
        psql("SELECT 1")
        break
    except subprocess.CalledProcessError:
        if time.time() > end:
            raise
        time.sleep(0.1)
psql(f"""CREATE STREAM clicks (user_id TEXT, page TEXT, event_time TIMESTAMP,
    duration_s DOUBLE PRECISION) WITH (connector = 'file', format = 'json', path = '{landing}')""")
psql(f"""CREATE SINK page_views_5m WITH (connector = 'parquet', path = '{tm}/sink',
    watermark = 'event_time - 10 minutes', output_mode = 'append',
    trigger = 'processing_time 1 second') AS
SELECT window.start AS window_start, window.end AS window_end, page,
       count(*) AS views, sum(duration_s) AS total_duration_s
FROM clicks GROUP BY window(event_time, '5 minutes'), page""")
LANDED = {}
feed(landing, LANDED)
ckpt = os.path.join(tm, "data", "checkpoints", "page_views_5m")
wait_committed(ckpt)
lags, twice, counted = checkpoint_lags(ckpt, LANDED)
rows = psql("SELECT batch_id, batch_duration_ms FROM tidemark.progress "
            "WHERE name = 'page_views_5m' AND num_input_rows > 0 ORDER BY batch_id")
durations = [int(d) for b, d in (r.split("|") for r in rows.split()) if int(b) in counted]
in_rows = int(psql("SELECT sum(num_input_rows) FROM tidemark.progress "
                   "WHERE name = 'page_views_5m'").strip() or 0)
server.terminate()
server.wait()
results = [("tidemark", durations, lags, twice, in_rows)]

if args.spark:
    sp = os.path.join(work, "spark")
    shutil.rmtree(sp, ignore_errors=True)
    landing = os.path.join(sp, "landing")
    os.makedirs(landing)
    proc = subprocess.Popen([args.spark, os.path.join(HERE, "spark_latency.py"), landing, sp],
                            stdout=open(os.path.join(sp, "log"), "w"), stderr=subprocess.STDOUT)
    end = time.time() + 180
    while not os.path.exists(os.path.join(sp, "ready")):
        if proc.poll() is not None or time.time() > end:
            raise SystemExit("Spark did not start: " + os.path.join(sp, "log"))
        time.sleep(0.1)
    LANDED = {}
    feed(landing, LANDED)
    wait_committed(os.path.join(sp, "checkpoint"))
    open(os.path.join(sp, "stop"), "w").close()
    proc.wait(timeout=120)
    progress = json.load(open(os.path.join(sp, "progress.json")))
    lags, twice, counted = checkpoint_lags(os.path.join(sp, "checkpoint"), LANDED)
    busy = [p for p in progress if p["numInputRows"] > 0 and p["batchId"] in counted]
    durations = [p["durationMs"]["triggerExecution"] for p in busy]
    results.append(("spark", durations, lags, twice, sum(p["numInputRows"] for p in progress)))

for name, durations, lags, twice, in_rows in results:
    report(name, durations, lags, twice)
    if in_rows != n_files * per_file:
        print(f"  {name} read {in_rows} rows, expected {n_files * per_file}")
