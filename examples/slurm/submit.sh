#!/usr/bin/env bash
# The data pipeline on Slurm: crawl-extract (array) -> filter (array) -> dedup (one job, or a
# Ray cluster over several nodes) -> tokenizer training (one job) -> tokenize (array), each
# stage submitted with --dependency=afterok on the one before, so nothing starts on a partial
# artifact. Re-running this script after a failure resubmits everything; finished shards are
# skipped, so only the missing work runs.
#
#   WARC_LIST=warc.paths OUT=/shared/cc examples/slurm/submit.sh
#
# Environment:
#   WARC_LIST        WARC paths or URLs, one a line. Common Crawl's warc.paths lines
#                    (crawl-data/CC-MAIN-...) get the https://data.commoncrawl.org/ prefix.
#   OUT              pipeline directory on a shared filesystem (docs, filtered, dedup, tokenizer, tokens)
#   WARCS_PER_TASK   WARC files per extract array task (default 90: one CC snapshot -> 1,000 tasks)
#   SHARD_TASKS      array size of filter and tokenize (default: the extract array's)
#   MAX_RUNNING      array tasks running at once (default 200; a politeness limit for data.commoncrawl.org)
#   DEDUP_NODES      nodes of the dedup job (default 1; more start a Ray cluster, see dedup.sbatch)
#   VOCAB_SIZE       tokenizer vocabulary (default 32768)
#   LLMCTL           llmctl command on the compute nodes (default: llmctl)
#   SBATCH_ARGS      extra sbatch flags for every job (e.g. "--partition=cpu --account=me")
set -euo pipefail
: "${WARC_LIST:?set WARC_LIST (a warc.paths file)}" "${OUT:?set OUT (a shared directory)}"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LLMCTL=${LLMCTL:-llmctl}
MAX_RUNNING=${MAX_RUNNING:-200}
mkdir -p "$OUT/logs"
OUT=$(cd "$OUT" && pwd)

# Common Crawl's warc.paths lines (crawl-data/...) -> URLs; other paths and URLs stay as they are
urls="$OUT/warc.urls"
awk 'NF && $0 !~ /^#/ { if ($0 ~ /^crawl-data\//) print "https://data.commoncrawl.org/" $0; else print }' "$WARC_LIST" > "$urls"
n_warcs=$(wc -l < "$urls")
per_task=${WARCS_PER_TASK:-90}
tasks=$(( (n_warcs + per_task - 1) / per_task ))
shard_tasks=${SHARD_TASKS:-$tasks}
echo "$n_warcs WARC files -> $tasks extract tasks, $shard_tasks filter/tokenize tasks" >&2

export LLMCTL
# shellcheck disable=SC2086
submit() { sbatch --parsable ${SBATCH_ARGS:-} "$@"; }
array_log="--output=$OUT/logs/%x-%A_%a.out"
job_log="--output=$OUT/logs/%x-%j.out"

extract=$(submit "$array_log" --array="0-$((tasks - 1))%$MAX_RUNNING" --export="ALL,WARC_LIST=$urls,OUT=$OUT" "$HERE/extract.sbatch")
filter=$(submit "$array_log" --array="0-$((shard_tasks - 1))%$MAX_RUNNING" --dependency="afterok:$extract" \
    "$HERE/stage.sbatch" filter "$OUT/docs" -o "$OUT/filtered" -q)
dedup=$(submit "$job_log" --nodes="${DEDUP_NODES:-1}" --dependency="afterok:$filter" --export="ALL,OUT=$OUT" "$HERE/dedup.sbatch")
tokenizer=$(submit "$job_log" --dependency="afterok:$dedup" --cpus-per-task=16 --mem=64G --job-name=llmctl-tokenizer \
    --wrap="$LLMCTL tokenize train $OUT/dedup -o $OUT/tokenizer --vocab-size ${VOCAB_SIZE:-32768} -q")
tokens=$(submit "$array_log" --array="0-$((shard_tasks - 1))%$MAX_RUNNING" --dependency="afterok:$tokenizer" \
    "$HERE/stage.sbatch" tokenize "$OUT/dedup" -o "$OUT/tokens" --tokenizer "$OUT/tokenizer" -q)
echo "submitted: extract $extract, filter $filter, dedup $dedup, tokenizer $tokenizer, tokenize $tokens" >&2
echo "$tokens"
