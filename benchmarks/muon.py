"""AdamW against Muon (`llmctl train --optimizer muon`) on real text: the same model, tokens and
schedule, each at its own best learning rate from a small sweep, over seeds.

    .venv/bin/python benchmarks/muon.py [--data pages-a|demo] [--seeds 0 1 2] [--lrs 1e-3 3e-3 1e-2 3e-2] [--max-tokens 327680]

Tokens: `--data pages-a` (real web text): pages-a's extracted documents (`llmctl crawl-extract`);
`--data demo`: the demo's example crawl (examples/crawl/, generated text); a BPE of 4,096 ids
trained on them, 90/10 train/validation split (`llmctl tokenize`). Model: the `tiny` preset (4 layers of
width 192, about 2.2M parameters: stages/train/tiny.toml) at --batch-tokens 4096, the WSD schedule over --max-tokens, validation
every 10 steps on the held-out split. Sweep: every --lrs value for both optimizers at the first
seed; then each optimizer's best rate (lowest final validation bits per byte) at the other seeds.
Muon's update is RMS-matched to AdamW's (torchrt/muon.py), so both sweep the same rates.

Reported: final validation bits per byte (mean ± standard deviation over seeds); the
token-efficiency ratio — the tokens AdamW's validation curve (linearly interpolated between its
evaluations) needs to reach Muon's final loss, over Muon's tokens ("> 1.0x" when AdamW never gets
there); and the step-time overhead, Muon's training tokens/s against AdamW's. The field guide's
optimizer chapter: compare only after a full decay, each at its own tuned rate; Muon gained about
1.35x at NanoGPT scale, falling to about 1.1x near 1B. This is a 2.2M-parameter model on 2 CPU cores, far
below either; the `small` preset is not run here (about an hour a run on this machine).

The table goes to stdout and into benchmarks/RESULTS.md (## muon, or ## muon: demo).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import mean, pstdev

from common import DEFAULT_WARC, LLMCTL, REPO, cpu_name, write_results  # benchmarks/common.py


def run(*args) -> None:
    p = subprocess.run([str(LLMCTL), *map(str, args)], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"failed: llmctl {' '.join(map(str, args))}\n{p.stderr[-2000:]}")


def train(tokens: Path, out: Path, optimizer: str, lr: float, seed: int, max_tokens: int, preset: str = "tiny") -> dict:
    run("train", tokens / "train", "--val", tokens / "val", "-o", out, "--config", preset, "--optimizer", optimizer,
        "--lr", lr, "--seed", seed, "--max-tokens", max_tokens, "--batch-tokens", 4096, "--eval-every", 10, "--overwrite", "-q")
    m = json.loads((out / "manifest.json").read_text())
    curve = []
    for line in (out / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if isinstance(r.get("val"), dict) and "bits_per_byte" in r["val"]:
            curve.append((r["tokens"], r["val"]["bits_per_byte"]))
    return {"bpb": m["counts"]["val_bits_per_byte"], "tok_s": m["counts"]["tokens"] / m["wall_seconds"], "curve": curve}


def tokens_to_reach(curve: list[tuple[int, float]], target: float) -> float | None:
    """The first token count at which the (linearly interpolated) curve is at or below target."""
    for (t0, y0), (t1, y1) in zip(curve, curve[1:]):
        if y1 <= target:
            return t0 + (t1 - t0) * ((y0 - target) / (y0 - y1) if y0 > target else 0.0)
    return None


def spread(v: list[float], fmt: str = "{:.4f}") -> str:
    return f"{fmt.format(mean(v))} ± {fmt.format(pstdev(v))}" if len(v) > 1 else fmt.format(v[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--data", choices=("pages-a", "demo"), default="pages-a")
    ap.add_argument("--preset", choices=("tiny", "small"), default="tiny", help="the train preset (small: ~21M parameters, minutes a run)")
    ap.add_argument("--lrs", type=float, nargs="+", default=[1e-3, 3e-3, 1e-2, 3e-2])
    ap.add_argument("--max-tokens", type=int, default=327_680)  # 80 steps of 4,096 tokens
    args = ap.parse_args()
    warcs = [DEFAULT_WARC] if args.data == "pages-a" else sorted((REPO / "examples" / "crawl").glob("*.warc.gz"))
    if not all(w.is_file() for w in warcs) or not warcs:
        raise SystemExit(f"missing input WARC(s): {', '.join(map(str, warcs)) or 'examples/crawl/*.warc.gz'}")
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-muon-") as tmp:
        work = Path(tmp)
        docs = str(work / "docs")
        run("crawl-extract", *warcs, "-o", docs, "-q")
        run("tokenize", "train", docs, "-o", work / "tok", "--vocab-size", 4096, "-q")
        for split in ("train", "val"):
            run("tokenize", docs, "-o", work / "tokens" / split, "--tokenizer", work / "tok", "--split", split, "--val-fraction", 0.1, "-q")
        results: dict[tuple[str, float, int], dict] = {}
        first = args.seeds[0]
        for opt in ("adamw", "muon"):
            for lr in args.lrs:
                print(f"{opt} lr {lr:g} seed {first} ...", file=sys.stderr)
                results[opt, lr, first] = train(work / "tokens", work / f"{opt}-{lr:g}-{first}", opt, lr, first, args.max_tokens, args.preset)
        best = {opt: min(args.lrs, key=lambda lr: results[opt, lr, first]["bpb"]) for opt in ("adamw", "muon")}
        for opt in ("adamw", "muon"):
            for seed in args.seeds[1:]:
                print(f"{opt} lr {best[opt]:g} seed {seed} ...", file=sys.stderr)
                results[opt, best[opt], seed] = train(work / "tokens", work / f"{opt}-{best[opt]:g}-{seed}", opt, best[opt], seed,
                                                       args.max_tokens, args.preset)

    final = {opt: [results[opt, best[opt], s] for s in args.seeds] for opt in ("adamw", "muon")}
    ratios = []
    for a, m in zip(final["adamw"], final["muon"]):
        need = tokens_to_reach(a["curve"], m["bpb"])
        ratios.append(None if need is None else need / m["curve"][-1][0])
    reached = [r for r in ratios if r is not None]
    lines = [
        f"`.venv/bin/python benchmarks/muon.py --seeds {' '.join(map(str, args.seeds))} --lrs {' '.join(f'{x:g}' for x in args.lrs)} "
        f"--max-tokens {args.max_tokens} --data {args.data} --preset {args.preset}` — {time.strftime('%Y-%m-%d')}, {cpu_name()}; {time.perf_counter() - t0:.0f} s in all; "
        f"1-min load average {load0:.2f} before / {os.getloadavg()[0]:.2f} after.",
        "",
        f"The `{args.preset}` preset on {'pages-a' if args.data == 'pages-a' else 'the example crawl'}'s text (BPE 4,096, 90/10 split), {args.max_tokens:,} tokens at 4,096 a step, WSD; "
        "validation bits per byte on the held-out split. Sweep at the first seed (final val bits/byte):",
        "",
        "| lr | " + " | ".join(f"{lr:g}" for lr in args.lrs) + " |",
        "|---|" + "---|" * len(args.lrs),
    ]
    for opt in ("adamw", "muon"):
        lines.append(f"| {opt} | " + " | ".join(f"{results[opt, lr, first]['bpb']:.4f}" for lr in args.lrs) + " |")
    lines += [
        "",
        f"Each at its best rate, {len(args.seeds)} seeds:",
        "",
        "| optimizer | lr | final val bits/byte | tokens/s |",
        "|---|---|---|---|",
    ]
    for opt in ("adamw", "muon"):
        lines.append(f"| {opt} | {best[opt]:g} | {spread([r['bpb'] for r in final[opt]])} | {spread([r['tok_s'] for r in final[opt]], '{:,.0f}')} |")
    overhead = mean(r["tok_s"] for r in final["adamw"]) / mean(r["tok_s"] for r in final["muon"])
    eff = (f"{spread(reached, '{:.2f}')}x over the {len(reached)} seeds where AdamW reached it" if reached else "AdamW never reached it")
    lines += [
        "",
        f"Token efficiency (tokens AdamW needs to reach Muon's final loss, over Muon's): {eff}"
        + (f"; on {len(ratios) - len(reached)} seed(s) AdamW never got there (> 1.0x)" if reached and len(reached) < len(ratios) else "")
        + f". Step time: Muon's steps take {overhead:.2f}x AdamW's (tokens/s ratio).",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    name = "muon" + (": demo" if args.data == "demo" else "") + (f": {args.preset}" if args.preset != "tiny" else "")
    write_results(name, f"## {name}\n\n{text}")


if __name__ == "__main__":
    main()
