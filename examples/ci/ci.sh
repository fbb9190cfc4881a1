#!/usr/bin/env bash
# The GitHub workflow (github-smoke.yml) as a plain script, for any other CI system: set up llmctl
# in its checkout, then run the smoke chain on your data. Run it from your repository's root:
#
#   LLMCTL_DIR=vendor/llmctl SMOKE_WARC=data/crawl-00000.warc.gz vendor/llmctl/examples/ci/ci.sh
#
# LLMCTL_DIR: a checkout of llmctl at the commit you pin (default: the one this script is in).
# The SMOKE_* variables are smoke.sh's. The report and the stage logs end up in $SMOKE_OUT
# (out/smoke): keep them as the job's artifacts.
set -euo pipefail
LLMCTL_DIR=$(cd "${LLMCTL_DIR:-$(dirname "${BASH_SOURCE[0]}")/../..}" && pwd)
make -C "$LLMCTL_DIR" setup                  # .venv (CPU torch) and lid.176; cache $LLMCTL_DIR/.venv between jobs
LLMCTL="$LLMCTL_DIR/.venv/bin/llmctl" "$LLMCTL_DIR/examples/ci/smoke.sh"
