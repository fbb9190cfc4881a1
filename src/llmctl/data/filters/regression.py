"""The FineWeb-Edu recipe's classifier head: a linear regression on frozen document embeddings,
trained with mean squared error on 0-5 scores, its prediction rounded and clipped to `int_score`,
and a document kept when int_score >= threshold (FineWeb-Edu: 3). Penedo et al. 2024 ("The
FineWeb datasets") train that head on Snowflake-arctic-embed-m embeddings of 450k pages scored
by Llama-3-70B.

The head is solved in closed form (ridge regression: the MSE optimum plus an L2 penalty) rather
than by FineWeb-Edu's AdamW epochs: a linear model under MSE has one optimum, and the closed form
reaches it exactly and deterministically in one pass. The penalty matters when the labelled set
is small next to the embedding's dimension (a few hundred pages on 384 dimensions fit their
labels exactly and nothing else), so by default it is chosen by 5-fold cross-validation on the
training part (`choose_ridge`); with FineWeb-Edu's 450k labels the smallest one wins. The held-out report is
FineWeb-Edu's: MSE, Spearman's rank correlation, F1 of the binary decision at the threshold and
the confusion matrix of the rounded scores.
"""

from __future__ import annotations

import numpy as np

SCORES = 6  # 0 .. 5, the additive rubric's range
RIDGE = 1e-3  # L2 penalty relative to the mean squared embedding norm: numerical safety only
RIDGES = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)  # what choose_ridge tries
FOLDS = 5


def fit_head(x: np.ndarray, y: np.ndarray, ridge: float = RIDGE) -> tuple[np.ndarray, float]:
    """(weights, bias) minimizing mean (x w + b - y)^2 + ridge * scale * |w|^2."""
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    mx, my = x.mean(axis=0), y.mean()
    xc = x - mx
    scale = float((xc**2).sum(axis=1).mean()) or 1.0
    gram = xc.T @ xc + ridge * scale * len(x) / max(1, x.shape[1]) * np.eye(x.shape[1])
    w = np.linalg.solve(gram, xc.T @ (y - my))
    return w, float(my - mx @ w)


def choose_ridge(x: np.ndarray, y: np.ndarray, grid=RIDGES, folds: int = FOLDS, seed: int = 0) -> tuple[float, dict]:
    """The ridge of `grid` with the least k-fold cross-validated MSE (a tie goes to the larger
    ridge, the simpler model), and each one's MSE. Under 2 rows a fold: RIDGE, untried."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    folds = min(folds, len(y) // 2)
    if folds < 2:
        return RIDGE, {}
    part = np.random.default_rng(seed).permutation(len(y)) % folds
    err = np.zeros(len(grid))
    for f in range(folds):
        fit, held = part != f, part == f
        for i, r in enumerate(grid):
            w, b = fit_head(x[fit], y[fit], r)
            err[i] += float(((x[held] @ w + b - y[held]) ** 2).sum())
    err /= len(y)
    best = min(range(len(grid)), key=lambda i: (err[i], -grid[i]))
    return float(grid[best]), {f"{r:g}": round(float(e), 4) for r, e in zip(grid, err)}


def predict(x: np.ndarray, w: np.ndarray, b: float) -> np.ndarray:
    return np.asarray(x, np.float64) @ w + b


def int_score(score: np.ndarray) -> np.ndarray:
    """FineWeb-Edu's int_score: the prediction rounded and clipped to 0 .. 5."""
    return np.clip(np.rint(score), 0, SCORES - 1).astype(np.int64)


def ranks(v: np.ndarray) -> np.ndarray:
    """Ranks with ties given their average rank (what Spearman's rho needs)."""
    v = np.asarray(v, np.float64)
    order = np.argsort(v, kind="stable")
    r = np.empty(len(v))
    r[order] = np.arange(len(v), dtype=np.float64)
    _, inverse, counts = np.unique(v, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=r)
    return (sums / counts)[inverse]


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = float(np.sqrt((ra**2).sum() * (rb**2).sum()))
    return float((ra * rb).sum() / den) if den else float("nan")


def report(pred: np.ndarray, y: np.ndarray, threshold: int) -> dict:
    """The held-out report: mse, spearman, precision/recall/F1 of int_score >= threshold against
    label >= threshold, and the confusion matrix (rows: label 0-5, columns: int_score 0-5)."""
    pred, y = np.asarray(pred, np.float64), np.asarray(y, np.float64)
    guess, truth = int_score(pred), int_score(y)
    pos, true_pos = guess >= threshold, truth >= threshold
    tp = int((pos & true_pos).sum())
    precision = tp / int(pos.sum()) if pos.any() else 0.0
    recall = tp / int(true_pos.sum()) if true_pos.any() else 0.0
    confusion = np.zeros((SCORES, SCORES), np.int64)
    np.add.at(confusion, (truth, guess), 1)
    return {
        "n": len(y),
        "mse": round(float(((pred - y) ** 2).mean()), 4) if len(y) else None,
        "spearman": round(spearman(pred, y), 4) if len(y) > 1 else None,
        "threshold": threshold,
        "precision": round(precision, 4),
        "recall": round(recall, 4),
        "f1": round(2 * precision * recall / (precision + recall), 4) if precision + recall else 0.0,
        "confusion": confusion.tolist(),
    }
