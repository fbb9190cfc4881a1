"""What GRPO buys the demo's SFT model on the held-out arithmetic problems (issue 9, "Measure": the
+10-point target), and why: one run of measurements on the `make demo` SFT model.

    make demo   # or: make posttrain OUT=out/demo (the SFT model this measures)
    .venv/bin/python benchmarks/rl_heldout.py [--sft out/demo/sft] [--steps 40] [--threads 2]

1. The SFT model on examples/tasks/arithmetic.jsonl (100 problems): greedy accuracy, and 8 samples
   per problem at the rollouts' temperature (0.7, top-p 0.95): pass@1, pass@8 and maj@8. RL mostly
   sharpens a model toward answers it already samples (spec 001-posttrain-rl: "RL sharpens more
   than it expands"), so maj@8 − greedy bounds what sharpening alone can add to greedy accuracy.
2. The greedy errors sorted by cause: an arithmetic fact written wrong (`30 * 7 = 120`), operands or
   steps other than the solution's, a final `#### n` that is not the last result.
3. A control with gold answers: `llmctl train --sft` continued from the SFT model for 10 steps at a
   constant rate, on fresh problems (make_crawl's generator, another seed, none in the eval or SFT
   sets): what restarting the optimizer at that rate does to an SFT model annealed to 0.
4. `llmctl rl` runs (`--steps` each, seed 1, held-out greedy accuracy every 10 steps, n = 100, with
   95% intervals): the demo's preset as the demo runs it, the preset on fresh problems, and 1e-4
   with and without warmup.

About 11 minutes on 2 cores. The section goes to benchmarks/RESULTS.md (## rl held-out).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import LLMCTL, REPO, cpu_name, write_results  # noqa: E402

sys.path.insert(0, str(REPO / "examples"))
import make_crawl as mc  # noqa: E402  (the crawl's word-problem generator)

EVAL = REPO / "examples" / "tasks" / "arithmetic.jsonl"
SFT_SET = REPO / "examples" / "tasks" / "arithmetic-train.jsonl"
FRESH_SEED = 77  # make_tasks.py draws the eval and SFT problems from --seed 2025
OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "/": lambda a, b: a / b if b else None}
EQUATION = re.compile(r"(\d+) ([-+*/]) (\d+) = (\d+)")


def llmctl(*args, threads: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    p = subprocess.run([str(LLMCTL), *map(str, args)], env=env, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"llmctl {' '.join(map(str, args[:3]))} … failed:\n{p.stderr[-2000:]}")
    return p


def fresh_problems(n: int, out: Path) -> Path:
    """n problems from make_crawl's generator over the crawl's own world, none of them in the eval
    set, the SFT set or the crawl's planted problems."""
    planted = json.loads((REPO / "examples" / "crawl" / "planted.json").read_text())
    world = mc.build_world(random.Random(planted["seed"]))
    taken = {json.loads(line)["question"] for f in (EVAL, SFT_SET) for line in open(f)}
    taken |= {p["question"] for p in planted["problems"]}
    rng, rows = random.Random(FRESH_SEED), []
    while len(rows) < n:
        q, solution, _ = mc.problem(rng, world)
        if q not in taken:
            taken.add(q)
            rows.append({"question": q, "answer": "\n".join(solution)})
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def evaluate(ckpt, out: Path, threads: int, *extra) -> dict:
    llmctl("eval", "run", ckpt, "-o", out, "--overwrite", "-q", "-t", f"gsm8k:{EVAL}", "--max-new-tokens", 64, *extra,
           threads=threads)
    res = json.loads((out / "results.json").read_text())
    return next(iter(res["tasks"].values()))["metrics"]


def error_causes(samples: Path) -> Counter:
    gold = [json.loads(line)["answer"] for line in open(EVAL)]
    causes = Counter()
    for r in pq.read_table(samples).to_pylist():
        if r["correct"]:
            causes["correct"] += 1
            continue
        text = r["completion"]
        results = re.findall(r"= (\d+)", text)
        final = re.search(r"#### (\d+)", text)
        facts_wrong = any(OPS[op](int(a), int(b)) != int(c) for a, op, b, c in EQUATION.findall(text))
        plan = [m[:3] for m in EQUATION.findall(gold[r["item"]])] != [m[:3] for m in EQUATION.findall(text)]
        if final and results and final.group(1) != results[-1]:
            causes["final `#### n` is not the last result"] += 1
        elif plan:
            causes["operands or steps not the solution's" + (" (and a fact wrong)" if facts_wrong else "")] += 1
        elif facts_wrong:
            causes["an arithmetic fact wrong, the plan right"] += 1
        else:
            causes["other"] += 1
    return causes


def ci(m: dict) -> str:
    return f"{m['mean'] * 100:.0f}% [{m['ci_low'] * 100:.0f}, {m['ci_high'] * 100:.0f}]"


def curve(evals: list[tuple[int, dict]]) -> str:
    return " → ".join(f"{step}: {m['mean'] * 100:.0f}" for step, m in evals)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sft", default=str(REPO / "out" / "demo" / "sft"), help="the SFT run (make demo's out/demo/sft)")
    ap.add_argument("--steps", type=int, default=40, help="GRPO steps per run (the demo runs 40)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--fresh", type=int, default=1000, help="fresh problems for the control and the RL runs")
    args = ap.parse_args()
    if not (Path(args.sft) / "manifest.json").exists():
        raise SystemExit(f"{args.sft} is not a finished run: `make demo` (or `make posttrain OUT=out/demo`) makes it")
    T, started, load0 = args.threads, time.time(), os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="rl-heldout-"))
    fresh = fresh_problems(args.fresh, tmp / "fresh.jsonl")

    greedy = evaluate(args.sft, tmp / "greedy", T)["acc"]
    sampled = evaluate(args.sft, tmp / "sampled", T, "-n", 8, "--temperature", 0.7, "--top-p", 0.95, "--pass-k", 1, "--pass-k", 8)
    causes = error_causes(tmp / "greedy" / "samples.parquet")

    control = {}
    for lr in ("1e-4", "3e-4"):
        run = tmp / f"gold-{lr}"
        llmctl("train", "--sft", fresh, "--init", args.sft, "-o", run, "--config", "sft-tiny", "--max-steps", 10, "--lr", lr,
               "--schedule", "wsd", "--set", "train.warmup_frac=0", "--set", "train.cooldown_frac=0", "--overwrite", "-q", threads=T)
        control[lr] = evaluate(run, tmp / f"gold-{lr}-eval", T)["acc"]

    runs = [("the demo's preset (`--config arith`: lr 2e-5 constant), the SFT problems as prompts", SFT_SET, []),
            ("the preset, fresh problems as prompts", fresh, []),
            ("lr 1e-4 constant, fresh problems", fresh, ["--lr", "1e-4"]),
            ("lr 1e-4, 5 warmup steps then linear to 0, fresh problems", fresh, ["--lr", "1e-4", "--warmup-steps", 5, "--schedule", "linear"])]
    rl_rows = []
    for label, prompts, extra in runs:
        run = tmp / f"rl-{len(rl_rows)}"
        t0 = time.time()
        llmctl("rl", args.sft, "--prompts", prompts, "--eval", EVAL, "-o", run, "--config", "arith", "--steps", args.steps,
               "--seed", 1, "--overwrite", "-q", *extra, threads=T)
        recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        evals = [(r["step"], r["eval"]) for r in recs if r.get("eval")]
        reward = [r["accuracy"] for r in recs[1:] if "accuracy" in r]
        k = max(1, len(reward) // 4)
        rl_rows.append((label, evals, sum(reward[:k]) / k, sum(reward[-k:]) / k, time.time() - t0))

    sft_pct = greedy["mean"] * 100
    lines = [
        "## rl held-out",
        "",
        f"`.venv/bin/python benchmarks/rl_heldout.py --sft {os.path.relpath(args.sft, REPO)} --steps {args.steps} "
        f"--threads {T}` — {datetime.date.today()}, `nproc` = {os.cpu_count()} ({cpu_name()}), 1-min load "
        f"{load0:.2f} before / {os.getloadavg()[0]:.2f} after, {(time.time() - started) / 60:.1f} min in all. The demo's SFT "
        f"model (`make demo`: the `tiny` model, 2M parameters, SFT on {sum(1 for _ in open(SFT_SET)):,} problems); the held-out "
        f"set is {EVAL.relative_to(REPO)} (n = 100, 95% intervals as `llmctl eval` gives them: Wald at n ≥ 100, Wilson near 0 or 1); fresh problems: {args.fresh:,} from "
        f"make_crawl's generator with seed {FRESH_SEED}, none in the eval or SFT sets.",
        "",
        "Issue 9 asks for held-out accuracy ≥ 10 points over the SFT model after a few minutes of GRPO in the CPU "
        "demo. **Not met at this scale**; what the SFT model leaves to RL, and what RL did with it:",
        "",
        "| the SFT model on the held-out problems | value |",
        "|---|---|",
        f"| greedy accuracy | **{ci(greedy)}** |",
        f"| pass@1, 8 samples at temperature 0.7, top-p 0.95 | {sampled['pass@1']['mean'] * 100:.1f}% |",
        f"| pass@8 (some sample right) | {sampled['pass@8']['mean'] * 100:.0f}% |",
        f"| maj@8 (the most frequent answer right): what perfect sharpening would give | {sampled['maj@8']['mean'] * 100:.0f}% "
        f"(greedy {sampled['maj@8']['mean'] * 100 - sft_pct:+.0f}) |",
        "",
        "| greedy answers by cause | problems |",
        "|---|---|",
        *[f"| {cause} | {n} |" for cause, n in causes.most_common()],
        "",
        "| gold answers (`llmctl train --sft` on fresh problems), 10 steps at a constant rate from the SFT model | greedy held-out |",
        "|---|---|",
        f"| (start) | {ci(greedy)} |",
        *[f"| lr {lr} | {ci(m)} |" for lr, m in control.items()],
        "",
        f"| GRPO run ({args.steps} steps, G 8, 8 prompts a step, seed 1) | held-out greedy by step | sampled accuracy on the "
        "prompts, first → last quarter of the run | minutes |",
        "|---|---|---|---|",
        *[f"| {label} | {curve(evals)} (final {ci(evals[-1][1])}) | {first * 100:.0f}% → {last * 100:.0f}% | {sec / 60:.1f} |"
          for label, evals, first, last, sec in rl_rows],
        "",
        "What this says. The SFT model's errors are mostly arithmetic facts on whole-number tokens (the tokenizer keeps "
        "runs of up to 3 digits together, so `30 * 7 = 210` is one fact to memorize); sharpening toward answers the model "
        "already samples can add at most maj@8 − greedy. Learning new facts needs a rate at which the SFT model, annealed "
        "to lr 0, first loses points even on gold answers (the control); GRPO's noisier signal at that rate loses more, and at "
        "the preset's 2e-5 it moves nothing measurable in the demo's time. The spec names no small model on which RL was "
        "shown to work (002-rl §D); this table is the measurement at 2M parameters.",
    ]
    write_results("rl held-out", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
