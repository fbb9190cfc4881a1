"""Tests of examples/make_crawl.py, the generator of the embedded example crawl.

The crawl is the ground truth of the other stages' end-to-end tests, so these tests check that
what planted.json claims is really in the WARC files, and that the files regenerate exactly.
"""
import gzip
import hashlib
import html
import importlib.util
import io
import json
import re
import zlib
from collections import Counter
from pathlib import Path

import pytest
from warcio.archiveiterator import ArchiveIterator

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "make_crawl.py"
COMMITTED = ROOT / "examples" / "crawl"


def load_generator():
    spec = importlib.util.spec_from_file_location("make_crawl", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gen():
    return load_generator()


@pytest.fixture(scope="module")
def crawl(gen, tmp_path_factory):
    """A freshly generated crawl: (directory, planted dict)."""
    out = tmp_path_factory.mktemp("crawl")
    return out, gen.generate(out, seed=1234)


def record_at(out, entry):
    """The warcio record that planted.json places at (file, offset)."""
    with open(out / entry["file"], "rb") as f:
        f.seek(entry["offset"])
        data = f.read(entry["length"])
    return next(iter(ArchiveIterator(io.BytesIO(data))))


def entries(planted, **match):
    return [e for e in planted["captures"] if all(e[k] == v for k, v in match.items())]


def shingles(text):
    """Word 5-grams, written independently of the generator: lowercase, strip punctuation, split."""
    words = re.sub(r"[^\w\s]", "", text.lower()).split()
    return {" ".join(words[i:i + 5]) for i in range(len(words) - 4)}


def test_regenerates_committed_files_byte_for_byte(gen, crawl):
    if not COMMITTED.is_dir():
        pytest.skip("examples/crawl is absent: run `python examples/make_crawl.py` to create it")
    out, _ = crawl
    same = [(out / f).read_bytes() == (COMMITTED / f).read_bytes() for f in gen.FILES]
    if not all(same):
        # The records are compressed with the system zlib; an other deflate implementation
        # (zlib-ng, e.g.) writes other bytes for the same records. Tell that apart from a real change.
        unzipped = [gzip.decompress((out / f).read_bytes()) == gzip.decompress((COMMITTED / f).read_bytes()) for f in gen.FILES]
        assert all(unzipped), "the regenerated WARC records differ from examples/crawl: rerun examples/make_crawl.py and commit"
        pytest.skip(f"records are identical, but zlib {zlib.ZLIB_RUNTIME_VERSION} compresses them to other bytes than the committed files")
    assert (out / "planted.json").read_bytes() == (COMMITTED / "planted.json").read_bytes()


def test_same_seed_same_bytes_other_seed_other_bytes(gen, crawl, tmp_path):
    out, planted = crawl
    again = gen.generate(tmp_path / "again", seed=1234)
    assert again == planted
    for name in (*gen.FILES, "planted.json"):
        assert (tmp_path / "again" / name).read_bytes() == (out / name).read_bytes()
    assert gen.generate(tmp_path / "other", seed=99)["files"] != planted["files"]


def test_planted_json_on_disk_matches_return_value_and_files(gen, crawl):
    out, planted = crawl
    assert json.loads((out / "planted.json").read_text(encoding="utf-8")) == planted
    for name, digest in planted["files"].items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest
    size = sum((out / name).stat().st_size for name in gen.FILES)
    assert 1e6 < size < 4e6, f"the example crawl should stay a few MB, is {size / 1e6:.2f} MB"


def test_warcio_reads_every_record_where_planted_says(crawl):
    out, planted = crawl
    seen = []
    for name in planted["files"]:
        with open(out / name, "rb") as f:
            it = ArchiveIterator(f)
            for rec in it:
                rec.content_stream().read()  # decodes chunked and gzip bodies; must not raise
                seen.append((name, it.get_record_offset(), rec.rec_type, rec.rec_headers.get_header("WARC-Record-ID"),
                             rec.rec_headers.get_header("WARC-Target-URI")))
    expected = [(e["file"], e["offset"], e["warc_type"], e["record_id"], e["url"]) for e in planted["captures"]]
    assert seen == expected
    by_type = Counter(t for _, _, t, _, _ in seen)
    assert by_type["warcinfo"] == 2
    assert by_type["request"] == by_type["metadata"] == by_type["response"] + by_type["revisit"]
    assert by_type["revisit"] == 1
    assert len({rid for _, _, _, rid, _ in seen}) == len(seen), "record ids are unique"


def test_category_counts(crawl):
    _, planted = crawl
    keys = {"file", "offset", "length", "warc_type", "record_id", "url", "http_status", "content_type", "category", "lang", "title",
            "sentence", "body_text", "dup_of"}
    assert all(set(e) == keys for e in planted["captures"]), "every record has the same keys"
    counts = Counter(e["category"] for e in planted["captures"])
    assert counts == planted["counts"]
    assert counts["article"] == 700 and counts["math"] == 150 and counts["exact_dup"] == 40 and counts["near_dup"] == 60
    assert Counter(e["lang"] for e in entries(planted, category="lang")) == {"de": 20, "fr": 20, "es": 20, "pl": 20, "zh": 2}
    for cat in ("junk_linkfarm", "junk_keyword", "junk_repeated", "junk_lorem", "junk_boilerplate"):
        assert counts[cat] == 15
    for cat in ("empty_body", "non_html", "not_found", "redirect"):
        assert counts[cat] >= 3
    for cat in ("revisit", "truncated", "gzip_encoded", "chunked", "no_content_type", "legacy_charset"):
        assert counts[cat] == 1


def test_near_duplicates_hit_their_planted_jaccard(crawl):
    _, planted = crawl
    text = {e["url"]: e["body_text"] for e in planted["captures"] if e.get("body_text")}
    pairs = planted["near_duplicates"]
    assert Counter(p["target_jaccard"] for p in pairs) == {t: 10 for t in (0.3, 0.5, 0.7, 0.8, 0.9, 0.95)}
    for p in pairs:
        a, b = shingles(text[p["url_a"]]), shingles(text[p["url_b"]])
        assert abs(len(a & b) / len(a | b) - p["jaccard"]) < 1e-9, p
        assert abs(p["jaccard"] - p["target_jaccard"]) <= planted["near_duplicate_tolerance"], p
    assert {e["url"] for e in entries(planted, category="near_dup")} == {p["url_b"] for p in pairs}


def test_exact_duplicates_serve_the_same_html_under_another_url(crawl):
    out, planted = crawl
    originals = {e["url"]: e for e in planted["captures"] if e["warc_type"] == "response" and e["category"] == "article"}
    dups = entries(planted, category="exact_dup")
    for d in dups:
        orig = originals[d["dup_of"]]
        assert d["url"] != orig["url"] and d["sentence"] == orig["sentence"]
        assert record_at(out, d).content_stream().read() == record_at(out, orig).content_stream().read()
        assert (orig["file"], orig["offset"]) < (d["file"], d["offset"]), "the copy is crawled after the original"


def test_every_text_page_contains_its_planted_sentence(crawl):
    out, planted = crawl
    pages = [e for e in planted["captures"] if e["warc_type"] == "response" and e.get("sentence")]
    assert len(pages) > 1000
    for e in pages:
        body = record_at(out, e).content_stream().read()
        text = body.decode("cp1252" if e["category"] == "legacy_charset" else "utf-8")
        assert html.escape(e["sentence"], quote=False) in text, e["url"]
        if e.get("body_text"):
            assert e["sentence"] in e["body_text"]


def test_math_problems_are_well_formed(crawl):
    _, planted = crawl
    problems = planted["problems"]
    math_urls = {e["url"] for e in entries(planted, category="math")}
    assert len(problems) >= 3 * len(math_urls) and {p["url"] for p in problems} == math_urls
    for p in problems:
        assert isinstance(p["answer"], int) and p["answer"] >= 0
        lines = p["solution"].split("\n")
        assert lines[-1] == f"#### {p['answer']}"
        for a, op, b, c in re.findall(r"(\d+) ([-+*/]) (\d+) = (\d+)", p["solution"]):  # every worked step is right
            assert {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b), "/": int(a) / int(b)}[op] == int(c), p


def test_legacy_charset_page_is_windows_1252_declared_only_in_meta(crawl):
    out, planted = crawl
    (e,) = entries(planted, category="legacy_charset")
    rec = record_at(out, e)
    assert rec.http_headers.get_header("Content-Type") == "text/html"
    body = rec.content_stream().read()
    assert b'<meta http-equiv="Content-Type" content="text/html; charset=windows-1252">' in body
    assert any(byte > 127 for byte in body)
    with pytest.raises(UnicodeDecodeError):
        body.decode("utf-8")
    sentence = planted["legacy_charset_sentence"]
    assert e["sentence"] == sentence and set("éüß“”—€") <= set(sentence)
    assert sentence in body.decode("cp1252")


def test_awkward_http_responses(crawl):
    out, planted = crawl
    one = lambda cat: record_at(out, entries(planted, category=cat)[0])

    rec = one("gzip_encoded")
    assert rec.http_headers.get_header("Content-Encoding") == "gzip"
    raw = rec.raw_stream.read()
    assert raw[:2] == b"\x1f\x8b" and gzip.decompress(raw).startswith(b"<!DOCTYPE html>")

    rec = one("chunked")
    assert rec.http_headers.get_header("Transfer-Encoding") == "chunked" and rec.http_headers.get_header("Content-Length") is None
    assert rec.content_stream().read().rstrip().endswith(b"</html>")

    rec = one("no_content_type")
    assert rec.http_headers.get_header("Content-Type") is None
    assert rec.content_stream().read().startswith(b"<!DOCTYPE html>")

    rec = one("truncated")
    assert rec.rec_headers.get_header("WARC-Truncated") == "length"
    assert len(rec.content_stream().read()) < int(rec.http_headers.get_header("Content-Length"))

    (e,) = entries(planted, warc_type="revisit")
    rec = record_at(out, e)
    orig = next(x for x in entries(planted, warc_type="response") if x["url"] == e["url"])
    assert rec.rec_headers.get_header("WARC-Refers-To-Target-URI") == e["url"]
    assert rec.rec_headers.get_header("WARC-Payload-Digest") == record_at(out, orig).rec_headers.get_header("WARC-Payload-Digest")

    for e in entries(planted, category="redirect"):
        rec = record_at(out, e)
        assert rec.http_headers.get_statuscode() in ("301", "302") and rec.http_headers.get_header("Location").startswith("https://")
    for e in entries(planted, category="not_found"):
        assert record_at(out, e).http_headers.get_statuscode() == "404"

    magic = {"image/png": b"\x89PNG\r\n\x1a\n", "application/pdf": b"%PDF-1.4"}
    for e in entries(planted, category="non_html"):
        body = record_at(out, e).content_stream().read()
        assert body.startswith(magic.get(e["content_type"], b""))
        if e["content_type"] == "application/json":
            assert json.loads(body)["items"]


def test_warc_records_are_linked_like_common_crawl(crawl):
    out, planted = crawl
    caps = planted["captures"]
    for i, e in enumerate(caps):
        if e["warc_type"] in ("response", "revisit"):
            req, meta = record_at(out, caps[i - 1]), record_at(out, caps[i + 1])
            rec = record_at(out, e)
            assert caps[i - 1]["warc_type"] == "request" and caps[i + 1]["warc_type"] == "metadata"
            assert rec.rec_headers.get_header("WARC-Concurrent-To") == req.rec_headers.get_header("WARC-Record-ID")
            assert meta.rec_headers.get_header("WARC-Concurrent-To") == e["record_id"]
            if i % 50 == 1:  # spot-check the metadata fields
                fields = meta.content_stream().read().decode()
                assert fields.startswith("fetchTimeMs: ")
                if e["category"] == "article":
                    assert '"code":"en"' in fields and "charset-detected: UTF-8" in fields
