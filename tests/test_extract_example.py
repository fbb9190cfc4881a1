"""crawl-extract on the embedded example crawl: every planted record ends where it should."""

import glob
import json
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import CRAWL, ROOT
from llmctl.config import build_config
from llmctl.data.crawl.extract import STAGE, ExtractConfig, run_crawl_extract
from llmctl.data.urlfilter import UrlFilter
from llmctl.runtime.options import RunOptions


@pytest.fixture(scope="module")
def extracted(tmp_path_factory):
    if not (CRAWL / "planted.json").exists():
        pytest.skip("examples/crawl not generated")
    planted = json.loads((CRAWL / "planted.json").read_text())
    cfg = build_config(ExtractConfig, STAGE, str(ROOT / "stages/crawl-extract/default.toml"))
    out = tmp_path_factory.mktemp("example") / "docs"
    m = run_crawl_extract([str(CRAWL)], str(out), cfg, RunOptions(workers=2))
    rows = pa.concat_tables([pq.read_table(p) for p in sorted(glob.glob(str(out / "part-*.parquet")))]).to_pylist()
    return planted, cfg, m, {r["url"]: r for r in rows}


def responses(planted):
    return {c["url"]: c for c in planted["captures"] if c["warc_type"] == "response"}


def test_exact_counts_per_skip_reason(extracted):
    planted, cfg, m, _ = extracted
    resp = responses(planted)
    cats = Counter(c["category"] for c in resp.values())
    urls = UrlFilter.from_files(cfg.blocklist_files, cfg.banned_words_files)
    blocked = {u for u in resp if urls.blocked(u)}
    assert blocked and all(resp[u]["category"].startswith(("junk_", "empty_body")) for u in blocked)
    records = Counter(c["warc_type"] for c in planted["captures"])
    skipped = m.counts["skipped"]
    assert m.counts["records"] == sum(records.values()) == 3434
    assert skipped["not_response"] == records["request"] + records["metadata"] + records["warcinfo"] + records["revisit"]
    assert skipped["url"] == len(blocked)
    assert skipped["status"] == cats["not_found"] + cats["redirect"] == 11
    assert skipped["not_html"] == cats["non_html"] == 15
    assert skipped["truncated"] == cats["truncated"] == 1
    # boilerplate-only pages and empty bodies have no main text for trafilatura to find
    empty_body_kept = sum(1 for u, c in resp.items() if c["category"] == "empty_body" and u not in blocked)
    assert skipped["empty"] == cats["junk_boilerplate"] + empty_body_kept
    assert skipped["decode"] == skipped["timeout"] == skipped["too_large"] == 0
    assert m.counts["errors"] == 0
    assert m.counts["out"] == len(resp) - sum(skipped[k] for k in skipped if k != "not_response")


def test_every_text_page_is_kept_with_its_sentence_and_language(extracted):
    planted, _, _, got = extracted
    for url, c in responses(planted).items():
        if c["category"] in ("article", "math", "exact_dup", "near_dup", "lang", "gzip_encoded", "chunked", "no_content_type", "legacy_charset"):
            row = got[url]
            sentence = c.get("sentence") or c["body_text"].split("\n")[0]
            assert sentence in row["text"], (url, c["category"])
            assert row["lang"] == c["lang"] and row["lang_score"] > 0.65, (url, row["lang"], c["lang"])
            assert row["id"] == c["record_id"] and row["title"]
    assert {r["lang"] for r in got.values()} >= {"en", "de", "fr", "es", "pl", "zh"}


def test_legacy_charset_page_has_no_mojibake(extracted):
    planted, _, _, got = extracted
    (url,) = [u for u, c in responses(planted).items() if c["category"] == "legacy_charset"]
    text = got[url]["text"]
    assert planted["legacy_charset_sentence"] in text
    assert "Ã" not in text and "â€" not in text


def test_redirects_404s_and_non_html_are_not_documents(extracted):
    planted, _, _, got = extracted
    for url, c in responses(planted).items():
        if c["category"] in ("redirect", "not_found", "non_html", "truncated"):
            assert url not in got, (url, c["category"])
