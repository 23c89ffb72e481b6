"""Spark's rate-micro-batch source, for tests/it/oracle.rs: the first four batches of
    rowsPerBatch=7, numPartitions=2, startTimestamp=1781085600000 (2026-06-10T10:00:00Z),
    advanceMillisPerBatch=1500,
written as expected.csv (batch_id,value,timestamp_ms, sorted) and offsets.json (each batch's
start and end offset as Spark's progress reports them).

    /tmp/oracle-venv/bin/python spark_rate_micro_batch.py OUT_DIR
"""
import json
import os
import sys
import threading

from pyspark.sql import SparkSession

out = sys.argv[1]
spark = (SparkSession.builder.master("local[2]").appName("rate_micro_batch")
         .config("spark.sql.session.timeZone", "UTC")
         .config("spark.sql.shuffle.partitions", "2").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
rows, done = [], threading.Event()


def collect(df, batch_id):
    if batch_id < 4:
        for r in df.selectExpr("value", "CAST(unix_millis(timestamp) AS BIGINT) AS ms").collect():
            rows.append((batch_id, r["value"], r["ms"]))
    if batch_id >= 3:
        done.set()


stream = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 7)
          .option("numPartitions", 2).option("startTimestamp", 1781085600000)
          .option("advanceMillisPerBatch", 1500).load())
q = stream.writeStream.foreachBatch(collect).start()
done.wait(300)
q.stop()
offsets = [{"batchId": p["batchId"], "description": p["sources"][0]["description"],
            "startOffset": p["sources"][0]["startOffset"], "endOffset": p["sources"][0]["endOffset"],
            "numInputRows": p["numInputRows"]}
           for p in q.recentProgress if p["batchId"] < 4]
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "expected.csv"), "w") as f:
    f.write("batch_id,value,timestamp_ms\n")
    for b, v, ms in sorted(rows):
        f.write(f"{b},{v},{ms}\n")
with open(os.path.join(out, "offsets.json"), "w") as f:
    json.dump(offsets, f, indent=1)
print(len(rows), "rows")
spark.stop()
