"""Kafka benchmarks (issue 39), driven by benches/kafka.sh; see docs/benchmarks.md.

  kafka.py throughput BIN LANDING EVENTS WORKDIR FILE_OUTPUT_CSV
  kafka.py latency BIN RATE SECONDS DELIVERY WORKDIR
  kafka.py produce BOOTSTRAP TOPIC RATE SECONDS      (the latency run's producer)
  kafka.py consume BOOTSTRAP TOPIC EXPECTED OUT      (the latency run's consumer)

The throughput run's broker is tansu (in memory; the mock cluster keeps only the last 5 MiB
of a partition); the latency run's is librdkafka's mock cluster (examples/mock_broker.rs,
transactions included). Both are started here.
"""

import csv
import glob
import json
import os
import random
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from timed import cpu_seconds, wall_and_rss  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))


def broker(*topics):
    """Starts the mock broker with `topics` (name:partitions); (process, bootstrap)."""
    p = subprocess.Popen(
        [os.environ.get("MOCK_BROKER", os.path.join(TARGET, "release/examples/mock_broker")), *topics],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    return p, p.stdout.readline().strip()


def tansu_broker(work):
    """Starts tansu (in memory) with the topic clicks:1; (process, bootstrap). The mock broker
    cannot host the throughput run: it keeps only the last 5 MiB of a partition."""
    from confluent_kafka.admin import AdminClient, NewTopic

    bin_ = os.environ.get("TIDEMARK_TANSU", "/var/cache/tidemark-broker/bin/tansu")
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    log = open(os.path.join(work, "tansu.log"), "w")
    p = subprocess.Popen([bin_, "broker", "--listener-url", url, "--advertised-listener-url", url,
                          "--storage-engine", "memory://tansu/"], stdout=log, stderr=log)
    bs = f"127.0.0.1:{port}"
    deadline = time.time() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert time.time() < deadline, "tansu did not start"
            time.sleep(0.05)
    admin = AdminClient({"bootstrap.servers": bs})
    for f in admin.create_topics([NewTopic("clicks", 1, 1)]).values():
        f.result(timeout=30)
    return p, bs


def produce_lines(bs, topic, lines):
    """One record per produce request: tansu 0.6 answers ListOffsets(latest) with the last
    batch's base offset + 1, right only for batches of one record."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bs, "linger.ms": 0, "batch.num.messages": 1,
                  "queue.buffering.max.messages": 1000000})
    for line in lines:
        while True:
            try:
                p.produce(topic, value=line, partition=0)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(900) == 0


def throughput(bin_, landing, events, work, file_csv):
    files = sorted(glob.glob(os.path.join(landing, "*.json")))
    proc, bs = tansu_broker(work)
    try:
        t = time.time()
        lines = []
        for f in files:
            with open(f) as fh:
                lines.extend(l.rstrip("\n") for l in fh if l.strip())
        produce_lines(bs, "clicks", lines)
        print(f"produced {len(lines)} records in {time.time() - t:.1f} s (not timed)")
        run = os.path.join(work, f"kafka-{events}")
        subprocess.run(["rm", "-rf", run], check=True)
        os.makedirs(run)
        per_batch = len(lines) // 10
        sql = f"""
CREATE STREAM clicks (user_id TEXT, page TEXT, event_time TIMESTAMP, duration_s DOUBLE PRECISION)
WITH (connector = 'kafka', bootstrap_servers = '{bs}', topic = 'clicks', starting_offsets = 'earliest',
      format = 'json', max_offsets_per_trigger = {per_batch});
CREATE SINK page_views_5m WITH (path = '{run}/sink', watermark = 'event_time - 10 minutes',
    output_mode = 'append', trigger = 'available_now') AS
SELECT window.start AS window_start, window.end AS window_end, page,
       count(*) AS views, sum(duration_s) AS total_duration_s
FROM clicks GROUP BY window(event_time, '5 minutes'), page;
COPY (SELECT * FROM page_views_5m) TO '{run}/output.csv' STORED AS CSV;
"""
        with open(os.path.join(run, "pipeline.sql"), "w") as f:
            f.write(sql)
        with open(os.path.join(run, "time.txt"), "w") as err:
            subprocess.run(
                ["/usr/bin/time", "-v", bin_, "run", os.path.join(run, "pipeline.sql"),
                 "--data-dir", os.path.join(run, "data")],
                stdout=subprocess.DEVNULL, stderr=err, check=True,
                env={**os.environ, "RUST_LOG": "warn"},
            )
        secs, rss = wall_and_rss(os.path.join(run, "time.txt"))
        cpu = cpu_seconds(os.path.join(run, "time.txt"))
        n = len(lines)
        # tansu serves one-record batches slowly, so the wall time is the broker's; the
        # CPU time is Tidemark's own work.
        print(f"kafka -> windows -> delta: {n} events in {secs:.2f} s wall "
              f"({n / secs / 1000:.1f} k events/s, broker-bound), Tidemark CPU {cpu:.2f} s "
              f"({n / cpu / 1000:.0f} k events per CPU-second), peak RSS {rss // 1024} MiB")

        def rows(path):
            with open(path) as f:
                r = list(csv.reader(f))
            return sorted(tuple(x[:3]) + (x[3], f"{float(x[4]):.3f}") for x in r[1:])

        if file_csv and os.path.exists(file_csv):
            a, b = rows(os.path.join(run, "output.csv")), rows(file_csv)
            print(f"output: {len(a)} windows; the file run's {len(b)}: "
                  f"{'identical' if a == b else 'DIFFERENT'}")
    finally:
        proc.kill()
        proc.wait()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def latency(bin_, rate, seconds, delivery, work):
    import psycopg

    proc, bs = broker("lat_in:2", "lat_out:2")
    data = os.path.join(work, f"latency-{rate}-{delivery}")
    subprocess.run(["rm", "-rf", data], check=True)
    port = free_port()
    server = subprocess.Popen(
        [bin_, "serve", "--listen", f"127.0.0.1:{port}", "--http", "off", "--data-dir", data],
        stdout=subprocess.DEVNULL, stderr=open(data + ".log", "w"),
        env={**os.environ, "RUST_LOG": "warn"},
    )
    try:
        for _ in range(200):
            try:
                conn = psycopg.connect(f"host=127.0.0.1 port={port} user=tidemark", autocommit=True)
                break
            except Exception:
                time.sleep(0.05)
        conn.execute(
            f"CREATE STREAM lat (id BIGINT, sent_us BIGINT, v DOUBLE PRECISION) WITH (connector = "
            f"'kafka', bootstrap_servers = '{bs}', topic = 'lat_in', format = 'json')")
        conn.execute(
            f"CREATE SINK filt WITH (connector = 'kafka', bootstrap_servers = '{bs}', topic = "
            f"'lat_out', delivery = '{delivery}') AS SELECT CAST(id AS TEXT) AS key, "
            f"to_json(named_struct('id', id, 'sent_us', sent_us)) AS value FROM lat WHERE v < 0.5")
        time.sleep(1)  # the query's first (empty) batch fixes its start at latest
        total = int(rate * seconds)
        expected = os.path.join(data, "expected")
        out = os.path.join(data, "latencies")
        consumer = subprocess.Popen(
            [sys.executable, __file__, "consume", bs, "lat_out", expected, out])
        subprocess.run([sys.executable, __file__, "produce", bs, "lat_in", str(rate),
                        str(seconds), expected], check=True)
        consumer.wait(timeout=120 + seconds)
        with open(out) as f:
            lat = sorted(float(x) for x in f.read().split())
        with open(expected) as f:
            want = int(f.read())
        p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] / 1000  # noqa: E731
        print(f"{rate} events/s for {seconds} s, delivery {delivery}: {len(lat)} of {want} "
              f"passing records read; end-to-end latency p50 {p(0.5):.1f} ms, "
              f"p99 {p(0.99):.1f} ms, max {lat[-1] / 1000:.1f} ms")
    finally:
        server.terminate()
        server.wait()
        proc.stdin.close()
        proc.wait()


def produce_paced(bs, topic, rate, seconds, expected):
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bs, "linger.ms": 1, "queue.buffering.max.messages": 2000000})
    rng = random.Random(7)
    start = time.time()
    total = int(rate * seconds)
    passing = 0
    i = 0
    while i < total:
        due = int((time.time() - start) * rate) + 1
        while i < min(due, total):
            v = rng.random()
            passing += v < 0.5
            rec = json.dumps({"id": i, "sent_us": int(time.time() * 1e6), "v": v})
            try:
                p.produce(topic, value=rec, partition=i % 2)
            except BufferError:
                p.poll(0.01)
                continue
            i += 1
        p.poll(0)
        time.sleep(0.0005)
    assert p.flush(60) == 0
    with open(expected, "w") as f:
        f.write(str(passing))


def consume_latencies(bs, topic, expected, out):
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bs, "group.id": "bench", "enable.auto.commit": False,
                  "isolation.level": "read_committed", "fetch.wait.max.ms": 5})
    c.assign([TopicPartition(topic, p, 0) for p in range(2)])
    lat = []
    deadline = None
    while True:
        msgs = c.consume(10000, 0.1)
        now = time.time() * 1e6
        for m in msgs:
            if m.error():
                continue
            lat.append(now - json.loads(m.value())["sent_us"])
        if deadline is None and os.path.exists(expected):
            deadline = time.time() + 60
        if deadline is not None:
            with open(expected) as f:
                text = f.read()
            if text and len(lat) >= int(text) or time.time() > deadline:
                break
    with open(out, "w") as f:
        f.write("\n".join(f"{x:.0f}" for x in lat))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "throughput":
        throughput(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6])
    elif cmd == "latency":
        latency(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5], sys.argv[6])
    elif cmd == "produce":
        produce_paced(sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]), sys.argv[6])
    elif cmd == "consume":
        consume_latencies(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5])
