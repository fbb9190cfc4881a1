"""What the demo's RL gain is made of, and whether a reward cut from the answers would give it too:
the demo's GRPO run and its two control runs (`llmctl rl --control`) from the same SFT model, on
several seeds, each reported by `llmctl report` (its rl section: the strict/flexible split, the
pass@k curves, the controls beside the real run, and the sentence that says what the gain is made of).

    make demo                                        # out/demo/sft, what this starts from
    make rl-controls                                 # = .venv/bin/python benchmarks/rl_controls.py --demo out/demo

For each seed S, under WORK/seed-S/:
- `rl`, `rl-random-reward`, `rl-shuffled-answers`: `llmctl rl SFT --config arith --seed S` with
  `--control none | random-reward | shuffled-answers` (the same prompts, steps and compute);
- `eval-sft`, `eval-rl`, `eval-rl-random-reward`, `eval-rl-shuffled-answers`: each model on the 300
  held-out problems as the demo evaluates them (`gsm8k:`, greedy, 64 new tokens);
- `eval-sft-k32`, `eval-rl-k32`: the SFT and RL models with K samples per problem at the rollouts'
  settings (temperature 0.7, top-p 0.95, seed S), for the pass@k curves k = 1 … K;
- `report/`: `llmctl report WORK/seed-S/rl`, which finds all of these beside the run.

The table across seeds is read back from each report's report.json (the product's own numbers) and
goes to benchmarks/RESULTS.md (## rl controls), whatever it shows. About 3 minutes a seed on 2 cores.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, cpu_name, llmctl, once, write_results  # noqa: E402

TASKS = REPO / "examples" / "tasks"
EVAL, PROMPTS = TASKS / "arithmetic.jsonl", TASKS / "arithmetic-train.jsonl"
CONTROLS = ("random-reward", "shuffled-answers")
GREEDY = ["-t", f"gsm8k:{EVAL}", "--max-new-tokens", 64]  # as the demo evaluates (Makefile, eval-%)


def seed_runs(sft: Path, d: Path, seed: int, k: int) -> Path:
    """Every run and eval of one seed, then its report; the report folder."""
    for control in ("none", *CONTROLS):
        name = "rl" if control == "none" else f"rl-{control}"
        once(d / name, "rl", sft, "--prompts", PROMPTS, "--eval", EVAL, "--config", "arith", "--seed", seed, "--control", control)
        once(d / f"eval-{name}", "eval", d / name, *GREEDY)
    once(d / "eval-sft", "eval", sft, *GREEDY)
    sampled = ["-n", k, "--temperature", 0.7, "--top-p", 0.95, "--seed", seed, "--pass-k", 1, "--pass-k", k]
    once(d / f"eval-sft-k{k}", "eval", sft, *GREEDY, *sampled)
    once(d / f"eval-rl-k{k}", "eval", d / "rl", *GREEDY, *sampled)
    llmctl("report", d / "rl", "-o", d / "report")
    return d / "report"


def rl_section(report: Path) -> dict:
    sections = json.loads((report / "report.json").read_text())["sections"]
    return next(s for s in sections if s["key"] == "rl")


def tables(report: Path, caption_starts: str) -> list[dict]:
    return [t for t in rl_section(report)["tables"] if t["caption"].startswith(caption_starts)]


def gains(report: Path) -> dict[str, dict[str, dict]]:
    """{run: {part: row}} of the report's "what the gain is made of" table, greedy evals only."""
    t = tables(report, "what the gain is made of")[0]
    out: dict[str, dict[str, dict]] = {}
    for row in t["rows"]:
        r = dict(zip(["run", "compared", "part", "n", "start", "runs", "gain", "low", "high", "z"], row))
        if "(greedy) − " in r["compared"]:
            out.setdefault(r["run"], {})[r["part"].split(":")[0].split(" (")[0]] = r
    return out


def spread(xs: list[float]) -> str:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return "—"
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{100 * statistics.fmean(xs):+.1f} ± {100 * sd:.1f}"


def pts(r: dict | None) -> str:
    return "—" if not r or r["gain"] is None else f"{100 * r['gain']:+.1f} [{100 * r['low']:+.1f}, {100 * r['high']:+.1f}]"


PARTS = ("strict", "format", "content", "strict among well-formed in both")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--demo", type=Path, default=REPO / "out" / "demo", help="a finished `make demo` output (sft/)")
    ap.add_argument("--work", type=Path, default=None, help="where the runs go (default: DEMO/rl-controls)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("-k", type=int, default=32, help="samples per problem for the pass@k curves")
    ap.add_argument("--note", default="", help="a line on the conditions (e.g. what else ran), kept in RESULTS")
    args = ap.parse_args()
    demo, work = args.demo, args.work or args.demo / "rl-controls"
    sft = demo / "sft"
    if not (sft / "manifest.json").exists():
        raise SystemExit(f"{sft} is missing: run `make demo` first")
    reports = {}
    for seed in args.seeds:
        print(f"seed {seed}", flush=True)
        reports[seed] = seed_runs(sft, work / f"seed-{seed}", seed, args.k)

    g = {s: gains(r) for s, r in reports.items()}
    lines = [
        "## rl controls", "",
        f"`make rl-controls` (= `.venv/bin/python benchmarks/rl_controls.py --demo {demo}"
        + (f" --work {work}" if args.work else "") + (f" --seeds {' '.join(map(str, args.seeds))}" if args.seeds != [0, 1, 2] else "")
        + (f" -k {args.k}" if args.k != 32 else "") + "`) — "
        f"{datetime.date.today().isoformat()}, {cpu_name()}, `nproc` = {os.cpu_count()}." + (f" {args.note}" if args.note else ""),
        "",
        f"From the demo's SFT model ({sft}): `llmctl rl --config arith` and its two controls on seeds "
        f"{', '.join(map(str, args.seeds))}; each model against the SFT model on the 300 held-out problems (greedy, "
        "paired; gains in points of accuracy with 95% intervals), from each seed's `llmctl report WORK/seed-S/rl` (its rl section):",
        "",
        "| seed | run | strict gain | format (well-formed) gain | content (flexible) gain | strict among well-formed in both | real run's lead over it |",
        "|---|---|---|---|---|---|---|",
    ]
    names = list(g[args.seeds[0]])
    for s in args.seeds:
        lead = {row[0]: dict(zip(["gain", "low", "high"], row[7:10])) for row in tables(reports[s], "the real run and its controls")[0]["rows"]}
        for name in names:
            r = g[s].get(name, {})
            lines.append(f"| {s} | {name} | " + " | ".join(pts(r.get(p)) for p in PARTS) + f" | {pts(lead.get(name))} |")
    lines += ["", f"Mean ± standard deviation over the {len(args.seeds)} seeds (points):", "",
              "| run | strict gain | format gain | content gain | strict among well-formed in both |", "|---|---|---|---|---|"]
    for name in names:
        lines.append(f"| {name} | " + " | ".join(spread([(g[s].get(name, {}).get(p) or {}).get("gain") for s in args.seeds]) for p in PARTS) + " |")
    lines += ["", "What each control keeps: the arith preset pays a format bonus (`format_reward = 0.1`) for any answer "
              "the verifier can read; `shuffled-answers` keeps it (the stand-in reference changes only which answer is "
              "right), `random-reward` replaces the whole reward by its 0/1 draw, bonus included."]
    lines += ["", "What each seed's report says the gain is made of (its sentence, computed from these numbers):", ""]
    lines += [f"- seed {s}: " + next(n for n in rl_section(reports[s])["notes"] if n.startswith("What the gain is made of")).removeprefix("What the gain is made of: ")
              for s in args.seeds]
    curves = {s: {row[0]: row for row in tables(r, "pass@k")[0]["rows"]} for s, r in reports.items() if tables(r, "pass@k")}
    if curves:
        ks = sorted({k for c in curves.values() for k in c})
        shown = [k for k in ks if k & (k - 1) == 0 or k == ks[-1]]  # powers of two and K
        lines += ["", f"pass@k of the SFT and RL models, K = {args.k} samples a problem (temperature 0.7, top-p 0.95, the "
                  "rollouts' settings; unbiased estimator), mean over seeds; RL − SFT in points, mean ± sd over seeds:", "",
                  "| k | SFT | RL | RL − SFT |", "|---|---|---|---|"]
        for k in shown:
            rows = [c[k] for c in curves.values() if k in c]
            lines.append(f"| {k} | {statistics.fmean(r[1] for r in rows):.3f} | {statistics.fmean(r[2] for r in rows):.3f} | "
                         f"{spread([r[3] for r in rows])} |")
    write_results("rl controls", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
