#!/usr/bin/env python3
"""Materialized views: freshness, reads under writes, memory per group, and PostgreSQL's
REFRESH MATERIALIZED VIEW beside an incremental view (issue 11, item 5).

    python3 benches/views.py BIN freshness [--rates 1000,50000] [--seconds 20]
    python3 benches/views.py BIN reads [--groups 1000000] [--rate 50000] [--seconds 20]
                                       [--store memory|rocksdb]
    python3 benches/views.py BIN postgres [--rows 1000000] [--probes 20]
    python3 benches/views.py BIN keys [--rows 1000000] [--probes 20]
    python3 benches/views.py BIN lookups [--groups 1000000] [--lookups 5000]

BIN is a release `tidemark` (built with --features rocksdb for --store rocksdb). Every
run starts its own server on a free port with a fresh data directory under --work (default
/tmp/views-bench) and talks to it with psycopg 3, as a client would.

freshness: a table-fed stream of the seed's clicks and the seed's five-minute page-view
  view (update mode, default trigger). A writer inserts RATE rows/s (a COPY of RATE/100
  rows every 10 ms) while a prober, 50 times a second, inserts one row of its own page and
  polls the view with a full-key lookup until the row's window shows it. Reported: the
  time from sending the probe's INSERT to the first read that sees it (p50, p99, max), the
  INSERT's own round trip, how many reads it took, and how many rows the writer got in.
  Then the same writer and probe against PostgreSQL, where the windows are a summary table
  upserted by a row trigger in the INSERT's transaction (PostgreSQL's way to an aggregate
  that is always current), in the same run.

reads: a view of one row per user (`GROUP BY user_id`, update mode) filled with GROUPS
  users by COPY (batches of at most 100,000 rows). The server's RSS is read before the
  view exists and after it holds every group: the difference over GROUPS is the memory per
  group (view rows plus the operator's state, in the --store). Then a writer inserts RATE
  rows/s for random users while a reader looks one user up at a time; reported: the
  lookup's round trip (p50, p99, max) and how many lookups ran, and the server's peak RSS
  (VmHWM) over the whole run. With --store rocksdb the view's rows are in RocksDB too.

postgres: the same ROWS clicks in a PostgreSQL table and in a Tidemark stream, and the same
  plain aggregate (views and total duration per page) as PostgreSQL's materialized view
  and as a Tidemark view. Each probe inserts one row and waits until the view shows it:
  PostgreSQL by `REFRESH MATERIALIZED VIEW`, Tidemark by polling its view. Reported: the
  probe's latency (p50, max) for each. Then PostgreSQL's way to an always-current result,
  a summary table upserted by a row trigger in the INSERT's transaction, against the
  Tidemark view, 10 x PROBES probes each, back to back and paced one every 20 ms (as the
  freshness probe is). PostgreSQL (Debian's, /usr/lib/postgresql/*) runs as the
  `postgres` user in a scratch cluster on a free port, with fsync on.

keys: the seed's windowed view with ROWS groups (ROWS / 1,000 five-minute windows of 1,000
  pages each). Each filter is timed through the view's key order and, as the yardstick,
  written so that no key column is compared directly (`page || '' = ...`, which scans
  every row); both must give the same answer (count, sum, min and max over the rows kept,
  one row back to the client). Reported: the query's round trip (p50) over PROBES runs of
  each, on a view that does not change (a scan then reads the Arrow batches the first scan
  decoded) and on one that changes before every query (each scan decodes every row).

lookups: the seed's windowed view with GROUPS groups (GROUPS / 1,000 windows of 1,000
  pages), read one row at a time by its whole key (window_start, window_end, page) as a
  prepared statement: LOOKUPS keys drawn at random (one in fifty not there), back to back.
  Timed three ways over the same keys: the view by its key (Tidemark answers it without
  planning), the same query with a filter on a non-key column added (`AND views > -1`, so
  DataFusion plans it: the cost the lookup path saves), and PostgreSQL reading a table
  holding the view's rows by its primary key. All three answers are compared row by row.
"""
import argparse
import datetime as dt
import glob
import os
import random
import shutil
import socket
import subprocess
import multiprocessing
import time

import psycopg

ap = argparse.ArgumentParser()
ap.add_argument("bin")
ap.add_argument("what", choices=["freshness", "reads", "postgres", "keys", "lookups"])
ap.add_argument("--rates", default="1000,50000")
ap.add_argument("--rate", type=int, default=50_000)
ap.add_argument("--seconds", type=int, default=20)
ap.add_argument("--groups", type=int, default=1_000_000)
ap.add_argument("--store", default="memory")
ap.add_argument("--rows", type=int, default=1_000_000)
ap.add_argument("--probes", type=int, default=20)
ap.add_argument("--work", default="/tmp/views-bench")
ap.add_argument("--lookups", type=int, default=5_000)
args = ap.parse_args()

BASE = dt.datetime(2026, 6, 10, 10, 0, 0)
PAGES = [f"/p{i}" for i in range(10)]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def pct(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")


def ms(values):
    return (f"p50={pct(values, .5) * 1000:7.2f} ms  p99={pct(values, .99) * 1000:7.2f} ms  "
            f"max={max(values) * 1000:7.2f} ms  n={len(values)}")


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
            env={**os.environ, "RUST_LOG": os.environ.get("TIDEMARK_BENCH_LOG", "warn")})
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

    def rss_bytes(self, field="VmRSS"):
        for line in open(f"/proc/{self.proc.pid}/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
        raise SystemExit(f"no {field}")

    def peak_rss_bytes(self):
        """The server's peak RSS so far (VmHWM)."""
        return self.rss_bytes("VmHWM")

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def event_time(start):
    """Event time runs with the wall clock from BASE."""
    return BASE + dt.timedelta(seconds=time.time() - start)


def writer(dsn, rate, start, stop, users, counts):
    """RATE rows/s as a COPY of RATE/100 rows every 10 ms, until `stop` is set, for random
    users of USERS (drawn once: 65,536 of them, cycled). Runs in its own process, so that
    the measuring thread does not share an interpreter with it."""
    conn = psycopg.connect(dsn, autocommit=True)
    per = max(1, rate // 100)
    rnd = random.Random(3)
    # COPY's text format, built as text: the generator must cost the machine little.
    users_of = [f"u{rnd.randrange(users)}\t{rnd.choice(PAGES)}\t" for _ in range(65_536)]
    durations = [f"\t{rnd.random() * 60:.3f}\n" for _ in range(4_096)]
    tick = time.time()
    i = 0
    while not stop.is_set():
        t = event_time(start).isoformat(sep=" ")
        lines = [users_of[(i + j) % 65_536] + t + durations[(i + j) % 4_096]
                 for j in range(per)]
        i += per
        with conn.cursor() as cur:
            with cur.copy("COPY clicks FROM STDIN") as copy:
                copy.write("".join(lines))
        with counts.get_lock():
            counts.value += per
        tick += 0.01
        delay = tick - time.time()
        if delay > 0:
            time.sleep(delay)


CLICKS = ("CREATE STREAM clicks (user_id TEXT, page TEXT, event_time TIMESTAMP, "
          "duration_s DOUBLE PRECISION, "
          "WATERMARK FOR event_time AS event_time - INTERVAL '10 minutes')")


def dsn(port):
    return f"host=127.0.0.1 port={port} user=bench dbname=bench"


# PostgreSQL's way to a result that is always current: a summary table upserted by a row
# trigger in the INSERT's own transaction (durable at its commit). For `freshness`, the
# seed's five-minute windows by page; for `postgres`, totals by page.
PG_WINDOWED = """
    CREATE TABLE page_views (window_start TIMESTAMP, window_end TIMESTAMP, page TEXT,
        views BIGINT, total_duration_s DOUBLE PRECISION, PRIMARY KEY (window_start, page));
    CREATE FUNCTION count_click() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE ws TIMESTAMP := date_bin('5 minutes', NEW.event_time, TIMESTAMP '2000-01-01');
    BEGIN
      INSERT INTO page_views VALUES (ws, ws + INTERVAL '5 minutes', NEW.page, 1,
                                     NEW.duration_s)
      ON CONFLICT (window_start, page) DO UPDATE SET views = page_views.views + 1,
        total_duration_s = page_views.total_duration_s + EXCLUDED.total_duration_s;
      RETURN NULL;
    END $$;
    CREATE TRIGGER count_click AFTER INSERT ON clicks
        FOR EACH ROW EXECUTE FUNCTION count_click();"""


def probe_freshness(conn, start, seconds):
    """Fifty times a second: INSERT one row of a page of its own, then read its window's
    row by the full key until it shows. Returns (INSERT -> visible, the INSERT alone,
    SELECTs per probe), after a 3-second warm-up."""
    lags, inserts, polls, n = [], [], [], 0
    warmup = start + 3
    end = start + seconds
    tick = time.time()
    while time.time() < end:
        n += 1
        page = f"probe{n}"
        t = event_time(start)
        ws = t.replace(minute=t.minute - t.minute % 5, second=0, microsecond=0)
        we = ws + dt.timedelta(minutes=5)
        t0 = time.perf_counter()
        conn.execute("INSERT INTO clicks VALUES (%s, %s, %s, %s)", ("probe", page, t, 1.0))
        inserted = time.perf_counter() - t0
        k = 1
        while conn.execute("SELECT views FROM page_views WHERE window_start = %s AND "
                           "window_end = %s AND page = %s", (ws, we, page)).fetchone() is None:
            k += 1
        lag = time.perf_counter() - t0
        if time.time() >= warmup:
            lags.append(lag)
            inserts.append(inserted)
            polls.append(k)
        tick += 0.02
        delay = tick - time.time()
        if delay > 0:
            time.sleep(delay)
    return lags, inserts, polls


def freshness(rate):
    """The Tidemark view, then PostgreSQL's trigger-fed table, each under the same writer
    and the same probe."""
    server = Server(f"freshness-{rate}")
    admin = server.connect()
    admin.execute(CLICKS)
    admin.execute("""CREATE MATERIALIZED VIEW page_views AS
        SELECT window.start AS window_start, window.end AS window_end, page,
               count(*) AS views, sum(duration_s) AS total_duration_s
        FROM clicks GROUP BY window(event_time, '5 minutes'), page""")
    tidemark = with_writer(dsn(server.port), rate, server.connect())
    server.stop()
    cluster = Postgres(f"freshness-pg-{rate}")
    try:
        pg = cluster.connect()
        pg.execute("CREATE TABLE clicks (user_id TEXT, page TEXT, event_time TIMESTAMP, "
                   "duration_s DOUBLE PRECISION)")
        pg.execute(PG_WINDOWED)
        version = pg.execute("SHOW server_version").fetchone()[0]
        postgres = with_writer(dsn(cluster.port), rate, cluster.connect())
    finally:
        cluster.stop()
    for name, (got, (lags, inserts, polls)) in [("tidemark, the view", tidemark),
                                                 (f"postgres {version}, trigger-fed table",
                                                  postgres)]:
        print(f"freshness at {rate:>6,} rows/s, {name} (wrote {got:,.0f} rows/s): "
              f"INSERT -> visible {ms(lags)}")
        # Where the time goes, from the client: the INSERT's own round trip, and how many
        # SELECTs it took to see the row (the last one included).
        print(f"    of which the INSERT statement {ms(inserts)}; SELECTs per probe "
              f"p50={pct(polls, .5)} p99={pct(polls, .99)}")


def with_writer(target, rate, probe):
    """Runs the writer at RATE rows/s into `target` while `probe` probes; returns (rows/s
    written, the probe's lists)."""
    start = time.time()
    stop = multiprocessing.Event()
    counts = multiprocessing.Value("q", 0)
    w = multiprocessing.Process(target=writer, args=(target, rate, start, stop, 10_000, counts))
    w.start()
    result = probe_freshness(probe, start, args.seconds)
    stop.set()
    w.join()
    return counts.value / (time.time() - start), result


def copy_rows(conn, rows):
    with conn.cursor() as cur:
        with cur.copy("COPY clicks FROM STDIN") as copy:
            for r in rows:
                copy.write_row(r)


def reads():
    server = Server(f"reads-{args.store}-{args.groups}")
    admin = server.connect()
    admin.execute(CLICKS)
    # The groups' rows first, so that the view's memory is all that changes after.
    rnd = random.Random(5)
    t0 = time.time()
    chunk = 100_000
    for lo in range(0, args.groups, chunk):
        copy_rows(admin, [(f"u{i}", rnd.choice(PAGES), BASE, rnd.random() * 60)
                          for i in range(lo, min(args.groups, lo + chunk))])
    loaded = time.time() - t0
    time.sleep(1)
    before = server.rss_bytes()
    t0 = time.time()
    admin.execute(f"""CREATE MATERIALIZED VIEW user_totals WITH (state_store = '{args.store}',
        max_rows_per_trigger = 100000) AS
        SELECT user_id, count(*) AS n, sum(duration_s) AS total FROM clicks GROUP BY user_id""")
    admin.execute("FLUSH MATERIALIZED VIEW user_totals")
    built = time.time() - t0
    held = admin.execute("SELECT count(*) FROM user_totals").fetchone()[0]
    assert held == args.groups, held
    time.sleep(1)
    after = server.rss_bytes()
    print(f"reads/{args.store}: {args.groups:,} groups copied in {loaded:.1f} s, view built in "
          f"{built:.1f} s; RSS {before / 2**20:,.0f} -> {after / 2**20:,.0f} MiB = "
          f"{(after - before) / args.groups:,.0f} bytes per group")
    # Lookups while RATE rows/s are written.
    start = time.time()
    stop = multiprocessing.Event()
    counts = multiprocessing.Value("q", 0)
    w = multiprocessing.Process(target=writer,
                                args=(dsn(server.port), args.rate, start, stop, args.groups, counts))
    w.start()
    reader = server.connect()
    lat = []
    end = start + args.seconds
    while time.time() < end:
        user = f"u{rnd.randrange(args.groups)}"
        t0 = time.perf_counter()
        row = reader.execute("SELECT n FROM user_totals WHERE user_id = %s", (user,)).fetchone()
        lat.append(time.perf_counter() - t0)
        assert row is not None and row[0] >= 1, (user, row)
    stop.set()
    w.join()
    elapsed = time.time() - start
    print(f"reads/{args.store}: 1-row lookup on {args.groups:,} groups while writing "
          f"{counts.value / elapsed:,.0f} rows/s: {ms(lat)}")
    print(f"reads/{args.store}: the server's peak RSS over the whole run "
          f"{server.peak_rss_bytes() / 2**20:,.0f} MiB, RSS at the end "
          f"{server.rss_bytes() / 2**20:,.0f} MiB")
    server.stop()


class Postgres:
    """Debian's PostgreSQL (/usr/lib/postgresql/*) as the `postgres` user in a scratch
    cluster on a free port, fsync on; database `bench`."""

    def __init__(self, name):
        self.bin = sorted(glob.glob("/usr/lib/postgresql/*/bin"))[-1]
        self.dir = os.path.join(args.work, name)
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        shutil.chown(self.dir, "postgres")
        self.as_pg = ["runuser", "-u", "postgres", "--"]
        subprocess.run(self.as_pg + [f"{self.bin}/initdb", "-D", f"{self.dir}/data", "-A",
                                     "trust", "-U", "bench"], check=True, capture_output=True)
        self.port = free_port()
        subprocess.run(self.as_pg + [f"{self.bin}/pg_ctl", "-D", f"{self.dir}/data", "-l",
                                     f"{self.dir}/log", "-o",
                                     f"-p {self.port} -k {self.dir} -c fsync=on", "-w", "start"],
                       check=True, capture_output=True)
        psycopg.connect(f"host=127.0.0.1 port={self.port} user=bench dbname=postgres",
                        autocommit=True).execute("CREATE DATABASE bench")

    def connect(self):
        return psycopg.connect(f"host=127.0.0.1 port={self.port} user=bench dbname=bench",
                               autocommit=True)

    def stop(self):
        subprocess.run(self.as_pg + [f"{self.bin}/pg_ctl", "-D", f"{self.dir}/data", "-m",
                                     "fast", "stop"], capture_output=True)


def postgres():
    cluster = Postgres("pg")
    try:
        pg = cluster.connect()
        version = pg.execute("SHOW server_version").fetchone()[0]
        pg.execute("CREATE TABLE clicks (user_id TEXT, page TEXT, event_time TIMESTAMP, "
                   "duration_s DOUBLE PRECISION)")
        rnd = random.Random(9)
        rows = [(f"u{rnd.randrange(10_000)}", rnd.choice(PAGES), BASE, rnd.random() * 60)
                for _ in range(args.rows)]
        t0 = time.time()
        copy_rows(pg, rows)
        pg.execute("CREATE MATERIALIZED VIEW per_page AS SELECT page, count(*) AS views, "
                   "sum(duration_s) AS total FROM clicks GROUP BY page")
        pg.execute("VACUUM ANALYZE clicks")
        print(f"postgres {version}: {args.rows:,} rows loaded and viewed in {time.time() - t0:.1f} s")
        pg_lat = []
        for i in range(args.probes):
            t0 = time.perf_counter()
            pg.execute("INSERT INTO clicks VALUES (%s, %s, %s, %s)", ("p", f"/probe{i}", BASE, 1.0))
            pg.execute("REFRESH MATERIALIZED VIEW per_page")
            seen = pg.execute("SELECT views FROM per_page WHERE page = %s", (f"/probe{i}",)).fetchone()
            pg_lat.append(time.perf_counter() - t0)
            assert seen == (1,), seen
        pg_total = pg.execute("SELECT sum(views) FROM per_page").fetchone()[0]
        # PostgreSQL's way to a result that is always current: a summary table kept by a
        # trigger, upserted in the INSERT's own transaction (durable at its commit).
        pg.execute("CREATE TABLE per_page_live (page TEXT PRIMARY KEY, views BIGINT, "
                   "total DOUBLE PRECISION)")
        pg.execute("INSERT INTO per_page_live SELECT page, count(*), sum(duration_s) "
                   "FROM clicks GROUP BY page")
        pg.execute("""CREATE FUNCTION count_click() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
              INSERT INTO per_page_live VALUES (NEW.page, 1, NEW.duration_s)
              ON CONFLICT (page) DO UPDATE SET views = per_page_live.views + 1,
                total = per_page_live.total + EXCLUDED.total;
              RETURN NULL;
            END $$""")
        pg.execute("CREATE TRIGGER count_click AFTER INSERT ON clicks "
                   "FOR EACH ROW EXECUTE FUNCTION count_click()")
        # Back to back, then paced as the freshness probe is (one every 20 ms): on an
        # idle machine each wake-up costs (PostgreSQL's `SELECT 1` takes 0.1 ms back to
        # back, 0.6 ms paced, on the 2-core VM of docs/benchmarks.md).
        live_lat = {0.0: [], 0.02: []}
        for pace, lat in live_lat.items():
            for i in range(args.probes * 10):
                t0 = time.perf_counter()
                pg.execute("INSERT INTO clicks VALUES (%s, %s, %s, %s)",
                           ("p", f"/live{pace}-{i}", BASE, 1.0))
                seen = pg.execute("SELECT views FROM per_page_live WHERE page = %s",
                                  (f"/live{pace}-{i}",)).fetchone()
                lat.append(time.perf_counter() - t0)
                assert seen == (1,), seen
                time.sleep(pace)
    finally:
        cluster.stop()
    server = Server("postgres-side")
    tm = server.connect()
    tm.execute(CLICKS)
    t0 = time.time()
    for lo in range(0, len(rows), 100_000):
        copy_rows(tm, rows[lo:lo + 100_000])
    tm.execute("CREATE MATERIALIZED VIEW per_page AS SELECT page, count(*) AS views, "
               "sum(duration_s) AS total FROM clicks GROUP BY page")
    tm.execute("FLUSH MATERIALIZED VIEW per_page")
    print(f"tidemark: {args.rows:,} rows loaded and viewed in {time.time() - t0:.1f} s")
    tm_lat = {0.0: [], 0.02: []}
    for pace, lat in tm_lat.items():
        for i in range(args.probes * 10):
            t0 = time.perf_counter()
            tm.execute("INSERT INTO clicks VALUES (%s, %s, %s, %s)",
                       ("p", f"/probe{pace}-{i}", BASE, 1.0))
            while tm.execute("SELECT views FROM per_page WHERE page = %s",
                             (f"/probe{pace}-{i}",)).fetchone() != (1,):
                pass
            lat.append(time.perf_counter() - t0)
            time.sleep(pace)
    tm_total = tm.execute("SELECT sum(views) FROM per_page").fetchone()[0]
    # The same clicks besides each side's own probes.
    tm_probes = sum(len(v) for v in tm_lat.values())
    assert tm_total - tm_probes == pg_total - args.probes, (tm_total, tm_probes, pg_total)
    server.stop()
    print(f"postgres: INSERT + REFRESH MATERIALIZED VIEW over {args.rows:,} rows: {ms(pg_lat)}")
    for pace in live_lat:
        how = f"one every {pace * 1000:.0f} ms" if pace else "back to back"
        print(f"INSERT -> visible, {how}:")
        print(f"  postgres, a summary table kept by a trigger: {ms(live_lat[pace])}")
        print(f"  tidemark, the view:                          {ms(tm_lat[pace])}")
    print(f"both views hold the {pg_total - args.probes:,} loaded clicks, and their probes")


def lookups():
    """One row by its whole key, back to back: the view read by its key (answered without
    planning), the same rows through DataFusion's plan (a filter on a non-key column added,
    so the query is no longer a key lookup), and PostgreSQL reading a table that holds the
    view's rows by its primary key. The same keys for all three; every answer compared."""
    server = Server("lookups")
    conn = server.connect()
    conn.execute(CLICKS)
    pages = 1_000
    windows = max(1, args.groups // pages)
    rnd = random.Random(11)
    for lo in range(0, windows, 100):
        lines = []
        for w in range(lo, min(windows, lo + 100)):
            t = (BASE + dt.timedelta(minutes=5 * w)).isoformat(sep=" ")
            lines.extend(f"u{w}\t/k{p}\t{t}\t{rnd.randrange(100)}\n"
                         for p in range(pages) for _ in range(1 + (w + p) % 3))
        with conn.cursor() as cur:
            with cur.copy("COPY clicks FROM STDIN") as copy:
                copy.write("".join(lines))
    conn.execute("""CREATE MATERIALIZED VIEW page_views WITH (max_rows_per_trigger = 1000000) AS
        SELECT window.start AS window_start, window.end AS window_end, page,
               count(*) AS views, sum(duration_s) AS total_duration_s
        FROM clicks GROUP BY window(event_time, '5 minutes'), page""")
    conn.execute("FLUSH MATERIALIZED VIEW page_views")
    rows = conn.execute("SELECT window_start, window_end, page, views, total_duration_s "
                        "FROM page_views").fetchall()
    assert len(rows) == windows * pages, len(rows)
    probes = [rows[rnd.randrange(len(rows))][:3] for _ in range(args.lookups)]
    # A few keys that are not there.
    probes[::50] = [(r[0], r[1], "/absent") for r in probes[::50]]
    where = "WHERE window_start = %s AND window_end = %s AND page = %s"
    results = {}

    def run(name, c, sql):
        lat, got = [], []
        for key in probes:
            t0 = time.perf_counter()
            got.append(c.execute(sql, key).fetchall())
            lat.append(time.perf_counter() - t0)
        results[name] = got
        print(f"lookups: {name:<62} {ms(lat)}")

    print(f"lookups: {len(rows):,} groups, {len(probes):,} keys ({len(probes[::50])} absent), "
          f"back to back, one connection each")
    cols = "SELECT views, total_duration_s FROM page_views "
    run("tidemark, the view by its key", conn, cols + where)
    run("tidemark, the same rows planned (+ views > -1)", conn, cols + where + " AND views > -1")
    server.stop()
    cluster = Postgres("lookups-pg")
    try:
        pg = cluster.connect()
        version = pg.execute("SHOW server_version").fetchone()[0]
        pg.execute("CREATE TABLE page_views (window_start TIMESTAMP, window_end TIMESTAMP, "
                   "page TEXT, views BIGINT, total_duration_s DOUBLE PRECISION, "
                   "PRIMARY KEY (window_start, window_end, page))")
        with pg.cursor() as cur:
            with cur.copy("COPY page_views FROM STDIN") as copy:
                for r in rows:
                    copy.write_row(r)
        pg.execute("VACUUM ANALYZE page_views")
        run(f"postgres {version}, the table by its primary key", pg, cols + where)
    finally:
        cluster.stop()
    names = list(results)
    for other in names[1:]:
        assert results[other] == results[names[0]], f"{other} differs from {names[0]}"
    print(f"lookups: the three answered alike ({sum(1 for r in results[names[0]] if r):,} "
          f"rows found)")


def keys():
    server = Server("keys")
    conn = server.connect()
    conn.execute(CLICKS)
    pages = 1_000
    windows = max(1, args.rows // pages)
    t0 = time.time()
    chunk = []
    for w in range(windows):
        t = (BASE + dt.timedelta(minutes=5 * w)).isoformat(sep=" ")
        chunk.extend(f"u{w}\t/k{p}\t{t}\t1.0\n" for p in range(pages))
        if len(chunk) >= 100_000 or w == windows - 1:
            with conn.cursor() as cur:
                with cur.copy("COPY clicks FROM STDIN") as copy:
                    copy.write("".join(chunk))
            chunk = []
    conn.execute("""CREATE MATERIALIZED VIEW page_views WITH (max_rows_per_trigger = 100000) AS
        SELECT window.start AS window_start, window.end AS window_end, page,
               count(*) AS views, sum(duration_s) AS total_duration_s
        FROM clicks GROUP BY window(event_time, '5 minutes'), page""")
    conn.execute("FLUSH MATERIALIZED VIEW page_views")
    held = conn.execute("SELECT count(*) FROM page_views").fetchone()[0]
    assert held == windows * pages, held
    print(f"keys: {held:,} groups ({windows:,} windows x {pages:,} pages) in "
          f"{time.time() - t0:.1f} s")
    mid = BASE + dt.timedelta(minutes=5 * (windows // 2))
    cases = [
        ("page = %s", "page || '' = %s", ("/k7",)),
        ("window_end = %s", "window_end + INTERVAL '0 seconds' = %s",
         (mid + dt.timedelta(minutes=5),)),
        ("window_start >= %s AND page = %s", "window_start + INTERVAL '0 seconds' >= %s "
         "AND page || '' = %s", (mid, "/k7")),
    ]
    # The last window is still open: a row there changes the view without closing any.
    last = (BASE + dt.timedelta(minutes=5 * (windows - 1))).isoformat(sep=" ")
    for changing in (False, True):
        print("  a view that changes before every query (one INSERT, then FLUSH, not timed):"
              if changing else "  a view that does not change between queries:")
        for keyed, scanned, params in cases:
            times = {}
            for label, where in (("key", keyed), ("scan", scanned)):
                # One row back, so that the client's decoding of many rows is not measured.
                q = (f"SELECT count(*), sum(views), min(page), max(window_end) "
                     f"FROM page_views WHERE {where}")
                lat, rows = [], None
                for _ in range(args.probes):
                    if changing:
                        conn.execute("INSERT INTO clicks VALUES ('x', '/k1', %s, 1.0)", (last,))
                        conn.execute("FLUSH MATERIALIZED VIEW page_views")
                    t0 = time.perf_counter()
                    rows = conn.execute(q, params).fetchall()
                    lat.append(time.perf_counter() - t0)
                times[label] = (lat, rows)
            if not changing:
                assert times["key"][1] == times["scan"][1], keyed
            print(f"    WHERE {keyed:<34} {times['key'][1][0][0]:>6,} rows: through the key "
                  f"p50={pct(times['key'][0], .5) * 1000:7.2f} ms, scanning "
                  f"p50={pct(times['scan'][0], .5) * 1000:7.2f} ms")
    server.stop()


if args.what == "freshness":
    for r in args.rates.split(","):
        freshness(int(r))
elif args.what == "reads":
    reads()
elif args.what == "keys":
    keys()
elif args.what == "lookups":
    lookups()
else:
    postgres()
