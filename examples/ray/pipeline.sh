#!/usr/bin/env bash
# The data pipeline on a running Ray cluster: every stage's shard tasks become Ray tasks
# (--executor ray), the llmctl process on this machine only plans and commits. Run it on the
# head node (or any machine that can reach the cluster) with inputs and OUT on a filesystem
# every node mounts at the same path.
#
#   ray start --head --num-cpus 32                       # on the head node
#   ray start --address HEAD_IP:6379 --num-cpus 32       # on every other node
#   examples/ray/pipeline.sh warc.paths /shared/cc HEAD_IP:6379
#
# Without an address it uses $RAY_ADDRESS, else starts a Ray on this machine (handy to try it:
# `examples/ray/pipeline.sh <(ls examples/crawl/*.warc.gz) out/ray`). A killed worker's task is
# retried by Ray; a failed run is resumed by running the same command again.
#
# Environment: LLMCTL (default llmctl), VOCAB_SIZE (default 32768), DEDUP_PARTITIONS
# (default 64), EXTRACT_MEMORY / DEDUP_MEMORY (memory Ray reserves per task; default 2G / 8G).
set -euo pipefail
WARC_LIST=${1:?usage: pipeline.sh WARC_LIST OUT [RAY_ADDRESS]}
OUT=${2:?usage: pipeline.sh WARC_LIST OUT [RAY_ADDRESS]}
LLMCTL=${LLMCTL:-llmctl}
ray=(--executor ray)
if [[ -n "${3:-${RAY_ADDRESS:-}}" ]]; then
    ray+=(--ray-address "${3:-$RAY_ADDRESS}")
fi
mkdir -p "$OUT"
# Common Crawl's warc.paths lines (crawl-data/...) -> URLs; other paths and URLs stay as they are
awk 'NF && $0 !~ /^#/ { if ($0 ~ /^crawl-data\//) print "https://data.commoncrawl.org/" $0; else print }' "$WARC_LIST" > "$OUT/warc.urls"

# shellcheck disable=SC2086
{
$LLMCTL crawl-extract "@$OUT/warc.urls" -o "$OUT/docs" "${ray[@]}" --cpus-per-task 1 --memory-per-task "${EXTRACT_MEMORY:-2G}"
$LLMCTL filter "$OUT/docs" -o "$OUT/filtered" "${ray[@]}"
$LLMCTL dedup "$OUT/filtered" -o "$OUT/dedup" --config minhash --partitions "${DEDUP_PARTITIONS:-64}" "${ray[@]}" --memory-per-task "${DEDUP_MEMORY:-8G}"
[[ -f "$OUT/tokenizer/manifest.json" ]] || $LLMCTL tokenize train "$OUT/dedup" -o "$OUT/tokenizer" --vocab-size "${VOCAB_SIZE:-32768}"
$LLMCTL tokenize "$OUT/dedup" -o "$OUT/tokens" --tokenizer "$OUT/tokenizer" "${ray[@]}"
}
