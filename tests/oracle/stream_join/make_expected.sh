#!/usr/bin/env bash
# Spark's answer for tests/it/oracle.rs's stream-stream join case: impressions/ and
# ad_clicks/ beside this script (one file of each per batch: maxFilesPerTrigger 1 per source,
# availableNow, mtimes in name order), Spark's documented ad example
# (impressions watermark 10 minutes, clicks 20 minutes, ON click_ad_id = impression_ad_id
# AND click_time >= impression_time AND click_time <= impression_time + interval 1 hour),
# once per join type (inner, leftOuter, rightOuter, fullOuter). Writes expected/<join>/output.csv (every row written),
# changelog.csv (rows by batch) and batches.csv.
#
#     ../shared/oracle-tools/setup.sh && tests/oracle/stream_join/make_expected.sh
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
TOOLS="${ORACLE_TOOLS:-$HERE/../../../../shared/oracle-tools}"
PY="${PY:-/tmp/oracle-venv/bin/python}"
for join in ${JOINS:-inner leftOuter rightOuter fullOuter}; do
    WORK="$(mktemp -d)"
    mkdir -p "$WORK/landing/impressions" "$WORK/landing/ad_clicks" "$HERE/expected/$join"
    t=$(( $(date +%s) - 86400 ))
    for i in 1 2 3 4 5 6; do
        for side in impressions ad_clicks; do
            cp "$HERE/$side/$i.json" "$WORK/landing/$side/.$i.json.tmp"
            mv "$WORK/landing/$side/.$i.json.tmp" "$WORK/landing/$side/$i.json"
            t=$((t + 1))
            touch -d "@$t" "$WORK/landing/$side/$i.json"
        done
    done
    nice -n 19 "$PY" "$TOOLS/spark_extra.py" --query stream_join --join "$join" \
        --landing "$WORK/landing" --checkpoint "$WORK/ckpt" --sink-path "$WORK/sink" \
        --max-files-per-trigger 1 \
        --out-csv "$HERE/expected/$join/output.csv" \
        --changelog-csv "$HERE/expected/$join/changelog.csv" \
        --batches-csv "$HERE/expected/$join/batches.csv" --progress-json "$WORK/progress.json"
    rm -rf "$WORK"
done
