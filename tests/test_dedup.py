"""dedup: the S-curve, clusters, survivor rules, resume per phase, edge cases, the example crawl."""

import glob
import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import CRAWL, ROOT, llmctl, shared_file
from llmctl.config import build_config
from llmctl.data.dedup.clusters import components, survivors
from llmctl.data.dedup.minhash import MinHasher, Shingler, Words, s_curve, threshold
from llmctl.data.dedup.normalize import normalize_text, normalize_url, normalized_codes, normalized_words
from llmctl.data.dedup.run import DedupConfig, run_dedup
from llmctl.data.crawl.extract import ExtractConfig, run_crawl_extract
from llmctl.errors import StageFailed, UsageError
from llmctl.runtime.options import RunOptions

WORDS = "river mill stone bridge market harbor valley orchard meadow forest castle village tower garden".split()


def article(seed: int, n: int = 120) -> str:
    rng = np.random.default_rng(seed)
    return " ".join(rng.choice(WORDS, n)) + " " + " ".join(f"w{chr(97 + seed % 26)}{chr(97 + (seed // 26) % 26)}{i}" for i in range(40))


def write(tmp_path, rows, parts=1, name="in"):
    d = tmp_path / name
    d.mkdir()
    step = -(-len(rows) // parts) if rows else 1
    for p in range(parts):
        chunk = rows[p * step : (p + 1) * step]
        cols = {k: [r.get(k) for r in chunk] for k in (rows[0] if rows else {"id": 0, "text": 0})}
        pq.write_table(pa.table(cols) if chunk else pa.table({"id": pa.array([], pa.string()), "text": pa.array([], pa.string())}), d / f"p{p}.parquet")
    return str(d)


def read(out, sub=""):
    parts = sorted(glob.glob(str(out / sub / "part-*.parquet")))
    return pa.concat_tables([pq.read_table(p) for p in parts]).to_pylist() if parts else []


def test_s_curve_spec_values():
    assert s_curve(0.7, 14, 8) == pytest.approx(0.5645, abs=1e-4)
    assert s_curve(0.8, 14, 8) == pytest.approx(0.9235, abs=1e-4)
    assert threshold(14, 8) == pytest.approx((1 / 14) ** (1 / 8))


def test_components_are_transitive_and_survivors_follow_rank():
    labels = components(5, np.array([[0, 1], [1, 2], [3, 4]]))
    assert labels.tolist() == [0, 0, 0, 3, 3]
    rank = np.array([5.0, 1.0, 1.0, 0.0, 0.0])
    assert survivors(labels, rank).tolist() == [1, 1, 1, 3, 3]  # lowest rank, then lowest index


def test_normalization():
    assert normalize_text("Héllo,  WORLD! 2024 café—ok") == "hello world 0000 cafe ok"
    same = {normalize_url(u) for u in ("https://www.Example.com:443/a/?utm_source=x&b=2&a=1#top", "http://example.com/a?a=1&b=2", "https://EXAMPLE.com/a/?a=1&b=2&fbclid=z")}
    assert len(same) == 1
    assert normalize_url("https://example.com:8080/a") != normalize_url("https://example.com/a")


def batch_words(texts: list[str]) -> list[list[str]]:
    """normalized_codes read back as words, document by document."""
    codes, starts = normalized_codes(texts)
    assert len(starts) == len(texts) + 1 and starts[-1] == len(codes)
    out = []
    for lo, hi in zip(starts[:-1], starts[1:]):
        doc = codes[lo:hi].copy()
        assert doc[-1] == 0  # every document ends with a word break
        doc[doc == 0] = ord(" ")
        out.append(doc.tobytes().decode("utf-32-le", "surrogatepass").split(" "))
    return [[w for w in ws if w] for ws in out]


TRICKY = [
    "", "   ", "a", "ΣΑΣ ΟΔΟΣ σοφός Σ.", "İstanbul ıi I", "ﬁne ﬂow Ⅻ ㎅ ℃ ½ ¼ ™", "cafe\u0301 e\u0301te\u0301 a\u0308\u0301b",
    "١٢٣ ४५६ ①②", "한국어 문장", "ǅemal ǈ", "x_y__z\x00w\x1cv\u2028u\u00a0t", "lone \ud800 surrogate\udcff!", "👍🏽 ok\ufe0f",
    "\u0f71\u0f72\u0f80 \U0001d165\U0001d16d", "ß ẞ ŉ ĳ", "ক্ষু়ঁ বাংলা", "\u3000full\uff21\uff10width",
]


def test_batch_normalization_is_the_definition():
    """normalized_codes (a table per character, numpy) gives normalized_words' words exactly."""
    assert batch_words(TRICKY) == [normalized_words(t) for t in TRICKY]
    assert batch_words([]) == []
    rng = np.random.default_rng(0)
    pool = np.array([c for t in TRICKY for c in t] + list("Ab9 ,.-\n"))
    fuzz = ["".join(rng.choice(pool, rng.integers(0, 30))) for _ in range(2000)]
    assert batch_words(fuzz) == [normalized_words(t) for t in fuzz]
    assert batch_words(fuzz[5:6]) == batch_words(fuzz)[5:6]  # a document's codes do not depend on its batch


def test_minhash_keys_do_not_depend_on_the_batch():
    texts = [article(1, 300), article(2, 200)] + [" ".join(WORDS[:n]) for n in range(7)] + TRICKY  # some shorter than a shingle
    shingler, hasher = Shingler(5), MinHasher(14, 8)

    def keys(batch):
        words = Words.of(*normalized_codes(batch))
        return words.text_keys(), hasher.band_keys(hasher.signatures(*shingler.shingles(words)))

    together = keys(texts)
    alone = [keys([t]) for t in texts]
    assert np.array_equal(together[0], np.concatenate([k[0] for k in alone]))
    assert np.array_equal(together[1], np.concatenate([k[1] for k in alone]))
    # a reordered copy of the words shares no shingle; the same words with other spacing all
    sets = [shingler.shingles(Words.of(*normalized_codes([t])))[0] for t in ("a b c d e f", "a  b c d e f", "f e d c b a")]
    assert np.array_equal(sets[0], sets[1]) and not set(sets[0]) & set(sets[2])


def test_transitive_cluster_across_methods_and_survivor_rules(tmp_path):
    # A and B share a URL, B and C share their text, A and C share nothing: one cluster of 3
    rows = [
        {"id": "A", "text": article(1), "url": "https://x.example/p?utm_source=feed", "date": "2024-03-01T00:00:00Z", "quality_score": 0.2},
        {"id": "B", "text": article(2), "url": "https://x.example/p", "date": "2023-01-01T00:00:00Z", "quality_score": 0.9},
        {"id": "C", "text": article(2).upper(), "url": "https://y.example/q", "date": "2025-01-01T00:00:00Z", "quality_score": 0.5},
        {"id": "D", "text": article(3), "url": "https://z.example/", "date": "2020-01-01T00:00:00Z", "quality_score": 0.1},
    ]
    src = write(tmp_path, rows)
    for keep, survivor in (("first", "A"), ("earliest", "B"), ("max:quality_score", "B")):
        out = tmp_path / keep.replace(":", "_")
        m = run_dedup([src], str(out), DedupConfig(url=True, exact=True, keep=keep, keep_rejected=True), RunOptions(workers=1))
        kept = {r["id"]: r for r in read(out)}
        assert set(kept) == {survivor, "D"}
        assert kept[survivor]["dup_cluster_size"] == 3 and kept[survivor]["dup_cluster_id"] == survivor
        assert kept["D"]["dup_cluster_size"] == 1
        assert {r["dup_of"] for r in read(out, "rejected")} == {survivor}
        assert m.counts["removed"]["url"]["docs"] + m.counts["removed"]["exact"]["docs"] == 2


def test_minhash_finds_near_duplicates_and_workers_do_not_matter(tmp_path):
    base = [article(i, 300) for i in range(60)]
    rows = [{"id": f"d{i}", "text": t} for i, t in enumerate(base)]
    for i in range(10):  # near copies: 3 words of 340 changed
        words = base[i].split()
        for k in (50, 150, 250):
            words[k] = "changed"
        rows.append({"id": f"near{i}", "text": " ".join(words)})
    src = write(tmp_path, rows, parts=3)
    run_dedup([src], str(tmp_path / "w1"), DedupConfig(minhash=True, keep_rejected=True), RunOptions(workers=1))
    run_dedup([src], str(tmp_path / "w2"), DedupConfig(minhash=True, keep_rejected=True, partitions=3), RunOptions(workers=2))
    removed = {r["id"] for r in read(tmp_path / "w1", "rejected")}
    assert removed == {f"near{i}" for i in range(10)}
    for p in sorted((tmp_path / "w1").glob("part-*.parquet")):
        assert p.read_bytes() == (tmp_path / "w2" / p.name).read_bytes()


def test_lines_dedup_drops_frequent_lines_and_keeps_documents(tmp_path):
    rows = [{"id": str(i), "text": f"Unique opening line number {i}.\nShare this page on social media\nClosing {i}."} for i in range(10)]
    src = write(tmp_path, rows)
    m = run_dedup([src], str(tmp_path / "o"), DedupConfig(lines=True, max_line_count=6), RunOptions(workers=1))
    kept = read(tmp_path / "o")
    assert len(kept) == 10 and all("Share this page" not in r["text"] for r in kept)
    assert m.counts["lines"]["removed"] == 10


def test_a_failed_filter_shard_leaves_no_temporary_file(tmp_path, monkeypatch):
    """A filter-phase shard that fails after it opened its kept and rejected writers aborts both:
    nothing `.NAME.tmp-PID` is left in OUT or in OUT/rejected (the rejected one used to stay)."""
    from llmctl.data.dedup import apply as dedup_apply

    rows = [{"id": str(i), "text": f"Opening {i}.\nShare this page on social media\nClosing {i}."} for i in range(4)]
    rows.append(dict(rows[0], id="copy"))  # an exact duplicate, so the rejected shard has a row to write
    src = write(tmp_path, rows)
    calls = []

    def broken(h, frequent):  # the filter phase's check of each kept document's lines
        calls.append(h)
        raise RuntimeError("injected failure")

    monkeypatch.setattr(dedup_apply, "_is_frequent", broken)
    out = tmp_path / "o"
    with pytest.raises(StageFailed, match="injected failure"):
        run_dedup([src], str(out), DedupConfig(exact=True, lines=True, max_line_count=1, keep_rejected=True), RunOptions(workers=1))
    assert calls  # it failed inside the task, with both writers open
    assert not list(out.glob(".*.tmp-*")) and not list((out / "rejected").glob(".*.tmp-*"))
    assert not list(out.glob("part-*.parquet")) and not list((out / "rejected").glob("part-*.parquet"))


@pytest.mark.parametrize("phase", ["sign", "pairs", "clusters", "filter"])
def test_resume_after_a_kill_in_each_phase(tmp_path, phase):
    rows = [{"id": f"d{i}", "text": article(i % 25, 200)} for i in range(50)]
    src = write(tmp_path, rows, parts=4)
    cfg = DedupConfig(exact=True, minhash=True, keep_rejected=True, keep_work=True)
    out = tmp_path / "o"
    clean = tmp_path / "clean"
    run_dedup([src], str(clean), DedupConfig(exact=True, minhash=True, keep_rejected=True), RunOptions(workers=1))
    run_dedup([src], str(out), cfg, RunOptions(workers=2))
    # leave the state a kill in `phase` leaves: later phases' files gone, this phase half done
    work = out / "_work"
    (out / "manifest.json").unlink()
    later = {"sign": ["pairs", "clusters", "filter"], "pairs": ["clusters", "filter"], "clusters": ["filter"], "filter": []}[phase]
    parts, markers = sorted(out.glob("part-*.parquet")), sorted((out / ".shards").glob("part-*.json"))
    if "filter" in later:
        for p in parts + markers:
            p.unlink()
    elif phase == "filter":  # shard 0 done; shard 1 renamed but not marked; the rest not started
        for p in parts[2:] + markers[1:]:
            p.unlink()
    if "clusters" in later or phase == "clusters":
        (work / "clusters.npz").unlink()
    if "pairs" in later:
        shutil.rmtree(work / "pairs")
        (work / "pairs").mkdir()
    elif phase == "pairs":
        for p in sorted((work / "pairs").glob("*.npy"))[::2]:
            p.unlink()
    if phase == "sign":
        for p in sorted((work / "sign").glob("*.npz"))[::2]:
            p.unlink()
    (work / "sign" / ".00000.npz.tmp-1.npz").write_bytes(b"junk a dead worker left")
    run_dedup([src], str(out), cfg, RunOptions(workers=2))
    assert read(out) == read(clean) and read(out, "rejected") == read(clean, "rejected")


def test_edge_cases(tmp_path):
    empty = write(tmp_path, [], name="empty")
    m = run_dedup([empty], str(tmp_path / "e"), DedupConfig(minhash=True, exact=True, url=True), RunOptions(workers=1))
    assert m.counts["in"] == 0 and m.counts["out"] == 0
    one = write(tmp_path, [{"id": "x", "text": "just one document here", "url": None}], name="one")
    assert run_dedup([one], str(tmp_path / "o"), DedupConfig(minhash=True, url=True), RunOptions(workers=1)).counts["out"] == 1
    shorts = [{"id": str(i), "text": t} for i, t in enumerate(["a b", "a b", "c d", "", "", "   "])]
    short = write(tmp_path, shorts, name="short")
    run_dedup([short], str(tmp_path / "s"), DedupConfig(minhash=True, keep_rejected=True), RunOptions(workers=1))
    kept = [r["id"] for r in read(tmp_path / "s")]
    # "a b" twice is one shingle each: a duplicate; the empty texts are skipped (counted); a text of
    # blanks has no words and never matches
    assert kept == ["0", "2", "5"]
    with pytest.raises(UsageError, match="at least one"):
        run_dedup([short], str(tmp_path / "n"), DedupConfig(), RunOptions())


@pytest.fixture(scope="module")
def example_dedup(tmp_path_factory):
    if not (CRAWL / "planted.json").exists():
        pytest.skip("examples/crawl not generated")
    base = tmp_path_factory.mktemp("exd")
    cfg = build_config(ExtractConfig, "crawl-extract", str(ROOT / "stages/crawl-extract/default.toml"))
    run_crawl_extract([str(CRAWL)], str(base / "docs"), cfg, RunOptions(workers=2))
    dcfg = build_config(DedupConfig, "dedup", str(ROOT / "stages/dedup/minhash.toml"), {"keep_rejected": True})
    m = run_dedup([str(base / "docs")], str(base / "dedup"), dcfg, RunOptions(workers=2))
    return base, m


def test_batch_normalization_on_extracted_pages(example_dedup, tmp_path):
    warc = shared_file("web/pages-a.warc.gz")  # real pages, many languages
    cfg = build_config(ExtractConfig, "crawl-extract", str(ROOT / "stages/crawl-extract/default.toml"))
    run_crawl_extract([str(warc)], str(tmp_path / "pages"), cfg, RunOptions(workers=2))
    base, _ = example_dedup
    for docs in (tmp_path / "pages", base / "docs"):
        texts = [r["text"] for r in read(docs)]
        assert texts and any(not t.isascii() for t in texts)
        assert batch_words(texts) == [normalized_words(t) for t in texts]


def test_example_crawl_planted_duplicates_are_found(example_dedup):
    base, m = example_dedup
    planted = json.loads((CRAWL / "planted.json").read_text())
    removed = {r["url"]: r for r in read(base / "dedup", "rejected")}
    kept = {r["url"] for r in read(base / "dedup")}
    dups = [c for c in planted["captures"] if c["warc_type"] == "response" and c["category"] == "exact_dup"]
    assert dups and all(c["url"] in removed and c["dup_of"] in kept for c in dups)
    flagged = {p["target_jaccard"]: 0 for p in planted["near_duplicates"]}
    for p in planted["near_duplicates"]:
        flagged[p["target_jaccard"]] += p["url_a"] in removed or p["url_b"] in removed
    assert flagged[0.9] == flagged[0.95] == 10  # P(flag) > 0.999 at these similarities
    assert flagged[0.8] >= 7  # 0.92 expected
    assert flagged[0.3] == 0  # 0.0009 expected
    assert m.counts["s_curve"]["p_flag"]["0.7"] == pytest.approx(0.5645, abs=1e-4)


def test_cli_dedup_and_plots(example_dedup, tmp_path):
    base, _ = example_dedup
    p = llmctl("dedup", base / "docs", "-o", tmp_path / "d", "--minhash", "--exact", "--plot", tmp_path / "plots")
    assert p.returncode == 0, p.stderr.decode()
    assert "S-curve" in p.stderr.decode()
    assert (tmp_path / "plots" / "s_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = llmctl("dedup", base / "docs", "-o", tmp_path / "x")
    assert bad.returncode == 2 and "at least one of" in bad.stderr.decode()


def test_removal_reason_is_the_cheapest_method_linking_to_the_survivor(tmp_path):
    a = article(5, 300)
    words = a.split()
    words[100] = "changed"
    b = " ".join(words)
    src = write(tmp_path, [{"id": "A", "text": a}, {"id": "B", "text": b}, {"id": "C", "text": b}])
    run_dedup([src], str(tmp_path / "o"), DedupConfig(minhash=True, exact=True, keep_rejected=True), RunOptions(workers=1))
    reasons = {r["id"]: (r["reason"], r["dup_of"]) for r in read(tmp_path / "o", "rejected")}
    assert reasons == {"B": ("dedup.minhash", "A"), "C": ("dedup.minhash", "A")}


def test_library_call_runs_every_phase_on_the_requested_executor(tmp_path, monkeypatch):
    """run_dedup owns its executor scope: with executor="ray" all its phases (sign, pairs, the span
    phases and the final filter) go to the Ray backend, not only the one that goes through run_sharded."""
    from contextlib import contextmanager

    from llmctl.runtime import executor, ray_executor

    seen: list[str] = []

    class Recording:
        def run(self, fn, tasks, *, workers, progress, on_result):
            seen.extend(t.name for t in tasks)
            results = executor.InOrder(tasks, on_result)
            for t in tasks:
                results.add(executor.call_task(fn, t, progress.advance))
            return results.all()

    @contextmanager
    def fake_session(*args, **kwargs):
        with executor.use_backend(Recording()):
            yield

    monkeypatch.setattr(ray_executor, "ray_session", fake_session)
    rows = [{"id": f"d{i}", "text": article(i % 3)} for i in range(9)]
    cfg = DedupConfig(exact=True, minhash=True, substring=True, sentences=True, min_len=10)
    m = run_dedup([write(tmp_path, rows, parts=2)], str(tmp_path / "out"), cfg, RunOptions(executor="ray"))
    assert m.counts["out"] == 3
    assert {n.split("-")[0] for n in seen} >= {"sign", "part", "units", "windows", "cuts", "0000"}  # the span phases too
    assert any(n.startswith(("minhash", "exact", "url")) for n in seen)
    run_dedup([str(tmp_path / "in")], str(tmp_path / "local"), cfg, RunOptions())
    assert read(tmp_path / "out") == read(tmp_path / "local")
