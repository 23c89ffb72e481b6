#!/usr/bin/env python3
"""Nexmark side by side: Tidemark and Apache Flink 2.3 (PyFlink from PyPI, local
mini-cluster, parallelism 2, batch mode) on the same JSON files, each query a fresh
process of each engine, in one run; the outputs compared.

    python3 benches/flink_nexmark.py [--events 10000000] [--batch 1000000]
        [--queries q0,q1,q2,q5agg,q7agg,q12,q3] [--repeats 1] [--bin PATH]

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

Flink: PyFlink in FLINK_VENV (default /var/cache/tidemark-flink), made by
benches/flink.py if missing.
"""
import argparse
import collections
import csv
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

FLINK_JOB = r'''
import json, sys, time
from pyflink.table import EnvironmentSettings, TableEnvironment
spec = json.load(open(sys.argv[1]))
env = TableEnvironment.create(EnvironmentSettings.in_batch_mode())
c = env.get_config()
c.set("parallelism.default", "2")
c.set("table.local-time-zone", "UTC")
for ddl in spec["sources"]:
    env.execute_sql(ddl)
env.execute_sql(spec["sink"])
t = time.time()
env.execute_sql("INSERT INTO sink " + spec["insert"]).wait()
print(f"JOB_S {time.time() - t:.3f}")
'''


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


def flink(args, q, files, work):
    out = os.path.join(work, f"flink-{q}")
    shutil.rmtree(out, ignore_errors=True)
    sink_cols, select, kinds, _ = FLINK[q]
    tables = TABLES.get(q, ("bid",))
    spec = dict(
        sources=[f"CREATE TABLE {t} ({FLINK_COLUMNS[t]}, {FLINK_WATERMARK}) WITH "
                 f"('connector' = 'filesystem', 'path' = '{files}/{t}', 'format' = 'json', "
                 f"'json.timestamp-format.standard' = 'ISO-8601')" for t in tables],
        sink=f"CREATE TABLE sink ({sink_cols}) WITH ('connector' = 'filesystem', "
             f"'path' = '{out}', 'format' = 'csv')",
        insert=select)
    job = os.path.join(work, "flink_nexmark_job.py")
    with open(job, "w") as f:
        f.write(FLINK_JOB)
    spec_path = os.path.join(work, f"flink-{q}.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    with open(os.path.join(work, f"flink-{q}.log"), "w") as log:
        wall, cpu, rss, stdout = run_measured(
            [os.path.join(args.flink_venv, "bin", "python"), job, spec_path], log=log)
    rows = collections.Counter()
    for path in glob.glob(os.path.join(out, "**", "*"), recursive=True):
        if os.path.isfile(path) and not os.path.basename(path).startswith((".", "_")):
            with open(path) as f:
                for row in csv.reader(f):
                    rows[canonical(row, kinds)] += 1
    shutil.rmtree(out)
    return dict(wall=wall, job=float(re.search(r"JOB_S ([\d.]+)", stdout).group(1)),
                cpu=cpu, rss=rss, rows=rows)


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
    return (f"{sum(missing.values())} of Tidemark's rows missing in Flink, "
            f"{sum(extra.values())} extra (e.g. {list(missing)[:2]} / {list(extra)[:2]})"), False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--batch", type=int, default=1_000_000, help="events per file")
    ap.add_argument("--queries", default="q0,q1,q2,q5agg,q7agg,q12,q3")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--workdir", default="/tmp/oracle-bench")
    tgt = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    ap.add_argument("--bin", default=os.path.join(tgt, "release", "tidemark"))
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
    for q in args.queries.split(","):
        runs = {"tidemark": [], "flink": []}
        for r in range(args.repeats):
            for e in runs:
                res = (tidemark if e == "tidemark" else flink)(args, q, files, work)
                runs[e].append(res)
                print(f"{q:6} run {r + 1} {e:9} wall {res['wall']:6.2f}s job {res['job']:6.2f}s "
                      f"cpu {res['cpu']:6.2f}s peak RSS {res['rss']:6.0f} MiB "
                      f"rows {sum(res['rows'].values())}", flush=True)
        for e, rs in runs.items():
            assert all(x["rows"] == rs[0]["rows"] for x in rs), f"{q} {e}: repeats differ"
        verdict, ok = compare(q, runs["tidemark"][0], runs["flink"][0])
        for rs in runs.values():  # the counts are enough from here on
            for x in rs:
                x["rows"] = sum(x["rows"].values())
        dropped = runs["tidemark"][0]["dropped"]
        print(f"{q}: {verdict}; Tidemark dropped {dropped} late rows", flush=True)
        if not ok:
            bad.append(q)
        best = {e: min(rs, key=lambda x: x["wall"]) for e, rs in runs.items()}
        table.append((q, best, verdict, dropped))
    print()
    print("| query | Tidemark wall / job / CPU s / RSS | Flink wall / job / CPU s / RSS | "
          "wall ratio | CPU ratio | rows (Tidemark) | outputs |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for q, b, verdict, dropped in table:
        t, f = b["tidemark"], b["flink"]
        cell = lambda x: (f"{x['wall']:.2f} s / {x['job']:.2f} s / {x['cpu']:.2f} / "
                          f"{x['rss']:.0f} MiB")
        print(f"| {q} | {cell(t)} | {cell(f)} | {f['wall'] / t['wall']:.1f}× | "
              f"{f['cpu'] / max(t['cpu'], 0.01):.1f}× | {t['rows']:,} | {verdict} |")
    if bad:
        raise SystemExit(f"outputs differ: {', '.join(bad)}")


if __name__ == "__main__":
    main()
