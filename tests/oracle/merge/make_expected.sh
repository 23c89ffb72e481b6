#!/usr/bin/env bash
# Spark's answer for tests/it/oracle.rs's MERGE case: the seed's Step 6 (foreachBatch with
# row_number() latest per user, then a MERGE: WHEN MATCHED AND s.event_time > t.event_time
# THEN UPDATE SET *, WHEN NOT MATCHED THEN INSERT *) over the files in clicks/ beside this
# script, maxFilesPerTrigger 1, availableNow, the files' mtimes in name order.
#
# It runs the oracle tools' spark_extra.py --query merge_latest (Delta's jar is not
# reachable here, so the MERGE is simulated in PySpark with a full outer join; a replayed
# batch reads the target as of the batch before, as Delta's txn makes it). Writes
# expected/output.csv (the target after the run), expected/changelog.csv (per batch: inserts
# and updates, Delta-CDF-like) and expected/batches.csv (per batch: input rows, source rows,
# rows inserted and updated).
#
#     ../shared/oracle-tools/setup.sh && tests/oracle/merge/make_expected.sh
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
TOOLS="${ORACLE_TOOLS:-$HERE/../../../../shared/oracle-tools}"
PY="${PY:-/tmp/oracle-venv/bin/python}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/landing" "$HERE/expected"
t=$(( $(date +%s) - 86400 ))
for f in "$HERE"/clicks/*.json; do
    name="$(basename "$f")"
    cp "$f" "$WORK/landing/.$name.tmp"
    mv "$WORK/landing/.$name.tmp" "$WORK/landing/$name"
    t=$((t + 1))
    touch -d "@$t" "$WORK/landing/$name"
done
nice -n 19 "$PY" "$TOOLS/spark_extra.py" --query merge_latest \
    --landing "$WORK/landing" --checkpoint "$WORK/ckpt" --sink-path "$WORK/sink" \
    --max-files-per-trigger 1 \
    --out-csv "$HERE/expected/output.csv" --changelog-csv "$HERE/expected/changelog.csv" \
    --batches-csv "$HERE/expected/batches.csv" --progress-json "$WORK/progress.json"
