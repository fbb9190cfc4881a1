"""Eval statistics against the spec's worked numbers (001-data-eval §A10, §A11). (Answer extraction:
tests/test_tasks_answers.py.)"""

from __future__ import annotations

import json
import math
import statistics
from math import comb

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from llmctl.artifacts.manifest import Manifest, write_manifest
from llmctl.errors import UsageError
from llmctl.eval.compare import compare_results
from llmctl.eval.metrics import (
    majority_vote,
    mcnemar_counts,
    mcnemar_var,
    paired_gap,
    pass_at_k,
    questions_needed,
    summarize_scores,
    wilson_interval,
)
from spec_stats import clustered_se, maj_at_k, pass_hat_k, unpaired_se

# --- single score ---------------------------------------------------------------------------


def test_wilson_30_of_30_spec_oracle():
    s = summarize_scores([1] * 30)
    assert s["interval"] == "wilson" and s["n"] == 30 and s["mean"] == 1.0
    assert s["ci_low"] == pytest.approx(0.8865, abs=5e-5) and s["ci_high"] == 1.0
    assert s["se"] == 0.0  # Wald SE collapses, which is why the interval is Wilson


def test_wald_for_large_n_and_wilson_at_the_edges():
    s = summarize_scores([1] * 600 + [0] * 400)
    assert s["interval"] == "wald"
    assert s["se"] == pytest.approx(math.sqrt(0.6 * 0.4 / 1000))
    assert s["ci_low"] == pytest.approx(0.6 - 1.96 * s["se"])
    assert summarize_scores([0] * 500)["interval"] == "wilson"  # a = 0: Wald would be [0, 0]
    lo, hi = summarize_scores([0] * 500)["ci_low"], summarize_scores([0] * 500)["ci_high"]
    assert lo == 0.0 and 0 < hi < 0.01
    small = summarize_scores([1, 0, 1, 1])
    assert small["interval"] == "wilson"
    assert (small["ci_low"], small["ci_high"]) == pytest.approx(wilson_interval(0.75, 4))


def test_wilson_formula_by_hand():
    a, n, z = 0.8, 50, 1.96
    c, h, d = a + z * z / (2 * n), z * math.sqrt(a * (1 - a) / n + z * z / (4 * n * n)), 1 + z * z / n
    assert wilson_interval(a, n) == pytest.approx(((c - h) / d, (c + h) / d))


def test_non_binary_scores_use_sample_se():
    xs = [0.5, 0.25, 1.0, 0.0, 0.75]
    s = summarize_scores(xs)
    assert s["interval"] == "wald" and s["mean"] == 0.5
    assert s["se"] == pytest.approx(statistics.stdev(xs) / math.sqrt(5))
    assert math.isnan(summarize_scores([2.5])["se"])  # one loss value: no spread to measure


def test_k_samples_variance_form():
    # per-question means over K = 4 samples
    a, K = [1.0, 0.5, 0.25, 0.0], 4
    mean = sum(a) / 4
    var = (sum((x - mean) ** 2 for x in a) / 4 + sum(x * (1 - x) for x in a) / 4 / K) / 4
    assert summarize_scores(a, k_samples=K)["se"] == pytest.approx(math.sqrt(var))
    # K = 1 with 0/1 scores reduces to the Wald SE
    xs = [1, 0, 0, 1, 1]
    assert summarize_scores(xs, k_samples=1)["se"] == pytest.approx(math.sqrt(0.6 * 0.4 / 5))


def test_empty_scores_is_a_usage_error():
    with pytest.raises(UsageError, match="n = 0"):
        summarize_scores([])


def test_clustered_se():
    se_cl, n_eff = clustered_se(0.01, n=1000, cluster_size=5, icc=0.25)  # DE = 2
    assert se_cl == pytest.approx(0.01 * math.sqrt(2)) and n_eff == pytest.approx(500)


# --- pass@k, pass^k, maj@k ------------------------------------------------------------------


def test_pass_at_k_spec_oracles():
    assert pass_at_k(200, 3, 10) == pytest.approx(0.1433, abs=5e-5)
    assert pass_at_k(200, 3, 100) == pytest.approx(0.8769, abs=5e-5)


def test_pass_at_k_matches_binomial_form_and_edges():
    for n, c, k in [(10, 3, 1), (10, 3, 5), (20, 0, 4), (7, 7, 3), (50, 12, 9)]:
        assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k))
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 = c/n
    assert pass_at_k(10, 8, 3) == 1.0  # n - c < k
    assert pass_at_k(5, 0, 5) == 0.0
    # the plug-in 1 - (1 - c/n)^k is biased low
    assert 1 - (1 - 3 / 200) ** 10 < pass_at_k(200, 3, 10)
    with pytest.raises(ValueError, match="k > n"):
        pass_at_k(5, 2, 6)
    with pytest.raises(ValueError):
        pass_at_k(5, 6, 1)


def test_pass_hat_k():
    assert pass_hat_k(10, 4, 2) == pytest.approx(comb(4, 2) / comb(10, 2))
    assert pass_hat_k(10, 1, 2) == 0.0 and pass_hat_k(10, 10, 10) == 1.0
    assert (4 / 10) ** 2 > pass_hat_k(10, 4, 2)  # plug-in biased high
    with pytest.raises(ValueError):
        pass_hat_k(3, 1, 4)


def test_majority_vote_ties_go_to_first_occurrence():
    assert majority_vote(["7", "5", "5", "7", "3"]) == ("7", 2)
    assert majority_vote(["5", "7", "7", "5"]) == ("5", 2)
    assert majority_vote([None, None, "2"]) == ("2", 1)
    assert majority_vote([None]) == (None, 0) and majority_vote([]) == (None, 0)


def test_maj_at_k():
    answers = ["3", "4", "4", "3", "3"]
    assert maj_at_k(answers, "3") == 1.0
    assert maj_at_k(answers, "4", k=3) == 1.0
    assert maj_at_k(answers, "3", k=1) == 1.0 and maj_at_k([None, None], "3") == 0.0
    with pytest.raises(ValueError):
        maj_at_k(answers, "3", k=6)


# --- comparing two models -------------------------------------------------------------------


def test_questions_needed_spec_oracle():
    assert questions_needed(0.084, 0.02) == 1649
    assert questions_needed(0.084, -0.02) == 1649
    with pytest.raises(ValueError):
        questions_needed(0.084, 0.0)


def test_paired_gap_and_mcnemar():
    a = [1, 1, 0, 1, 0, 1, 1, 0]
    b = [1, 0, 0, 1, 1, 0, 0, 0]
    d = [x - y for x, y in zip(a, b)]
    mean, se, z = paired_gap(a, b)
    assert mean == pytest.approx(0.25)
    assert se == pytest.approx(statistics.stdev(d) / math.sqrt(8)) and z == pytest.approx(mean / se)
    assert mcnemar_counts(a, b) == {"a_only": 3, "b_only": 1, "both": 2, "neither": 2}
    f10, f01 = 3 / 8, 1 / 8
    assert mcnemar_var(a, b) == pytest.approx(f10 + f01 - (f10 - f01) ** 2)
    assert mcnemar_var(a, b) == pytest.approx(statistics.pvariance(d))  # the same quantity
    assert paired_gap(a, a) == (0.0, 0.0, 0.0)
    with pytest.raises(UsageError):
        paired_gap([1, 0], [1])
    with pytest.raises(UsageError):
        paired_gap([1], [0])


def test_unpaired_se():
    assert unpaired_se(0.6, 100, 0.5, 200) == pytest.approx(math.sqrt(0.24 / 100 + 0.25 / 200))


def _finished(path):
    """An eval's manifest, written after its results: what marks them finished."""
    write_manifest(path, Manifest(kind="eval", stage="eval"))
    return path


def _results_dir(path, rows):
    path.mkdir()
    (path / "results.json").write_text(json.dumps({"tasks": {}}))
    tasks, items, scores = zip(*rows)
    pq.write_table(pa.table({"task": list(tasks), "item": list(items), "score": list(scores)}),
                   path / "samples.parquet")
    return _finished(path)


def test_compare_results(tmp_path):
    acc_a = [1, 1, 0, 1, 0, 1, 1, 0]
    acc_b = [1, 0, 0, 1, 1, 0, 0, 0]
    frac_a, frac_b = [0.5, 0.75, 1.0], [0.25, 0.75, 0.5]
    a = _results_dir(tmp_path / "a", [("arith", i, float(s)) for i, s in enumerate(acc_a)]
                     + [("arith", 8, 1.0)]  # only in A
                     + [("cloze", i, s) for i, s in enumerate(frac_a)])
    b = _results_dir(tmp_path / "b", [("arith", i, float(s)) for i, s in enumerate(acc_b)]
                     + [("arith", 9, 0.0), ("arith", 10, 1.0)]  # only in B
                     + [("cloze", i, s) for i, s in enumerate(frac_b)])
    out = compare_results(a, b)
    json.dumps(out)  # plain data
    assert out["a"] == str(a) and [r["task"] for r in out["tasks"]] == ["arith", "cloze"]
    arith, cloze = out["tasks"]
    mean, se, z = paired_gap(acc_a, acc_b)
    assert arith["n"] == 8 and arith["only_a"] == 1 and arith["only_b"] == 2
    assert arith["mean_a"] == pytest.approx(5 / 8) and arith["mean_b"] == pytest.approx(3 / 8)
    assert (arith["diff"], arith["se"], arith["z"]) == pytest.approx((mean, se, z))
    assert (arith["ci_low"], arith["ci_high"]) == pytest.approx((mean - 1.96 * se, mean + 1.96 * se))
    assert arith["binary"]
    assert [arith[k] for k in ("a_only", "b_only", "both", "neither")] == [3, 1, 2, 2]
    assert arith["var_d"] == pytest.approx(mcnemar_var(acc_a, acc_b))
    assert arith["questions_needed"] == questions_needed(arith["var_d"], 0.25)
    assert not cloze["binary"] and cloze["a_only"] is None
    assert cloze["diff"] == pytest.approx(0.25)
    assert cloze["var_d"] == pytest.approx(statistics.variance([0.25, 0.0, 0.5]))


def test_compare_identical_runs_has_no_gap(tmp_path):
    rows = [("t", i, float(i % 2)) for i in range(10)]
    out = compare_results(_results_dir(tmp_path / "a", rows), _results_dir(tmp_path / "b", rows))
    row = out["tasks"][0]
    assert row["diff"] == 0 and row["z"] == 0 and row["questions_needed"] is None


def test_compare_bad_inputs(tmp_path):
    a = _results_dir(tmp_path / "a", [("t", 0, 1.0), ("t", 1, 0.0)])
    b = _results_dir(tmp_path / "b", [("u", 0, 1.0), ("u", 1, 0.0)])
    with pytest.raises(UsageError, match="different tasks"):
        compare_results(a, b)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="no results.json"):
        compare_results(a, tmp_path / "empty")
    c = tmp_path / "c"
    c.mkdir()
    (c / "results.json").write_text("{}")
    pq.write_table(pa.table({"task": ["t"], "score": [1.0]}), c / "samples.parquet")
    with pytest.raises(UsageError, match="an unfinished eval"):  # results without the manifest written after them
        compare_results(a, c)
    _finished(c)
    with pytest.raises(UsageError, match="missing column.*item"):
        compare_results(a, c)
    d = _results_dir(tmp_path / "d", [("t", 0, 1.0), ("t", 0, 0.0)])
    with pytest.raises(UsageError, match="appears twice"):
        compare_results(a, d)
    e = _results_dir(tmp_path / "e", [("t", 5, 1.0), ("t", 6, 0.0)])
    with pytest.raises(UsageError, match="0 item"):
        compare_results(a, e)


def test_compare_pairs_a_metric_with_itself(tmp_path):
    """Each task is compared on its headline (results.json); two runs headlined by different
    normalizations are an error unless --metric names the per-item column to pair."""
    def run(path, headline, acc, acc_norm):
        path.mkdir()
        (path / "results.json").write_text(json.dumps({"tasks": {"mc:x": {"headline": headline}, "gsm8k:y": {"headline": "acc"}}}))
        score = acc if headline == "acc" else acc_norm
        pq.write_table(pa.table({"task": ["mc:x"] * 4 + ["gsm8k:y"] * 2, "item": [0, 1, 2, 3, 0, 1],
                                 "score": score + [1.0, 0.0], "acc": acc + [None, None], "acc_norm": acc_norm + [None, None]}),
                       path / "samples.parquet")
        return _finished(path)

    a = run(tmp_path / "a", "acc_norm", [1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0])
    b = run(tmp_path / "b", "acc", [0.0, 0.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0])
    with pytest.raises(UsageError, match="A is scored by acc_norm, B by acc"):
        compare_results(a, b)
    out = {r["task"]: r for r in compare_results(a, b, metric="acc")["tasks"]}
    assert out["mc:x"]["metric"] == "acc" and out["mc:x"]["diff"] == pytest.approx(0.25)
    assert out["gsm8k:y"]["metric"] == "acc" and out["gsm8k:y"]["diff"] == 0  # its headline is acc already
    out = {r["task"]: r for r in compare_results(a, b, metric="acc_norm")["tasks"]}
    assert out["mc:x"]["diff"] == pytest.approx(0.5) and out["gsm8k:y"]["metric"] == "acc"
    assert compare_results(a, a)["tasks"][1]["metric"] == "acc_norm"
    with pytest.raises(UsageError, match="--metric acc_pmi"):
        compare_results(a, b, metric="acc_pmi")
