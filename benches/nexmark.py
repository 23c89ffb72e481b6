#!/usr/bin/env python3
"""Nexmark on Tidemark: events/s per core (CPU time) and peak RSS per query.

    python3 benches/nexmark.py [--events N] [--queries q0,q1,...] [--batch N] [BINARY]

Each query runs in a fresh `tidemark run` process over a `connector = 'nexmark'` stream
(the nexmark crate's generator, in process, as Flink's and Feldera's harnesses do) into a
`noop` sink (Spark's noop format: the query runs, the rows are dropped), with
`trigger = 'available_now'` over N events of all three kinds (default 10 M; bids are 46 in
50 of them). "ev/s/core" = N / (user + system CPU seconds of the whole process), the
generator's CPU included; "w/o gen" = N / (that CPU minus the generator's thread CPU time,
which the source reports as its `generatorCpuNanos` progress metric): the engine's own
cost per event, as Feldera's and Flink's harnesses count it (their generator threads run
beside the workers they count). `gen` is a query that keeps only the event time. Peak RSS
is the process's.

With --files DIR the streams are read from Parquet files instead (DIR/bid, DIR/auction and
DIR/person, one file per batch, landed there by Tidemark Parquet sinks over the same
generator when DIR does not exist), so that benches/spark_nexmark.py can run the same
queries on the same files; "ev/s" still counts events of all kinds.

The queries are Nexmark's as Flink's nexmark repo writes them, in Tidemark's SQL (the
comments beside each say where the form differs); q5agg and q7agg are q5's and q7's
aggregations alone, q12 counts on event time (Tidemark has no processing-time windows).
Not here: q4 and q6 (an aggregation over a join's aggregation, without windows: update
mode over a join, which Spark refuses too) and q5 whole (a self-join of two chained
aggregations).
"""
import argparse, csv, json, os, re, shutil, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timed import wall_and_rss  # noqa: E402

QUERIES = {
    "gen": ("append", "SELECT date_time FROM bid"),
    "q0": ("append", "SELECT auction, bidder, price, date_time, extra FROM bid"),
    "q1": ("append", "SELECT auction, bidder, 0.908 * price AS price, date_time, extra FROM bid"),
    "q2": ("append", "SELECT auction, price FROM bid WHERE auction % 123 = 0"),
    # Local item suggestion: sellers in three states with auctions in category 10. A join of
    # two streams without a time condition, so both sides stay in state (Spark allows it for
    # an inner join). The nexmark crate writes the states in lower case (Flink's generator
    # in upper case).
    "q3": ("append", "SELECT p.name, p.city, p.state, a.id FROM auction a JOIN person p "
                     "ON a.seller = p.id WHERE a.category = 10 AND p.state IN ('or', 'id', 'ca')"),
    # Hot items, the first aggregation: bids per auction per sliding window (10 s, every 2 s).
    "q5agg": ("append", "SELECT auction, count(*) AS num, window.start AS starttime, window.end AS endtime "
                        "FROM bid GROUP BY auction, window(date_time, '10 seconds', '2 seconds')"),
    # Highest bid: the bids at the top price of their 10-second window, the aggregation joined
    # back to the bids (a join over an aggregation, keyed by the window; Flink's form, a
    # BETWEEN on the window's end, also admits a bid exactly at the end).
    "q7": ("append", "SELECT b.auction, b.price, b.bidder, b.date_time, b.extra FROM "
                     "(SELECT auction, price, bidder, date_time, extra, "
                     "window(date_time, '10 seconds') AS w FROM bid) b JOIN "
                     "(SELECT w, max(price) AS maxprice FROM "
                     "(SELECT window(date_time, '10 seconds') AS w, price FROM bid) GROUP BY w) m "
                     "ON b.w = m.w AND b.price = m.maxprice"),
    # q7's aggregation alone: the top price per 10-second window.
    "q7agg": ("append", "SELECT window.start AS starttime, window.end AS endtime, max(price) AS maxprice "
                        "FROM bid GROUP BY window(date_time, '10 seconds')"),
    # Monitor new users: people who opened an auction in the 10-second window in which they
    # registered. Nexmark's form groups each side by (id, window) and joins the groups; a
    # person id occurs once, so the person side's GROUP BY is the rows themselves, and the
    # auction side's is a DISTINCT, which a stream can run before a join (an aggregation
    # cannot be joined, in Spark as here). Same rows as Nexmark's q8.
    "q8": ("append", "SELECT p.id, p.name, p.w.start AS starttime FROM "
                     "(SELECT id, name, window(date_time, '10 seconds') AS w FROM person) p JOIN "
                     "(SELECT DISTINCT seller, window(date_time, '10 seconds') AS w FROM auction) a "
                     "ON p.id = a.seller AND p.w = a.w"),
    # Bids per bidder per 10-second window (on event time).
    "q12": ("append", "SELECT bidder, count(*) AS bid_count, window.start AS starttime, window.end AS endtime "
                      "FROM bid GROUP BY bidder, window(date_time, '10 seconds')"),
}

# The streams each query reads (the others read only bids).
TABLES = {"q3": ("auction", "person"), "q8": ("person", "auction")}


def cpu_seconds(path):
    t = open(path).read()
    user = float(re.search(r"User time \(seconds\): ([\d.]+)", t).group(1))
    sys_ = float(re.search(r"System time \(seconds\): ([\d.]+)", t).group(1))
    return user, sys_


COLUMNS = {
    "bid": "auction BIGINT, bidder BIGINT, price BIGINT, channel TEXT, url TEXT, "
           "date_time TIMESTAMP, extra TEXT",
    "auction": "id BIGINT, item_name TEXT, description TEXT, initial_bid BIGINT, reserve BIGINT, "
               "date_time TIMESTAMP, expires TIMESTAMP, seller BIGINT, category BIGINT, extra TEXT",
    "person": "id BIGINT, name TEXT, email_address TEXT, credit_card TEXT, city TEXT, state TEXT, "
              "date_time TIMESTAMP, extra TEXT",
}
WATERMARK = "WATERMARK FOR date_time AS date_time - INTERVAL '4 seconds'"


def generate_files(binary, events, batch, out, fmt="parquet"):
    """Lands each of the three streams of `events` events as `fmt` (parquet or json) files in
    out/<table>, one file per batch of `batch` events, through a file sink (Spark's
    file-sink layout), for Spark's and Flink's runs and for --files runs."""
    for table in COLUMNS:
        work = tempfile.mkdtemp(prefix="nexmark-gen-")
        script = os.path.join(work, "gen.sql")
        with open(script, "w") as f:
            f.write(f"""
CREATE STREAM {table} WITH (connector = 'nexmark', table = '{table}', max_events = {events},
    events_per_batch = {batch});
CREATE SINK {table}_files WITH (connector = '{fmt}', path = '{out}/{table}',
    trigger = 'available_now') AS SELECT * FROM {table};
""")
        subprocess.run([binary, "run", script, "--data-dir", os.path.join(work, "data")],
                       stdout=subprocess.DEVNULL, check=True, env={**os.environ, "RUST_LOG": "warn"})
        shutil.rmtree(work)


def stream(table, events, batch, files):
    if files:
        return (f"CREATE STREAM {table} ({COLUMNS[table]}, {WATERMARK})\n"
                f"WITH (format = 'parquet', path = '{files}/{table}', max_files_per_trigger = 1);")
    return (f"CREATE STREAM {table} ({WATERMARK})\nWITH (connector = 'nexmark', table = '{table}', "
            f"max_events = {events}, events_per_batch = {batch});")


def run(binary, name, events, batch, store, files=None, keep=None):
    mode, sql = QUERIES[name]
    work = tempfile.mkdtemp(prefix=f"nexmark-{name}-")
    script = os.path.join(work, "pipeline.sql")
    streams = "\n".join(stream(t, events, batch, files) for t in TABLES.get(name, ("bid",)))
    sink = f"connector = 'parquet', path = '{keep}/{name}'" if keep else "connector = 'noop'"
    with open(script, "w") as f:
        f.write(f"""
{streams}
CREATE SINK {name} WITH ({sink}, trigger = 'available_now', output_mode = '{mode}',
    state_store = '{store}') AS {sql};
COPY (SELECT count(*) AS batches, sum(num_input_rows) AS rows, sum(sink_output_rows) AS out,
             sum(batch_duration_ms) AS ms FROM tidemark.progress) TO '{work}/progress.csv' STORED AS CSV;
COPY (SELECT progress FROM tidemark.progress) TO '{work}/reports.json' STORED AS JSON;
""")
    timed = os.path.join(work, "time.txt")
    with open(timed, "w") as err:
        subprocess.run(["/usr/bin/time", "-v", binary, "run", script, "--data-dir", os.path.join(work, "data")],
                       stdout=subprocess.DEVNULL, stderr=err, check=True,
                       env={**os.environ, "RUST_LOG": "warn"})
    wall, rss = wall_and_rss(timed)
    user, sys_ = cpu_seconds(timed)
    p = next(csv.DictReader(open(os.path.join(work, "progress.csv"))))
    gen_ns = 0
    for line in open(os.path.join(work, "reports.json")):
        for src in json.loads(json.loads(line)["progress"])["sources"]:
            gen_ns += int(src.get("metrics", {}).get("generatorCpuNanos", 0))
    shutil.rmtree(work)
    cpu = user + sys_
    engine_cpu = cpu - gen_ns / 1e9
    return {
        "query": name, "events": events, "rows_in": int(p["rows"]), "out": int(p["out"]),
        "batches": int(p["batches"]), "query_s": int(p["ms"]) / 1000, "wall_s": wall, "cpu_s": cpu,
        "ev_per_s": events / (int(p["ms"]) / 1000), "ev_per_cpu_s": events / cpu, "rss_mib": rss / 1024,
        "gen_cpu_s": gen_ns / 1e9, "ev_per_engine_cpu_s": events / engine_cpu if gen_ns else None,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary", nargs="?", default=os.path.join(
        os.environ.get("CARGO_TARGET_DIR", "target"), "release", "tidemark"))
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--batch", type=int, default=1_000_000, help="events per micro-batch")
    ap.add_argument("--queries", default=",".join(QUERIES))
    ap.add_argument("--store", default="memory")
    ap.add_argument("--keep-output", metavar="DIR", help="write each query's rows as Parquet "
                    "into DIR/<query> instead of dropping them (for benches/spark_nexmark.py "
                    "--compare; the timings then include the writes)")
    ap.add_argument("--files", help="read the streams from Parquet files in this folder (DIR/bid, DIR/auction, DIR/person), landed "
                    "there first if it does not exist (for the side-by-side run with Spark)")
    a = ap.parse_args()
    if a.files and not os.path.isdir(a.files):
        generate_files(a.binary, a.events, a.batch, a.files)
    print(f"{'query':6} {'events':>10} {'rows in':>10} {'out rows':>10} {'batches':>7} {'query s':>8} "
          f"{'CPU s':>7} {'gen CPU s':>9} {'ev/s':>10} {'ev/s/core':>10} {'w/o gen':>10} {'peak RSS':>9}")
    for q in a.queries.split(","):
        r = run(a.binary, q, a.events, a.batch, a.store, a.files, a.keep_output)
        print(f"{r['query']:6} {r['events']:>10} {r['rows_in']:>10} {r['out']:>10} {r['batches']:>7} "
              f"{r['query_s']:>8.2f} {r['cpu_s']:>7.2f} {r['gen_cpu_s']:>9.2f} {r['ev_per_s']/1e6:>9.2f}M "
              f"{r['ev_per_cpu_s']/1e6:>9.2f}M "
              + (f"{r['ev_per_engine_cpu_s']/1e6:>9.2f}M" if r['ev_per_engine_cpu_s'] else f"{'-':>10}")
              + f" {r['rss_mib']:>6.0f} MiB", flush=True)


if __name__ == "__main__":
    main()
