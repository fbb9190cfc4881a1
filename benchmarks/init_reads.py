"""Bytes `train TOKENS --init CKPT` reads from the checkpoint's weight files, counted at the one
call that reads them (safetensors' load_file, which maps the file and copies every tensor out, so
/proc/self/io's rchar does not see it). Before model/load.py, --init read every tensor twice: once
for the config, tokenizer and step, once for the weights.

    .venv/bin/python benchmarks/init_reads.py --tokens out/demo/tokens/train     # the `small` preset

A `small`-preset checkpoint of random weights (its tokenizer the tokens'), then one step of
`llmctl train --init` on it, in this process so the reads can be counted.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
from pathlib import Path

import safetensors.torch


def count_weight_reads(run) -> dict[str, list[int]]:
    """{weights file name: [bytes of each read]} over `run()`: every load_file of a checkpoint."""
    from llmctl.artifacts import checkpoint

    reads: dict[str, list[int]] = collections.defaultdict(list)
    real = safetensors.torch.load_file

    def counted(filename, *a, **kw):
        reads[Path(filename).name].append(os.path.getsize(filename))
        return real(filename, *a, **kw)

    checkpoint.load_file = counted
    try:
        run()
    finally:
        checkpoint.load_file = real
    return dict(reads)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="out/demo/tokens/train", help="a tokens artifact (its tokenizer goes into the checkpoint)")
    ap.add_argument("--config", default="small", help="the train preset whose [model] the checkpoint has")
    args = ap.parse_args()

    import torch

    from llmctl.artifacts.checkpoint import save_checkpoint
    from llmctl.cli import main as llmctl
    from llmctl.train.config import load_run_config
    from llmctl.model.transformer import Transformer

    model_cfg, _ = load_run_config(args.config, {}, [])
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as d:
        ckpt = save_checkpoint(Path(d) / "ckpt", 0, model_cfg, Transformer(model_cfg).state_dict(), {"step": 0},
                               tokenizer_file=Path(args.tokens) / "tokenizer.json")
        size = os.path.getsize(ckpt / "model.safetensors")

        def train():
            try:
                llmctl(["--quiet", "train", args.tokens, "-o", str(Path(d) / "run"), "--init", str(ckpt), "--config",
                        args.config, "--max-steps", "1", "--batch-tokens", "4096", "--micro-batch", "8",
                        "--eval-every", "1000", "--checkpoint-every", "1000"])
            except SystemExit as e:
                if e.code:
                    raise

        reads = count_weight_reads(train)
    total = sum(sum(v) for v in reads.values())
    print(f"--config {args.config}: model.safetensors is {size:,} bytes")
    for name, sizes in reads.items():
        print(f"  {name}: read {len(sizes)} time(s), {sum(sizes):,} bytes")
    print(f"  bytes read from the checkpoint's weights: {total:,} ({total / size:.2f}x the file)")
    sys.exit(0)


if __name__ == "__main__":
    main()
