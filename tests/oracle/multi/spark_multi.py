"""Two plan shapes of Spark 4 for tests/it/oracle.rs, over the JSON files beside this script:

  chained: clicks/ (event_time, page), watermark 10 minutes; a 10-minute window count per
           page, then a 1-hour window over window_time(window) summing those counts
           (two stateful operators, append mode);
  union:   a/ (watermark 5 minutes) UNION ALL b/ (watermark 20 minutes); a 10-minute
           window count (two watermarks, policy min);
  union_max: the same under spark.sql.streaming.multipleWatermarkPolicy = max.

Each runs with availableNow and maxFilesPerTrigger 1, the files' mtimes in name order.
Written per shape to OUT_DIR/<shape>/: output.csv (every emitted row, sorted) and
batches.csv (batch_id, input rows, watermark in force, rows emitted: counted in
foreachBatch, as its progress reports none).

    /tmp/oracle-venv/bin/python spark_multi.py OUT_DIR
"""
import csv
import os
import shutil
import sys
import tempfile

from pyspark.sql import SparkSession, functions as F

HERE = os.path.dirname(os.path.abspath(__file__))
out = sys.argv[1]
spark = (SparkSession.builder.master("local[2]").appName("multi")
         .config("spark.sql.session.timeZone", "UTC")
         .config("spark.sql.shuffle.partitions", "2").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
schema = "event_time TIMESTAMP, page STRING"


def landed(name):
    """A copy of the input folder with mtimes strictly increasing in name order."""
    d = tempfile.mkdtemp(prefix=f"multi-{name}-")
    for i, n in enumerate(sorted(os.listdir(os.path.join(HERE, name)))):
        shutil.copy(os.path.join(HERE, name, n), os.path.join(d, n))
        os.utime(os.path.join(d, n), (1781085600 + i * 10, 1781085600 + i * 10))
    return d


def read(name):
    return (spark.readStream.schema(schema).option("maxFilesPerTrigger", 1)
            .json(landed(name)))


def run(shape, df, columns):
    emitted, per_batch = [], {}

    def collect(batch, batch_id):
        rows = batch.collect()
        per_batch[batch_id] = len(rows)
        for r in rows:
            emitted.append([str(r[c]) for c in columns])

    q = (df.writeStream.outputMode("append").trigger(availableNow=True)
         .option("checkpointLocation", tempfile.mkdtemp(prefix=f"multi-ck-{shape}-"))
         .foreachBatch(collect).start())
    q.awaitTermination()
    os.makedirs(os.path.join(out, shape), exist_ok=True)
    with open(os.path.join(out, shape, "output.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(columns)
        w.writerows(sorted(emitted))
    with open(os.path.join(out, shape, "batches.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["batch_id", "input_rows", "watermark", "output_rows"])
        for p in q.recentProgress:
            w.writerow([p["batchId"], p["numInputRows"], p["eventTime"]["watermark"],
                        per_batch.get(p["batchId"], 0)])
    print(shape, len(emitted), "rows")


clicks = read("clicks").withWatermark("event_time", "10 minutes")
tens = clicks.groupBy(F.window("event_time", "10 minutes"), "page").agg(F.count("*").alias("n"))
hours = (tens.groupBy(F.window(F.window_time("window"), "1 hour"))
         .agg(F.sum("n").alias("clicks"), F.count("*").alias("windows"))
         .select(F.col("window.start").alias("hour"), "clicks", "windows"))
run("chained", hours, ["hour", "clicks", "windows"])

a = read("a").withWatermark("event_time", "5 minutes")
b = read("b").withWatermark("event_time", "20 minutes")
both = (a.unionAll(b).groupBy(F.window("event_time", "10 minutes"))
        .agg(F.count("*").alias("n")).select(F.col("window.start").alias("ws"), "n"))
run("union", both, ["ws", "n"])

spark.conf.set("spark.sql.streaming.multipleWatermarkPolicy", "max")
a = read("a").withWatermark("event_time", "5 minutes")
b = read("b").withWatermark("event_time", "20 minutes")
both = (a.unionAll(b).groupBy(F.window("event_time", "10 minutes"))
        .agg(F.count("*").alias("n")).select(F.col("window.start").alias("ws"), "n"))
run("union_max", both, ["ws", "n"])
spark.stop()
