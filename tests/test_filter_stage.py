"""The filter stage end to end: funnel, annotate-only, rejected rows, bad input, the example crawl."""

import glob
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import CRAWL, ROOT, llmctl
from llmctl.config import build_config
from llmctl.data.crawl.extract import ExtractConfig, run_crawl_extract
from llmctl.data.filter import FilterConfig, funnel_rows, run_chain, build_steps, step_labels, run_filter
from llmctl.runtime.options import RunOptions


def read(out, sub=""):
    parts = sorted(glob.glob(str(out / sub / "part-*.parquet")))
    return pa.concat_tables([pq.read_table(p) for p in parts]).to_pylist() if parts else []


@pytest.fixture(scope="module")
def example_docs(tmp_path_factory):
    if not (CRAWL / "planted.json").exists():
        pytest.skip("examples/crawl not generated")
    out = tmp_path_factory.mktemp("ex") / "docs"
    cfg = build_config(ExtractConfig, "crawl-extract", str(ROOT / "stages/crawl-extract/default.toml"))
    run_crawl_extract([str(CRAWL)], str(out), cfg, RunOptions(workers=2))
    return out


@pytest.fixture(scope="module")
def fineweb(example_docs, tmp_path_factory):
    out = tmp_path_factory.mktemp("fw") / "filtered"
    cfg = build_config(FilterConfig, "filter", str(ROOT / "stages/filter/fineweb.toml"), {"keep_rejected": True})
    return out, run_filter([str(example_docs)], str(out), cfg, RunOptions(workers=2))


def test_funnel_adds_up(fineweb):
    out, m = fineweb
    c = m.counts
    kept, rejected = read(out), read(out, "rejected")
    assert c["in"] == len(kept) + len(rejected) and c["kept"] == len(kept) == c["out"]
    assert sum(c["rejected"].values()) == len(rejected)
    rows = funnel_rows(m)
    assert [r["step"] for r in rows] == ["language", "gopher_repetition", "gopher_quality", "c4", "fineweb"]
    assert rows[-1]["docs_left"] == c["kept"]
    assert rows[-1]["chars_left"] == c["chars_kept"] == sum(len(r["text"]) for r in kept)
    assert sum(r["docs_removed"] for r in rows) == len(rejected)


def test_example_crawl_junk_is_rejected_for_the_expected_reasons(fineweb):
    out, _ = fineweb
    planted = json.loads((CRAWL / "planted.json").read_text())
    category = {c["url"]: c["category"] for c in planted["captures"] if c["warc_type"] == "response"}
    reasons = {}
    for r in read(out, "rejected"):
        reasons.setdefault(category[r["url"]], set()).add(r["reason"].split(".")[0])
    kept_categories = {category[r["url"]] for r in read(out)}
    assert not kept_categories & {"junk_linkfarm", "junk_keyword", "junk_repeated", "junk_lorem", "lang"}
    assert reasons["lang"] == {"language"}  # German, French, Spanish, Polish, Chinese pages
    assert reasons["junk_repeated"] <= {"gopher_repetition", "language"}
    assert reasons["junk_keyword"] <= {"gopher_repetition", "language"}
    assert "article" in kept_categories


def test_annotate_only_writes_the_statistics_the_filter_uses(example_docs, fineweb, tmp_path):
    out, m = fineweb
    cfg = build_config(FilterConfig, "filter", str(ROOT / "stages/filter/fineweb.toml"), {"annotate_only": True})
    ann = run_filter([str(example_docs)], str(tmp_path / "ann"), cfg, RunOptions(workers=1))
    rows = read(tmp_path / "ann")
    assert len(rows) == ann.counts["in"] == ann.counts["out"] == m.counts["in"]
    assert ann.counts["kept"] == m.counts["kept"] and ann.counts["rejected"] == m.counts["rejected"]
    rejected = {r["id"]: r["reason"] for r in read(out, "rejected")}
    steps, labels = build_steps(cfg), step_labels(cfg.steps)
    original = {r["id"]: r for r in read(example_docs)}
    for row in rows[:150]:
        assert row["reason"] == rejected.get(row["id"])
        assert row["text"] == original[row["id"]]["text"]  # annotate-only changes nothing
        redo = run_chain(steps, labels, [dict(original[row["id"]])], annotate=True)[0]
        for k, v in redo.stats.items():
            assert row[k] == pytest.approx(v, nan_ok=True), k
    assert "stats.gopher_quality.stop_words" in rows[0] and "stats.fineweb.list_ratio" in rows[0]


def test_pathological_documents_pass_through(tmp_path):
    texts = ["", "   \n\t  \n", "😀" * 1000, "a\x00b\x00c " * 100, "x" * (5 << 20), ("word " * 200 + "\n") * 5, None]
    pq.write_table(pa.table({"id": [str(i) for i in range(len(texts))], "text": texts}), tmp_path / "bad.parquet")
    steps = [{"name": n} for n in ("gopher_repetition", "gopher_quality", "c4", "fineweb", "repeated_ngrams", "pii")]
    m = run_filter([str(tmp_path / "bad.parquet")], str(tmp_path / "out"), FilterConfig(steps=steps, keep_rejected=True), RunOptions(workers=1))
    # the empty and the null text are skipped before the chain and counted; the rest go through it
    assert m.counts["skipped"] == {"null_text": 1, "empty_text": 1}
    assert m.counts["in"] == len(texts) - 2 and m.counts["errors"] == 0
    assert len(read(tmp_path / "out")) + len(read(tmp_path / "out", "rejected")) == len(texts) - 2
    ann = run_filter([str(tmp_path / "bad.parquet")], str(tmp_path / "ann"), FilterConfig(steps=steps, annotate_only=True), RunOptions(workers=1))
    assert ann.counts["out"] == len(texts) - 2


def test_workers_do_not_change_the_output(example_docs, fineweb, tmp_path):
    out, _ = fineweb
    cfg = build_config(FilterConfig, "filter", str(ROOT / "stages/filter/fineweb.toml"), {"keep_rejected": True})
    run_filter([str(example_docs)], str(tmp_path / "w1"), cfg, RunOptions(workers=1))
    for p in sorted(out.glob("part-*.parquet")):
        assert p.read_bytes() == (tmp_path / "w1" / p.name).read_bytes()


def test_cli_pipe_and_funnel_table(example_docs, tmp_path):
    stream = llmctl("head", "-n", "200", example_docs, "-o", "-", "--quiet", check=True).stdout
    p = llmctl("filter", "-", "-o", tmp_path / "f", input=stream, check=True)
    err = p.stderr.decode()
    assert "funnel" in err and "gopher_quality" in err
    summary = json.loads(llmctl("inspect", tmp_path / "f", "--json", check=True).stdout)
    assert summary["stage"] == "filter" and summary["counts"]["in"] == 200
    bad = llmctl("filter", example_docs, "-o", tmp_path / "g", "--config", "nope")
    assert bad.returncode == 2 and "no config named 'nope'" in bad.stderr.decode()
