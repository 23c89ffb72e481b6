"""What spark_dedup.py and stream_join/spark_join_more.py share: one streaming query run
with availableNow into foreachBatch, written to OUT_DIR/<shape>/ as

  output.csv   every emitted row, sorted (NULL empty, values as Python's str());
  batches.csv  per batch: id, input rows, the watermark in force, rows emitted (counted in
               foreachBatch, as its progress reports none), then per stateful operator, top
               of the plan first, joined with ';': its name, rows total, updated, removed,
               dropped by watermark, and numDroppedDuplicateRows where it has it.
"""
import csv
import os
import tempfile


def text(v):
    return "" if v is None else str(v)


def run(out, shape, df, columns):
    emitted, per_batch = [], {}

    def collect(batch, batch_id):
        rows = batch.collect()
        per_batch[batch_id] = len(rows)
        for r in rows:
            emitted.append([text(r[c]) for c in columns])

    q = (df.writeStream.outputMode("append").trigger(availableNow=True)
         .option("checkpointLocation", tempfile.mkdtemp(prefix=f"oracle-ck-{shape}-"))
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
