#!/usr/bin/env python3
"""Spark's own streaming SQL, run by real Spark, written out as sql/slt/spark_compat.slt.

The corpus: the streaming examples of Spark's Structured Streaming programming guide (word
count, aggregations, event-time windows with and without a watermark, sliding windows,
session windows, filters) and of Spark's SQL reference for `window`, `session_window` and
`window_time`, written as Spark SQL over one generated stream. Each case runs in Spark
(file source, trigger availableNow, memory sink) and its rows become the expected rows of a
Tidemark sink made from the same SQL. Cases Tidemark refuses are listed in REFUSED with the
error Tidemark answers (which must name what it does not support); their Spark answers are
still computed and kept in the slt file as a comment.

    ../../../../shared/oracle-tools/setup.sh            # PySpark 4.3 in /tmp/oracle-venv
    /tmp/oracle-venv/bin/python tests/oracle/spark_compat/make_slt.py > sql/slt/spark_compat.slt

Rows are written as Tidemark's wire writes them (PostgreSQL's text: `2026-06-10 10:05:00`,
`2.5`, `4`), sorted (`rowsort`).
"""
import datetime as dt
import json
import os
import shutil
import sys
import tempfile
import time

os.environ["TZ"] = "UTC"
time.tzset()

BASE = dt.datetime(2026, 6, 10, 10, 0, 0)

# The stream: words with event times (some out of order, some late for a 10-minute
# watermark), users, a number and a line of text.
WORDS = ["cat", "dog", "owl", "cat", "dog", "cat", "fox", "owl", "cat", "dog"]


def events():
    rows = []
    for i in range(40):
        minute = i * 37 % 60 if i % 7 else i
        t = BASE + dt.timedelta(minutes=minute, seconds=i * 11 % 60)
        rows.append({
            "ts": t.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "word": WORDS[i % len(WORDS)],
            "user_id": "u%d" % (i % 4),
            "n": i * 7 % 23,
            "line": "%s %s" % (WORDS[i % len(WORDS)], WORDS[(i + 3) % len(WORDS)]),
        })
    return rows


# name, output mode, watermark (column, delay) or None, the SQL (Spark's and Tidemark's).
CASES = [
    # Programming guide, "Basic Operations - Selection, Projection, Aggregation".
    ("select_where", "append", None,
     "SELECT word, n FROM events WHERE n > 10"),
    ("group_count", "complete", None,
     "SELECT word, count(*) AS count FROM events GROUP BY word"),
    ("group_avg", "complete", None,
     "SELECT word, avg(n) AS avg_n FROM events GROUP BY word"),
    # "Quick Example": word count over lines.
    ("word_count_lines", "complete", None,
     "SELECT word, count(*) AS count FROM "
     "(SELECT explode(split(line, ' ')) AS word FROM events) GROUP BY word"),
    # "Window Operations on Event Time": sliding windows of 10 minutes every 5.
    ("sliding_windows", "complete", None,
     "SELECT window.start AS window_start, window.end AS window_end, word, count(*) AS count "
     "FROM events GROUP BY window(ts, '10 minutes', '5 minutes'), word"),
    # "Handling Late Data and Watermarking": the same in append mode with a watermark.
    ("sliding_windows_watermark", "append", ("ts", "10 minutes"),
     "SELECT window.start AS window_start, window.end AS window_end, word, count(*) AS count "
     "FROM events GROUP BY window(ts, '10 minutes', '5 minutes'), word"),
    ("tumbling_windows_watermark", "append", ("ts", "10 minutes"),
     "SELECT window.start AS window_start, window.end AS window_end, count(*) AS count, "
     "sum(n) AS total FROM events GROUP BY window(ts, '15 minutes')"),
    # "Types of time windows": session windows.
    ("session_windows", "append", ("ts", "10 minutes"),
     "SELECT user_id, session_window.start AS session_start, session_window.end AS session_end, "
     "count(*) AS count FROM events GROUP BY session_window(ts, '5 minutes'), user_id"),
    # SQL reference, window: the `window` column and its fields by Spark's implicit name.
    ("window_implicit_name", "complete", None,
     "SELECT word, window.start AS start, window.end AS end, cnt FROM "
     "(SELECT word, window, count(*) AS cnt FROM events GROUP BY word, window(ts, '5 minutes'))"),
    # SQL reference, window_time.
    ("window_time", "complete", None,
     "SELECT word, window.start AS start, window.end AS end, window_time(window) AS wt, cnt FROM "
     "(SELECT word, window, count(*) AS cnt FROM events GROUP BY word, window(ts, '5 minutes'))"),
    # SQL reference, window: the fields at the top level keep Spark's names (start, end).
    ("sql_ref_window", "complete", None,
     "SELECT word, window.start, window.end, count(*) AS cnt FROM events "
     "GROUP BY word, window(ts, '5 minutes')"),
    # SQL reference, session_window.
    ("sql_ref_session_window", "complete", None,
     "SELECT word, session_window.start, session_window.end, count(*) AS cnt FROM events "
     "GROUP BY word, session_window(ts, '5 minutes')"),
    # Programming guide, "Types of time windows": a gap computed per row.
    ("dynamic_session_gap", "complete", None,
     "SELECT user_id, session_window.start AS start, count(*) AS cnt FROM events GROUP BY "
     "user_id, session_window(ts, CASE WHEN user_id = 'u0' THEN '10 minutes' ELSE '5 minutes' END)"),
    # Programming guide, "Unsupported Operations": sorting is allowed after an aggregation
    # in complete mode; HAVING.
    ("sorted_complete", "complete", None,
     "SELECT word, count(*) AS c FROM events GROUP BY word ORDER BY c DESC"),
    ("having", "complete", None,
     "SELECT word, sum(n) AS total FROM events GROUP BY word HAVING count(*) > 5"),
    # Programming guide, "Basic Operations": projections and a filter.
    ("projections", "append", None,
     "SELECT word, upper(word) AS w, n * 2 AS n2, CAST(ts AS DATE) AS d FROM events "
     "WHERE user_id IN ('u1', 'u2')"),
    # Spark's implicit aggregate name, read by an outer query.
    ("count_1_name", "complete", None,
     "SELECT word, `count(1)` AS c FROM (SELECT word, count(*) FROM events GROUP BY word)"),
]

# Cases Tidemark refuses, with the start of its error (SQLSTATE and message).
REFUSED = {
    # Spark's generators (explode) and split() into arrays are not supported.
    "word_count_lines": "ERROR 42883: function explode does not exist",
    # Spark 3.2's dynamic gap duration.
    "dynamic_session_gap": "ERROR 0A000: a session gap computed per row is not supported yet",
}


def pg_float(v):
    """A float as PostgreSQL (and so Tidemark) writes it: the shortest digits that read back
    to the same value (Python's repr), fixed notation for decimal exponents -4 to 14."""
    import decimal
    if v != v:
        return "NaN"
    if v in (float("inf"), float("-inf")):
        return "Infinity" if v > 0 else "-Infinity"
    if v == 0:
        return "-0" if str(v).startswith("-") else "0"
    sign, digits, e = decimal.Decimal(repr(v)).as_tuple()
    figures = "".join(map(str, digits)).rstrip("0") or "0"
    exp = len(digits) + e - 1
    sign = "-" if sign else ""
    if exp < -4 or exp >= 15:
        rest = figures[1:]
        return "%s%s%se%s%02d" % (sign, figures[0], "." + rest if rest else "",
                                  "-" if exp < 0 else "+", abs(exp))
    if exp < 0:
        return "%s0.%s%s" % (sign, "0" * (-exp - 1), figures)
    n = exp + 1
    if len(figures) <= n:
        return sign + figures + "0" * (n - len(figures))
    return "%s%s.%s" % (sign, figures[:n], figures[n:])


def text(v):
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "t" if v else "f"
    if isinstance(v, dt.datetime):
        s = v.strftime("%Y-%m-%d %H:%M:%S")
        if v.microsecond:
            s += (".%06d" % v.microsecond).rstrip("0")
        return s
    if isinstance(v, float):
        return pg_float(v)
    return str(v)


def spark_rows(spark, landing, name, mode, watermark, sql):
    from pyspark.sql.types import StructType, StructField, StringType, TimestampType, LongType
    schema = StructType([
        StructField("ts", TimestampType()), StructField("word", StringType()),
        StructField("user_id", StringType()), StructField("n", LongType()),
        StructField("line", StringType()),
    ])
    df = spark.readStream.schema(schema).json(landing)
    if watermark:
        df = df.withWatermark(*watermark)
    df.createOrReplaceTempView("events")
    q = (spark.sql(sql).writeStream.format("memory").queryName(name).outputMode(mode)
         .trigger(availableNow=True).start())
    q.awaitTermination()
    result = spark.sql("SELECT * FROM %s" % name)
    rows = result.collect()
    return len(result.columns), sorted(" ".join(text(v) for v in r) for r in rows)


def main():
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master("local[2]").appName("tidemark-spark-compat")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    work = tempfile.mkdtemp()
    landing = os.path.join(work, "events")
    os.makedirs(landing)
    rows = events()
    with open(os.path.join(landing, "part-0.json"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    out = []
    out.append("# Spark's own streaming SQL, with the rows real Spark computed for it.")
    out.append("# Generated by tests/oracle/spark_compat/make_slt.py (PySpark %s): do not edit;"
               % spark.version)
    out.append("# change the script and run it again. Each case is a sink with trigger")
    out.append("# available_now over the same file; a case Tidemark refuses expects its error,")
    out.append("# which names what is not supported, and keeps Spark's rows as a comment.")
    out.append("")
    out.append("control substitution on")
    out.append("")
    out.append("system ok")
    out.append("mkdir -p $__TEST_DIR__/events && printf '%s' > $__TEST_DIR__/events/.p.tmp && "
               "mv $__TEST_DIR__/events/.p.tmp $__TEST_DIR__/events/part-0.json"
               % "".join(json.dumps(r) + "\\n" for r in rows))
    out.append("")
    out.append("statement ok")
    out.append("CREATE STREAM events (ts TIMESTAMP, word TEXT, user_id TEXT, n BIGINT, line TEXT) "
               "WITH (format = 'json', path = '$__TEST_DIR__/events')")
    out.append("")
    for name, mode, wm, sql in CASES:
        ncols, expected = spark_rows(spark, landing, name, mode, wm, sql)
        options = ["trigger = 'available_now'", "output_mode = '%s'" % mode]
        if wm:
            options.append("watermark = '%s - %s'" % wm)
        create = "CREATE SINK %s WITH (%s) AS %s" % (name, ", ".join(options), sql.replace("`", '"'))
        out.append("# %s" % name)
        if name in REFUSED:
            out.append("statement error %s" % REFUSED[name])
            out.append(create)
            out.append("")
            out.append("# Spark's rows:")
            out.extend("#   " + r for r in expected)
            out.append("")
            continue
        out.append("statement ok")
        out.append(create)
        out.append("")
        out.append("statement ok")
        out.append("FLUSH SINK %s" % name)
        out.append("")
        out.append("query %s rowsort" % ("T" * ncols))
        out.append("SELECT * FROM %s" % name)
        out.append("----")
        out.extend(expected)
        out.append("")
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)
    sys.stdout.write("\n".join(out))


if __name__ == "__main__":
    main()
