"""crawl-extract's two extractors (trafilatura, resiliparse): same records, same skips before the
extractor, the same bytes whatever --workers, the dclm preset; and the WARC reader's member reads."""

import glob
import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import CRAWL, DATA, ROOT, llmctl, shared_file
from llmctl.config import build_config
from llmctl.data.crawl import extractors, warc
from llmctl.data.crawl.extract import STAGE, ExtractConfig, run_crawl_extract
from llmctl.data.urlfilter import UrlFilter
from llmctl.runtime.options import RunOptions

PRE_EXTRACTION = ("not_response", "url", "status", "truncated", "too_large", "not_html", "decode")


def rows(out: Path) -> list[dict]:
    parts = sorted(glob.glob(str(out / "part-*.parquet")))
    return pa.concat_tables([pq.read_table(p) for p in parts]).to_pylist() if parts else []


def same_parts(a: Path, b: Path) -> None:
    names = sorted(p.name for p in a.glob("part-*.parquet"))
    assert names == sorted(p.name for p in b.glob("part-*.parquet")) and len(names) > 1
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_dclm_preset_loads_with_dclms_settings():
    cfg = build_config(ExtractConfig, STAGE, "dclm")
    assert cfg.extractor == "resiliparse" and cfg.main_content and cfg.include_comments
    assert cfg.alt_texts and cfg.list_bullets and cfg.preserve_formatting and not (cfg.links or cfg.form_fields or cfg.noscript)
    assert build_config(ExtractConfig, STAGE, "default").extractor == "trafilatura"


def test_resiliparse_settings_reach_the_extractor():
    html = ("<html><head><title>t</title></head><body><nav><a href='/a'>Home</a> <a href='/b'>About</a></nav>"
            "<article><h1>Alpine lakes</h1><p>" + "Glacial lakes hold cold, clear water all summer long. " * 8 + "</p>"
            "<img src='x.png' alt='A blue lake under a grey peak'><ul><li>Lakes in the north freeze from November on.</li>"
            "<li>Lakes in the south rarely freeze at all.</li></ul></article></body></html>")

    def text(**kw):
        return extractors.make(ExtractConfig(extractor="resiliparse", **kw))(html)

    main = text()
    assert "Glacial lakes hold cold" in main and "A blue lake under a grey peak" in main and "About" not in main
    assert "A blue lake" not in text(alt_texts=False)
    everything = text(main_content=False)
    assert "About" in everything and "\u2022 Lakes in the north freeze" in everything
    assert "Lakes in the north freeze" in text(main_content=False, list_bullets=False) and "\u2022" not in text(main_content=False, list_bullets=False)


def test_bad_extractor_is_a_one_line_usage_error(tmp_path):
    p = llmctl("crawl-extract", tmp_path / "x.warc.gz", "-o", tmp_path / "o", "--extractor", "boilerpipe")
    err = p.stderr.decode()
    assert p.returncode == 2 and err.startswith("llmctl: error:") and len(err.splitlines()) == 1 and "trafilatura, resiliparse" in err
    toml = tmp_path / "bad.toml"
    toml.write_text('extractor = "jusText"\n')
    p = llmctl("crawl-extract", tmp_path / "x.warc.gz", "-o", tmp_path / "o2", "--config", toml)
    assert p.returncode == 2 and len(p.stderr.decode().splitlines()) == 1 and "jusText" in p.stderr.decode()


@pytest.fixture(scope="module")
def example_resiliparse(tmp_path_factory):
    if not (CRAWL / "planted.json").exists():
        pytest.skip("examples/crawl not generated")
    cfg = build_config(ExtractConfig, STAGE, str(ROOT / "stages/crawl-extract/dclm.toml"))
    base = tmp_path_factory.mktemp("example-resiliparse")
    m = run_crawl_extract([str(CRAWL)], str(base / "w2"), cfg, RunOptions(workers=2))
    run_crawl_extract([str(CRAWL)], str(base / "w1"), cfg, RunOptions(workers=1))
    return json.loads((CRAWL / "planted.json").read_text()), cfg, m, base


def test_example_crawl_resiliparse_skips_and_text(example_resiliparse):
    planted, cfg, m, base = example_resiliparse
    same_parts(base / "w1", base / "w2")
    resp = {c["url"]: c for c in planted["captures"] if c["warc_type"] == "response"}
    cats = Counter(c["category"] for c in resp.values())
    urls = UrlFilter.from_files(cfg.blocklist_files, cfg.banned_words_files)
    skipped = m.counts["skipped"]
    # everything before the extractor is the trafilatura run's (test_extract_example.py)
    assert m.counts["records"] == 3434 and m.counts["errors"] == 0 and m.counts["in"] == len(resp)
    assert skipped["url"] == sum(1 for u in resp if urls.blocked(u))
    assert skipped["status"] == cats["not_found"] + cats["redirect"] and skipped["not_html"] == cats["non_html"]
    assert skipped["truncated"] == cats["truncated"] and skipped["decode"] == skipped["too_large"] == skipped["timeout"] == 0
    got = {r["url"]: r for r in rows(base / "w2")}
    assert m.counts["out"] == len(got) == len(resp) - sum(skipped[k] for k in skipped if k != "not_response")
    for url, c in resp.items():
        if c["category"] in ("article", "math", "exact_dup", "near_dup", "lang", "gzip_encoded", "chunked", "no_content_type", "legacy_charset"):
            sentence = c.get("sentence") or c["body_text"].split("\n")[0]
            assert sentence in got[url]["text"], (url, c["category"])
            assert got[url]["lang"] == c["lang"] and got[url]["id"] == c["record_id"] and got[url]["title"]
    assert planted["legacy_charset_sentence"] in next(r["text"] for u, r in got.items() if resp[u]["category"] == "legacy_charset")


def test_pages_a_resiliparse_same_bytes_whatever_workers(tmp_path):
    warc_path = str(shared_file("web/pages-a.warc.gz"))
    cfg = ExtractConfig(extractor="resiliparse")
    m = run_crawl_extract([warc_path], str(tmp_path / "w2"), cfg, RunOptions(workers=2))
    run_crawl_extract([warc_path], str(tmp_path / "w1"), cfg, RunOptions(workers=1))
    same_parts(tmp_path / "w1", tmp_path / "w2")
    assert m.counts["in"] == 455 and m.counts["out"] >= 430 and m.counts["errors"] == 0
    assert all(m.counts["skipped"][k] == 0 for k in PRE_EXTRACTION if k != "not_response")
    got = {r["url"]: r for r in rows(tmp_path / "w2")}
    kochbar = next(r for u, r in got.items() if "Tomaten-richtig-schneiden" in u)
    assert "Die Kerne fallen heraus" in kochbar["text"] and kochbar["lang"] == "de"
    leber = next(r for u, r in got.items() if "rinderleber-geschnetzeltes" in u)
    assert "So schön winterlich" in leber["text"] and "Ã" not in leber["text"]  # decode.py, whatever the extractor


@pytest.mark.parametrize("name", sorted(p.name for p in (DATA / "warc-bad").glob("*")) or ["(shared data absent)"])
def test_damaged_files_same_counts_before_extraction_with_both(tmp_path, name):
    path = str(shared_file(f"warc-bad/{name}"))
    ms = {ex: run_crawl_extract([path], str(tmp_path / ex), ExtractConfig(extractor=ex), RunOptions(workers=1)) for ex in extractors.EXTRACTORS}
    a, b = ms["trafilatura"], ms["resiliparse"]
    assert a.counts["records"] == b.counts["records"] >= 1 and a.counts["in"] == b.counts["in"]
    assert a.counts["errors"] == b.counts["errors"] and [e["offset"] for e in a.errors] == [e["offset"] for e in b.errors]
    assert {k: a.counts["skipped"][k] for k in PRE_EXTRACTION} == {k: b.counts["skipped"][k] for k in PRE_EXTRACTION}


def test_member_reads_across_block_boundaries(monkeypatch):
    """Members are read in MEMBER_BLOCK pieces with the rest carried to the next member: a tiny
    block (members spanning many reads) gives the same records, offsets and errors."""
    path = str(shared_file("warc-bad/pages-truncated.warc.gz"))

    def listing():
        out = []
        for item in warc.iter_records(path, 0, 1_500_000):
            if isinstance(item, warc.WarcError):
                out.append(("error", item.offset, item.message))
            else:
                out.append((item.offset, item.record.rec_headers.get_header("WARC-Record-ID"), len(item.record.content_stream().read())))
        return out

    normal = listing()
    monkeypatch.setattr(warc, "MEMBER_BLOCK", 1000)
    assert listing() == normal and len(normal) > 100
