#!/usr/bin/env python3
"""Nexmark side by side: Tidemark and Apache Flink 2.3 (PyFlink from PyPI, local
mini-cluster, parallelism 2, batch mode) on the same JSON files, each query a fresh
process of each engine, in one run; the outputs compared.

    python3 benches/flink_nexmark.py [--events 10000000] [--batch 1000000]
        [--queries q0,q1,q2,q5agg,q7agg,q12,q3] [--repeats 1] [--bin PATH]
        [--flink-modes batch,monitor] [--monitor-spacing 4] [--monitor-quiet 15]
        [--idle-timeout 1s]

The files: Nexmark's three streams from the nexmark crate's generator, landed once by
Tidemark JSON sinks as one file per batch of --batch events in
/tmp/nexmark-json-<EVENTS>/{bid,auction,person} (benches/nexmark.py's generate_files).
The JSON format is the one both engines read (the Flink wheel ships JSON and CSV, not
Parquet), so the decoders are part of what is measured.

Tidemark runs benches/nexmark.py's form of each query over `format = 'json'` streams with
`max_files_per_trigger = 1` and a 4-second watermark, `trigger = 'available_now'`, into a
Parquet sink whose rows are then copied out to CSV; Flink runs Nexmark's Flink SQL (window
TVFs for the windows) in batch mode, the like-for-like answer (nothing is late in batch
mode), into a filesystem CSV sink. Per run: wall time (process start to exit), job time
(Tidemark: the sum of its batches' durations; Flink: `execute().wait()`), CPU seconds and
peak RSS of the process tree (the JVMs included), as benches/flink.py measures them.

Outputs: each side's rows canonicalised (timestamps without a trailing zero fraction,
q1's price to 3 decimals) and compared as multisets. q0-q2 and q3 must be equal. A
windowed query must give Flink Tidemark's rows plus only windows that end after
Tidemark's final watermark (Flink closes every window at the end of a bounded input,
append mode holds those in state), and Tidemark no row Flink lacks; rows Tidemark
dropped as late (its `rows_dropped_by_watermark`) are reported.

`--flink-modes monitor` also runs Flink the always-on way: streaming mode, the files of each
stream landing one by one in time order (part number order, a hidden name then a rename,
--monitor-spacing s apart; q3's two streams land their i-th files together) in folders
Flink watches (`source.monitor-interval` 200 ms). Checkpoints every 500 ms commit the CSV
sink's part files, which roll every second (by default a CSV part file rolls at 128 MB or
after 30 minutes, and its rows stay invisible until then). Checkpoints are stored in files
(the default, the JobManager's memory, refuses a state over 5 MB: q3's join state outgrew
it, and the sink committed none of its last rows). A reader idle for --idle-timeout (1 s)
does not hold the watermark back. A run ends when Flink has committed as many rows as
Tidemark's run, or when its output has not grown for --monitor-quiet s after the last file
(at most 180 s). Flink advances its watermark while it reads a file (every 200 ms, from the
largest event time read so far), not between micro-batches as Spark and Tidemark do, so a
windowed query may lose rows that are more than the 4-second delay behind a newer row
earlier in the same file: the verdict then checks that every difference is a window Flink
has fewer rows in (or lacks), gives the window ends of those it lacks, and reports how many
bids, read in file order, fall in a window that the watermark of a newer bid before them
had already ended: the bound on what Flink can drop from a bid's first window.
Stateless queries and q3's join must be equal.

Flink: PyFlink in FLINK_VENV (default /var/cache/tidemark-flink), made by
benches/flink.py if missing.
"""
import argparse
import collections
import csv
import datetime
import glob
import json
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from flink import ROOT, run_measured  # noqa: E402
from nexmark import COLUMNS, QUERIES as TIDEMARK_SQL, TABLES, WATERMARK, generate_files  # noqa: E402

FLINK_COLUMNS = {
    "bid": "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, "
           "date_time TIMESTAMP(3), extra STRING",
    "auction": "id BIGINT, item_name STRING, description STRING, initial_bid BIGINT, "
               "reserve BIGINT, date_time TIMESTAMP(3), expires TIMESTAMP(3), seller BIGINT, "
               "category BIGINT, extra STRING",
    "person": "id BIGINT, name STRING, email_address STRING, credit_card STRING, city STRING, "
              "state STRING, date_time TIMESTAMP(3), extra STRING",
}
FLINK_WATERMARK = "WATERMARK FOR date_time AS date_time - INTERVAL '4' SECOND"


def tumble(seconds):
    return f"TABLE(TUMBLE(TABLE bid, DESCRIPTOR(date_time), INTERVAL '{seconds}' SECOND))"


# Each query: Flink's sink columns, Flink's SELECT (Nexmark's Flink SQL, the columns in
# the order of Tidemark's form in benches/nexmark.py), the output's column kinds
# (i integer, f float, s text, t timestamp) and the index of a window's end (None: not
# windowed).
FLINK = {
    "q0": ("auction BIGINT, bidder BIGINT, price BIGINT, date_time TIMESTAMP(3), extra STRING",
           "SELECT auction, bidder, price, date_time, extra FROM bid", "iiits", None),
    "q1": ("auction BIGINT, bidder BIGINT, price DOUBLE, date_time TIMESTAMP(3), extra STRING",
           "SELECT auction, bidder, CAST(0.908 * price AS DOUBLE), date_time, extra FROM bid",
           "iifts", None),
    "q2": ("auction BIGINT, price BIGINT",
           "SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0", "ii", None),
    "q3": ("name STRING, city STRING, state STRING, id BIGINT",
           "SELECT P.name, P.city, P.state, A.id FROM auction AS A INNER JOIN person AS P "
           "ON A.seller = P.id WHERE A.category = 10 AND P.state IN ('or', 'id', 'ca')",
           "sssi", None),
    "q5agg": ("auction BIGINT, num BIGINT, starttime TIMESTAMP(3), endtime TIMESTAMP(3)",
              "SELECT auction, COUNT(*), window_start, window_end FROM TABLE(HOP(TABLE bid, "
              "DESCRIPTOR(date_time), INTERVAL '2' SECOND, INTERVAL '10' SECOND)) "
              "GROUP BY auction, window_start, window_end", "iitt", 3),
    "q7agg": ("starttime TIMESTAMP(3), endtime TIMESTAMP(3), maxprice BIGINT",
              f"SELECT window_start, window_end, MAX(price) FROM {tumble(10)} "
              "GROUP BY window_start, window_end", "tti", 1),
    "q12": ("bidder BIGINT, bid_count BIGINT, starttime TIMESTAMP(3), endtime TIMESTAMP(3)",
            f"SELECT bidder, COUNT(*), window_start, window_end FROM {tumble(10)} "
            "GROUP BY bidder, window_start, window_end", "iitt", 3),
}

def job_start(mode, settings=""):
    """The start of a PyFlink program: a table environment in `mode` (batch or streaming),
    parallelism 2, UTC, then `settings`, then the spec's sources and sink."""
    return f'''
import glob, json, os, shutil, sys, time
from pyflink.table import EnvironmentSettings, TableEnvironment
spec = json.load(open(sys.argv[1]))
env = TableEnvironment.create(EnvironmentSettings.in_{mode}_mode())
c = env.get_config()
c.set("parallelism.default", "2")
c.set("table.local-time-zone", "UTC")
{settings}for ddl in spec["sources"]:
    env.execute_sql(ddl)
env.execute_sql(spec["sink"])
'''


FLINK_JOB = job_start("batch") + r'''t = time.time()
env.execute_sql("INSERT INTO sink " + spec["insert"]).wait()
print(f"JOB_S {time.time() - t:.3f}")
'''


# A reader with no file to read does not hold the watermark back (as benches/latency.py's
# Flink job): otherwise the last window closes only when both readers have moved past it.
# Checkpoints go to files: the default, the JobManager's memory, refuses a state over 5 MB.
FLINK_MONITOR_JOB = job_start("streaming", '''c.set("execution.checkpointing.interval", "500ms")
c.set("table.exec.source.idle-timeout", spec["idle_timeout"])
c.set("execution.checkpointing.storage", "filesystem")
c.set("execution.checkpointing.dir", "file://" + spec["checkpoints"])
''') + r'''result = env.execute_sql("INSERT INTO sink " + spec["insert"])
counted = {}
def committed():
    # A committed file (no leading dot) is never written again: each is counted once.
    for name in glob.glob(os.path.join(spec["out"], "**", "*"), recursive=True):
        if (name not in counted and os.path.isfile(name)
                and not os.path.basename(name).startswith((".", "_"))):
            with open(name, "rb") as f:
                counted[name] = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    return sum(counted.values())
time.sleep(2)
t = time.time()
# Each stream's files land in part-number order, which is time order; the i-th files of
# all streams together. A hidden name first, then the rename Flink sees.
for batch in zip(*spec["landings"]):
    for source, watched in batch:
        name = os.path.basename(source)
        shutil.copy(source, os.path.join(watched, "." + name))
        os.rename(os.path.join(watched, "." + name), os.path.join(watched, name))
    time.sleep(spec["spacing"])
landed = time.time()
last, since = -1, time.time()
while time.time() < landed + 180:
    n = committed()
    if n >= spec["want"]:
        break
    if n != last:
        last, since = n, time.time()
    elif time.time() - since > spec["quiet"]:
        break
    time.sleep(0.2)
print(f"JOB_S {time.time() - t:.3f}")
print(f"LANDED_S {landed - t:.3f}")
pending = 0
for name in glob.glob(os.path.join(spec["out"], "**", ".*"), recursive=True):
    if os.path.isfile(name):
        with open(name, "rb") as f:
            pending += f.read().count(b"\n")
print(f"PENDING_ROWS {pending}")
result.get_job_client().cancel().result()
'''

# Each windowed query's aggregate column (a count or a max, which rows Flink drops as
# late can only lower).
AGGREGATE = {"q5agg": 1, "q7agg": 2, "q12": 1}
# And its windows' slide in seconds.
SLIDE = {"q5agg": 2, "q7agg": 10, "q12": 10}


def ts(v):
    """A timestamp as text in one form: a space between date and time, no zone, no
    trailing zeros in the fraction."""
    v = v.strip().replace("T", " ").rstrip("Z")
    if "." in v:
        v = v.rstrip("0").rstrip(".")
    return v


def canonical(row, kinds):
    out = []
    for v, k in zip(row, kinds):
        if k == "t":
            out.append(ts(v))
        elif k == "f":
            out.append("%.3f" % float(v))
        elif k == "i":
            out.append(str(int(v)))
        else:
            out.append(v)
    return tuple(out)


def tidemark(args, q, files, work):
    run = os.path.join(work, f"tidemark-{q}")
    shutil.rmtree(run, ignore_errors=True)
    os.makedirs(run)
    mode, sql = TIDEMARK_SQL[q]
    streams = "\n".join(
        f"CREATE STREAM {t} ({COLUMNS[t]}, {WATERMARK}) WITH (format = 'json', "
        f"path = '{files}/{t}', max_files_per_trigger = 1);"
        for t in TABLES.get(q, ("bid",)))
    script = os.path.join(run, "pipeline.sql")
    with open(script, "w") as f:
        f.write(f"""{streams}
CREATE SINK {q} WITH (connector = 'parquet', path = '{run}/sink', trigger = 'available_now',
    output_mode = '{mode}') AS {sql};
COPY (SELECT * FROM {q}) TO '{run}/output.csv' STORED AS CSV;
COPY (SELECT sum(batch_duration_ms) AS ms, max(watermark) AS watermark,
             sum(rows_dropped_by_watermark) AS dropped FROM tidemark.progress)
    TO '{run}/progress.csv' STORED AS CSV;
""")
    env = dict(os.environ, RUST_LOG="warn")
    with open(os.path.join(run, "log.txt"), "w") as log:
        wall, cpu, rss, _ = run_measured(
            [args.bin, "run", script, "--data-dir", os.path.join(run, "data")], env, log)
    kinds = FLINK[q][2]
    rows = collections.Counter()
    with open(os.path.join(run, "output.csv")) as f:
        r = csv.reader(f)
        next(r)
        for row in r:
            rows[canonical(row, kinds)] += 1
    p = next(csv.DictReader(open(os.path.join(run, "progress.csv"))))
    shutil.rmtree(os.path.join(run, "sink"))
    return dict(wall=wall, job=int(p["ms"]) / 1000, cpu=cpu, rss=rss, rows=rows,
                watermark=ts(p["watermark"]) if p["watermark"] else None,
                dropped=int(p["dropped"] or 0))


def flink(args, q, files, work, mode="batch"):
    """Flink's run of `q`: batch mode over the files, or (`monitor`) streaming mode with the
    files landing one by one in folders it watches."""
    name = "flink" if mode == "batch" else "flink-monitor"
    out = os.path.join(work, f"{name}-{q}")
    shutil.rmtree(out, ignore_errors=True)
    sink_cols, select, kinds, _ = FLINK[q]
    tables = TABLES.get(q, ("bid",))
    watched = {t: os.path.join(work, f"{name}-{q}-landing", t) for t in tables}
    if mode == "monitor":
        for d in watched.values():
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d)
    read = {t: (watched[t] if mode == "monitor" else f"{files}/{t}") for t in tables}
    monitor = ", 'source.monitor-interval' = '200ms'" if mode == "monitor" else ""
    # A CSV part file is committed at the checkpoint after it rolls, and rolls only at
    # 128 MB or after 30 minutes unless told: in streaming mode, a second.
    rolling = (", 'sink.rolling-policy.rollover-interval' = '1s', "
               "'sink.rolling-policy.check-interval' = '1s'") if mode == "monitor" else ""
    spec = dict(
        sources=[f"CREATE TABLE {t} ({FLINK_COLUMNS[t]}, {FLINK_WATERMARK}) WITH "
                 f"('connector' = 'filesystem', 'path' = '{read[t]}', 'format' = 'json', "
                 f"'json.timestamp-format.standard' = 'ISO-8601'{monitor})" for t in tables],
        sink=f"CREATE TABLE sink ({sink_cols}) WITH ('connector' = 'filesystem', "
             f"'path' = '{out}', 'format' = 'csv'{rolling})",
        insert=select, out=out, want=args.want, spacing=args.monitor_spacing,
        quiet=args.monitor_quiet, idle_timeout=args.idle_timeout,
        checkpoints=os.path.join(work, f"{name}-{q}-checkpoints"),
        landings=[[(p, watched[t]) for p in part_files(files, t)] for t in tables])
    job = os.path.join(work, f"{name}_job.py")
    with open(job, "w") as f:
        f.write(FLINK_JOB if mode == "batch" else FLINK_MONITOR_JOB)
    spec_path = os.path.join(work, f"{name}-{q}.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    with open(os.path.join(work, f"{name}-{q}.log"), "w") as log:
        wall, cpu, rss, stdout = run_measured(
            [os.path.join(args.flink_venv, "bin", "python"), job, spec_path], log=log)
    rows = collections.Counter()
    for path in glob.glob(os.path.join(out, "**", "*"), recursive=True):
        if os.path.isfile(path) and not os.path.basename(path).startswith((".", "_")):
            with open(path) as f:
                for row in csv.reader(f):
                    rows[canonical(row, kinds)] += 1
    shutil.rmtree(out)
    if mode == "monitor":
        shutil.rmtree(os.path.dirname(next(iter(watched.values()))))
        shutil.rmtree(spec["checkpoints"], ignore_errors=True)
    landed = re.search(r"LANDED_S ([\d.]+)", stdout)
    pending = re.search(r"PENDING_ROWS (\d+)", stdout)
    if pending and int(pending.group(1)):
        print(f"{q} {name}: {pending.group(1)} rows in files Flink had not committed", flush=True)
    return dict(wall=wall, job=float(re.search(r"JOB_S ([\d.]+)", stdout).group(1)),
                cpu=cpu, rss=rss, rows=rows, landed=float(landed.group(1)) if landed else None)


def part_files(files, table):
    """A stream's data files in part-number order, the order its sink wrote them."""
    return sorted(glob.glob(os.path.join(files, table, "part-*")))


def late_bound(files, slide_s, delay_s=4):
    """How many bids, read file by file in part order and each file top to bottom, fall
    only in windows (of slide `slide_s`) that had ended by the watermark (`delay_s` behind
    the newest bid read before them): the most a watermark that moves while it reads, as
    Flink's does, could drop from the first of a bid's windows."""
    cache = os.path.join(files, f".late-bound-{slide_s}-{delay_s}")
    if os.path.exists(cache):
        return int(open(cache).read())
    pat = re.compile(rb'"date_time":"([^"]+)"')
    epoch = datetime.datetime(1970, 1, 1)
    top, n = None, 0
    for path in part_files(files, "bid"):
        with open(path, "rb") as f:
            for line in f:
                t = (datetime.datetime.fromisoformat(pat.search(line).group(1).decode())
                     - epoch).total_seconds()
                first_end = (t // slide_s + 1) * slide_s
                if top is not None and first_end <= top - delay_s:
                    n += 1
                top = t if top is None else max(top, t)
    with open(cache, "w") as f:
        f.write(str(n))
    return n


def differ(missing, extra):
    return (f"{sum(missing.values())} of Tidemark's rows missing in Flink, "
            f"{sum(extra.values())} extra (e.g. {list(missing)[:2]} / {list(extra)[:2]})")


def compare(q, mine, theirs):
    """The verdict on Flink's rows against Tidemark's, and whether it is acceptable."""
    missing = mine["rows"] - theirs["rows"]
    extra = theirs["rows"] - mine["rows"]
    end = FLINK[q][3]
    if not missing and not extra:
        return "equal", True
    if end is not None and not missing and mine["watermark"]:
        open_ = sum(n for r, n in extra.items() if r[end] > mine["watermark"])
        if open_ == sum(extra.values()):
            return (f"Tidemark's rows plus {open_} windows ending after its final watermark "
                    f"{mine['watermark']} (append mode holds them)"), True
    return differ(missing, extra), False


def compare_monitor(q, mine, theirs, files):
    """The verdict on Flink's always-on rows against Tidemark's: equal, or (a windowed query)
    only windows Flink has fewer rows in or lacks, which its late rows explain."""
    missing = mine["rows"] - theirs["rows"]
    extra = theirs["rows"] - mine["rows"]
    if not missing and not extra:
        return "equal", True
    agg = AGGREGATE.get(q)
    if agg is None:
        return differ(missing, extra), False
    key = lambda r: r[:agg] + r[agg + 1:]
    ours = {key(r): int(r[agg]) for r in mine["rows"]}
    lower = [r for r in extra if key(r) in ours and int(r[agg]) < ours[key(r)]]
    if len(lower) != len(extra):
        odd = [r for r in extra if r not in lower][:2]
        return (f"{len(extra) - len(lower)} Flink rows not a lower aggregate of one of "
                f"Tidemark's windows (e.g. {odd})"), False
    lower_keys = {key(r) for r in lower}
    absent_ends = sorted(r[FLINK[q][3]] for r in missing if key(r) not in lower_keys)
    lacking = len(absent_ends)
    total = lambda rows: sum(int(r[agg]) * n for r, n in rows.items())
    lost = "" if q == "q7agg" else (
        f", {total(mine['rows']) - total(theirs['rows']):,} fewer counted")
    span = f" (ending {absent_ends[0]} to {absent_ends[-1]})" if absent_ends else ""
    return (f"{len(lower):,} of Tidemark's {len(ours):,} windows lower in Flink and {lacking:,} "
            f"absent{span}{lost}; in file order, {late_bound(files, SLIDE[q]):,} bids fall in a window "
            "already ended by the watermark of a newer bid before them"), True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--batch", type=int, default=1_000_000, help="events per file")
    ap.add_argument("--queries", default="q0,q1,q2,q5agg,q7agg,q12,q3")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--workdir", default="/tmp/oracle-bench")
    tgt = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    ap.add_argument("--bin", default=os.path.join(tgt, "release", "tidemark"))
    ap.add_argument("--flink-modes", default="batch",
                    help="batch, monitor (streaming, files landing in time order) or both")
    ap.add_argument("--monitor-spacing", type=float, default=4.0,
                    help="monitor: seconds between two files landing")
    ap.add_argument("--monitor-quiet", type=float, default=15.0,
                    help="monitor: seconds without new output, after the last file, that end the run")
    ap.add_argument("--idle-timeout", default="1s",
                    help="monitor: Flink's table.exec.source.idle-timeout (0 ms: never idle)")
    ap.add_argument("--flink-venv", default=os.environ.get("FLINK_VENV",
                                                           "/var/cache/tidemark-flink"))
    args = ap.parse_args()
    if not os.path.exists(os.path.join(args.flink_venv, "bin", "python")):
        raise SystemExit(f"no PyFlink in {args.flink_venv}: run benches/flink.py once")
    files = f"/tmp/nexmark-json-{args.events}"
    if not os.path.exists(os.path.join(files, ".done")):
        shutil.rmtree(files, ignore_errors=True)
        generate_files(args.bin, args.events, args.batch, files, fmt="json")
        open(os.path.join(files, ".done"), "w").close()
    work = os.path.join(args.workdir, f"nexmark-flink-{args.events}")
    os.makedirs(work, exist_ok=True)
    table, bad = [], []
    engines = ["tidemark"] + [{"batch": "flink", "monitor": "flink-monitor"}[m]
                              for m in args.flink_modes.split(",")]
    for q in args.queries.split(","):
        runs = {e: [] for e in engines}
        for r in range(args.repeats):
            for e in runs:
                if e == "tidemark":
                    res = tidemark(args, q, files, work)
                    args.want = sum(res["rows"].values())
                else:
                    res = flink(args, q, files, work, "batch" if e == "flink" else "monitor")
                runs[e].append(res)
                print(f"{q:6} run {r + 1} {e:13} wall {res['wall']:6.2f}s job {res['job']:6.2f}s "
                      f"cpu {res['cpu']:6.2f}s peak RSS {res['rss']:6.0f} MiB "
                      f"rows {sum(res['rows'].values())}", flush=True)
        for e, rs in runs.items():
            if e != "flink-monitor":  # what it drops as late depends on timing
                assert all(x["rows"] == rs[0]["rows"] for x in rs), f"{q} {e}: repeats differ"
        verdicts = {}
        for e in engines[1:]:
            verdict, ok = (compare if e == "flink" else
                           lambda q, a, b: compare_monitor(q, a, b, files))(
                q, runs["tidemark"][0], runs[e][0])
            verdicts[e] = verdict
            print(f"{q} {e}: {verdict}", flush=True)
            if not ok:
                bad.append(f"{q} ({e})")
        for rs in runs.values():  # the counts are enough from here on
            for x in rs:
                x["rows"] = sum(x["rows"].values())
        dropped = runs["tidemark"][0]["dropped"]
        print(f"{q}: Tidemark dropped {dropped} late rows", flush=True)
        best = {e: min(rs, key=lambda x: x["wall"]) for e, rs in runs.items()}
        table.append((q, best, verdicts, dropped))
    cell = lambda x: (f"{x['wall']:.2f} s / {x['job']:.2f} s / {x['cpu']:.2f} / "
                      f"{x['rss']:.0f} MiB")

    def batch_row(q, b, verdicts):
        t, f = b["tidemark"], b["flink"]
        return [q, cell(t), cell(f), f"{f['wall'] / t['wall']:.1f}×",
                f"{f['cpu'] / max(t['cpu'], 0.01):.1f}×", f"{t['rows']:,}", verdicts["flink"]]

    def monitor_row(q, b, verdicts):
        t, f = b["tidemark"], b["flink-monitor"]
        return [q, cell(t), f"{f['landed']:.1f} s / {f['job']:.1f} s / {f['cpu']:.2f} / "
                f"{f['rss']:.0f} MiB", f"{t['rows']:,}", f"{f['rows']:,}",
                verdicts["flink-monitor"]]

    for engine, header, row in [
            ("flink", ["query", "Tidemark wall / job / CPU s / RSS",
                       "Flink wall / job / CPU s / RSS", "wall ratio", "CPU ratio",
                       "rows (Tidemark)", "outputs"], batch_row),
            ("flink-monitor", ["query", "Tidemark wall / job / CPU s / RSS",
                               "Flink streaming: files landed in / all output in / CPU s / RSS",
                               "rows (Tidemark)", "rows (Flink)", "outputs"], monitor_row)]:
        if engine in engines:
            print()
            print("| " + " | ".join(header) + " |")
            print("|" + " --- |" * len(header))
            for q, b, verdicts, _ in table:
                print("| " + " | ".join(row(q, b, verdicts)) + " |")
    if bad:
        raise SystemExit(f"outputs differ: {', '.join(bad)}")


if __name__ == "__main__":
    main()
