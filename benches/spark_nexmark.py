#!/usr/bin/env python3
"""Spark's side of benches/nexmark.py --files: the same queries on the same Parquet files.

    python benches/spark_nexmark.py FILES WORKDIR EVENTS [q0,q1,...] [--compare DIR]

FILES holds the bids, auctions and persons of EVENTS Nexmark events in FILES/bid,
FILES/auction and FILES/person, one Parquet file per batch (landed by `benches/nexmark.py
--files FILES`). Each query reads the streams it needs with readStream.parquet,
maxFilesPerTrigger 1, a 4-second watermark on date_time, into the noop sink with
availableNow; local[2], shuffle partitions 2, a 12 GiB heap, after one unmeasured warm-up run of q2.
Prints per query: the query's wall time,
the CPU seconds of the JVM over the query (utime + stime of the Java process), events of
all kinds per second and per CPU second, the rows read and the rows the sink got.

With --compare DIR (Tidemark's output of `benches/nexmark.py --files FILES --keep-output
DIR`), Spark writes each query's rows as Parquet instead and checks that they are exactly
Tidemark's rows in DIR/<query> (as multisets, both ways; q1's price compared as a double:
Spark types 0.908 * price as a decimal, Tidemark as a double).
"""
import json
import os
import sys
import time

from pyspark.sql import SparkSession, functions as F

args = sys.argv[1:]
compare = None
if "--compare" in args:
    i = args.index("--compare")
    compare = args[i + 1]
    del args[i:i + 2]
files, work, events = args[0], args[1], int(args[2])
wanted = (args[3].split(",") if len(args) > 3
          else ["q0", "q1", "q2", "q3", "q5agg", "q7", "q7agg", "q8", "q12"])
spark = (SparkSession.builder.master("local[2]").appName("nexmark")
         .config("spark.sql.shuffle.partitions", "2")
         # q7's join holds a window of bids: the default 1 GiB heap runs out.
         .config("spark.driver.memory", "12g")
         .config("spark.sql.session.timeZone", "UTC")
         .config("spark.ui.enabled", "false").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
jvm = spark.sparkContext._gateway.proc.pid
tick = os.sysconf("SC_CLK_TCK")


def jvm_cpu():
    fields = open(f"/proc/{jvm}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / tick


SCHEMAS = {
    "bid": "auction long, bidder long, price long, channel string, url string, "
           "date_time timestamp, extra string",
    "auction": "id long, item_name string, description string, initial_bid long, reserve long, "
               "date_time timestamp, expires timestamp, seller long, category long, extra string",
    "person": "id long, name string, email_address string, credit_card string, city string, "
              "state string, date_time timestamp, extra string",
}


def stream(table):
    return (spark.readStream.schema(SCHEMAS[table]).option("maxFilesPerTrigger", 1)
            .parquet(os.path.join(files, table)).withWatermark("date_time", "4 seconds"))


def bids():
    return stream("bid")


def query(name):
    b = bids()
    if name == "q0":
        return b.select("auction", "bidder", "price", "date_time", "extra")
    if name == "q1":
        return b.select("auction", "bidder", (F.lit(0.908) * F.col("price")).alias("price"),
                        "date_time", "extra")
    if name == "q2":
        return b.where(F.col("auction") % 123 == 0).select("auction", "price")
    if name == "q3":
        a, p = stream("auction"), stream("person")
        return (a.join(p, a.seller == p.id)
                .where((a.category == 10) & p.state.isin("or", "id", "ca"))
                .select(p.name, p.city, p.state, a.id))
    if name == "q5agg":
        return (b.groupBy("auction", F.window("date_time", "10 seconds", "2 seconds").alias("w"))
                .agg(F.count(F.lit(1)).alias("num"))
                .select("auction", "num", F.col("w.start").alias("starttime"),
                        F.col("w.end").alias("endtime")))
    if name == "q7":
        # Spark allows one event-time column per side of a join: the bid's time rides along
        # as microseconds beside its window.
        b = bids().select("auction", "price", "bidder", F.unix_micros("date_time").alias("us"),
                          "extra", F.window("date_time", "10 seconds").alias("w"))
        m = (bids().groupBy(F.window("date_time", "10 seconds").alias("mw"))
             .agg(F.max("price").alias("maxprice")))
        return (b.join(m, (b.w == m.mw) & (b.price == m.maxprice))
                .select("auction", "price", "bidder", F.timestamp_micros("us").alias("date_time"),
                        "extra"))
    if name == "q8":
        p = stream("person").select("id", "name", F.window("date_time", "10 seconds").alias("pw"))
        a = (stream("auction").select("seller", F.window("date_time", "10 seconds").alias("aw"))
             .dropDuplicates(["seller", "aw"]))
        return (p.join(a, (p.id == a.seller) & (p.pw == a.aw))
                .select("id", "name", F.col("pw.start").alias("starttime")))
    if name == "q7agg":
        return (b.groupBy(F.window("date_time", "10 seconds").alias("w"))
                .agg(F.max("price").alias("maxprice"))
                .select(F.col("w.start").alias("starttime"), F.col("w.end").alias("endtime"),
                        "maxprice"))
    if name == "q12":
        return (b.groupBy("bidder", F.window("date_time", "10 seconds").alias("w"))
                .agg(F.count(F.lit(1)).alias("bid_count"))
                .select("bidder", "bid_count", F.col("w.start").alias("starttime"),
                        F.col("w.end").alias("endtime")))
    raise SystemExit(f"unknown query {name}")


# One unmeasured run first, so that the first measured query does not pay for the JVM's
# warm-up (class loading, JIT) alone.
warm = (query("q2").writeStream.format("noop").option("checkpointLocation", f"{work}/warmup")
        .trigger(availableNow=True).start())
warm.awaitTermination()

for name in wanted:
    c0, t0 = jvm_cpu(), time.time()
    w = (query(name).writeStream.outputMode("append")
         .option("checkpointLocation", f"{work}/{name}/checkpoint").trigger(availableNow=True))
    q = w.format("parquet").start(f"{work}/{name}/out") if compare else w.format("noop").start()
    q.awaitTermination()
    secs, cpu = time.time() - t0, jvm_cpu() - c0
    progress = q.recentProgress
    print(json.dumps({
        "query": name, "query_s": round(secs, 2), "jvm_cpu_s": round(cpu, 2),
        "ev_per_s": round(events / secs), "ev_per_cpu_s": round(events / cpu),
        "rows_in": sum(p["numInputRows"] for p in progress),
        "rows_out": sum(max(p["sink"].get("numOutputRows", 0), 0) for p in progress),
        "batches": sum(1 for p in progress if p["numInputRows"] > 0),
    }), flush=True)
    if compare:
        ours = spark.read.parquet(f"{work}/{name}/out")
        theirs = spark.read.parquet(f"{compare}/{name}")
        if name == "q1":
            ours = ours.withColumn("price", F.col("price").cast("double"))
            theirs = theirs.withColumn("price", F.col("price").cast("double"))
        theirs = theirs.select(*ours.columns)
        only_spark = ours.exceptAll(theirs).count()
        only_tidemark = theirs.exceptAll(ours).count()
        print(json.dumps({"query": name, "spark_rows": ours.count(), "tidemark_rows": theirs.count(),
                          "only_in_spark": only_spark, "only_in_tidemark": only_tidemark,
                          "identical": only_spark == 0 and only_tidemark == 0}), flush=True)
spark.stop()
