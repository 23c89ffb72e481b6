"""Two more stream-stream join shapes of Spark 4 for tests/it/oracle.rs, over impressions/
and ad_clicks/ beside this script (Spark's documented ad example: impressions watermark
10 minutes, clicks 20 minutes, ON click ad = impression ad AND click_time >=
impression_time AND click_time <= impression_time + interval 1 hour):

  leftSemi:     impressions LEFT SEMI JOIN ad_clicks (each impression once, at its first
                click);
  aggAfterJoin: the inner join, then a 30-minute window count over impression_time (two
                stateful operators: the join's output watermark drives the aggregation).

Each runs with availableNow and maxFilesPerTrigger 1 per source, the files' mtimes in name
order (impressions/i before ad_clicks/i). Written per shape to OUT_DIR/<shape>/, as
spark_dedup.py writes them: output.csv (every emitted row, sorted) and batches.csv (batch
id, input rows, the watermark in force, rows emitted as counted in foreachBatch, then per
stateful operator, top of the plan first, joined with ';': its name, rows total, updated,
removed, dropped by watermark, and numDroppedDuplicateRows where it has it).

    /tmp/oracle-venv/bin/python spark_join_more.py OUT_DIR
"""
import csv
import os
import shutil
import sys
import tempfile
import time

os.environ["TZ"] = "UTC"  # PySpark converts timestamps with the Python process's local zone
time.tzset()

from pyspark.sql import SparkSession, functions as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
out = sys.argv[1]
spark = (SparkSession.builder.master("local[2]").appName("join_more")
         .config("spark.sql.session.timeZone", "UTC")
         .config("spark.sql.shuffle.partitions", "2").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")


def landed():
    """Copies of impressions/ and ad_clicks/ with mtimes increasing: impressions/1,
    ad_clicks/1, impressions/2, ..."""
    d = tempfile.mkdtemp(prefix="join-more-")
    t = 1781085600
    names = sorted(os.listdir(os.path.join(HERE, "impressions")), key=lambda n: int(n.split(".")[0]))
    for n in names:
        for side in ["impressions", "ad_clicks"]:
            os.makedirs(os.path.join(d, side), exist_ok=True)
            dst = os.path.join(d, side, n)
            shutil.copy(os.path.join(HERE, side, n), dst)
            os.utime(dst, (t, t))
            t += 10
    return d


def streams():
    d = landed()
    imp = (spark.readStream.schema("ad_id string, impression_time timestamp")
           .option("maxFilesPerTrigger", 1).json(os.path.join(d, "impressions"))
           .withColumnRenamed("ad_id", "impression_ad_id")
           .withWatermark("impression_time", "10 minutes"))
    clk = (spark.readStream.schema("ad_id string, click_time timestamp")
           .option("maxFilesPerTrigger", 1).json(os.path.join(d, "ad_clicks"))
           .withColumnRenamed("ad_id", "click_ad_id")
           .withWatermark("click_time", "20 minutes"))
    cond = F.expr("click_ad_id = impression_ad_id AND click_time >= impression_time AND "
                  "click_time <= impression_time + interval 1 hour")
    return imp, clk, cond


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
         .option("checkpointLocation", tempfile.mkdtemp(prefix=f"join-more-ck-{shape}-"))
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


imp, clk, cond = streams()
run("leftSemi", imp.join(clk, cond, "leftsemi"), ["impression_ad_id", "impression_time"])

imp, clk, cond = streams()
joined = imp.join(clk, cond, "inner")
agg = (joined.groupBy(F.window("impression_time", "30 minutes"))
       .agg(F.count("*").alias("clicks"), F.max("click_time").alias("last_click"))
       .select(F.col("window.start").alias("ws"), "clicks", "last_click"))
run("aggAfterJoin", agg, ["ws", "clicks", "last_click"])
spark.stop()
