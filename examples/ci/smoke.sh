#!/usr/bin/env bash
# llmctl smoke run: every stage of the demo's chain on tiny shards, a few steps each, then lineage
# and the report. It checks that the chain still runs end to end (a changed filter config, a
# changed preset), not what the models learn. `make smoke` runs it; so can any CI system.
#
#   examples/ci/smoke.sh                                       # the example crawl
#   SMOKE_WARC=crawl/part-00000.warc.gz examples/ci/smoke.sh   # the first SMOKE_RECORDS responses of your WARC
#   SMOKE_DOCS=my-docs/ examples/ci/smoke.sh                  # a seeded sample of your docs (no crawl-extract)
#   SMOKE_FILTER=configs/my-filter.toml examples/ci/smoke.sh  # the config your change touches
#
# It runs from any directory (paths are taken from where it is called; the presets and example
# files from the llmctl checkout it lives in). Variables: LLMCTL (the command; default that
# checkout's .venv/bin/llmctl), SMOKE_OUT (out/smoke), SMOKE_WARC, SMOKE_DOCS, SMOKE_RECORDS
# (response records cut from the WARC, 200), SMOKE_SAMPLE (documents sampled from SMOKE_DOCS,
# 300), SMOKE_TASKS (the checkout's examples/tasks: arithmetic prompts, chats, pairs),
# SMOKE_FILTER / SMOKE_DEDUP (the configs under test: a name under stages/ or a .toml path).
# Exit status: 0 when every stage ran; otherwise 1 and one line naming the stage that failed.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
export LLMCTL_STAGES=${LLMCTL_STAGES:-$REPO/stages}   # the smoke presets, whatever llmctl is installed from
LLMCTL=${LLMCTL:-$REPO/.venv/bin/llmctl}
OUT=${SMOKE_OUT:-out/smoke}
WARC=${SMOKE_WARC:-$REPO/examples/crawl/CC-EXAMPLE-00000.warc.gz}
DOCS=${SMOKE_DOCS:-}
RECORDS=${SMOKE_RECORDS:-200}
SAMPLE=${SMOKE_SAMPLE:-300}
TASKS=${SMOKE_TASKS:-$REPO/examples/tasks}
FILTER=${SMOKE_FILTER:-fineweb}
DEDUP=${SMOKE_DEDUP:-minhash}
read -r -a L <<< "$LLMCTL"   # LLMCTL may be a command with arguments ("python -m llmctl")

started=$SECONDS
stage() {  # stage NAME llmctl-arguments...: run it quietly; on failure say which stage and stop
    local name=$1 t0=$SECONDS
    shift
    if ! "${L[@]}" "$@" --quiet > "$OUT/logs/$name.log" 2>&1; then
        tail -n 5 "$OUT/logs/$name.log" >&2
        echo "smoke: stage '$name' failed (llmctl $*); its log: $OUT/logs/$name.log" >&2
        exit 1
    fi
    printf '%-14s ok  %3ds\n' "$name" $((SECONDS - t0))
}

rm -rf "$OUT"
mkdir -p "$OUT/logs"
if [ -n "$DOCS" ]; then
    stage sample sample "$DOCS" -n "$SAMPLE" --seed 0 -o "$OUT/docs"
else
    stage sample-warc sample --warc "$WARC" -n "$RECORDS" -o "$OUT/crawl"
    stage crawl-extract crawl-extract "$OUT/crawl" -o "$OUT/docs"
fi
stage filter filter "$OUT/docs" -o "$OUT/filtered" --config "$FILTER" --keep-rejected
stage dedup dedup "$OUT/filtered" -o "$OUT/dedup" --config "$DEDUP"
stage tokenizer tokenize train "$OUT/dedup" -o "$OUT/tokenizer" --vocab-size 512
stage tokens-train tokenize "$OUT/dedup" -o "$OUT/tokens/train" --tokenizer "$OUT/tokenizer" --split train --val-fraction 0.1
stage tokens-val tokenize "$OUT/dedup" -o "$OUT/tokens/val" --tokenizer "$OUT/tokenizer" --split val --val-fraction 0.1
stage tokens-arith tokenize "$TASKS/arithmetic-corpus.jsonl" -o "$OUT/tokens/arith" --tokenizer "$OUT/tokenizer"
stage train train "$OUT/tokens/train" --val "$OUT/tokens/val" -o "$OUT/run" --config smoke
stage midtrain train --data "crawl=$OUT/tokens/train:0.5" --data "arith=$OUT/tokens/arith:0.5" --val "$OUT/tokens/val" \
    --init "$OUT/run/checkpoints/step-000003" --init-optimizer --schedule decay --max-tokens 1024 -o "$OUT/mid" --config smoke
stage sft train --sft "$TASKS/arithmetic-sft.jsonl" --init "$OUT/mid" -o "$OUT/sft" --config sft-smoke
stage eval eval "$OUT/sft" -o "$OUT/eval" -t "loss:$OUT/tokens/val" -t "gsm8k:$TASKS/arithmetic.jsonl" --limit 4 --max-new-tokens 8
stage best-of-n best-of-n "$OUT/sft" --prompts "$TASKS/arithmetic-train.jsonl" -o "$OUT/bon" -n 2 --limit 4 --max-new-tokens 8 --device cpu
stage dpo dpo "$OUT/sft" --pairs "$TASKS/arithmetic-pairs.jsonl" -o "$OUT/dpo" --max-steps 2 --batch-pairs 2 --micro-batch 2 --seq-len 256 --device cpu
stage train-rm train-rm "$OUT/sft" --pairs "$TASKS/arithmetic-pairs.jsonl" -o "$OUT/rm" --max-steps 2 --batch-pairs 2 --micro-batch 2 --seq-len 256 --device cpu
stage rl rl "$OUT/sft" --prompts "$TASKS/arithmetic-train.jsonl" --eval "$TASKS/arithmetic.jsonl" -o "$OUT/rl" --config smoke
stage lineage lineage "$OUT/rl"
stage report report "$OUT/rl" -o "$OUT/report"
echo "smoke: every stage ran in $((SECONDS - started)) s; the report is $OUT/report/"
