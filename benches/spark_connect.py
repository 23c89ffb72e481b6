#!/usr/bin/env python3
"""The control plane's cost of sinks on Spark (issue 40): Tidemark holding Spark Connect
sessions, polling each query's progress and publishing it.

    python3 benches/spark_connect.py BIN --pyspark PYTHON [--queries 1,4] [--seconds 60]

A Spark Connect server (`spark-submit --class ...SparkConnectServer --master local[2]`,
from the pyspark wheel of PYTHON) and `BIN serve` start on ports they pick. For each
count K of --queries, K sinks with `engine = 'spark'` read a `rate` stream (100 rows/s)
into `noop` with `trigger = 'processing_time 1 second'`, for SECONDS after a warm-up of
15 s. Measured:

- the delay from a Spark batch's commit (its report's `timestamp` plus `batchDuration`:
  Spark writes `commits/N` at the end of the trigger) to the moment its `progress` event
  arrives over `LISTEN tidemark_events` (published together with its tidemark.progress
  row), p50/p95/max over every batch of the window;
- Tidemark's CPU time over the window (utime + stime from /proc), and its RSS, against
  the same window with no query; per watched query = (with K - idle) / K.

It also checks that every batch of every query reached tidemark.progress once: batch
ids without gaps, none twice.
"""
import argparse
import json
import os
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import psycopg

ap = argparse.ArgumentParser()
ap.add_argument("bin")
ap.add_argument("--pyspark", required=True, help="a python with pyspark 4.3.0")
ap.add_argument("--queries", default="1,4")
ap.add_argument("--seconds", type=int, default=60)
ap.add_argument("--warmup", type=int, default=15)
args = ap.parse_args()

TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mib(pid):
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


def wait_for(path, marker, proc, what, timeout=180):
    start = time.time()
    while time.time() - start < timeout:
        text = open(path).read() if os.path.exists(path) else ""
        if marker in text:
            return text
        if proc.poll() is not None:
            sys.exit(f"{what} exited:\n{text[-3000:]}")
        time.sleep(0.1)
    sys.exit(f"{what} did not start")


work = tempfile.mkdtemp(prefix="tidemark-spark-connect-bench-")
home = subprocess.check_output(
    [args.pyspark, "-c", "import os, pyspark; print(os.path.dirname(pyspark.__file__))"],
    text=True,
).strip()
connect_log = os.path.join(work, "connect.log")
connect = subprocess.Popen(
    [
        os.path.join(home, "bin/spark-submit"),
        "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
        "--master", "local[2]",
        "--conf", "spark.driver.memory=1g",
        "--conf", "spark.ui.enabled=false",
        "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
        "--conf", "spark.connect.grpc.binding.port=0",
        "--conf", f"spark.local.dir={work}",
    ],
    env={**os.environ, "SPARK_HOME": home},
    stdout=open(connect_log, "w"),
    stderr=subprocess.STDOUT,
)
text = wait_for(connect_log, "Spark Connect server started at: ", connect, "Spark Connect")
port = int(text.split("Spark Connect server started at: ")[1].split()[0].rsplit(":", 1)[1])
remote = f"sc://127.0.0.1:{port}"

tm_log = os.path.join(work, "tidemark.log")
tidemark = subprocess.Popen(
    [args.bin, "serve", "--data-dir", os.path.join(work, "data"), "--listen", "127.0.0.1:0",
     "--http", "off"],
    stdout=subprocess.PIPE, stderr=open(tm_log, "w"), text=True,
)
pg_port = None
for line in tidemark.stdout:
    if line.startswith("listening on "):
        pg_port = int(line.rsplit(":", 1)[1])
        break
if pg_port is None:
    sys.exit("tidemark did not start:\n" + open(tm_log).read())
dsn = f"host=127.0.0.1 port={pg_port} user=postgres dbname=tidemark"
sql = psycopg.connect(dsn, autocommit=True)
listen = psycopg.connect(dsn, autocommit=True)
listen.execute("LISTEN tidemark_events")
sql.execute(
    "CREATE STREAM ticks (WATERMARK FOR timestamp AS timestamp - INTERVAL '1 second') "
    "WITH (connector = 'rate', rows_per_second = 100, num_partitions = 2)"
)


def window(seconds, on_event=None):
    """CPU seconds and RSS of tidemark over `seconds`, handing each event to on_event."""
    c0, t0 = cpu_seconds(tidemark.pid), time.time()
    end = t0 + seconds
    while time.time() < end:
        for n in listen.notifies(timeout=max(0.0, min(1.0, end - time.time())), stop_after=1):
            if on_event:
                on_event(json.loads(n.payload), time.time())
    return cpu_seconds(tidemark.pid) - c0, time.time() - t0, rss_mib(tidemark.pid)


def drain(seconds):
    window(seconds)


idle_cpu, idle_wall, idle_rss = window(args.seconds)
print(f"idle: {idle_cpu:.2f} s CPU in {idle_wall:.0f} s ({100 * idle_cpu / idle_wall:.2f} %), "
      f"RSS {idle_rss:.1f} MiB")

made = 0
for k in [int(x) for x in args.queries.split(",")]:
    while made < k:
        sql.execute(
            f"CREATE SINK q{made} WITH (engine = 'spark', spark_remote = '{remote}', "
            f"connector = 'noop', checkpoint_location = '{work}/ck/q{made}', "
            f"trigger = 'processing_time 1 second') "
            f"AS SELECT value % 10 AS k, value FROM ticks"
        )
        made += 1
    drain(args.warmup)
    delays, seen = [], {}

    def on_event(ev, at):
        if ev.get("event") != "progress":
            return
        p = ev["progress"]
        ts = p["timestamp"]
        t = time.mktime(time.strptime(ts[:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
        t += int(ts[20:23]) / 1000 + p["batchDuration"] / 1000
        delays.append((at - t) * 1000)
        seen.setdefault(p["name"], []).append(p["batchId"])

    cpu, wall, rss = window(args.seconds, on_event)
    for name, ids in seen.items():
        assert ids == list(range(ids[0], ids[0] + len(ids))), f"{name}: {ids}"
    rows = sql.execute(
        "SELECT name, count(*), count(DISTINCT batch_id) FROM tidemark.progress GROUP BY name"
    ).fetchall()
    for name, n, distinct in rows:
        assert n == distinct, f"{name}: a batch twice in tidemark.progress"
    delays.sort()
    q = lambda f: delays[min(len(delays) - 1, int(f * len(delays)))]
    per_query_cpu = (cpu / wall - idle_cpu / idle_wall) / k
    print(
        f"{k} queries: {len(delays)} batches in {wall:.0f} s; commit -> tidemark.progress "
        f"p50 {q(0.5):.0f} ms, p95 {q(0.95):.0f} ms, max {delays[-1]:.0f} ms; "
        f"Tidemark CPU {100 * cpu / wall:.2f} % of a core ({100 * per_query_cpu:.3f} % per "
        f"query), RSS {rss:.1f} MiB ({(rss - idle_rss) / k:+.2f} MiB per query)"
    )

tidemark.terminate()
tidemark.wait(timeout=60)
connect.kill()
connect.wait()
shutil.rmtree(work, ignore_errors=True)
