"""Post-training methods side by side on the demo's SFT model: GRPO, DPO on its own rejection-sampled
pairs, rejection-sampling SFT, and GRPO with LoRA — each against the SFT start on the 300 held-out
problems, paired, with intervals.

    make demo                                        # out/demo/sft and out/demo/rl, what this starts from
    make posttrain-compare                           # = .venv/bin/python benchmarks/posttrain.py --demo out/demo

Every method sees the same prompts (examples/tasks/arithmetic-train.jsonl, never the held-out
ones) and starts from the same SFT model:

- GRPO: the demo's own `llmctl rl --config arith` run (out/demo/rl);
- best-of-n: `llmctl best-of-n` samples `-n` completions of the first `--prompts` prompts at the
  rollout settings of the arith preset and scores them with the math verifier; its `sft.jsonl` (the
  best completion of each prompt) and `pairs.jsonl` (best against worst) feed
- RS-SFT: `llmctl train --sft sft.jsonl --init SFT` (a few epochs at a low rate), and
- DPO: `llmctl dpo SFT --pairs pairs.jsonl --config dpo-tiny` (2 epochs) at lr 1e-4 and 1e-5 (the preset's);
- GRPO + LoRA: the demo's rl run again with `--lora-rank` (adapters only; the same steps).

Each is evaluated as the demo evaluates (`gsm8k:` greedy, 64 new tokens) and compared with the SFT
model's eval by `llmctl eval compare`'s arithmetic (eval/compare.py). The section goes to
benchmarks/RESULTS.md (## posttrain), whatever the outcome. About 15 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, cpu_name, once, write_results  # noqa: E402

from llmctl.eval.compare import compare_results  # noqa: E402

TASKS = REPO / "examples" / "tasks"
EVAL, PROMPTS = TASKS / "arithmetic.jsonl", TASKS / "arithmetic-train.jsonl"


def evaluate(ckpt: Path, out: Path) -> Path:
    once(out, "eval", ckpt, "-t", f"gsm8k:{EVAL}", "--max-new-tokens", 64)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--demo", type=Path, default=REPO / "out" / "demo", help="a finished `make demo` output (sft/, rl/)")
    ap.add_argument("--work", type=Path, default=None, help="where the runs go (default: DEMO/posttrain)")
    ap.add_argument("-n", type=int, default=8, help="samples per prompt for best-of-n")
    ap.add_argument("--prompts", type=int, default=400, help="how many training prompts best-of-n samples")
    ap.add_argument("--lora-rank", type=int, default=16)
    ap.add_argument("--note", default="", help="a line on the conditions (e.g. what else ran), kept in RESULTS")
    args = ap.parse_args()
    demo, work = args.demo, args.work or args.demo / "posttrain"
    work.mkdir(parents=True, exist_ok=True)
    sft, rl = demo / "sft", demo / "rl"
    for d in (sft, rl):
        if not (d / "manifest.json").exists():
            raise SystemExit(f"{d} is missing: run `make demo` first")
    arith = ["--max-new-tokens", 64, "--temperature", 0.7, "--top-p", 0.95]  # the arith preset's rollout settings
    bon = once(work / "bon", "best-of-n", sft, "--prompts", PROMPTS, "-n", args.n, "--limit", args.prompts, *arith)
    runs = {
        "GRPO (demo rl)": rl,
        "RS-SFT": work / "rs-sft",
        "DPO, lr 1e-4": work / "dpo",
        "DPO, lr 1e-5 (dpo-tiny)": work / "dpo-low",
        f"GRPO + LoRA r{args.lora_rank}": work / "rl-lora",
    }
    seconds = {"GRPO (demo rl)": json.loads((rl / "manifest.json").read_text())["wall_seconds"]}
    m = once(work / "rs-sft", "train", "--sft", work / "bon" / "sft.jsonl", "--init", sft, "--config", "sft-tiny",
             "--max-tokens", 200_000, "--lr", 2e-4)
    seconds["RS-SFT"] = m["wall_seconds"]
    for label, lr in (("DPO, lr 1e-4", 1e-4), ("DPO, lr 1e-5 (dpo-tiny)", 1e-5)):
        m = once(runs[label], "dpo", sft, "--pairs", work / "bon" / "pairs.jsonl", "--config", "dpo-tiny", "--epochs", 2, "--lr", lr)
        seconds[label] = m["wall_seconds"]
    m = once(work / "rl-lora", "rl", sft, "--prompts", PROMPTS, "--eval", EVAL, "--config", "arith",
             "--lora-rank", args.lora_rank, "--lr", 2e-4)
    seconds[f"GRPO + LoRA r{args.lora_rank}"] = m["wall_seconds"]

    base = evaluate(sft, work / "eval-sft")
    rows = []
    for label, run in runs.items():
        gap = compare_results(evaluate(run, work / f"eval-{run.name}"), base)["tasks"][0]
        rows.append((label, gap, seconds[label]))
    c = bon["counts"]
    when = datetime.date.today().isoformat()
    lines = [
        "## posttrain", "",
        f"`.venv/bin/python benchmarks/posttrain.py --demo {demo}` — {when}, {cpu_name()}, `nproc` = {os.cpu_count()}."
        + (f" {args.note}" if args.note else ""),
        "",
        f"From the demo's SFT model ({sft}), on the same training prompts; each row's model against the SFT model "
        f"on the {rows[0][1]['n']} held-out problems (greedy, paired; 95% interval of the difference). best-of-n: "
        f"{c['prompts']} prompts × {args.n} samples, pass@1 {c.get('pass_at_1')}, best-of-{args.n} accuracy "
        f"{c.get('best_of_n_accuracy')}, {c['kept']} kept (the best of each prompt), {c['pairs']} best-vs-worst pairs.",
        "",
        "| method | SFT acc | method acc | difference | 95% interval | z | wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, g, s in rows:
        lines.append(f"| {label} | {g['mean_b']:.3f} | {g['mean_a']:.3f} | {g['diff']:+.3f} | "
                     f"[{g['ci_low']:+.3f}, {g['ci_high']:+.3f}] | {g['z']:.2f} | {s:.0f} |")
    lines += ["", "One seed each (the demo's); GRPO's seed spread is in `## rl held-out`. RS-SFT and DPO take "
              "their data from best-of-n (its wall time not included above: "
              f"{bon['wall_seconds']:.0f} s)."]
    write_results("posttrain", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
