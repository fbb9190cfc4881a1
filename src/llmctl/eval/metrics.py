"""Eval statistics: error bars, pass@k and the majority vote, paired comparison. (Answer extraction and
canonical numbers are llmctl/tasks/answers.py.)

Pure Python (math, statistics). Formulas follow spec 001-data-eval §A10 (estimators)
and §A11 (uncertainty); each function names the formula it implements.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence

from llmctl.errors import UsageError

WILSON_BELOW_N = 100  # Wald's interval undercovers for small n; Wilson is used below this
# ... and when successes or failures are few (n·a or n·(1−a) under 10, the usual normal-approximation
# rule), where Wald's interval would cross 0 or 1
WILSON_BELOW_COUNT = 10


def _normal_quantile(p: float) -> float:
    return statistics.NormalDist().inv_cdf(p)


def is_binary(xs: Iterable[float]) -> bool:
    """True when every score is 0 or 1 (an accuracy, not a fraction or a loss)."""
    return all(x in (0, 1) for x in xs)


# ---------------------------------------------------------------------------------------------
# A single score (§A11 "Single score")


Z95 = 1.96  # the normal quantile of a two-sided 95% interval


def wilson_interval(a: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval (§A11): (a + z²/2n ± z·sqrt(a(1-a)/n + z²/4n²)) / (1 + z²/n)."""
    z2 = z * z
    center = a + z2 / (2 * n)
    half = z * math.sqrt(a * (1 - a) / n + z2 / (4 * n * n))
    denom = 1 + z2 / n
    return max(0.0, (center - half) / denom), min(1.0, (center + half) / denom)


def summarize_scores(scores: Sequence[float], z: float = Z95, k_samples: int | None = None) -> dict:
    """Mean, standard error and interval of per-item scores (§A11).

    - 0/1 scores: Wald SE = sqrt(a(1-a)/n). The interval is Wald a ± z·SE for n ≥ 100, and Wilson
      when n < 100 or fewer than 10 successes or failures (where Wald collapses or crosses 0 or 1).
    - other scores (per-item fractions, losses): SE = stdev(ddof=1)/sqrt(n), Wald interval.
    - ``k_samples=K``: each score is a question's mean over K samples, a_i = c_i/K; then
      Var = (Var(a_i) + E[a_i(1-a_i)]/K)/n with Var(a_i) the population variance (ddof=0), so
      K = 1 with 0/1 scores gives exactly the Wald SE. Wald interval.

    Returns {n, mean, se, ci_low, ci_high, interval: "wald"|"wilson"}. An empty list raises
    UsageError (there is no score to report); a single non-binary score has se = nan.
    """
    xs = [float(x) for x in scores]
    n = len(xs)
    if n == 0:
        raise UsageError("no scores to summarize (n = 0)")
    mean = math.fsum(xs) / n
    interval = "wald"
    if k_samples is not None:
        if k_samples < 1:
            raise UsageError(f"k_samples must be ≥ 1, got {k_samples}")
        within = math.fsum(x * (1 - x) for x in xs) / n
        se = math.sqrt((statistics.pvariance(xs, mu=mean) + within / k_samples) / n)
    elif is_binary(xs):
        se = math.sqrt(mean * (1 - mean) / n)
        if n < WILSON_BELOW_N or min(mean, 1 - mean) * n < WILSON_BELOW_COUNT:
            interval = "wilson"
    else:
        se = statistics.stdev(xs) / math.sqrt(n) if n > 1 else math.nan
    if interval == "wilson":
        lo, hi = wilson_interval(mean, n, z)
    else:
        lo, hi = mean - z * se, mean + z * se
    return {"n": n, "mean": mean, "se": se, "ci_low": lo, "ci_high": hi, "interval": interval}


# ---------------------------------------------------------------------------------------------
# Sampling estimators (§A10)


def check_nck(n: int, c: int, k: int) -> None:
    """ValueError unless 0 ≤ c ≤ n and 1 ≤ k ≤ n: the (samples, correct, k) an estimator is defined for."""
    if not (0 <= c <= n):
        raise ValueError(f"need 0 ≤ c ≤ n, got n={n}, c={c}")
    if k < 1:
        raise ValueError(f"k must be ≥ 1, got {k}")
    if k > n:
        raise ValueError(f"pass@k is not identified for k > n (k={k}, n={n} samples)")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem (§A10): 1 - C(n-c,k)/C(n,k), = 1 when n-c < k.

    Computed in the stable product form 1 - prod_{j=n-c+1..n} (1 - k/j). n samples, c correct.
    Average over problems for the benchmark score. ValueError when k > n (not identified)."""
    check_nck(n, c, k)
    if n - c < k:
        return 1.0
    prod = 1.0
    for j in range(n - c + 1, n + 1):
        prod *= 1 - k / j
    return 1 - prod


def majority_vote(answers: Sequence[str | None]) -> tuple[str | None, int]:
    """Most frequent answer and its count. Ties go to the answer that occurred first.

    ``None`` (no answer could be extracted) never wins; all-None or empty gives (None, 0)."""
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None, 0
    best = max(counts.values())
    for a in answers:  # first occurrence among the tied
        if a is not None and counts[a] == best:
            return a, best
    raise AssertionError("unreachable")


# ---------------------------------------------------------------------------------------------
# Comparing two models (§A11 "Comparing two models")


def _paired(a: Sequence[float], b: Sequence[float]) -> list[float]:
    if len(a) != len(b):
        raise UsageError(f"paired scores need equal lengths, got {len(a)} and {len(b)}")
    return [float(x) - float(y) for x, y in zip(a, b)]


def paired_gap(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """Paired difference of per-item scores (§A11 reference code): d_i = a_i - b_i, returns
    (mean d, SE = stdev(d, ddof=1)/sqrt(n), z = mean/SE). Equivalent to
    Var(D) = sA² + sB² - 2ρ·sA·sB. z is 0 when there is no difference at all, ±inf when every
    item differs by the same nonzero amount. Needs n ≥ 2."""
    d = _paired(a, b)
    n = len(d)
    if n < 2:
        raise UsageError(f"a paired comparison needs at least 2 items, got {n}")
    mean = math.fsum(d) / n
    se = statistics.stdev(d) / math.sqrt(n)
    z = mean / se if se > 0 else (0.0 if mean == 0 else math.copysign(math.inf, mean))
    return mean, se, z


def mcnemar_counts(a: Sequence[float], b: Sequence[float]) -> dict[str, int]:
    """Discordant and concordant counts for paired 0/1 scores: a_only (A right, B wrong: f10),
    b_only (f01), both, neither."""
    _paired(a, b)
    pairs = Counter((int(x), int(y)) for x, y in zip(a, b))
    return {"a_only": pairs[1, 0], "b_only": pairs[0, 1], "both": pairs[1, 1], "neither": pairs[0, 0]}


def mcnemar_var(a: Sequence[float], b: Sequence[float]) -> float:
    """McNemar form of the per-item variance of D for 0/1 scores (§A11):
    Var(D) = f10 + f01 - (f10 - f01)², with f10, f01 the fractions of items only A / only B got
    right (the population variance of d_i)."""
    c = mcnemar_counts(a, b)
    n = len(a)
    f10, f01 = c["a_only"] / n, c["b_only"] / n
    return f10 + f01 - (f10 - f01) ** 2


def questions_needed(var_d: float, gap: float, alpha: float = 0.05, power: float = 0.8) -> int:
    """Questions needed to detect a true gap (§A11): ceil((z_{1-α/2} + z_power)² · Var(D) / gap²).

    Var(D) is the per-item variance of the paired difference. ValueError when gap = 0."""
    if gap == 0:
        raise ValueError("questions_needed: the gap to detect must be nonzero")
    z = _normal_quantile(1 - alpha / 2) + _normal_quantile(power)
    return math.ceil(z * z * var_d / (gap * gap))
