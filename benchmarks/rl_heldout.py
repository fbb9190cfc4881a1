"""What the demo's GRPO buys on held-out problems, what the gain is made of, and its controls.

    make demo   # makes out/demo/run, the pretrained tiny model every run here starts from
    .venv/bin/python benchmarks/rl_heldout.py [--base out/demo/run] [--sft-seeds 0 1] [--rl-seeds 1 2 3]

The demo's tasks (examples/make_tasks.py): word problems whose steps are one-digit facts; the SFT
set (arithmetic-sft.jsonl) ends a seeded half of its 1,200 solutions in a true `Check: 28 / 4 = 7.`
line instead of `#### 28`, so the SFT model has two ways to finish a solution and only one of them
is read as the answer. GRPO (`llmctl rl --config arith`, prompts with `#### n` references) is
rewarded for the answer the verifier reads. This script measures, on the 300 held-out problems:

1. per SFT seed: greedy accuracy; the headroom `llmctl rl` logs at step 0 (greedy, pass@1, maj@G and
   pass@G at the rollout temperature, on the preset's first `headroom_limit` held-out prompts);
2. per SFT seed x RL seed: RL - SFT paired (the numbers `llmctl eval compare` prints), RL wall time;
3. what the gain is made of: the share of answers that end in `#### n`, and accuracy among those
   (a gain in the second is more than format);
4. the control: the same RL from an SFT model trained on one format only (arithmetic-train.jsonl,
   every solution ends in `#### n`): what GRPO does when there is no behaviour to choose.

About 45 minutes on 2 cores with the defaults. The section goes to benchmarks/RESULTS.md (## rl held-out).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, cpu_name, write_results  # noqa: E402
from common import once as run_once  # noqa: E402

from llmctl.eval.compare import compare_results  # noqa: E402

TASKS = REPO / "examples" / "tasks"
EVAL, PROMPTS = TASKS / "arithmetic.jsonl", TASKS / "arithmetic-train.jsonl"
SFT_MIXED, SFT_PLAIN = TASKS / "arithmetic-sft.jsonl", TASKS / "arithmetic-train.jsonl"
FINAL = re.compile(r"####\s*-?\d")
RUN_SECONDS: list[float] = []  # wall seconds of every run the table uses, from their manifests


def once(out: Path, *args, threads: int) -> dict:
    """common.once, keeping the run's wall seconds for the table."""
    m = run_once(out, *args, threads=threads)
    RUN_SECONDS.append(m["wall_seconds"])
    return m


def evaluate(ckpt: Path, out: Path, threads: int) -> dict:
    """Greedy held-out accuracy, as the demo's eval stage runs it, plus the answer-format split."""
    once(out, "eval", "run", ckpt, "-t", f"gsm8k:{EVAL}", "--max-new-tokens", 64, threads=threads)
    rows = pq.read_table(out / "samples.parquet").to_pylist()
    formed = [r for r in rows if FINAL.search(r["completion"])]
    return {"dir": out, "acc": statistics.fmean(r["score"] for r in rows), "n": len(rows),
            "formed": len(formed) / len(rows), "acc_formed": statistics.fmean(r["score"] for r in formed) if formed else 0.0}


def headroom(run: Path) -> dict:
    """The step-0 headroom record `llmctl rl` wrote to metrics.jsonl."""
    first = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    return first["headroom"]


def summary(rows: list) -> list[str]:
    """What the table says, in numbers computed from it: the gain's spread, and its two parts. With
    f the share of answers ending in `#### n` and a the accuracy among them, accuracy ≈ f·a (the
    other endings are scored by their last number, which a check line makes wrong), so a gain
    splits into (f₁ − f₀)·a₀, more answers the verifier reads, and f₁·(a₁ − a₀), better answers."""
    mixed = [r for r in rows if r[0].startswith("two endings")]
    plain = [r for r in rows if r not in mixed]

    def span(xs, sign="+"):
        return f"{min(xs) * 100:{sign}.1f} to {max(xs) * 100:{sign}.1f}"

    out = []
    if mixed:
        gaps, zs = [r[4]["diff"] for r in mixed], [r[4]["z"] for r in mixed]
        form = statistics.fmean((a["formed"] - b["formed"]) * b["acc_formed"] for _, _, b, a, _, _ in mixed)
        within = statistics.fmean(a["formed"] * (a["acc_formed"] - b["acc_formed"]) for _, _, b, a, _, _ in mixed)
        out.append(
            f"From the two-ending SFT models, RL − SFT is {span(gaps)} points over {len(mixed)} runs (z {min(zs):.1f} to "
            f"{max(zs):.1f}); {sum(g >= 0.10 and z >= 2 for g, z in zip(gaps, zs))} of {len(mixed)} clear +10 points at z ≥ 2. "
            f"Answers ending in `#### n`: {span([r[2]['formed'] for r in mixed], '')}% of the SFT models', "
            f"{span([r[3]['formed'] for r in mixed], '')}% after RL; accuracy among them changes by "
            f"{span([r[3]['acc_formed'] - r[2]['acc_formed'] for r in mixed])} points. On average {form * 100:+.1f} points "
            f"come from the ending the verifier reads (a behaviour the SFT model already had) and {within * 100:+.1f} from "
            "better answers in that format.")
    if plain:
        out.append(
            f"The control (one ending only, nothing to choose): RL − SFT {span([r[4]['diff'] for r in plain])} points "
            f"(z {min(r[4]['z'] for r in plain):.1f} to {max(r[4]['z'] for r in plain):.1f}): what the same RL does "
            f"to accuracy itself. That SFT model alone scores {pct(plain[0][2]['acc'])}"
            + (f"; RL from the two-ending models reaches {span([r[3]['acc'] for r in mixed], '')}%"
               + (": the gain makes up for the ending the SFT data taught; it does not go past a model that never learned it."
                  if max(r[3]["acc"] for r in mixed) <= plain[0][2]["acc"] + 0.02 else
                  ", past the one-ending model: more than the ending.") if mixed else "."))
    return [x for o in out for x in ("", o)]


def pct(x: float) -> str:
    return f"{x * 100:.1f}%"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default=str(REPO / "out" / "demo" / "run"), help="the pretrained model (make demo's out/demo/run)")
    ap.add_argument("--sft-seeds", type=int, nargs="+", default=[0, 1], help="SFT seeds (weights' data order); 0 is the demo's")
    ap.add_argument("--rl-seeds", type=int, nargs="+", default=[1, 2, 3], help="RL seeds for every SFT model (the demo runs 0)")
    ap.add_argument("--control-rl-seeds", type=int, nargs="+", default=[1, 2], help="RL seeds for the one-format control")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", help="keep the runs here (default: a new temporary directory)")
    args = ap.parse_args()
    if not (Path(args.base) / "manifest.json").exists():
        raise SystemExit(f"{args.base} is not a finished run: `make demo` makes out/demo/run")
    T, started, load0 = args.threads, time.time(), os.getloadavg()[0]
    tmp = Path(args.work or tempfile.mkdtemp(prefix="rl-heldout-"))
    tmp.mkdir(parents=True, exist_ok=True)

    models = [(f"two endings, SFT seed {s}", SFT_MIXED, s, args.rl_seeds) for s in args.sft_seeds]
    models.append(("one ending (control), SFT seed 0", SFT_PLAIN, 0, args.control_rl_seeds))
    rows, heads = [], []
    for k, (label, chats, sft_seed, rl_seeds) in enumerate(models):
        sft = tmp / f"sft-{k}"
        once(sft, "train", "--sft", chats, "--init", args.base, "--config", "sft-tiny", "--seed", sft_seed, threads=T)
        before = evaluate(sft, tmp / f"sft-{k}-eval", T)
        for rl_seed in rl_seeds:
            run = tmp / f"rl-{k}-{rl_seed}"
            m = once(run, "rl", sft, "--prompts", PROMPTS, "--eval", EVAL, "--config", "arith", "--seed", rl_seed, threads=T)
            if rl_seed == rl_seeds[0]:
                heads.append((label, before, headroom(run)))
            after = evaluate(run, tmp / f"rl-{k}-{rl_seed}-eval", T)
            gap = compare_results(after["dir"], before["dir"])["tasks"][0]
            rows.append((label, rl_seed, before, after, gap, m["wall_seconds"]))

    def ci(g: dict) -> str:
        return f"{g['diff'] * 100:+.1f} [{g['ci_low'] * 100:+.1f}, {g['ci_high'] * 100:+.1f}]"

    n_eval = rows[0][2]["n"]
    lines = [
        "## rl held-out",
        "",
        f"`.venv/bin/python benchmarks/rl_heldout.py --base {os.path.relpath(args.base, REPO)} --sft-seeds "
        f"{' '.join(map(str, args.sft_seeds))} --rl-seeds {' '.join(map(str, args.rl_seeds))} --control-rl-seeds "
        f"{' '.join(map(str, args.control_rl_seeds))}` — {datetime.date.today()}, `nproc` = {os.cpu_count()} ({cpu_name()}), "
        f"1-min load {load0:.2f} before / {os.getloadavg()[0]:.2f} after this pass; the runs took {sum(RUN_SECONDS) / 60:.1f} min "
        f"(their manifests' wall seconds; this pass {(time.time() - started) / 60:.1f} min, finished runs in --work are reused). "
        f"Every model starts from make demo's pretrained `tiny` model (2M parameters); SFT with `--config sft-tiny`; RL with "
        f"`--config arith` (the demo's preset) on {PROMPTS.relative_to(REPO)}; greedy accuracy on the {n_eval} held-out problems of "
        f"{EVAL.relative_to(REPO)} as the demo's eval stage scores them; RL − SFT is paired over the same problems (95% interval).",
        "",
        f"Headroom before RL (`llmctl rl`'s step-0 record: its first {heads[0][2]['n']} held-out prompts, 8 samples each at the "
        "rollouts' temperature 0.7, top-p 0.95; maj@8 is what sharpening alone can reach):",
        "",
        f"| SFT model | greedy, all {n_eval} | greedy | pass@1 | maj@8 | pass@8 |",
        "|---|---|---|---|---|---|",
        *[f"| {label} | {pct(b['acc'])} | {pct(h['greedy'])} | {pct(h['pass@1'])} | {pct(h['maj@8'])} | {pct(h['pass@8'])} |"
          for label, b, h in heads],
        "",
        "| SFT model | RL seed | SFT → RL greedy | RL − SFT, points [95%] | z | answers ending in `#### n`, SFT → RL | accuracy among those, SFT → RL | RL wall |",
        "|---|---|---|---|---|---|---|---|",
        *[f"| {label} | {s} | {pct(b['acc'])} → {pct(a['acc'])} | {ci(g)} | {g['z']:.1f} | {pct(b['formed'])} → {pct(a['formed'])} | "
          f"{pct(b['acc_formed'])} → {pct(a['acc_formed'])} | {sec / 60:.1f} min |" for label, s, b, a, g, sec in rows],
        "",
        *summary(rows),
    ]
    write_results("rl held-out", "\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"runs kept in {tmp}", file=sys.stderr)


if __name__ == "__main__":
    main()
