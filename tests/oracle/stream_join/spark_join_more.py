"""More stream-stream join shapes of Spark 4 for tests/it/oracle.rs, over impressions/
and ad_clicks/ beside this script (Spark's documented ad example: impressions watermark
10 minutes, clicks 20 minutes, ON click ad = impression ad AND click_time >=
impression_time AND click_time <= impression_time + interval 1 hour):

  leftSemi:     impressions LEFT SEMI JOIN ad_clicks (each impression once, at its first
                click);
  aggAfterJoin: the inner join, then a 30-minute window count over impression_time (two
                stateful operators: the join's output watermark drives the aggregation);
  windowInner, windowLeftOuter: each side's 1-hour tumbling window (its only event-time
                column) as an equi-join key with the ad: state evicted by the state key
                watermark, outer rows when the watermark passes their window's end.

Each runs with availableNow and maxFilesPerTrigger 1 per source, the files' mtimes in name
order (impressions/i before ad_clicks/i). Written per shape to OUT_DIR/<shape>/ by
../foreach_batch.py, as spark_dedup.py's: output.csv (every emitted row, sorted) and
batches.csv (per batch the counts and each stateful operator's).

    /tmp/oracle-venv/bin/python spark_join_more.py OUT_DIR
"""
import os
import shutil
import sys
import tempfile
import time

os.environ["TZ"] = "UTC"  # PySpark converts timestamps with the Python process's local zone
time.tzset()

from pyspark.sql import SparkSession, functions as F  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from foreach_batch import run  # noqa: E402

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




imp, clk, cond = streams()
run(out, "leftSemi", imp.join(clk, cond, "leftsemi"), ["impression_ad_id", "impression_time"])

imp, clk, cond = streams()
joined = imp.join(clk, cond, "inner")
agg = (joined.groupBy(F.window("impression_time", "30 minutes"))
       .agg(F.count("*").alias("clicks"), F.max("click_time").alias("last_click"))
       .select(F.col("window.start").alias("ws"), "clicks", "last_click"))
run(out, "aggAfterJoin", agg, ["ws", "clicks", "last_click"])


def windowed(join_type):
    """Each side's 1-hour window as the only event-time column (Spark allows one per
    side), the times kept as epoch seconds; joined on ad and window."""
    imp, clk, _ = streams()
    i = imp.select("impression_ad_id",
                   F.unix_timestamp("impression_time").alias("impression_s"),
                   F.window("impression_time", "1 hour").alias("iw"))
    c = clk.select("click_ad_id", F.unix_timestamp("click_time").alias("click_s"),
                   F.window("click_time", "1 hour").alias("cw"))
    j = i.join(c, F.expr("impression_ad_id = click_ad_id AND iw = cw"), join_type)
    return j.select("impression_ad_id", F.col("iw.start").alias("ws"), "impression_s",
                    "click_s")


window_cols = ["impression_ad_id", "ws", "impression_s", "click_s"]
run(out, "windowInner", windowed("inner"), window_cols)
run(out, "windowLeftOuter", windowed("leftouter"), window_cols)


def after_agg(join_type, agg_first=False):
    """The clicks per (ad, hour) joined back to the impressions of that ad and hour (the
    aggregation the join's right side, or its left with agg_first)."""
    imp, clk, _ = streams()
    i = imp.select("impression_ad_id", F.unix_timestamp("impression_time").alias("impression_s"),
                   F.window("impression_time", "1 hour").alias("iw"))
    c = (clk.groupBy("click_ad_id", F.window("click_time", "1 hour").alias("cw"))
         .agg(F.count("*").alias("clicks")))
    on = F.expr("impression_ad_id = click_ad_id AND iw = cw")
    j = c.join(i, on, join_type) if agg_first else i.join(c, on, join_type)
    return j.select("impression_ad_id", F.col("iw.start").alias("ws"), "impression_s", "clicks")


agg_cols = ["impression_ad_id", "ws", "impression_s", "clicks"]
run(out, "joinAfterAgg", after_agg("inner"), agg_cols)
run(out, "leftJoinAfterAgg", after_agg("leftouter"), agg_cols)
run(out, "aggLeftOfJoin", after_agg("inner", agg_first=True), agg_cols)
spark.stop()
