"""Scaling-law fits of a ladder of runs: L(N, D) = E + A/N^α + B/D^β, two ways (spec
001-arch-optim-scaling §A11, the field guide's scaling chapter, Table 6.4).

- **IsoFLOP** (Hoffmann et al. 2022, "Chinchilla", approach 2): the runs are grouped by compute
  budget; in each budget a parabola of loss in ln N gives the loss-minimizing size N_opt(C) (and,
  by a line of ln D in ln N, its D_opt(C)); a power law through the minima gives N_opt ∝ C^a and
  D_opt ∝ C^b. For the Chinchilla form a = β/(α+β), b = α/(α+β).
- **Parametric** (Hoffmann et al. approach 3, as Besiroglu et al. 2024 redid it): minimize
  Σ_i Huber_δ(LSE(a − α·ln N_i, b − β·ln D_i, e) − ln L_i), δ = 1e-3, a sum over runs (never a
  mean: a mean rescales the Huber threshold against the gradient tolerance), with L-BFGS from a
  grid of initial points; A = e^a, B = e^b, E = e^e. The grid is Hoffmann et al.'s; the objective
  is evaluated at every grid point and L-BFGS-B runs from the best `starts` of them. How many
  starts reach the best objective, and whether their parameters agree, is reported: the usual
  failure is a fit that stops early at a wrong exponent and says nothing (Besiroglu et al.).
- **Bootstrap** over runs: resample the runs with replacement, refit, percentile intervals of
  E, A, B, α, β and of N_opt, D_opt at a budget (from `arithmetic.compute_optimal`, C = 6ND).

Pure numpy/scipy; nothing here prints or reads files (plan/ladder_runs.py reads runs).
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from llmctl.plan.arithmetic import ChinchillaConstants, compute_optimal

HUBER_DELTA = 1e-3  # Hoffmann et al. 2022 §D.2 (and Besiroglu et al. 2024)
# Hoffmann et al. 2022 §D.2's initial grid: α, β ∈ {0, 0.5, …, 2}, e ∈ {−1, −0.5, …, 1}, a, b ∈ {0, 5, …, 25}
GRID_A = GRID_B = tuple(range(0, 30, 5))
GRID_E = (-1.0, -0.5, 0.0, 0.5, 1.0)
GRID_EXP = (0.0, 0.5, 1.0, 1.5, 2.0)
# The search box of L-BFGS-B: wide enough that no sensible fit touches it; a best fit on its edge is
# reported (an exponent pinned at 0 or 4 is a failed fit, not a law).
BOX = ((-20.0, 60.0), (-20.0, 60.0), (-20.0, 10.0), (0.0, 4.0), (0.0, 4.0))  # a, b, e, α, β
OBJ_RTOL = 1e-4  # a start "reached the best" when its objective is within this share of it
AGREE_TOL = 1e-3  # ... and its α, β, ln A, ln B, ln E within this of the best's
BUDGET_RTOL = 0.1  # runs whose compute is within 10% of a budget's first are one IsoFLOP budget
SCALE = 1 / HUBER_DELTA**2  # what the objective is multiplied by inside L-BFGS
EXACT = 1e-20  # per run: an objective below this is an exact fit (residuals ~1e-10)
OBJ_ATOL = 1e-12  # per run: a noise-free fit ends near 0, where a relative tolerance says nothing
PARAMS = ("E", "A", "B", "alpha", "beta")
MIN_RUNS = 3


@dataclass
class Parametric:
    """One parametric fit: the constants, the objective, and how the starts agreed."""

    constants: ChinchillaConstants
    objective: float
    starts: int
    at_best: int  # starts whose objective is within OBJ_RTOL of the best
    agree: bool  # those starts' parameters agree within AGREE_TOL
    spread: float  # the largest difference of α, β, ln A, ln B, ln E among them
    on_edge: list[str]  # parameters at the edge of the search box
    warnings: list[str] = field(default_factory=list)


@dataclass
class Budget:
    """One IsoFLOP budget: its runs, its parabola, the size that minimizes loss."""

    flops: float
    n: list[float]
    d: list[float]
    loss: list[float]
    coef: tuple[float, float, float] | None = None  # loss = c2·x² + c1·x + c0, x = ln N
    n_opt: float | None = None
    d_opt: float | None = None
    loss_opt: float | None = None
    used: bool = False
    why: str | None = None  # why the budget is not in the power law


@dataclass
class IsoFlop:
    budgets: list[Budget]
    a: float | None = None  # N_opt ∝ C^a
    b: float | None = None  # D_opt ∝ C^b
    n_coef: float | None = None  # N_opt = n_coef·C^a
    d_coef: float | None = None
    why: str | None = None  # why there is no power law

    def at(self, flops: float) -> tuple[float, float] | None:
        """(N_opt, D_opt) at `flops` from the power laws through the minima, or None."""
        if self.a is None:
            return None
        return self.n_coef * flops**self.a, self.d_coef * flops**self.b


def _objective(theta: np.ndarray, ln_n: np.ndarray, ln_d: np.ndarray, ln_l: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Σ Huber(LSE − ln L) and its gradient, for each row of `theta` (k, 5): (a, b, e, α, β)."""
    a, b, e, alpha, beta = (theta[:, i:i + 1] for i in range(5))
    u = np.stack([a - alpha * ln_n, b - beta * ln_d, np.broadcast_to(e, (theta.shape[0], ln_n.size))])  # (3, k, n)
    top = u.max(axis=0)
    w = np.exp(u - top)
    s = w.sum(axis=0)
    r = top + np.log(s) - ln_l
    small = np.abs(r) <= HUBER_DELTA
    loss = np.where(small, 0.5 * r**2, HUBER_DELTA * (np.abs(r) - 0.5 * HUBER_DELTA)).sum(axis=1)
    dr = np.clip(r, -HUBER_DELTA, HUBER_DELTA)  # dHuber/dr
    p = w / s  # softmax: dLSE/du
    grad = np.stack([(dr * p[0]).sum(1), (dr * p[1]).sum(1), (dr * p[2]).sum(1),
                     -(dr * p[0] * ln_n).sum(1), -(dr * p[1] * ln_d).sum(1)], axis=1)
    return loss, grad


def _grid() -> np.ndarray:
    return np.array(list(itertools.product(GRID_A, GRID_B, GRID_E, GRID_EXP, GRID_EXP)), dtype=float)


def _lbfgs(theta0: np.ndarray, ln_n: np.ndarray, ln_d: np.ndarray, ln_l: np.ndarray) -> tuple[np.ndarray, float]:
    from scipy.optimize import minimize

    def f(t: np.ndarray) -> tuple[float, np.ndarray]:
        # _objective for one point, written out: L-BFGS calls it thousands of times a fit
        u1, u2 = t[0] - t[3] * ln_n, t[1] - t[4] * ln_d
        top = np.maximum(np.maximum(u1, u2), t[2])
        w1, w2, w3 = np.exp(u1 - top), np.exp(u2 - top), np.exp(t[2] - top)
        s = w1 + w2 + w3
        r = top + np.log(s) - ln_l
        dr = np.clip(r, -HUBER_DELTA, HUBER_DELTA)
        value = float(np.sum(np.where(dr == r, 0.5 * r * r, HUBER_DELTA * (np.abs(r) - 0.5 * HUBER_DELTA))))
        g1, g2, g3 = dr * w1 / s, dr * w2 / s, dr * w3 / s
        grad = np.array([g1.sum(), g2.sum(), g3.sum(), -(g1 @ ln_n), -(g2 @ ln_d)])
        return value * SCALE, grad * SCALE

    # The objective is ~δ²·n (1e-6·n): at scipy's default tolerances (gtol 1e-5) L-BFGS stops at
    # its first step, the early stop Besiroglu et al. found in the original fit. It is minimized
    # scaled by 1/δ² (the same minimizer) with tight tolerances, so L-BFGS runs until the steps stop
    # improving; the cap on iterations only bounds a pathological start.
    # On noise-free losses the objective goes to 0 and no relative test ends the run: a fit whose
    # residuals are all ~1e-10 (parameters to ~1e-7) is exact, and stops there.
    exact = EXACT * ln_n.size * SCALE

    def done(intermediate_result) -> None:
        if intermediate_result.fun < exact:
            raise StopIteration

    r = minimize(f, theta0, jac=True, method="L-BFGS-B", bounds=BOX, callback=done,
                 options={"maxiter": 1_000, "maxfun": 2_000, "ftol": 1e-14, "gtol": 1e-10, "maxcor": 20})
    return r.x, float(r.fun) / SCALE


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """scipy's L-BFGS-B calls BLAS on 5-vectors; OpenBLAS's threads make each call ~3 ms instead of
    ~50 µs (measured, 2 busy cores), so the fits run with one BLAS thread where threadpoolctl (which
    scikit-learn brings with scipy) can set it."""
    import scipy.optimize  # noqa: F401  (loaded first: threadpoolctl limits only the libraries loaded by then)

    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        yield
        return
    with threadpool_limits(1, user_api="blas"):
        yield


def _constants(theta: np.ndarray, key: str = "fit") -> ChinchillaConstants:
    a, b, e, alpha, beta = (float(x) for x in theta)
    return ChinchillaConstants(key, "fitted to the runs", math.exp(e), math.exp(a), math.exp(b), alpha, beta)


def _logs(n, d, loss) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ln_n, ln_d, ln_l = (np.log(np.asarray(x, dtype=float)) for x in (n, d, loss))
    if not (np.all(np.isfinite(ln_n)) and np.all(np.isfinite(ln_d)) and np.all(np.isfinite(ln_l))):
        raise ValueError("N, D and L must be positive and finite")
    return ln_n, ln_d, ln_l


def fit_parametric(n, d, loss, starts: int = 32, extra_starts: np.ndarray | None = None) -> Parametric:
    """The Huber/LSE fit of L = E + A/N^α + B/D^β to runs (N params, D tokens, L loss), from the
    `starts` best points of Hoffmann et al.'s grid (and `extra_starts`, rows of (a, b, e, α, β))."""
    ln_n, ln_d, ln_l = _logs(n, d, loss)
    grid = _grid()
    values, _ = _objective(grid, ln_n, ln_d, ln_l)
    inits = grid[np.argsort(values, kind="stable")[:starts]]
    if extra_starts is not None:
        inits = np.vstack([np.atleast_2d(extra_starts), inits])
    with one_blas_thread():
        results = [_lbfgs(t, ln_n, ln_d, ln_l) for t in inits]
    objs = np.array([r[1] for r in results])
    best = int(np.argmin(objs))
    theta = results[best][0]
    reached = [r[0] for r, o in zip(results, objs) if o <= objs[best] * (1 + OBJ_RTOL) + OBJ_ATOL * len(ln_n)]
    spread = float(max(np.max(np.abs(t - theta)) for t in reached))
    edge = [name for name, v, (lo, hi) in zip(("ln A", "ln B", "ln E", "alpha", "beta"), theta, BOX)
            if min(v - lo, hi - v) < 1e-6]
    fit = Parametric(_constants(theta), float(objs[best]), len(results), len(reached), spread <= AGREE_TOL, spread, edge)
    if len(reached) < 2:
        fit.warnings.append(f"only 1 of {len(results)} starts reached the best objective: the fit may not have converged")
    if not fit.agree:
        fit.warnings.append(f"the starts at the best objective disagree by up to {spread:.3g} in the log-parameters: "
                            "the law is not pinned down by these runs (a flat valley, often a wrong exponent)")
    if edge:
        fit.warnings.append(f"{', '.join(edge)} at the edge of the search box: a failed fit, not a law")
    if len(ln_n) <= len(PARAMS):
        fit.warnings.append(f"{len(ln_n)} runs for {len(PARAMS)} parameters: the fit is underdetermined")
    if len(set(np.round(ln_n, 9))) < 2 or len(set(np.round(ln_d, 9))) < 2:
        fit.warnings.append("the runs do not vary both N and D: α or β is not identified")
    return fit


def theta_of(c: ChinchillaConstants) -> np.ndarray:
    """(a, b, e, α, β) = (ln A, ln B, ln E, α, β): the fit's coordinates."""
    return np.array([math.log(c.A), math.log(c.B), math.log(c.E), c.alpha, c.beta])


def bootstrap(n, d, loss, rounds: int, budget: float, best: ChinchillaConstants, seed: int = 0,
              starts: int = 2, level: float = 0.95) -> dict[str, dict[str, float]]:
    """Percentile intervals over `rounds` refits on runs resampled with replacement: E, A, B,
    alpha, beta, and N_opt, D_opt at `budget` (C = 6ND). Each refit starts from the full fit and
    the `starts` best grid points of its resample. {name: {"lo", "hi", "median"}}; {} for 0 rounds."""
    if rounds <= 0:
        return {}
    n, d, loss = (np.asarray(x, dtype=float) for x in (n, d, loss))
    rng = np.random.default_rng(seed)
    draws: dict[str, list[float]] = {k: [] for k in (*PARAMS, "n_opt", "d_opt")}
    for _ in range(rounds):
        idx = rng.integers(0, n.size, n.size)
        c = fit_parametric(n[idx], d[idx], loss[idx], starts=starts, extra_starts=theta_of(best)).constants
        n_opt, d_opt = optimal(budget, c)
        for k, v in (("E", c.E), ("A", c.A), ("B", c.B), ("alpha", c.alpha), ("beta", c.beta), ("n_opt", n_opt), ("d_opt", d_opt)):
            draws[k].append(v)
    tail = 100 * (1 - level) / 2
    out = {}
    for k, v in draws.items():
        v = np.asarray(v)
        v = v[np.isfinite(v)]  # a degenerate resample (α + β = 0) has no frontier
        out[k] = {"lo": float(np.percentile(v, tail)), "median": float(np.median(v)), "hi": float(np.percentile(v, 100 - tail)),
                  "rounds": int(v.size)} if v.size else {"lo": None, "median": None, "hi": None, "rounds": 0}
    return out


def optimal(flops: float, c: ChinchillaConstants) -> tuple[float, float]:
    """`arithmetic.compute_optimal`, or (nan, nan) for a law that has no frontier (α + β = 0, or
    a G past the floats)."""
    try:
        n, d = compute_optimal(flops, c)
    except (ArithmeticError, ValueError):
        return math.nan, math.nan
    return (n, d) if math.isfinite(n) and math.isfinite(d) and n > 0 else (math.nan, math.nan)


def group_budgets(n, d, loss, flops, rtol: float = BUDGET_RTOL) -> list[Budget]:
    """Runs grouped by compute: sorted by C, a run joins the budget whose first run's C is within
    `rtol` of its own. A budget's C is its runs' geometric mean."""
    order = np.argsort(np.asarray(flops, dtype=float), kind="stable")
    groups: list[list[int]] = []
    for i in order:
        if groups and flops[i] <= flops[groups[-1][0]] * (1 + rtol):
            groups[-1].append(int(i))
        else:
            groups.append([int(i)])
    return [Budget(float(np.exp(np.mean(np.log([flops[i] for i in g])))), [float(n[i]) for i in g],
                   [float(d[i]) for i in g], [float(loss[i]) for i in g]) for g in groups]


def fit_isoflop(n, d, loss, flops, rtol: float = BUDGET_RTOL) -> IsoFlop:
    """Hoffmann et al.'s approach 2: a parabola in ln N per budget, a power law through the minima.
    A budget needs 3 sizes, a convex parabola and its minimum among the sizes tried (the guide:
    sizes on both sides of each minimum); one that has not is kept with its reason."""
    budgets = group_budgets(n, d, loss, flops, rtol)
    for bud in budgets:
        x, y = np.log(bud.n), np.asarray(bud.loss)
        if len(set(np.round(x, 9))) < 3:
            bud.why = f"{len(set(np.round(x, 9)))} model size(s); a parabola needs 3"
            continue
        c2, c1, c0 = np.polyfit(x, y, 2)
        bud.coef = (float(c2), float(c1), float(c0))
        if c2 <= 0:
            bud.why = "loss is not convex in ln N here"
            continue
        x_opt = -c1 / (2 * c2)
        bud.n_opt, bud.loss_opt = float(np.exp(x_opt)), float(c0 - c1**2 / (4 * c2))
        slope, icpt = np.polyfit(x, np.log(bud.d), 1)  # ln D along the budget (exactly −ln N + ln C/6 for C = 6ND)
        bud.d_opt = float(np.exp(icpt + slope * x_opt))
        if not x.min() <= x_opt <= x.max():
            bud.why = "minimum outside the sizes tried"
            continue
        bud.used = True
    used = [b for b in budgets if b.used]
    iso = IsoFlop(budgets)
    if len(used) < 2:
        iso.why = f"{len(used)} budget(s) with a minimum; the power law needs 2"
        return iso
    ln_c = np.log([b.flops for b in used])
    iso.a, ln_kn = (float(v) for v in np.polyfit(ln_c, np.log([b.n_opt for b in used]), 1))
    iso.b, ln_kd = (float(v) for v in np.polyfit(ln_c, np.log([b.d_opt for b in used]), 1))
    iso.n_coef, iso.d_coef = math.exp(ln_kn), math.exp(ln_kd)
    return iso


def frontier_exponents(c: ChinchillaConstants) -> tuple[float, float]:
    """(a, b) of N_opt ∝ C^a, D_opt ∝ C^b that the parametric law implies: β/(α+β), α/(α+β)
    (scaling §A11 L2926-2928)."""
    return c.beta / (c.alpha + c.beta), c.alpha / (c.alpha + c.beta)


def frontier_loss(c: ChinchillaConstants, flops: float) -> float:
    """The loss at the compute-optimal (N_opt, D_opt) of `flops` (C = 6ND); nan without a frontier."""
    n, d = optimal(flops, c)
    return c.loss(n, d) if math.isfinite(n) else math.nan


def synthetic_ladder(c: ChinchillaConstants, noise: float = 0.0, seed: int = 0, budgets=(1e18, 1e19, 1e20, 1e21),
                     sizes: int = 7) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(N, D, L, C) of a ladder whose losses are the law `c`'s: per budget, sizes from N_opt/10 to
    10·N_opt (both sides of each minimum, several D/N per budget: the guide's design), C = 6ND, each
    loss times exp(noise·z). The known truth the fitter is checked against (tests, benchmarks)."""
    rng = np.random.default_rng(seed)
    rows = []
    for flops in budgets:
        n_opt, _ = compute_optimal(flops, c)
        for rho in np.logspace(-1, 1, sizes):
            n = n_opt * rho
            d = flops / (6 * n)
            rows.append((n, d, c.loss(n, d) * math.exp(noise * rng.standard_normal()), flops))
    return tuple(np.array(x) for x in zip(*rows))

