"""What the demo's midtraining does to held-out arithmetic, before and after SFT, against its control.

    make demo   # makes out/demo/{tokenizer,tokens/train,tokens/val,tokens/arith}
    .venv/bin/python benchmarks/midtrain.py [--demo out/demo] [--seeds 0 1 2]

Per seed, two WSD decay branches from the same stable phase (the `tiny` preset: 150 steps, the last
30 its cooldown; spec 001-arch-optim-scaling, midtraining as a decay branch):
  crawl  the run's own cooldown, on the crawl only (`train tokens/train --config tiny --seed s`;
         a stable phase continued as a decay branch on its own data equals this run, tests/test_midtrain.py)
  mix    from its step-120 checkpoint, `--init … --init-optimizer --schedule decay --max-tokens 245760`
         on `--data crawl=tokens/train:0.5 --data arith=tokens/arith:0.5` (the demo's `mid`)
Same steps, same learning rates, same optimizer state at the branch point: the only difference is the
data of the last 30 steps. Each branch is evaluated as the demo evaluates a base model (greedy, 64 new
tokens, the 300 held-out problems of examples/tasks/arithmetic.jsonl, and validation bits per byte on
the crawl), then SFT'd with `--config sft-tiny --seed s` and evaluated again. mix − crawl is paired
over the same problems (the numbers `llmctl eval compare` prints). The section goes to
benchmarks/RESULTS.md (## midtrain).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, cpu_name, write_results  # noqa: E402
from rl_heldout import RUN_SECONDS, once  # noqa: E402  (a run made once, reused from --work)

from llmctl.eval.compare import compare_results  # noqa: E402

TASKS = REPO / "examples" / "tasks"
EVAL, SFT = TASKS / "arithmetic.jsonl", TASKS / "arithmetic-sft.jsonl"
BRANCH_STEP = 120  # tiny: 150 steps of 8,192 tokens, cooldown_frac 0.2
DECAY_TOKENS = 30 * 8192


def evaluate(ckpt: Path, out: Path, val: Path | None, threads: int) -> dict:
    """Greedy held-out accuracy (and bits per byte on `val`) as the demo's eval stage scores them."""
    loss = ["-t", f"loss:{val}"] if val else []
    once(out, "eval", "run", ckpt, "-t", f"gsm8k:{EVAL}", *loss, "--max-new-tokens", 64, threads=threads)
    tasks = json.loads((out / "results.json").read_text())["tasks"]
    by_kind = {t["kind"]: t for t in tasks.values()}
    gsm, loss = by_kind["gsm8k"], by_kind.get("loss")
    # a base model never ends in "#### n" (the corpus's worked steps have no such line), so its strict
    # accuracy is 0: it is read by flexible extraction (lm-eval's last number); an SFT model by the strict rule
    return {"dir": out, "acc": gsm["metrics"]["acc" if val is None else "acc_flexible"]["mean"],
            "bpb": loss["metrics"]["bits_per_byte"]["mean"] if loss else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--demo", default=str(REPO / "out" / "demo"), help="make demo's output (tokenizer and tokens)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds of the whole chain (pretraining, mixture, SFT)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", help="keep the runs here (default: a new temporary directory)")
    args = ap.parse_args()
    demo = Path(args.demo)
    train, val, arith = demo / "tokens" / "train", demo / "tokens" / "val", demo / "tokens" / "arith"
    for p in (train, val, arith):
        if not (p / "manifest.json").exists():
            raise SystemExit(f"{p} is missing: `make demo` makes it")
    T, started, load0 = args.threads, time.time(), os.getloadavg()[0]
    tmp = Path(args.work or tempfile.mkdtemp(prefix="midtrain-"))
    tmp.mkdir(parents=True, exist_ok=True)

    rows = []
    for s in args.seeds:
        crawl, mix = tmp / f"crawl-{s}", tmp / f"mix-{s}"
        once(crawl, "train", train, "--val", val, "--config", "tiny", "--seed", s, threads=T)
        once(mix, "train", "--data", f"crawl={train}:0.5", "--data", f"arith={arith}:0.5", "--val", val,
             "--init", crawl / "checkpoints" / f"step-{BRANCH_STEP:06d}", "--init-optimizer", "--schedule", "decay",
             "--max-tokens", DECAY_TOKENS, "--config", "tiny", "--seed", s, threads=T)
        row = {"seed": s}
        for arm, run in (("crawl", crawl), ("mix", mix)):
            row[arm] = evaluate(run, tmp / f"{arm}-{s}-eval", val, T)
            once(tmp / f"{arm}-{s}-sft", "train", "--sft", SFT, "--init", run, "--config", "sft-tiny", "--seed", s, threads=T)
            row[f"{arm}_sft"] = evaluate(tmp / f"{arm}-{s}-sft", tmp / f"{arm}-{s}-sft-eval", None, T)
        row["base_gap"] = next(t for t in compare_results(row["mix"]["dir"], row["crawl"]["dir"], metric="correct_flexible")["tasks"] if not t["task"].startswith("loss"))
        row["sft_gap"] = compare_results(row["mix_sft"]["dir"], row["crawl_sft"]["dir"])["tasks"][0]
        rows.append(row)

    def pct(x: float) -> str:
        return f"{x * 100:.1f}%"

    def ci(g: dict) -> str:
        return f"{g['diff'] * 100:+.1f} [{g['ci_low'] * 100:+.1f}, {g['ci_high'] * 100:+.1f}]"

    def spread(key: str) -> str:
        xs = [r[key]["diff"] * 100 for r in rows]
        return f"{statistics.fmean(xs):+.1f} (from {min(xs):+.1f} to {max(xs):+.1f})"

    n = rows[0]["base_gap"]["n"]
    lines = [
        "## midtrain",
        "",
        f"`.venv/bin/python benchmarks/midtrain.py --seeds {' '.join(map(str, args.seeds))}` — {datetime.date.today()}, "
        f"`nproc` = {os.cpu_count()} ({cpu_name()}), 1-min load {load0:.2f} before / {os.getloadavg()[0]:.2f} after; the runs "
        f"took {sum(RUN_SECONDS) / 60:.1f} min (their manifests' wall seconds; this pass {(time.time() - started) / 60:.1f} min). "
        f"Two decay branches of the same `tiny` stable phase (step {BRANCH_STEP} of 150): **crawl** is the run's own cooldown "
        f"on the crawl, **mix** decays over the same 30 steps from the step-{BRANCH_STEP} checkpoint and its AdamW state on half "
        "crawl, half examples/tasks/arithmetic-corpus.jsonl (worked steps without `#### n`; no eval problem). Base models "
        f"are scored greedy on the {n} held-out problems (64 new tokens, as the demo's eval) by flexible extraction (`acc_flexible`: "
        "they never write `#### n`, so their strict `acc` is 0), then each is SFT'd "
        "(`--config sft-tiny`, the same seed) and scored again; mix − crawl is paired over the same problems (95% interval).",
        "",
        "| seed | base: crawl → mix | mix − crawl, points [95%] | z | val bits/byte crawl → mix | SFT: crawl → mix | "
        "mix − crawl after SFT [95%] | z |",
        "|---|---|---|---|---|---|---|---|",
        *[f"| {r['seed']} | {pct(r['crawl']['acc'])} → {pct(r['mix']['acc'])} | {ci(r['base_gap'])} | {r['base_gap']['z']:.1f} | "
          f"{r['crawl']['bpb']:.4f} → {r['mix']['bpb']:.4f} | {pct(r['crawl_sft']['acc'])} → {pct(r['mix_sft']['acc'])} | "
          f"{ci(r['sft_gap'])} | {r['sft_gap']['z']:.1f} |" for r in rows],
        "",
        f"Over {len(rows)} seeds, midtraining on the mixture moves base-model accuracy by {spread('base_gap')} points and, after "
        f"the same SFT, by {spread('sft_gap')} points; the crawl's validation bits per byte move by "
        f"{statistics.fmean(r['mix']['bpb'] - r['crawl']['bpb'] for r in rows):+.4f} on average (half the decay's tokens were "
        "not the crawl's).",
    ]
    write_results("midtrain", "\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"runs kept in {tmp}", file=sys.stderr)


if __name__ == "__main__":
    main()
