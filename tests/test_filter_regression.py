"""The FineWeb-Edu-style regression head (data/filters/regression.py): it learns a target it must
learn, its metrics on worked numbers, ties in Spearman's rho."""

from __future__ import annotations

import numpy as np
import pytest

from llmctl.data.filters import regression as R


def test_the_head_learns_a_noisy_linear_score():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3000, 64)).astype(np.float32)
    w_true = rng.normal(size=64)
    raw = x @ w_true
    y = np.clip(2.5 + 1.2 * raw / raw.std() + rng.normal(scale=0.3, size=len(raw)), 0, 5)
    w, b = R.fit_head(x[:2000], y[:2000])
    rep = R.report(R.predict(x[2000:], w, b), y[2000:], threshold=3)
    assert rep["spearman"] >= 0.9 and rep["mse"] < 0.2 and rep["f1"] > 0.85
    assert sum(map(sum, rep["confusion"])) == 1000


def test_a_constant_feature_and_a_shuffled_target_learn_nothing():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2000, 16))
    y = rng.integers(0, 6, size=2000).astype(float)
    w, b = R.fit_head(x[:1000], y[:1000])
    assert abs(R.report(R.predict(x[1000:], w, b), y[1000:], 3)["spearman"]) < 0.1
    w, b = R.fit_head(np.ones((50, 4)), np.arange(50.0))  # singular without the ridge term
    assert np.isfinite(w).all() and R.predict(np.ones((1, 4)), w, b)[0] == pytest.approx(24.5, abs=1e-6)


def test_spearman_and_ranks_on_worked_numbers():
    assert list(R.ranks(np.array([10, 20, 20, 30]))) == [0, 1.5, 1.5, 3]
    assert R.spearman(np.array([1, 2, 3, 4, 5]), np.array([5, 6, 7, 8, 7])) == pytest.approx(8 / 95**0.5)  # ranks 1 2 3.5 5 3.5: 8 / sqrt(10 x 9.5)
    assert R.spearman(np.array([1, 2, 3]), np.array([3, 2, 1])) == pytest.approx(-1.0)


def test_int_score_and_f1_at_the_threshold():
    assert list(R.int_score(np.array([-0.7, 0.49, 2.5, 3.5, 7.0]))) == [0, 0, 2, 4, 5]  # numpy rounds half to even
    rep = R.report(np.array([3.2, 2.4, 4.0, 1.0]), np.array([3, 3, 1, 0]), threshold=3)
    # predicted >= 3: items 0, 2; labelled >= 3: items 0, 1 -> tp 1, precision 1/2, recall 1/2
    assert (rep["precision"], rep["recall"], rep["f1"]) == (0.5, 0.5, 0.5)
    assert rep["confusion"][3][3] == 1 and rep["confusion"][3][2] == 1 and rep["confusion"][1][4] == 1
