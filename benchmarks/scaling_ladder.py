"""A real scaling ladder on this CPU: `llmctl plan ladder` lays it out, make trains it, `llmctl
plan fit` fits it, and a larger run held out of the fit is predicted, then trained and measured.

    .venv/bin/python benchmarks/scaling_ladder.py [--sizes 32x1 32x2 64x1 64x2] [--budgets 2e11 6e11 2e12]
                                                  [--holdout 96x2@4e12] [--work DIR]

Tokens: pages-a and the example crawl (`llmctl crawl-extract`, then a 1,024-id BPE and a 95/5
train/validation split). The `tiny` preset's family at the given widths x depths; each size's
budgets are decay branches of one WSD run (plan/ladder.py). The held-out run (SIZE@BUDGET) is a
whole WSD run at a size and budget above the ladder's; the fit never sees it (`plan fit
--holdout`). Target: final validation loss in nats per token.

The table goes to stdout and into benchmarks/RESULTS.md (## plan ladder).
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

from common import DEFAULT_WARC, LLMCTL, REPO, cpu_name, write_results  # benchmarks/common.py


def llmctl(*args, capture: bool = False) -> str:
    p = subprocess.run([str(LLMCTL), *map(str, args)], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"failed: llmctl {' '.join(map(str, args))}\n{p.stderr[-3000:]}")
    return p.stdout


def g(x: float) -> str:
    return f"{x:.4g}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=["32x1", "32x2", "64x1", "64x2"])
    ap.add_argument("--budgets", nargs="+", default=["2e11", "6e11", "2e12"])
    ap.add_argument("--holdout", default="96x2@4e12", help="SIZE@BUDGET of the run predicted, then trained")
    ap.add_argument("--work", default=None, help="keep the runs here (default: a temporary folder)")
    args = ap.parse_args()
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    crawl = sorted((REPO / "examples" / "crawl").glob("*.warc.gz"))
    with tempfile.TemporaryDirectory(prefix="bench-ladder-") as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        if not (work / "tokens" / "val" / "manifest.json").is_file():
            llmctl("crawl-extract", DEFAULT_WARC, *crawl, "-o", work / "docs", "-q", "--overwrite")
            llmctl("tokenize", "train", work / "docs", "-o", work / "tok", "--vocab-size", 1024, "-q", "--overwrite")
            for split in ("train", "val"):
                llmctl("tokenize", work / "docs", "-o", work / "tokens" / split, "--tokenizer", work / "tok", "--split", split,
                       "--val-fraction", 0.05, "-q", "--overwrite")
        tokens = json.loads((work / "tokens" / "train" / "manifest.json").read_text())["counts"]["tokens"]
        mk = work / "ladder.mk"
        info = json.loads(llmctl("--json", "plan", "ladder", work / "tokens" / "train", "--val", work / "tokens" / "val", "-o", mk,
                                 "--runs", work / "runs", *[x for s in args.sizes for x in ("--size", s)],
                                 *[x for b in args.budgets for x in ("--budget", b)], capture=True))
        t_make = time.perf_counter()
        make = subprocess.run(["make", "-f", str(mk), "all", f"LLMCTL={LLMCTL} -q"], capture_output=True, text=True)
        if make.returncode != 0:
            raise SystemExit(make.stderr[-3000:])
        make_s = time.perf_counter() - t_make
        # the held-out run: a whole WSD run above the ladder, the same way the ladder's WSD runs are made
        size, budget = args.holdout.split("@")
        held = json.loads(llmctl("--json", "plan", "ladder", work / "tokens" / "train", "--val", work / "tokens" / "val",
                                 "-o", work / "held.mk", "--runs", work / "held", "--size", size, "--size", args.sizes[0],
                                 "--budget", budget, "--min-tpp", "0.01", "--max-tpp", "1e6", capture=True))
        row = next(r for r in held["runs"] if r["run"].startswith(f"d{size.split('x')[0]}-l{size.split('x')[1]}-"))
        t_held = time.perf_counter()
        held_make = subprocess.run(["make", "-f", str(work / "held.mk"), str(work / "held" / row["run"] / "manifest.json"),
                                    f"LLMCTL={LLMCTL} -q"], capture_output=True, text=True)
        if held_make.returncode != 0:
            raise SystemExit(held_make.stderr[-3000:])
        held_s = time.perf_counter() - t_held
        runs = [work / "runs" / r["run"] for r in info["runs"]]
        # training time from the runs' own manifests (a rerun over kept runs trains nothing)
        make_s = sum(json.loads((r / "manifest.json").read_text())["wall_seconds"] for r in runs)
        held_s = json.loads((work / "held" / row["run"] / "manifest.json").read_text())["wall_seconds"]
        epochs = max(r["tokens"] for r in info["runs"]) / tokens
        fit = json.loads(llmctl("--json", "plan", "fit", *runs, "--holdout", work / "held" / row["run"], "-o", work / "fit", capture=True))

    p, iv, h = fit["parametric"], fit["bootstrap"]["intervals"], fit["holdout"]

    def ci(k: str) -> str:
        b = iv.get(k) or {}
        return f"[{g(b['lo'])}, {g(b['hi'])}]" if b.get("lo") is not None else "—"

    lines = [
        f"`.venv/bin/python benchmarks/scaling_ladder.py --sizes {' '.join(args.sizes)} --budgets {' '.join(args.budgets)} "
        f"--holdout {args.holdout}` — {time.strftime('%Y-%m-%d')}, {cpu_name()}; training (the runs' own wall seconds): the "
        f"ladder {make_s:.0f} s, the held-out run {held_s:.0f} s; this invocation {time.perf_counter() - t0:.0f} s (runs already in "
        f"--work are not trained again); 1-min load average {load0:.2f} before / "
        f"{os.getloadavg()[0]:.2f} after.",
        "",
        f"Tokens: pages-a and the example crawl, BPE 1,024, {tokens:,} training tokens: runs past that repeat them "
        f"(the longest reads {epochs:.1f} epochs; the held-out run {row['tokens'] / tokens:.1f}), which a law of fresh tokens does not model. "
        f"{len(info['runs'])} runs, {sum(r['branch_of'] is None for r in info['runs'])} of them WSD runs and the rest decay branches:",
        "",
        "| run | params | tokens | D/N | FLOPs | branch of |",
        "|---|---|---|---|---|---|",
    ]
    lines += [f"| {r['run']} | {r['params']:,} | {r['tokens']:,} | {r['tokens_per_param']:.1f} | {r['flops']:.2e} | "
              f"{(r['branch_of'] + ' @ step ' + str(r['branch_step'])) if r['branch_of'] else ''} |" for r in info["runs"]]
    lines += [
        "",
        f"`llmctl plan fit` ({len(fit['runs'])} runs used, {len(fit['excluded'])} excluded: "
        + ("; ".join(f"{Path(e['path']).name}: {e['reason']}" for e in fit["excluded"]) or "none") + "), final validation loss "
        f"(nats/token), 95% bootstrap intervals over runs ({fit['bootstrap']['rounds']} rounds); convergence: {p['at_best']} of "
        f"{p['starts']} starts at the best objective, parameters {'agree' if p['agree'] else 'disagree'}:",
        "",
        "| E | A | B | alpha | beta | a = beta/(alpha+beta) |",
        "|---|---|---|---|---|---|",
        f"| {g(p['E'])} {ci('E')} | {g(p['A'])} {ci('A')} | {g(p['B'])} {ci('B')} | {g(p['alpha'])} {ci('alpha')} | "
        f"{g(p['beta'])} {ci('beta')} | {g(p['a'])} |",
        "",
        f"IsoFLOP: " + (f"N_opt ~ C^{g(fit['isoflop']['a'])}, D_opt ~ C^{g(fit['isoflop']['b'])}" if fit["isoflop"]["a"] is not None
                        else f"no power law ({fit['isoflop']['why']})") + ".",
        "",
        f"Held out, predicted then trained: {row['run']} ({row['params']:,} parameters, {row['tokens']:,} tokens, "
        f"{row['flops']:.2e} FLOPs): predicted {g(h['predicted'])}, measured {g(h['measured'])} nats/token, error "
        f"{h['error']:+.4f} ({100 * h['relative_error']:+.2f}%).",
    ]
    if fit["warnings"]:
        lines += ["", "Warnings of the fit: " + "; ".join(fit["warnings"]) + "."]
    text = "\n".join(lines) + "\n"
    print(text)
    write_results("plan ladder", f"## plan ladder\n\n{text}")


if __name__ == "__main__":
    sys.exit(main())
