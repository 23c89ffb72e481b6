#!/usr/bin/env python3
"""Spark's side of benches/latency.py: the seed query on a folder that files keep landing in.

    python benches/spark_latency.py LANDING WORK

readStream.json(LANDING), a 10-minute watermark, 5-minute windows per page, count and sum,
append mode into JSON files (WORK/sink, checkpoint WORK/checkpoint), trigger processingTime
1 second; local[2], 2 shuffle partitions. Writes WORK/ready once the query has run its
first trigger, runs until WORK/stop exists, then writes every progress report to
WORK/progress.json and stops.
"""
import json
import os
import sys
import time

from pyspark.sql import SparkSession, functions as F

landing, work = sys.argv[1], sys.argv[2]
spark = (SparkSession.builder.master("local[2]").appName("latency")
         .config("spark.sql.shuffle.partitions", "2")
         .config("spark.sql.session.timeZone", "UTC")
         .config("spark.sql.streaming.numRecentProgressUpdates", "100000")
         .config("spark.ui.enabled", "false").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
clicks = (spark.readStream
          .schema("user_id string, page string, event_time timestamp, duration_s double")
          .json(landing))
q = (clicks.withWatermark("event_time", "10 minutes")
     .groupBy(F.window("event_time", "5 minutes").alias("w"), "page")
     .agg(F.count(F.lit(1)).alias("views"), F.sum("duration_s").alias("total_duration_s"))
     .select(F.col("w.start").alias("window_start"), F.col("w.end").alias("window_end"),
             "page", "views", "total_duration_s")
     .writeStream.outputMode("append").format("json")
     .option("checkpointLocation", work + "/checkpoint")
     .trigger(processingTime="1 second").start(work + "/sink"))
while not q.recentProgress:
    time.sleep(0.05)
open(work + "/ready", "w").close()
while not os.path.exists(work + "/stop"):
    time.sleep(0.1)
with open(work + "/progress.json", "w") as f:
    json.dump([json.loads(p.json) if hasattr(p, "json") else p for p in q.recentProgress], f)
q.stop()
spark.stop()
