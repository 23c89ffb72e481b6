#!/usr/bin/env bash
# Packs a build of the `dist` profile (release with one codegen unit per crate; see
# Cargo.toml) for shipping: the binary without its debug info and symbol table,
# and the debug info beside it in tidemark.debug, linked by a .gnu_debuglink section.
# Rust's backtraces (std's symbolizer) follow that link, so panics in the shipped binary
# still print function names, files and lines while tidemark.debug sits next to it.
#
#   scripts/dist.sh [OUT_DIR]            (default dist/; FEATURES=rocksdb for that build)
#
# Needs objcopy (binutils). Prints the sizes.
set -euo pipefail
OUT=${1:-dist}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
(cd "$ROOT" && cargo build --profile dist --quiet ${FEATURES:+--features "$FEATURES"})
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/dist/tidemark
mkdir -p "$OUT"
objcopy --only-keep-debug "$BIN" "$OUT/tidemark.debug"
objcopy --strip-all --add-gnu-debuglink="$OUT/tidemark.debug" "$BIN" "$OUT/tidemark.tmp"
mv "$OUT/tidemark.tmp" "$OUT/tidemark"
# The link must name the debug file, or backtraces lose their symbols.
readelf --string-dump=.gnu_debuglink "$OUT/tidemark" | grep -q tidemark.debug
ls -l "$BIN" "$OUT/tidemark" "$OUT/tidemark.debug" | awk '{printf "%6d MB  %s\n", $5 / 1048576, $9}'
