"""Spark 4's deduplication (spec section 7) for tests/it/oracle.rs, over the JSON files in
clicks/ beside this script (user_id, page, event_time; watermark 10 minutes on event_time),
availableNow, maxFilesPerTrigger 1, the files' mtimes in name order. Shapes:

  exact:    dropDuplicates(user_id, event_time): the event time is a key, so keys are
            evicted by the watermark;
  by_user:  dropDuplicates(user_id): late rows are still dropped, keys are never evicted;
  within:   dropDuplicatesWithinWatermark(user_id): a key expires 10 minutes after the
            event time of its first row;
  distinct: select(user_id, page).dropDuplicates(): no event-time column below the
            operator, so nothing is late and nothing is evicted;
  counted:  dropDuplicates(user_id, event_time), then a 10-minute count per page (two
            stateful operators, append).

Written per shape to OUT_DIR/<shape>/: output.csv (every emitted row, sorted) and
batches.csv (batch id, input rows, the watermark in force, rows emitted as counted in
foreachBatch, then per stateful operator joined with ';': its name, rows total, updated,
removed, dropped by watermark, and numDroppedDuplicateRows where it has it).

    /tmp/oracle-venv/bin/python spark_dedup.py OUT_DIR
"""
import csv
import os
import shutil
import sys
import tempfile
import time

os.environ["TZ"] = "UTC"
time.tzset()

from pyspark.sql import SparkSession, functions as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
out = sys.argv[1]
spark = (SparkSession.builder.master("local[2]").appName("dedup")
         .config("spark.sql.session.timeZone", "UTC")
         .config("spark.sql.shuffle.partitions", "2").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
schema = "user_id STRING, page STRING, event_time TIMESTAMP"


def landed():
    """A copy of clicks/ with mtimes strictly increasing in name order."""
    d = tempfile.mkdtemp(prefix="dedup-clicks-")
    for i, n in enumerate(sorted(os.listdir(os.path.join(HERE, "clicks")))):
        shutil.copy(os.path.join(HERE, "clicks", n), os.path.join(d, n))
        os.utime(os.path.join(d, n), (1781085600 + i * 10, 1781085600 + i * 10))
    return d


def clicks():
    return (spark.readStream.schema(schema).option("maxFilesPerTrigger", 1)
            .json(landed()).withWatermark("event_time", "10 minutes"))


def text(v):
    return "" if v is None else str(v)


def run(shape, df, columns):
    emitted, per_batch = [], {}

    def collect(batch, batch_id):
        rows = batch.collect()
        per_batch[batch_id] = len(rows)
        for r in rows:
            emitted.append([text(r[c]) for c in columns])

    q = (df.writeStream.outputMode("append").trigger(availableNow=True)
         .option("checkpointLocation", tempfile.mkdtemp(prefix=f"dedup-ck-{shape}-"))
         .foreachBatch(collect).start())
    q.awaitTermination()
    os.makedirs(os.path.join(out, shape), exist_ok=True)
    with open(os.path.join(out, shape, "output.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(columns)
        w.writerows(sorted(emitted))
    with open(os.path.join(out, shape, "batches.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["batch_id", "input_rows", "watermark", "output_rows", "operators",
                    "rows_total", "rows_updated", "rows_removed", "dropped_late",
                    "dropped_duplicates"])
        for p in q.recentProgress:
            ops = p["stateOperators"]
            each = lambda f: ";".join(str(f(o)) for o in ops)  # noqa: E731
            w.writerow([p["batchId"], p["numInputRows"], p["eventTime"]["watermark"],
                        per_batch.get(p["batchId"], 0),
                        each(lambda o: o["operatorName"]),
                        each(lambda o: o["numRowsTotal"]),
                        each(lambda o: o["numRowsUpdated"]),
                        each(lambda o: o["numRowsRemoved"]),
                        each(lambda o: o["numRowsDroppedByWatermark"]),
                        each(lambda o: o["customMetrics"].get("numDroppedDuplicateRows", ""))])
    print(shape, len(emitted), "rows")


cols = ["user_id", "page", "event_time"]
run("exact", clicks().dropDuplicates(["user_id", "event_time"]), cols)
run("by_user", clicks().dropDuplicates(["user_id"]), cols)
run("within", clicks().dropDuplicatesWithinWatermark(["user_id"]), cols)
run("distinct", clicks().select("user_id", "page").dropDuplicates(), ["user_id", "page"])
counted = (clicks().dropDuplicates(["user_id", "event_time"])
           .groupBy(F.window("event_time", "10 minutes"), "page").agg(F.count("*").alias("n"))
           .select(F.col("window.start").alias("window_start"), "page", "n"))
run("counted", counted, ["window_start", "page", "n"])
spark.stop()
