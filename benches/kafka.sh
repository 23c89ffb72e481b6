#!/usr/bin/env bash
# Kafka benchmarks (issue 39), on librdkafka's mock broker (examples/mock_broker.rs: Kafka's
# protocol in memory, transactions included), started by the script:
#
#   benches/kafka.sh [EVENTS]      (default 1000000)
#
# 1. Throughput: the seed query (five-minute windows, ten-minute watermark, append,
#    available_now, ten batches) over a one-partition topic holding the events of
#    benches/windowed.sh's files, in file order, into Delta; beside it the same query over
#    the files (benches/windowed.sh); wall time, events/s (per core), peak RSS, and whether
#    the two outputs are identical.
# 2. Latency: produce -> Kafka -> Tidemark (a filter) -> Kafka -> consume (read_committed),
#    at a steady 10 k and 100 k events/s for RUN_SECONDS (default 20), exactly_once and
#    at_least_once; p50/p99 of consume time minus produce time.
#
# Spark is not run beside these: its Kafka connector (spark-sql-kafka) is not in PySpark's
# wheel, and this machine reaches no Maven repository. Needs Python's confluent-kafka and
# psycopg 3. SKIP_BUILD: use the binaries as built; MOCK_BROKER: the mock_broker binary to run.
set -euo pipefail
EVENTS=${1:-1000000}
SECONDS_PER_RUN=${RUN_SECONDS:-20}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${BENCH_DIR:-/tmp/oracle-bench}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
if [ -z "${SKIP_BUILD:-}" ]; then
    (cd "$ROOT" && cargo build --release --quiet && cargo build --release --quiet --example mock_broker)
fi
echo "== the seed query over files (benches/windowed.sh)"
SKIP_BUILD=1 "$ROOT/benches/windowed.sh" "$EVENTS"
echo "== the seed query over a Kafka topic"
python3 "$ROOT/benches/kafka.py" throughput "$TARGET/release/tidemark" "$WORK/landing-$EVENTS" \
    "$EVENTS" "$WORK" "$WORK/tidemark-$EVENTS/output.csv"
echo "== end-to-end latency through Kafka"
for rate in 10000 100000; do
    for delivery in exactly_once at_least_once; do
        python3 "$ROOT/benches/kafka.py" latency "$TARGET/release/tidemark" "$rate" \
            "$SECONDS_PER_RUN" "$delivery" "$WORK"
    done
done
