#!/usr/bin/env python3
"""Streaming queries side by side: Tidemark, Apache Flink 2.3 (PyFlink from PyPI, local
mini-cluster) and Spark 4.3 (PySpark, local[2]) on the same JSON files, each a fresh
process, in one run; the outputs compared.

    python3 benches/flink.py [--query seed|churn] [--events 5000000] [--files 100]
        [--repeats 2] [--engines tidemark,flink-batch,flink-streaming,flink-monitor,spark]
        [--bin PATH]

--query seed (the default): five-minute page-view windows (count, sum of duration), a
ten-minute watermark. --query churn: benches/state_churn.sh's query, (10-minute window,
user) groups with a 1-minute watermark over 5 M events with 1 M users, one file a batch
for Tidemark and Spark (benches/spark_churn.py, whose closed windows and their events
are compared, not its rows). Tidemark runs it as the README's seed sink (append, available_now,
max_files_per_trigger 10, a Delta sink, the rows copied out to CSV); Flink as Flink SQL
(a TUMBLE window TVF, a filesystem CSV sink, parallelism 2) in batch mode (the
like-for-like answer: no row is late in batch mode), in streaming mode over the bounded
folder, and in streaming mode with the files landing one by one in time order
(--monitor-spacing, 0.5 s apart) in a folder it monitors (`source.monitor-interval` 200 ms, checkpoints every
500 ms, which commit the sink's files; its job time is from the first file landed to the
last window committed, so it is a freshness figure, not a throughput one); Spark with shared/oracle-tools/spark_windowed.py (Parquet sink, availableNow).

Files: /tmp/oracle-bench/landing-<EVENTS> (--workdir), made by
shared/oracle-tools/gen_clicks.py as benches/windowed.sh and bench.py make them, so every
engine reads the very same files.

Per run: wall time (process start to exit), job time (the engine's own: Tidemark's run
from its log, Flink's `execute().wait()`, Spark's query), CPU seconds and peak RSS of the
whole process tree (the JVMs included), sampled from /proc every 0.1 s.

Outputs: every engine's rows canonicalised (ISO timestamps, the sum to 3 decimals).
Tidemark and Spark (append mode) must be equal. Flink closes every window at the end of
its input (its final watermark is +inf), so it must hold Tidemark's rows plus only windows
that end after the final watermark (max event time - 10 minutes), which append mode
keeps in state; its streaming mode reads files in no fixed order and drops as late what
arrives behind its watermark, so it is reported, not required to match.

Flink: PyFlink in the venv FLINK_VENV (default /var/cache/tidemark-flink), made with
`pip install apache-flink==2.3.0` if missing. Spark: PYSPARK_PYTHON (default
/var/cache/tidemark-pyspark/bin/python).
"""
import argparse
import calendar
import csv
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "oracle-tools")
TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")

# The Flink side of each query: the source's columns and watermark, the sink's columns,
# the INSERT; and Tidemark's side, a pipeline for `tidemark run`.
QUERIES = {
    "seed": dict(
        flink_source="user_id STRING, page STRING, event_time TIMESTAMP_LTZ(3), "
                     "duration_s DOUBLE, WATERMARK FOR event_time AS event_time - "
                     "INTERVAL '10' MINUTE",
        flink_sink="window_start TIMESTAMP(3), window_end TIMESTAMP(3), page STRING, "
                   "`views` BIGINT, total_duration_s DOUBLE",
        flink_insert="SELECT window_start, window_end, page, COUNT(*), SUM(duration_s) "
                     "FROM TABLE(TUMBLE(TABLE clicks, DESCRIPTOR(event_time), "
                     "INTERVAL '5' MINUTE)) GROUP BY window_start, window_end, page",
        tidemark=(
            "CREATE STREAM clicks (user_id TEXT, page TEXT, event_time TIMESTAMP, "
            "duration_s DOUBLE PRECISION) WITH (connector = 'file', format = 'json', "
            "path = '{landing}', max_files_per_trigger = 10);\n"
            "CREATE SINK out WITH (path = '{run}/sink', watermark = 'event_time - 10 minutes', "
            "trigger = 'available_now') AS SELECT window.start AS window_start, window.end AS "
            "window_end, page, count(*) AS views, sum(duration_s) AS total_duration_s FROM "
            "clicks GROUP BY window(event_time, '5 minutes'), page;\n"
            "COPY (SELECT window_start, window_end, page, views, total_duration_s FROM out) "
            "TO '{run}/output.csv' STORED AS CSV;\n"),
        delay_s=600,
    ),
    "churn": dict(
        flink_source="user_id STRING, event_time TIMESTAMP_LTZ(3), amount BIGINT, "
                     "WATERMARK FOR event_time AS event_time - INTERVAL '1' MINUTE",
        flink_sink="window_start TIMESTAMP(3), window_end TIMESTAMP(3), user_id STRING, "
                   "n BIGINT, total BIGINT",
        flink_insert="SELECT window_start, window_end, user_id, COUNT(*), SUM(amount) "
                     "FROM TABLE(TUMBLE(TABLE clicks, DESCRIPTOR(event_time), "
                     "INTERVAL '10' MINUTE)) GROUP BY window_start, window_end, user_id",
        tidemark=(
            "CREATE STREAM events (user_id TEXT, event_time TIMESTAMP, amount BIGINT, "
            "WATERMARK FOR event_time AS event_time - INTERVAL '1 minute') WITH (format = "
            "'json', path = '{landing}', max_files_per_trigger = 1);\n"
            "CREATE SINK out WITH (path = '{run}/sink', trigger = 'available_now', "
            "auto_compact = 0) AS SELECT window.start AS w, window.end AS w_end, user_id, "
            "count(*) AS n, sum(amount) AS total FROM events GROUP BY window(event_time, "
            "'10 minutes'), user_id;\n"
            "COPY (SELECT w, w_end, user_id, n, total FROM out) TO '{run}/output.csv' "
            "STORED AS CSV;\n"),
        delay_s=60,
    ),
}

FLINK_JOB = r'''
import json, sys, time
from pyflink.table import EnvironmentSettings, TableEnvironment
q, landing, out, mode = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3], sys.argv[4]
settings = (EnvironmentSettings.in_batch_mode() if mode == "batch"
            else EnvironmentSettings.in_streaming_mode())
env = TableEnvironment.create(settings)
c = env.get_config()
c.set("parallelism.default", "2")
c.set("table.local-time-zone", "UTC")
env.execute_sql(f"""CREATE TABLE clicks ({q['flink_source']})
WITH ('connector' = 'filesystem', 'path' = '{landing}', 'format' = 'json',
      'json.timestamp-format.standard' = 'ISO-8601')""")
env.execute_sql(f"""CREATE TABLE sink ({q['flink_sink']})
WITH ('connector' = 'filesystem', 'path' = '{out}', 'format' = 'csv')""")
t = time.time()
env.execute_sql("INSERT INTO sink " + q["flink_insert"]).wait()
print(f"JOB_S {time.time() - t:.3f}")
'''

FLINK_MONITOR_JOB = r'''
import glob, json, os, shutil, sys, time
from pyflink.table import EnvironmentSettings, TableEnvironment
q, source, landing, out = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3], sys.argv[4]
want, spacing = int(sys.argv[5]), float(sys.argv[6])
env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
c = env.get_config()
c.set("parallelism.default", "2")
c.set("table.local-time-zone", "UTC")
c.set("execution.checkpointing.interval", "500ms")
env.execute_sql(f"""CREATE TABLE clicks ({q['flink_source']})
WITH ('connector' = 'filesystem', 'path' = '{landing}', 'format' = 'json',
      'json.timestamp-format.standard' = 'ISO-8601', 'source.monitor-interval' = '200ms')""")
env.execute_sql(f"""CREATE TABLE sink ({q['flink_sink']})
WITH ('connector' = 'filesystem', 'path' = '{out}', 'format' = 'csv')""")
result = env.execute_sql("INSERT INTO sink " + q["flink_insert"])
def committed():
    n = 0
    for name in glob.glob(os.path.join(out, "**", "*"), recursive=True):
        if os.path.isfile(name) and not os.path.basename(name).startswith("."):
            with open(name) as f:
                n += sum(1 for _ in f)
    return n
time.sleep(2)
t = time.time()
# The files land one by one in name order, which is time order (hidden name, then
# renamed), `spacing` s apart.
for name in sorted(os.listdir(source)):
    shutil.copy(os.path.join(source, name), os.path.join(landing, "." + name))
    os.rename(os.path.join(landing, "." + name), os.path.join(landing, name))
    time.sleep(spacing)
landed = time.time()
deadline = landed + 120
while committed() < want and time.time() < deadline:
    time.sleep(0.2)
print(f"JOB_S {time.time() - t:.3f}")
result.get_job_client().cancel().result()
'''


def proc_table():
    """{pid: (ppid, cpu ticks, rss pages)} of every process."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
            rest = st[st.rindex(")") + 2:].split()
            out[int(d)] = (int(rest[1]), int(rest[11]) + int(rest[12]), int(rest[21]))
        except (OSError, ValueError, IndexError):
            pass
    return out


def run_measured(cmd, env=None, log=None):
    """Runs `cmd`; returns (wall s, CPU s of the tree, peak tree RSS MiB, stdout). The
    tree is sampled from /proc every 0.1 s. Its CPU is the process's own rusage (its
    waited-for descendants included) where that is larger, as in a run shorter than one
    sample; not its peak RSS, which counts this script's pages shared after the fork."""
    start = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log or subprocess.DEVNULL,
                         env=env, text=True)
    cpu_by_pid, peak = {}, 0
    done = threading.Event()

    def sample():
        nonlocal peak
        while not done.is_set():
            table = proc_table()
            tree, stack = set(), [p.pid]
            kids = {}
            for pid, (ppid, _, _) in table.items():
                kids.setdefault(ppid, []).append(pid)
            while stack:
                q = stack.pop()
                if q in tree:
                    continue
                tree.add(q)
                stack.extend(kids.get(q, []))
            rss = 0
            for q in tree:
                if q in table:
                    cpu_by_pid[q] = max(cpu_by_pid.get(q, 0), table[q][1])
                    rss += table[q][2]
            peak = max(peak, rss)
            done.wait(0.1)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    stdout = p.stdout.read()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    wall = time.time() - start
    done.set()
    t.join()
    if p.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed ({p.returncode}); see {log.name if log else ''}")
    cpu = max(usage.ru_utime + usage.ru_stime, sum(cpu_by_pid.values()) / TICK)
    return wall, cpu, peak * PAGE / 2**20, stdout


def iso(s):
    s = s.strip().replace(" ", "T").replace("Z", "")
    s = re.sub(r"\.0*$", "", s)
    return s + "Z"


def canonical(rows):
    """Timestamps (the first two columns) in ISO form, the count as an integer, the last
    column (a sum) to 3 decimals."""
    out = []
    for r in rows:
        r = list(r)
        out.append(tuple([iso(r[0]), iso(r[1])] + r[2:-2]
                         + [int(r[-2]), "%.3f" % float(r[-1])]))
    return sorted(out)


def tidemark(args, landing, work):
    run = os.path.join(work, "tidemark")
    shutil.rmtree(run, ignore_errors=True)
    os.makedirs(run)
    sql = os.path.join(run, "pipeline.sql")
    with open(sql, "w") as f:
        f.write(QUERIES[args.query]["tidemark"].format(landing=landing, run=run))
    env = dict(os.environ, RUST_LOG="warn")
    with open(os.path.join(run, "log.txt"), "w") as log:
        wall, cpu, rss, _ = run_measured(
            [args.bin, "run", sql, "--data-dir", os.path.join(run, "data")], env, log)
    with open(os.path.join(run, "output.csv")) as f:
        r = csv.reader(f)
        next(r)
        rows = list(r)
    return dict(wall=wall, job=None, cpu=cpu, rss=rss, rows=canonical(rows))


def run_flink(args, work, name, source, argv):
    """Runs the PyFlink program `source` with the query's Flink SQL and `argv`, as `name`;
    its CSV output is in `<work>/<name>`, which it must be given (emptied first)."""
    out = os.path.join(work, name)
    shutil.rmtree(out, ignore_errors=True)
    job = os.path.join(work, f"{name}_job.py")
    with open(job, "w") as f:
        f.write(source)
    spec = os.path.join(work, "query.json")
    with open(spec, "w") as f:
        json.dump({k: v for k, v in QUERIES[args.query].items() if k.startswith("flink")}, f)
    with open(os.path.join(work, f"{name}.log"), "w") as log:
        wall, cpu, rss, stdout = run_measured(
            [os.path.join(args.flink_venv, "bin", "python"), job, spec] + argv, log=log)
    job_s = float(re.search(r"JOB_S ([\d.]+)", stdout).group(1))
    rows = []
    for path in glob.glob(os.path.join(out, "**", "*"), recursive=True):
        if os.path.isfile(path) and not os.path.basename(path).startswith("."):
            with open(path) as f:
                rows.extend(tuple(r) for r in csv.reader(f))
    return dict(wall=wall, job=job_s, cpu=cpu, rss=rss, rows=canonical(rows))


def flink(args, landing, work, mode):
    out = os.path.join(work, f"flink-{mode}")
    return run_flink(args, work, f"flink-{mode}", FLINK_JOB, [landing, out, mode])


def flink_monitor(args, landing, work, want):
    """Flink in streaming mode, the files landing one by one in time order into a folder it
    monitors; ends when it has committed `want` windows (Tidemark's count), or 120 s after
    the last file."""
    watched = os.path.join(work, "flink-monitor-landing")
    shutil.rmtree(watched, ignore_errors=True)
    os.makedirs(watched)
    out = os.path.join(work, "flink-monitor")
    return run_flink(args, work, "flink-monitor", FLINK_MONITOR_JOB,
                     [landing, watched, out, str(want), str(args.monitor_spacing)])


def spark(args, landing, work):
    run = os.path.join(work, "spark")
    shutil.rmtree(run, ignore_errors=True)
    os.makedirs(run)
    timing = os.path.join(run, "timing.json")
    with open(os.path.join(run, "log.txt"), "w") as log:
        wall, cpu, rss, _ = run_measured(
            [args.pyspark, os.path.join(SHARED, "spark_windowed.py"), "--landing", landing,
             "--checkpoint", os.path.join(run, "ck"), "--sink-path", os.path.join(run, "sink"),
             "--max-files-per-trigger", "10", "--out-csv", os.path.join(run, "out.csv"),
             "--progress-json", os.path.join(run, "progress.json"), "--timing-json", timing],
            log=log)
    with open(os.path.join(run, "out.csv")) as f:
        r = csv.DictReader(f)
        rows = [(x["window_start"], x["window_end"], x["page"], x["views"],
                 x["total_duration_s"]) for x in r]
    job = None
    try:
        t = json.load(open(timing))
        job = t.get("query_s") or t.get("stream_s")
    except (OSError, ValueError):
        pass
    return dict(wall=wall, job=job, cpu=cpu, rss=rss, rows=canonical(rows))


def spark_churn(args, landing, work):
    """benches/spark_churn.py (the churn query on Spark, Parquet sink): its rows are not
    read back, only the closed windows and their events, which `rows` stands for."""
    run = os.path.join(work, "spark")
    shutil.rmtree(run, ignore_errors=True)
    os.makedirs(run)
    with open(os.path.join(run, "log.txt"), "w") as log:
        wall, cpu, rss, stdout = run_measured(
            [args.pyspark, os.path.join(ROOT, "benches", "spark_churn.py"), landing, run],
            log=log)
    out = json.loads(stdout.strip().splitlines()[-1])
    return dict(wall=wall, job=out["query_s"], cpu=cpu, rss=rss,
                counts=(out["closed_windows"], out["events_in_closed_windows"]),
                rows=[])


def churn_files(workdir, name="churn-landing"):
    """The state-churn files (5 M events in 100 files, in event-time order over one day,
    user ids drawn from 1 M), made once in `<workdir>/<name>`; benches/state_churn.sh makes
    its own through here too."""
    landing = os.path.join(workdir, name)
    if os.path.isdir(landing):
        return landing
    import random
    tmp = landing + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    random.seed(3)
    base, files, per = 1781049600, 100, 50000  # 2026-06-10T00:00:00Z
    now = time.time() - 3600
    for f in range(files):
        path = os.path.join(tmp, "part-%04d.json" % f)
        with open(path, "w") as fh:
            for i in range(per):
                t = base + (f * per + i) * 86400 // (files * per)
                fh.write('{"user_id":"u%d","event_time":"%s","amount":%d}\n' % (
                    random.randrange(1000000),
                    time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t)), i % 100))
        os.utime(path, (now + f, now + f))
    os.rename(tmp, landing)
    return landing


def max_event_time(landing):
    newest = ""
    for name in os.listdir(landing):
        with open(os.path.join(landing, name)) as f:
            for line in f:
                t = json.loads(line)["event_time"]
                newest = max(newest, t)
    return newest


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--query", choices=sorted(QUERIES), default="seed")
    ap.add_argument("--events", type=int, default=5_000_000)
    ap.add_argument("--files", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--engines",
                    default="tidemark,flink-batch,flink-streaming,flink-monitor,spark")
    ap.add_argument("--workdir", default="/tmp/oracle-bench")
    ap.add_argument("--monitor-spacing", type=float, default=0.5,
                    help="flink-monitor: seconds between two files landing")
    tgt = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    ap.add_argument("--bin", default=os.path.join(tgt, "release", "tidemark"))
    ap.add_argument("--flink-venv", default=os.environ.get("FLINK_VENV",
                                                           "/var/cache/tidemark-flink"))
    ap.add_argument("--pyspark", default=os.environ.get(
        "PYSPARK_PYTHON", "/var/cache/tidemark-pyspark/bin/python"))
    args = ap.parse_args()
    engines = args.engines.split(",")
    if any(e.startswith("flink") for e in engines) and not os.path.exists(
            os.path.join(args.flink_venv, "bin", "python")):
        subprocess.check_call([sys.executable, "-m", "venv", args.flink_venv])
        subprocess.check_call([os.path.join(args.flink_venv, "bin", "pip"), "install", "-q",
                               "--prefer-binary", "apache-flink==2.3.0"])
    if args.query == "churn":
        landing = churn_files(args.workdir)
    else:
        landing = os.path.join(args.workdir, f"landing-{args.events}")
        if args.files != 100:
            landing += f"-f{args.files}"
    if not os.path.isdir(landing):
        subprocess.check_call([sys.executable, os.path.join(SHARED, "gen_clicks.py"), "--out",
                               landing, "--events", str(args.events), "--files",
                               str(args.files), "--users", "10000", "--pages", "10", "--span",
                               "24h", "--late-fraction", "0.05", "--lateness-max", "9m",
                               "--seed", "7", "--quiet"])
    work = os.path.join(args.workdir, f"side-by-side-{args.query}-{args.events}")
    os.makedirs(work, exist_ok=True)
    results = {}
    for r in range(args.repeats):
        for e in engines:
            if e == "tidemark":
                res = tidemark(args, landing, work)
            elif e == "spark" and args.query == "churn":
                res = spark_churn(args, landing, work)
            elif e == "spark":
                res = spark(args, landing, work)
            elif e == "flink-monitor":
                want = len(results["tidemark"][0]["rows"]) if "tidemark" in results else 0
                res = flink_monitor(args, landing, work, want)
            else:
                res = flink(args, landing, work, e.split("-")[1])
            results.setdefault(e, []).append(res)
            job = f"{res['job']:.2f}s" if res["job"] else "-"
            windows = res["counts"][0] if "counts" in res else len(res["rows"])
            print(f"run {r + 1} {e:16} wall {res['wall']:6.2f}s job {job:>7} "
                  f"cpu {res['cpu']:6.2f}s peak RSS {res['rss']:6.0f} MiB "
                  f"windows {windows}", flush=True)
    print()
    print("| engine | wall (best) | job | CPU s | peak RSS | windows |")
    print("| --- | --- | --- | --- | --- | --- |")
    for e, runs in results.items():
        best = min(runs, key=lambda x: x["wall"])
        job = f"{best['job']:.2f} s" if best["job"] else "-"
        windows = best["counts"][0] if "counts" in best else len(best["rows"])
        print(f"| {e} | {best['wall']:.2f} s | {job} | {best['cpu']:.2f} | "
              f"{best['rss']:.0f} MiB | {windows:,} |")
    # Outputs.
    base = results.get("tidemark", [None])[0]
    if base:
        wm = iso(max_event_time(landing))
        wm_s = (calendar.timegm(time.strptime(wm[:19], "%Y-%m-%dT%H:%M:%S"))
                - QUERIES[args.query]["delay_s"])
        for e, runs in results.items():
            # Flink's streaming runs read the files in no fixed order: repeats may differ.
            if e in ("tidemark", "flink-batch", "spark"):
                for res in runs:
                    assert res["rows"] == runs[0]["rows"], f"{e}: repeats differ"
            rows = runs[0]["rows"]
            if e == "tidemark":
                continue
            if "counts" in runs[0]:
                mine = (len(base["rows"]), sum(r[-2] for r in base["rows"]))
                same = runs[0]["counts"] == mine
                print(f"{e}: closed windows and their events {runs[0]['counts']}, "
                      f"Tidemark's {mine}: {'equal' if same else 'DIFFERENT'}")
                assert same, e
                continue
            mine, theirs = set(base["rows"]), set(rows)
            extra = theirs - mine
            missing = mine - theirs
            open_windows = [x for x in extra
                            if calendar.timegm(time.strptime(x[1][:19], "%Y-%m-%dT%H:%M:%S"))
                            > wm_s]
            verdict = "equal" if not extra and not missing else (
                f"Tidemark's rows plus {len(extra)} windows ending after the final watermark "
                f"(append mode holds them)" if not missing and len(open_windows) == len(extra)
                else f"{len(missing)} of Tidemark's rows missing or different, "
                     f"{len(extra)} extra")
            print(f"{e}: {verdict}")
            if e in ("spark", "flink-batch"):
                assert not missing and len(open_windows) == len(extra), f"{e}: {verdict}"


if __name__ == "__main__":
    main()
