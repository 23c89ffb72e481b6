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
            stateful operators, append);
  by_window: dropDuplicates(user_id, w) over a 10-minute window w computed in a select,
            the only event-time column left: late rows and eviction by the window's end.

Written per shape to OUT_DIR/<shape>/ by ../foreach_batch.py: output.csv (every emitted
row, sorted) and batches.csv (per batch the counts and each stateful operator's).

    /tmp/oracle-venv/bin/python spark_dedup.py OUT_DIR
"""
import os
import shutil
import sys
import tempfile
import time

os.environ["TZ"] = "UTC"
time.tzset()

from pyspark.sql import SparkSession, functions as F  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from foreach_batch import run  # noqa: E402

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




cols = ["user_id", "page", "event_time"]
run(out, "exact", clicks().dropDuplicates(["user_id", "event_time"]), cols)
run(out, "by_user", clicks().dropDuplicates(["user_id"]), cols)
run(out, "within", clicks().dropDuplicatesWithinWatermark(["user_id"]), cols)
run(out, "distinct", clicks().select("user_id", "page").dropDuplicates(),
    ["user_id", "page"])
counted = (clicks().dropDuplicates(["user_id", "event_time"])
           .groupBy(F.window("event_time", "10 minutes"), "page").agg(F.count("*").alias("n"))
           .select(F.col("window.start").alias("window_start"), "page", "n"))
run(out, "counted", counted, ["window_start", "page", "n"])
by_window = (clicks().select("user_id", F.window("event_time", "10 minutes").alias("w"))
             .dropDuplicates(["user_id", "w"])
             .select("user_id", F.col("w.start").alias("window_start")))
run(out, "by_window", by_window, ["user_id", "window_start"])
spark.stop()
