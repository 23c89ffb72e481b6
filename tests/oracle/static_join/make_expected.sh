#!/usr/bin/env bash
# Spark's answer for tests/it/oracle.rs's stream-static join case: the clicks in
# ../merge/clicks (maxFilesPerTrigger 1, availableNow, mtimes in name order) joined with the
# static pages.csv beside this script, USING (page), inner and left outer. Runs the oracle
# tools' spark_extra.py --query static_join once per join type and writes
# expected/<join>/output.csv (every row written) and expected/<join>/batches.csv.
#
#     ../shared/oracle-tools/setup.sh && tests/oracle/static_join/make_expected.sh
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
TOOLS="${ORACLE_TOOLS:-$HERE/../../../../shared/oracle-tools}"
PY="${PY:-/tmp/oracle-venv/bin/python}"
for join in inner left_outer; do
    WORK="$(mktemp -d)"
    mkdir -p "$WORK/landing" "$HERE/expected/$join"
    t=$(( $(date +%s) - 86400 ))
    for f in "$HERE"/../merge/clicks/*.json; do
        name="$(basename "$f")"
        cp "$f" "$WORK/landing/.$name.tmp"
        mv "$WORK/landing/.$name.tmp" "$WORK/landing/$name"
        t=$((t + 1))
        touch -d "@$t" "$WORK/landing/$name"
    done
    nice -n 19 "$PY" "$TOOLS/spark_extra.py" --query static_join --join "$join" \
        --static-path "$HERE/pages.csv" \
        --landing "$WORK/landing" --checkpoint "$WORK/ckpt" --sink-path "$WORK/sink" \
        --max-files-per-trigger 1 \
        --out-csv "$HERE/expected/$join/output.csv" \
        --changelog-csv "$HERE/expected/$join/changelog.csv" \
        --batches-csv "$HERE/expected/$join/batches.csv" --progress-json "$WORK/progress.json"
    rm -rf "$WORK"
done
