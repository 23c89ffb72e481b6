#!/usr/bin/env python3
"""Latency under a steady load: files keep landing, a processing_time '1 second' trigger
keeps up, and we measure how long each batch takes and how long each file waits.

    python3 benches/latency.py BIN [--rate 100000] [--fps 10] [--seconds 60]
                                   [--warmup 15] [--spark PYTHON] [--flink PYTHON]
                                   [--work DIR]

The feed: RATE events per second landing as FPS JSON files per second (the seed's
columns: user_id, page, event_time, duration_s), for SECONDS. Files are generated before
the run and hard-linked into the landing folder on schedule, so landing costs no CPU
and each file appears whole. Event time advances 10 s per second of feed, so the
10-minute watermark closes 5-minute windows during a minute-long run.

The query: the seed's (5-minute windows per page, count and sum, 10-minute watermark,
append mode) into a JSON file sink, `trigger = 'processing_time 1 second'`, no file limit
per trigger. Tidemark runs it in `tidemark serve`; with --spark, Spark 4.3 (`local[2]`,
benches/spark_latency.py) runs the same query on the same files; with --flink (a python
with PyFlink 2.3), Flink in streaming mode (benches/flink_latency.py: the folder
monitored every 200 ms, checkpoints every second, which commit the sink's files); one
engine after the other on the same machine.

Per engine it prints: batch duration p50/p99/max (Tidemark: tidemark.progress's
batch_duration_ms; Spark: durationMs.triggerExecution), and the end-to-end lag of every
file: from the moment it was linked into the folder to the moment the batch that read
it wrote its commits/N file (both engines keep Spark's checkpoint layout, so this is read
the same way from sources/0/* and commits/*). It checks that every file was read once.
Flink has no batches: its figure is each checkpoint's end-to-end duration (the REST
API's), and its file lag is not defined.

For all three, the result lag of every closed window: from the moment the file whose
event times first reached the window's end plus the 10-minute delay was linked into the
folder, to the moment the window's row became visible in the sink (Tidemark and Spark:
the mtime of its file, which the sink log `_spark_metadata` commits within the same
batch, milliseconds later; Flink: the rename that commits its file). Spark's and
Tidemark's rule emits a window one batch after the batch that moved the watermark past it; Flink's as soon as its watermark passes, then commits
it at the next checkpoint. The first WARMUP seconds of the feed are fed but not counted
(files landed then, batches and checkpoints made then, windows closed by them), so a
JVM's warm-up is not held against it.
"""
import argparse
import bisect
import calendar
import json
import os
import random
import re
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
ap.add_argument("--flink", help="a python with apache-flink 2.3 (benches/flink.py makes "
                "/var/cache/tidemark-flink)")
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


class CheckpointWatcher:
    """Both engines keep the newest 100 batches' `commits/N` and `offsets/N` only (Spark's
    minBatchesToRetain), fewer than a 120-second run makes: this records each as it
    appears (every 0.1 s), and what it read stays known after the engine deletes it."""

    def __init__(self, ckpt):
        self.ckpt, self.commit_time, self.log_offset = ckpt, {}, {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def poll(self):
        for kind, seen in (("commits", self.commit_time), ("offsets", self.log_offset)):
            try:
                names = [f for f in os.listdir(os.path.join(self.ckpt, kind)) if f.isdigit()]
            except FileNotFoundError:
                continue
            for f in names:
                if int(f) in seen:
                    continue
                path = os.path.join(self.ckpt, kind, f)
                try:
                    if kind == "commits":
                        seen[int(f)] = os.stat(path).st_mtime
                    else:
                        lines = open(path).read().splitlines()
                        if len(lines) < 3:
                            continue  # not whole yet: again next time
                        seen[int(f)] = (json.loads(lines[2])["logOffset"]
                                        if lines[2] not in ("", "-", "null") else None)
                except (FileNotFoundError, ValueError):
                    continue

    def run(self):
        while not self.done.is_set():
            self.poll()
            self.done.wait(0.1)

    def stop(self):
        self.done.set()
        self.thread.join()
        self.poll()


def checkpoint_lags(watch, landed):
    """(lag seconds per file landed after the warm-up, files read more than once, counted
    batch ids) from Spark's checkpoint layout, as `watch` (a CheckpointWatcher) saw it."""
    ckpt = watch.ckpt
    commit_time = dict(watch.commit_time)
    # A file entry's `batchId` is the source's own log offset, which falls behind the
    # query's batch id after a batch without new files (a no-data batch that moves the
    # watermark): the batch that read log offset k is the first whose offsets file ends at k.
    batch_of_offset = {}
    for n in sorted(watch.log_offset):
        if watch.log_offset[n] is not None:
            batch_of_offset.setdefault(watch.log_offset[n], n)
    # Every batch a file was read in (Spark's compacted log files, `N.compact`, repeat the
    # earlier batches' entries with their batch ids).
    batches_of = {}
    src = os.path.join(ckpt, "sources", "0")
    for f in os.listdir(src):
        if not f.split(".")[0].isdigit():
            continue
        for line in open(os.path.join(src, f)).read().splitlines()[1:]:
            e = json.loads(line)
            batches_of.setdefault(os.path.basename(e["path"]), set()).add(
                batch_of_offset.get(e["batchId"], e["batchId"]))
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


def wait_committed(watch, deadline_s=120):
    """Until every landed file is in a committed batch (or the deadline passes)."""
    end = time.time() + deadline_s
    while time.time() < end:
        try:
            checkpoint_lags(watch, LANDED)
            return
        except (SystemExit, FileNotFoundError):
            time.sleep(0.2)
    raise SystemExit(f"files still not committed after {deadline_s} s ({watch.ckpt})")


def file_max_times():
    """[the newest event time (epoch s) in feed file i], cached beside the files."""
    cache = os.path.join(staging, "max_event_times.json")
    if os.path.exists(cache):
        return json.load(open(cache))
    pattern = re.compile(r'"event_time":"([^"]+)Z"')
    out = []
    for i in range(n_files):
        text = open(os.path.join(staging, f"clicks-{i:05}.json")).read()
        newest = max(pattern.findall(text))
        out.append(calendar.timegm(time.strptime(newest[:19], "%Y-%m-%dT%H:%M:%S"))
                   + float("0" + newest[19:]))
    json.dump(out, open(cache, "w"))
    return out


def window_key(row):
    """(window start 'YYYY-MM-DDTHH:MM:SS', page) of an output row, in every engine's form."""
    return row["window_start"].replace(" ", "T")[:19], row["page"]


def visible_spark_layout(sink):
    """{window: (the time it became visible, views)} of a Tidemark or Spark file sink: the
    mtime of the window's file, among those its log `_spark_metadata` commits (the entry
    is written just after the file, in the same batch; the log's own files are compacted
    and deleted, so their times are not kept)."""
    log = os.path.join(sink, "_spark_metadata")
    paths, out = set(), {}
    for f in os.listdir(log):
        if f.split(".")[0].isdigit():
            for line in open(os.path.join(log, f)).read().splitlines()[1:]:
                paths.add(json.loads(line)["path"].removeprefix("file://"))
    for path in paths:
        read_windows(path, os.stat(path).st_mtime, out)
    return out


def read_windows(path, at, out):
    """Adds each row of the JSON file `path` to `out` as {window: (at, views)}."""
    for row in open(path):
        r = json.loads(row)
        out[window_key(r)] = (at, int(r["views"]))


def visible_flink(sink):
    """{window: (the time it became visible, views)} of Flink's file sink: the rename that
    committed the window's file (its ctime)."""
    out = {}
    for root, _, files in os.walk(sink):
        for f in files:
            if f.startswith((".", "_")):
                continue
            path = os.path.join(root, f)
            read_windows(path, os.stat(path).st_ctime, out)
    return out


def window_lags(visible, landed):
    """Seconds from the landing of the file that closed each window (its event times first
    reached the window's end plus the watermark's 10 minutes) to the window's row being
    visible, for windows closed by a file landed after the warm-up."""
    closing_at, newest = [], float("-inf")
    for t in file_max_times():
        newest = max(newest, t)
        closing_at.append(newest)
    counted_from = landed["_start"] + args.warmup
    lags = []
    for (start, _), (at, _) in visible.items():
        end = calendar.timegm(time.strptime(start, "%Y-%m-%dT%H:%M:%S")) + 300
        i = bisect.bisect_left(closing_at, end + 600)
        name = f"clicks-{i:05}.json"
        if i < n_files and landed.get(name, 0) >= counted_from:
            lags.append(at - landed[name])
    return lags


def start_jvm_engine(name, python):
    """Starts benches/<name>_latency.py with `python` on a fresh <work>/<name>/landing;
    returns (its folder, the landing folder, the process) once it wrote `ready`."""
    home = os.path.join(work, name)
    shutil.rmtree(home, ignore_errors=True)
    landing = os.path.join(home, "landing")
    os.makedirs(landing)
    proc = subprocess.Popen([python, os.path.join(HERE, f"{name}_latency.py"), landing, home],
                            stdout=open(os.path.join(home, "log"), "w"),
                            stderr=subprocess.STDOUT)
    end = time.time() + 180
    while not os.path.exists(os.path.join(home, "ready")):
        if proc.poll() is not None or time.time() > end:
            raise SystemExit(f"{name} did not start: " + os.path.join(home, "log"))
        time.sleep(0.1)
    return home, landing, proc


def report(name, durations, lags, twice, wlags):
    unit, units = ("checkpoint", "checkpoints") if name == "flink" else ("batch", "batches")
    files = (f"   file lag s p50={pct(lags, .5):5.2f} p99={pct(lags, .99):5.2f} "
             f"max={max(lags):5.2f} files={len(lags)} read twice={twice}" if lags else "")
    print(f"{name:8} {units}={len(durations):3}  {unit} ms p50={pct(durations, .5):6.0f} "
          f"p99={pct(durations, .99):6.0f} max={max(durations):6.0f}   "
          f"window lag s p50={pct(wlags, .5):5.2f} p99={pct(wlags, .99):5.2f} "
          f"max={max(wlags, default=float('nan')):5.2f} windows={len(wlags)}" + files)


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
psql(f"""CREATE SINK page_views_5m WITH (connector = 'json', path = '{tm}/sink',
    watermark = 'event_time - 10 minutes', output_mode = 'append',
    trigger = 'processing_time 1 second') AS
SELECT window.start AS window_start, window.end AS window_end, page,
       count(*) AS views, sum(duration_s) AS total_duration_s
FROM clicks GROUP BY window(event_time, '5 minutes'), page""")
LANDED = {}
watch = CheckpointWatcher(os.path.join(tm, "data", "checkpoints", "page_views_5m"))
feed(landing, LANDED)
wait_committed(watch)
watch.stop()
lags, twice, counted = checkpoint_lags(watch, LANDED)
# tidemark.progress keeps the newest 100 reports, as Spark's recentProgress does by
# default: the batch figures are of those (the warm-up's are older), and the rows read are
# checked through the files (every landed file in one committed batch), not the reports.
rows = psql("SELECT batch_id, batch_duration_ms FROM tidemark.progress "
            "WHERE name = 'page_views_5m' AND num_input_rows > 0 ORDER BY batch_id")
durations = [int(d) for b, d in (r.split("|") for r in rows.split()) if int(b) in counted]
in_rows = None
server.terminate()
server.wait()
visible = {"tidemark": visible_spark_layout(os.path.join(tm, "sink"))}
results = [("tidemark", durations, lags, twice, in_rows, window_lags(visible["tidemark"], LANDED))]

if args.spark:
    sp, landing, proc = start_jvm_engine("spark", args.spark)
    LANDED = {}
    watch = CheckpointWatcher(os.path.join(sp, "checkpoint"))
    feed(landing, LANDED)
    wait_committed(watch)
    watch.stop()
    open(os.path.join(sp, "stop"), "w").close()
    proc.wait(timeout=120)
    progress = json.load(open(os.path.join(sp, "progress.json")))
    lags, twice, counted = checkpoint_lags(watch, LANDED)
    busy = [p for p in progress if p["numInputRows"] > 0 and p["batchId"] in counted]
    durations = [p["durationMs"]["triggerExecution"] for p in busy]
    visible["spark"] = visible_spark_layout(os.path.join(sp, "sink"))
    results.append(("spark", durations, lags, twice, sum(p["numInputRows"] for p in progress),
                    window_lags(visible["spark"], LANDED)))

if args.flink:
    fl, landing, proc = start_jvm_engine("flink", args.flink)
    LANDED = {}
    feed(landing, LANDED)
    # Until the windows the last file closes are committed (or 60 s): the count the other
    # engines reached, else Flink's own stops growing for 5 s.
    want = max((len(v) for v in visible.values()), default=0)
    end, last, steady = time.time() + 60, -1, time.time()
    while time.time() < end:
        n = len(visible_flink(os.path.join(fl, "sink")))
        if n != last:
            last, steady = n, time.time()
        if n >= want or time.time() - steady > 5:
            break
        time.sleep(0.2)
    open(os.path.join(fl, "stop"), "w").close()
    proc.wait(timeout=120)
    stats = json.load(open(os.path.join(fl, "checkpoints.json")))
    counted_from = (LANDED["_start"] + args.warmup) * 1000
    durations = [c["end_to_end_duration"] for c in stats["history"]
                 if c["trigger_timestamp"] >= counted_from]
    visible["flink"] = visible_flink(os.path.join(fl, "sink"))
    results.append(("flink", durations, [], 0, None, window_lags(visible["flink"], LANDED)))

for name, durations, lags, twice, in_rows, wlags in results:
    report(name, durations, lags, twice, wlags)
    if in_rows is not None and in_rows != n_files * per_file:
        print(f"  {name} read {in_rows} rows, expected {n_files * per_file}")
# The windows every engine closed: the same counts? (Rows a watermark drops as late
# depend on where the batches or checkpoints fell, so a few may differ.)
if len(visible) > 1:
    common = set.intersection(*(set(v) for v in visible.values()))
    same = sum(len({v[w][1] for v in visible.values()}) == 1 for w in common)
    print(f"windows closed by every engine: {len(common)}, with equal counts: {same}; "
          + ", ".join(f"{k} closed {len(v)}" for k, v in visible.items()))
