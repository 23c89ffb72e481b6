#!/usr/bin/env python3
"""Flink's side of benches/latency.py: the seed query on a folder that files keep landing in.

    FLINK_VENV/bin/python benches/flink_latency.py LANDING WORK

Flink 2.3 (PyFlink, local mini-cluster, parallelism 2) in streaming mode: a filesystem
JSON source monitoring LANDING every 200 ms (`source.monitor-interval`), a 10-minute
watermark, 5-minute tumbling windows per page (count and sum), into a filesystem JSON
sink at WORK/sink, whose files are committed by checkpoints every second (the file sink's
exactly-once protocol; the counterpart of a 1-second trigger). Sources idle for 1 s do
not hold the watermark back. Writes WORK/ready once the job runs, runs until WORK/stop
exists, then writes the completed checkpoints' statistics (from the mini-cluster's REST
API) to WORK/checkpoints.json and cancels the job.
"""
import json
import os
import socket
import sys
import time
import urllib.request

from pyflink.common import Configuration
from pyflink.table import EnvironmentSettings, TableEnvironment

landing, work = sys.argv[1], sys.argv[2]
s = socket.socket()
s.bind(("127.0.0.1", 0))
port = s.getsockname()[1]
s.close()
conf = Configuration()
conf.set_string("rest.port", str(port))
conf.set_string("rest.address", "127.0.0.1")
conf.set_string("parallelism.default", "2")
conf.set_string("table.local-time-zone", "UTC")
conf.set_string("execution.checkpointing.interval", "1s")
conf.set_string("execution.checkpointing.dir", "file://" + os.path.join(work, "checkpoints"))
conf.set_string("table.exec.source.idle-timeout", "1s")
conf.set_string("web.checkpoints.history", "100000")
env = TableEnvironment.create(
    EnvironmentSettings.new_instance().in_streaming_mode().with_configuration(conf).build())
env.execute_sql(f"""CREATE TABLE clicks (user_id STRING, page STRING, event_time TIMESTAMP_LTZ(3),
    duration_s DOUBLE, WATERMARK FOR event_time AS event_time - INTERVAL '10' MINUTE)
WITH ('connector' = 'filesystem', 'path' = '{landing}', 'format' = 'json',
      'json.timestamp-format.standard' = 'ISO-8601', 'source.monitor-interval' = '200ms')""")
env.execute_sql(f"""CREATE TABLE sink (window_start TIMESTAMP(3), window_end TIMESTAMP(3),
    page STRING, `views` BIGINT, total_duration_s DOUBLE)
WITH ('connector' = 'filesystem', 'path' = '{work}/sink', 'format' = 'json',
      'json.timestamp-format.standard' = 'ISO-8601',
      'sink.rolling-policy.rollover-interval' = '1s',
      'sink.rolling-policy.check-interval' = '100ms')""")
result = env.execute_sql(
    "INSERT INTO sink SELECT window_start, window_end, page, COUNT(*), SUM(duration_s) "
    "FROM TABLE(TUMBLE(TABLE clicks, DESCRIPTOR(event_time), INTERVAL '5' MINUTE)) "
    "GROUP BY window_start, window_end, page")
job = str(result.get_job_client().get_job_id())


def rest(path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        return json.load(r)


# Ready once the first checkpoint has completed (the job is running end to end).
deadline = time.time() + 120
while True:
    try:
        if rest(f"/jobs/{job}/checkpoints")["counts"]["completed"] > 0:
            break
    except OSError:
        pass
    if time.time() > deadline:
        raise SystemExit("no checkpoint completed in 120 s")
    time.sleep(0.1)
open(os.path.join(work, "ready"), "w").close()
while not os.path.exists(os.path.join(work, "stop")):
    time.sleep(0.1)
stats = rest(f"/jobs/{job}/checkpoints?")
history = [c for c in stats.get("history", []) if c.get("status") == "COMPLETED"]
with open(os.path.join(work, "checkpoints.json"), "w") as f:
    json.dump(dict(counts=stats["counts"], summary=stats.get("summary"), history=history), f)
result.get_job_client().cancel().result()
