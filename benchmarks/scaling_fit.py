"""`llmctl plan fit` on known truth: losses made by the field guide's Chinchilla constants (as
printed by Hoffmann et al. 2022, and the Besiroglu et al. 2024 refit), on an IsoFLOP ladder, with
multiplicative noise; the fitter's constants with their bootstrap intervals against the truth.

    .venv/bin/python benchmarks/scaling_fit.py [--noise 0.01] [--bootstrap 200]

The ladder: 4 budgets a decade apart (1e18-1e21 FLOPs), 7 sizes per budget from N_opt/10 to 10·N_opt
(both sides of each minimum, several D/N per budget: the guide's design), C = 6ND, so N spans about
3 decades; losses L·exp(noise·z), z standard normal, 3 seeds. The parametric fit is plan/fit.py's
(Huber δ = 1e-3 on ln L, L-BFGS from Hoffmann et al.'s grid), the intervals 95% percentile
bootstrap over runs; the IsoFLOP exponent a is compared with β/(α+β).

The table goes to stdout and into benchmarks/RESULTS.md (## plan fit).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_name, write_results  # benchmarks/common.py

from llmctl.plan import fit
from llmctl.plan.arithmetic import CHINCHILLA, compute_optimal
from llmctl.plan.fit import synthetic_ladder

BUDGETS = (1e18, 1e19, 1e20, 1e21)
SIZES = 7
SEEDS = (0, 1, 2)


def ladder(c, noise: float, seed: int):
    return synthetic_ladder(c, noise, seed, BUDGETS, SIZES)


def cell(v: float, ci: dict | None, truth: float) -> str:
    inside = ci is not None and ci["lo"] <= truth <= ci["hi"]
    band = f" [{ci['lo']:.4g}, {ci['hi']:.4g}]" if ci else ""
    return f"{v:.4g}{band}{'' if inside else ' ✗'}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--noise", type=float, default=0.01)
    ap.add_argument("--bootstrap", type=int, default=200)
    args = ap.parse_args()
    lines = ["| constants | seed | E | A | B | alpha | beta | a (IsoFLOP) | starts at best |", "|---|---|---|---|---|---|---|---|---|"]
    covered = total = 0
    t0 = time.time()
    for key in ("original", "besiroglu"):
        c = CHINCHILLA[key]
        a_true = fit.frontier_exponents(c)[0]
        lines.append(f"| **{key} (truth)** | | {c.E} | {c.A} | {c.B} | {c.alpha} | {c.beta} | {a_true:.4g} | |")
        for seed in SEEDS:
            n, d, loss, flops = ladder(c, args.noise, seed)
            p = fit.fit_parametric(n, d, loss)
            ci = fit.bootstrap(n, d, loss, args.bootstrap, 1e22, p.constants, seed=seed)
            iso = fit.fit_isoflop(n, d, loss, flops)
            cells = []
            for name in fit.PARAMS:
                truth = getattr(c, name)
                covered += ci[name]["lo"] <= truth <= ci[name]["hi"]
                total += 1
                cells.append(cell(getattr(p.constants, name), ci[name], truth))
            a_iso = f"{iso.a:.4g}" if iso.a is not None else "-"
            lines.append(f"| {key} | {seed} | {' | '.join(cells)} | {a_iso} | {p.at_best}/{p.starts}{'' if p.agree else ' (disagree)'} |")
            print(lines[-1], file=sys.stderr)
    n_lo = min(compute_optimal(BUDGETS[0], CHINCHILLA[k])[0] for k in ("original", "besiroglu")) / 10
    n_hi = max(compute_optimal(BUDGETS[-1], CHINCHILLA[k])[0] for k in ("original", "besiroglu")) * 10
    text = "\n".join([
        "## plan fit",
        "",
        f"`benchmarks/scaling_fit.py`: the fitter on losses made by the guide's Chinchilla constants; {len(BUDGETS)} budgets "
        f"({BUDGETS[0]:.0e}-{BUDGETS[-1]:.0e} FLOPs) x {SIZES} sizes (N_opt/10 to 10 N_opt, N from {n_lo:.2g} to {n_hi:.2g}), "
        f"C = 6ND, multiplicative noise {args.noise:g} (lognormal), seeds {', '.join(map(str, SEEDS))}; each cell is the fit "
        f"and its 95% bootstrap interval ({args.bootstrap} rounds over runs), ✗ where the truth is outside it. "
        f"{cpu_name()}, {time.time() - t0:.0f} s in all.",
        "",
        *lines,
        "",
        f"The truth is inside the interval in {covered} of {total} cases. A and B are the least certain: they trade "
        "off against alpha and beta along a valley of the objective, which is why the guide asks for intervals and "
        "3 significant digits rather than a single point.",
    ])
    print(text)
    write_results("plan fit", text)


if __name__ == "__main__":
    main()
