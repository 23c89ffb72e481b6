#!/usr/bin/env python3
"""Spark's side of benches/state_churn.sh: the same query on the same files.

    python benches/spark_churn.py LANDING WORKDIR [memory|rocksdb]

readStream.json(LANDING) with maxFilesPerTrigger 1, a 1-minute watermark, grouped by
(10-minute window, user_id), count and sum, append mode into parquet, availableNow;
local[2], shuffle partitions 2. The state store is Spark's default (HDFS-backed, in
memory) or, with `rocksdb`, its RocksDBStateStoreProvider. Prints the query's wall time (start to termination,
the session's start-up excluded and printed apart), the median batch duration, and the
closed windows with their events, which must equal Tidemark's.
"""
import json
import statistics
import sys
import time

t0 = time.time()
from pyspark.sql import SparkSession, functions as F  # noqa: E402

landing, work = sys.argv[1], sys.argv[2]
store = sys.argv[3] if len(sys.argv) > 3 else "memory"
builder = SparkSession.builder
if store == "rocksdb":
    builder = builder.config(
        "spark.sql.streaming.stateStore.providerClass",
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
elif store != "memory":
    raise SystemExit(f"unknown store {store!r}: memory or rocksdb")
spark = (builder.master("local[2]").appName("state-churn")
         .config("spark.sql.shuffle.partitions", "2")
         .config("spark.sql.session.timeZone", "UTC")
         .config("spark.ui.enabled", "false").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
t_session = time.time()
events = (spark.readStream.schema("user_id string, event_time timestamp, amount long")
          .option("maxFilesPerTrigger", 1).json(landing))
q = (events.withWatermark("event_time", "1 minute")
     .groupBy(F.window("event_time", "10 minutes").alias("w"), "user_id")
     .agg(F.count(F.lit(1)).alias("n"), F.sum("amount").alias("total"))
     .select(F.col("w.start").alias("w"), "user_id", "n", "total")
     .writeStream.outputMode("append").format("parquet")
     .option("checkpointLocation", work + "/checkpoint")
     .trigger(availableNow=True).start(work + "/sink"))
t_start = time.time()
q.awaitTermination()
t_end = time.time()
batches = [p for p in q.recentProgress if p["numInputRows"] > 0]
ms = sorted(p["durationMs"]["triggerExecution"] for p in batches)
res = spark.read.parquet(work + "/sink").agg(F.count(F.lit(1)), F.sum("n")).collect()[0]
print(json.dumps({
    "store": store,
    "session_start_s": round(t_session - t0, 1),
    "query_s": round(t_end - t_start, 1),
    "process_s": round(time.time() - t0, 1),
    "data_batches": len(batches),
    "batch_ms_median": statistics.median(ms) if ms else None,
    "closed_windows": res[0], "events_in_closed_windows": res[1],
}))
spark.stop()
