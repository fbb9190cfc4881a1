"""Bytes `train TOKENS --init CKPT` reads from the checkpoint's weight files, counted at the one
call that reads them (safetensors' load_file, which maps the file and copies every tensor out, so
/proc/self/io's rchar does not see it). Before model/load.py, --init read every tensor twice: once
for the config, tokenizer and step, once for the weights.

    .venv/bin/python benchmarks/init_reads.py --tokens out/demo/tokens/train [--baseline-src OLD/src]

A `small`-preset checkpoint of random weights (its tokenizer the tokens'), then one step of
`llmctl train --init` on it, counted in a child process per source tree: this checkout's, and with
--baseline-src an older checkout's `src/` for the before/after. The table goes to stdout and into
benchmarks/RESULTS.md (## init reads).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from common import REPO, cpu_name, write_results  # benchmarks/common.py


def count(tokens: str, config: str) -> dict:
    """In this process (the llmctl on sys.path): {file: [bytes of each read]} over one --init step."""
    import safetensors.torch
    import torch

    from llmctl.artifacts import checkpoint
    from llmctl.artifacts.checkpoint import save_checkpoint
    from llmctl.cli import main as llmctl
    from llmctl.model.transformer import Transformer
    from llmctl.train.config import load_run_config

    model_cfg, _ = load_run_config(config, {}, [])
    torch.manual_seed(0)
    reads: dict[str, list[int]] = collections.defaultdict(list)
    real = safetensors.torch.load_file

    def counted(filename, *a, **kw):
        reads[Path(filename).name].append(os.path.getsize(filename))
        return real(filename, *a, **kw)

    with tempfile.TemporaryDirectory() as d:
        ckpt = save_checkpoint(Path(d) / "ckpt", 0, model_cfg, Transformer(model_cfg).state_dict(), {"step": 0},
                               tokenizer_file=Path(tokens) / "tokenizer.json")
        size = os.path.getsize(ckpt / "model.safetensors")
        checkpoint.load_file = counted
        try:
            llmctl(["--quiet", "train", tokens, "-o", str(Path(d) / "run"), "--init", str(ckpt), "--config", config,
                    "--max-steps", "1", "--batch-tokens", "4096", "--micro-batch", "8", "--eval-every", "1000",
                    "--checkpoint-every", "1000"])
        except SystemExit as e:
            if e.code:
                raise
        finally:
            checkpoint.load_file = real
    return {"file_bytes": size, "reads": dict(reads)}


def measure(src: Path, tokens: str, config: str) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{Path(__file__).resolve().parent}"}
    code = f"import json, init_reads; print(json.dumps(init_reads.count({tokens!r}, {config!r})))"
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="out/demo/tokens/train", help="a tokens artifact (its tokenizer goes into the checkpoint)")
    ap.add_argument("--config", default="small", help="the train preset whose [model] the checkpoint has")
    ap.add_argument("--baseline-src", help="an older checkout's src/ to count the same way (the 'before')")
    ap.add_argument("--no-write", action="store_true", help="print the section, leave RESULTS.md alone")
    args = ap.parse_args()
    tokens = str(Path(args.tokens).resolve())
    trees = ([("before", Path(args.baseline_src).resolve())] if args.baseline_src else []) + [("now", REPO / "src")]
    rows = []
    for label, src in trees:
        r = measure(src, tokens, args.config)
        sizes = [b for v in r["reads"].values() for b in v]
        rows.append(f"| {label} | {len(sizes)} | {sum(sizes):,} | {sum(sizes) / r['file_bytes']:.2f}x |")
    cmd = "benchmarks/init_reads.py --tokens " + args.tokens + (" --baseline-src OLD/src" if args.baseline_src else "")
    section = (f"## init reads\n\n`.venv/bin/python {cmd}` on {cpu_name()}: the `{args.config}` preset's "
               f"model.safetensors ({r['file_bytes']:,} bytes), one step of `train --init`, every read of the "
               "checkpoint's weight files counted.\n\n| tree | reads | bytes read | of the file |\n|---|---|---|---|\n"
               + "\n".join(rows) + "\n")
    print(section)
    if not args.no_write:
        write_results("init reads", section)


if __name__ == "__main__":
    main()
