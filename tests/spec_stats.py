"""Formulas of spec 001-data-eval §A10/§A11 that no llmctl command computes (pass^k, maj@k against
a reference, the clustered and the unpaired standard error), kept beside the tests that check them
against the spec's numbers (test_eval_metrics.py). What commands use is llmctl/eval/metrics.py."""

from __future__ import annotations

import math
from collections.abc import Sequence

from llmctl.eval.metrics import check_nck, majority_vote


def clustered_se(se: float, n: int, cluster_size: float, icc: float) -> tuple[float, float]:
    """Clustered questions (§A11): DE = 1 + (g-1)·ρ_ICC, SE_cl = SE·sqrt(DE), n_eff = n/DE.

    Returns (SE_cl, n_eff)."""
    de = 1 + (cluster_size - 1) * icc
    return se * math.sqrt(de), n / de


def pass_hat_k(n: int, c: int, k: int) -> float:
    """pass^k for one problem (§A10): C(c,k)/C(n,k), the chance that k draws are all correct.

    Exact integer binomials; average over problems for the benchmark score."""
    check_nck(n, c, k)
    return math.comb(c, k) / math.comb(n, k)


def maj_at_k(answers: Sequence[str | None], reference: str, k: int | None = None) -> float:
    """maj@k for one problem: 1.0 when the majority vote over the first k answers equals the
    reference, else 0.0 (§A10: majority vote is a separate metric from pass@1). Answers and
    reference should already be extracted and canonicalized (``llmctl.tasks.answers.canonical_number``)."""
    k = len(answers) if k is None else k
    if k < 1 or k > len(answers):
        raise ValueError(f"maj@k needs 1 ≤ k ≤ {len(answers)} answers, got k={k}")
    winner, _ = majority_vote(answers[:k])
    return float(winner is not None and winner == reference)


def unpaired_se(a1: float, n1: int, a2: float, n2: int) -> float:
    """SE of the gap between two accuracies on independent question sets (§A11):
    sqrt(a1(1-a1)/n1 + a2(1-a2)/n2)."""
    return math.sqrt(a1 * (1 - a1) / n1 + a2 * (1 - a2) / n2)
