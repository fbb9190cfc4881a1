"""dedup --substring: later copies of every span >= --min-len units cut, the first copy kept.

The unit tests check substring.py's pieces on hand-made arrays; the end-to-end tests run the CLI
on documents with planted spans at known places (below, at and above N), on random text over a
tiny alphabet checked against a brute-force oracle (every window of N units that also starts at
an earlier position is cut), across shards, workers, resumes and kills.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import ROOT, llmctl, shared_file
from llmctl.data.dedup import substring
from llmctl.data.dedup.run import DedupConfig, run_dedup
from llmctl.runtime.options import RunOptions

LETTERS = np.array(list("abcdefghijklmnopqrstuvwxyz"))


def utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


# ---------------------------------------------------------------------------------------------
# helpers: inputs, outputs, the oracle


def write(tmp_path, rows, parts=1, name="in"):
    """rows ({id, text}) into `parts` Parquet files under tmp_path/name (a part may be empty)."""
    d = tmp_path / name
    d.mkdir()
    step = -(-len(rows) // parts) if rows else 1
    for p in range(parts):
        chunk = rows[p * step : (p + 1) * step]
        table = pa.table({"id": pa.array([r["id"] for r in chunk], pa.string()), "text": pa.array([r["text"] for r in chunk], pa.string())})
        pq.write_table(table, d / f"p{p}.parquet")
    return d


def read(out, sub=""):
    parts = sorted(glob.glob(str(out / sub / "part-*.parquet")))
    return pa.concat_tables([pq.read_table(p) for p in parts]).to_pylist() if parts else []


def by_id(rows):
    return {r["id"]: r for r in rows}


def dedup(src, out, *flags, check=True):
    """The CLI, as a user runs it: `llmctl dedup SRC -o OUT --substring FLAGS`."""
    p = llmctl("dedup", src, "-o", out, "--substring", "--quiet", *flags)
    if check:
        assert p.returncode == 0, p.stderr.decode()
        assert b"Traceback" not in p.stderr
    return p


def manifest(out):
    return json.loads((out / "manifest.json").read_text())


def cut(text: str, spans) -> str:
    data, kept, pos = utf8(text), [], 0
    for s, e in spans:
        kept.append(data[pos:s])
        pos = e
    kept.append(data[pos:])
    return b"".join(kept).decode("utf-8", "surrogatepass")


def units_of(text: str, unit: str) -> tuple[list, list[int]]:
    """(units, bounds): unit i is the UTF-8 bytes [bounds[i], bounds[i + 1]) of the text."""
    data = utf8(text)
    if unit == "bytes":
        return list(data), list(range(len(data) + 1))
    pieces = substring.GPT2_PIECES.findall(text)
    bounds = [0]
    for p in pieces:
        bounds.append(bounds[-1] + len(utf8(p)))
    assert bounds[-1] == len(data)
    return pieces, bounds


def merge_touching(spans):
    out = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def oracle(texts: list[str], unit: str, n: int) -> list[list[list[int]]]:
    """The expected removed_spans of each text, by brute force: every window of n units inside one
    document that also starts at an earlier position (an earlier document, or earlier in the same
    one) is cut; the union, as byte ranges; in bytes shrunk to whole characters."""
    seen, out = set(), []
    for text in texts:
        data = utf8(text)
        units, bounds = units_of(text, unit)
        hit = np.zeros(len(units), bool)
        for i in range(len(units) - n + 1):
            key = tuple(units[i : i + n])
            if key in seen:
                hit[i : i + n] = True
            seen.add(key)
        spans, i = [], 0
        while i < len(units):
            if not hit[i]:
                i += 1
                continue
            j = i
            while j < len(units) and hit[j]:
                j += 1
            s, e = bounds[i], bounds[j]
            if unit == "bytes":
                while s < e and data[s] & 0xC0 == 0x80:
                    s += 1
                while e > s and e < len(data) and data[e] & 0xC0 == 0x80:
                    e -= 1
            if e > s:
                spans.append([s, e])
            i = j
        out.append(merge_touching(spans))
    return out


def filler(rng, n: int) -> str:
    """n random lowercase words: no run of them repeats anywhere by chance."""
    return " ".join("".join(rng.choice(LETTERS, int(rng.integers(4, 9)))) for _ in range(n))


def make_span(rng, length: int, unit: str) -> str:
    """A span of exactly `length` units (tokens: words; bytes: ASCII letters and spaces), which
    starts and ends with a letter."""
    if unit == "tokens":
        return filler(rng, length)
    s = filler(rng, length)[:length]
    return s[:-1] + "q" if s.endswith(" ") else s


BRACKETS = ["[]", "()", "{}", "<>", "«»"]  # each placement of a span gets its own pair: a match is the span exactly


def planted_corpus(unit: str, n: int, seed: int = 7):
    """Documents of random words with planted spans of n - 1, n, n + 2 and n + 9 units; each
    placement between its own kind of brackets, so that a copy matches an earlier one in exactly
    the span. Returns (rows, expected removed_spans per id, the byte ranges that must stay)."""
    rng = np.random.default_rng(seed)
    spans = {"long": make_span(rng, n + 9, unit), "exact": make_span(rng, n, unit), "short": make_span(rng, n - 1, unit), "inner": make_span(rng, n + 2, unit)}
    sizes = {"long": n + 9, "exact": n, "short": n - 1, "inner": n + 2}
    for name, s in spans.items():
        assert len(units_of(s, unit)[0]) == sizes[name]
    # document -> the spans planted in it, in order; a span's first placement is its first copy
    layout = [["short"], ["long"], ["exact"], ["inner", "short", "inner"], ["exact"], ["long"], ["long", "short"], ["short"], []]
    count = {k: 0 for k in spans}
    rows, expected, stays = [], {}, {}
    for d, names in enumerate(layout):
        text, cuts, keep = filler(rng, 12), [], []
        for name in names:
            o, c = BRACKETS[count[name]]
            text += f" {o}"
            start = len(utf8(text))
            text += spans[name]
            rng_ = [start, len(utf8(text))]
            (cuts if count[name] > 0 and sizes[name] >= n else keep).append(rng_)
            text += f"{c} " + filler(rng, 12)
            count[name] += 1
        rows.append({"id": f"d{d}", "text": text})
        expected[f"d{d}"], stays[f"d{d}"] = cuts, keep
    return rows, expected, stays


def shard_of_docs(work, n_files: int) -> list[int]:
    """The shard holding each document (input order), from _work/layout.npz and units/."""
    with np.load(work / "layout.npz") as z:
        where = z["where"]
    shards = []
    for k in range(n_files):
        with np.load(work / "units" / f"{k:05d}.npz") as z:
            starts = z["starts"]
        for lo in starts[:-1].tolist():
            rows = where[(where[:, 1] == k) & (where[:, 2] <= lo) & (lo < where[:, 3])]
            assert len(rows) == 1
            shards.append(int(rows[0, 0]))
    return shards


def n_shards(work) -> int:
    with np.load(work / "layout.npz") as z:
        return len(z["shard_units"])


# ---------------------------------------------------------------------------------------------
# 1. unit tests of substring.py


def docs_units(docs: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    units = np.frombuffer(b"".join(d + b"\xff" for d in docs), np.uint8)
    return units, units == substring.SEP_BYTE


def ranges(iv) -> list[list[int]]:
    return np.asarray(iv).tolist()


def test_later_copies_cuts_a_repeat_of_exactly_n_and_not_n_minus_1():
    units, sep = docs_units([b"xxabcdeyy", b"zzabcdeww"])  # "abcde": 5 units, the copy at 12..17
    assert ranges(substring.later_copies(units, sep, 0, 5)) == [[12, 17]]
    assert ranges(substring.later_copies(units, sep, 0, 6)) == []
    units, sep = docs_units([b"xxabcdyy", b"zzabcdww"])  # a repeat of 4
    assert ranges(substring.later_copies(units, sep, 0, 5)) == []
    assert ranges(substring.later_copies(units, sep, 0, 4)) == [[11, 15]]


def test_later_copies_never_cross_a_separator():
    # "abc|dez|" appears twice end to end: as units that is an 8-long repeat across a separator,
    # but each document's piece is only 3 long
    units, sep = docs_units([b"xyabc", b"dez", b"qabc", b"dez"])
    assert ranges(substring.later_copies(units, sep, 0, 4)) == []
    found = ranges(substring.later_copies(units, sep, 0, 3))
    assert found == [[11, 14], [15, 18]]  # doc 2's "abc", doc 3's "dez": the separator at 14 not in either
    assert all(not sep[s:e].any() for s, e in found)


def test_later_copies_within_one_document_and_overlapping_runs():
    units, sep = docs_units([b"abcdefg--abcdefg"])
    assert ranges(substring.later_copies(units, sep, 0, 7)) == [[9, 16]]
    units, sep = docs_units([b"aaaaaaaa"])  # "aaa" at 1 also starts at 0: everything after the first unit
    assert ranges(substring.later_copies(units, sep, 0, 3)) == [[1, 8]]


def test_later_copies_region_sees_earlier_units_but_reports_only_its_own():
    a, _ = docs_units([b"hello world and more"])
    b, _ = docs_units([b"say hello world twice, hello world"])
    units = np.concatenate([a, b])
    sep = units == substring.SEP_BYTE
    found = ranges(substring.later_copies(units, sep, len(a), 11))
    # "hello world " (from a) and " hello world" (from b's first copy): both in b, reported; a's not
    assert found == [[len(a) + 4, len(a) + 16], [len(a) + 22, len(a) + 34]]
    assert ranges(substring.later_copies(units, sep, len(units), 3)) == []


def brute_later_copies(units: np.ndarray, sep: np.ndarray, n: int) -> list[list[int]]:
    hit = np.zeros(len(units), bool)
    seen = set()
    for i in range(len(units) - n + 1):
        if sep[i : i + n].any():
            continue
        key = units[i : i + n].tobytes()
        if key in seen:
            hit[i : i + n] = True
        seen.add(key)
    out, i = [], 0
    while i < len(hit):
        if hit[i]:
            j = i
            while j < len(hit) and hit[j]:
                j += 1
            out.append([i, j])
            i = j
        else:
            i += 1
    return out


@pytest.mark.parametrize("seed", range(6))
def test_later_copies_match_brute_force_in_bytes_and_in_64_bit_keys(seed):
    rng = np.random.default_rng(seed)
    docs = [bytes(rng.choice(np.frombuffer(b"abc", np.uint8), int(rng.integers(0, 40)))) for _ in range(25)]
    units, sep = docs_units(docs)
    for n in (1, 3, 5, 8):
        want = brute_later_copies(units, sep, n)
        assert ranges(substring.later_copies(units, sep, 0, n)) == want
        # the tokens' path: 64-bit keys (the separator is SEP_TOKEN), sorted as dense ids
        keys = np.array([0] + [int(x) for x in rng.integers(1, 2**63, 255, dtype=np.int64)], dtype=np.uint64)
        keys[substring.SEP_BYTE] = substring.SEP_TOKEN
        keys[0] = 12345
        tok = keys[units]
        assert ranges(substring.later_copies(tok, tok == substring.SEP_TOKEN, 0, n)) == want


def test_merge():
    assert ranges(substring.merge(np.array([[5, 7], [1, 3], [3, 4], [6, 9], [10, 11]]))) == [[1, 4], [5, 9], [10, 11]]
    assert ranges(substring.merge(np.array([[1, 10], [2, 3], [4, 12]]))) == [[1, 12]]
    assert ranges(substring.merge(np.array([[4, 6], [4, 5]]))) == [[4, 6]]
    empty = substring.merge(np.zeros((0, 2), np.int64))
    assert empty.shape == (0, 2)


def test_plan_shards_respects_the_cap_and_puts_an_oversized_document_alone():
    assert substring.plan_shards(np.array([3, 3, 3, 10, 2, 2]), 6) == [(0, 2), (2, 3), (3, 4), (4, 6)]
    assert substring.plan_shards(np.array([], np.int64), 6) == []
    assert substring.plan_shards(np.array([50]), 6) == [(0, 1)]
    rng = np.random.default_rng(0)
    for _ in range(50):
        sizes = rng.integers(1, 30, int(rng.integers(1, 40)))
        cap = int(rng.integers(1, 60))
        shards = substring.plan_shards(sizes, cap)
        assert shards[0][0] == 0 and shards[-1][1] == len(sizes)
        assert all(a[1] == b[0] for a, b in zip(shards, shards[1:]))  # contiguous, in order
        for lo, hi in shards:
            assert hi > lo
            assert sizes[lo:hi].sum() <= cap or hi - lo == 1
        for (lo, hi), (lo2, hi2) in zip(shards, shards[1:]):  # greedy: the next document did not fit
            assert sizes[lo:hi].sum() + sizes[lo2] > cap
    assert substring.shard_cap(4800, "bytes") == 4800 // (2 * substring.COST_PER_UNIT["bytes"])
    assert substring.shard_cap(4800, "tokens") == 4800 // (2 * substring.COST_PER_UNIT["tokens"])
    assert substring.shard_cap(1, "tokens") == 1


def test_shard_pairs():
    assert substring.shard_pairs(0) == []
    assert substring.shard_pairs(1) == [(0, 0)]
    assert substring.shard_pairs(3) == [(0, 0), (0, 1), (0, 2), (1, 2)]
    for s in range(2, 8):
        pairs = substring.shard_pairs(s)
        assert len(pairs) == s * (s - 1) // 2 + 1 and len(set(pairs)) == len(pairs)
        for b in range(1, s):  # every shard b sees every earlier shard
            assert {a for a, bb in pairs if bb == b} == set(range(b))


def test_snap_utf8_shrinks_to_whole_characters():
    text = "aé€😀b中\ud800z"  # 1, 2, 3, 4, 1, 3, 3 (a surrogate, as read), 1 bytes
    data = utf8(text)
    buf = np.frombuffer(data + b"\xff", np.uint8)
    boundaries = {len(utf8(text[:i])) for i in range(len(text) + 1)}
    for s in range(len(data) + 1):
        for e in range(s, len(data) + 1):
            a, b = substring.snap_utf8(buf, s, e)
            inside = [x for x in boundaries if s <= x <= e]
            if a < b:
                assert s <= a < b <= e and a in boundaries and b in boundaries
                data[a:b].decode("utf-8", "surrogatepass")
                assert (a, b) == (min(inside), max(inside))  # the largest whole-character range inside
            else:
                assert len(inside) <= 1 or max(inside) == min(inside)


def test_memory_bytes_parsing_and_errors():
    assert substring.memory_bytes("4G") == 4 << 30
    assert substring.memory_bytes("512M") == 512 << 20
    assert substring.memory_bytes("2000000") == 2_000_000
    assert substring.memory_bytes("1.5K") == 1536
    assert substring.memory_bytes(" 8gb ") == 8 << 30
    assert substring.memory_bytes("2T") == 2 << 40
    for bad in ("lots", "", "G", "GB", "0", "-1G", "inf", "nan", "1e400", "4X", "4 GiB"):
        with pytest.raises(ValueError, match="--memory"):
            substring.memory_bytes(bad)


NON_ASCII = [
    "café € 5€ naïve — “quoted” 😀👍🏽 emoji",
    "中文的句子，还有标点。日本語のテキスト",
    "e\u0301 combining, ﬁ ligature, \r\n\ttabs   and  spaces ",
    "",
    "   ",
    "lone \ud800 surrogate \udcff!",
    "x's it'll 123 4.5 ½",
]


def test_encode_tokens_byte_offsets_reproduce_the_text():
    enc = substring.encode_tokens(NON_ASCII)
    units, starts, bs, be = enc["units"], enc["starts"], enc["byte_start"], enc["byte_end"]
    assert len(units) == len(bs) == len(be) == starts[-1] and len(starts) == len(NON_ASCII) + 1
    pieces_of = {}
    for d, text in enumerate(NON_ASCII):
        data = utf8(text)
        lo, hi = int(starts[d]), int(starts[d + 1])
        assert units[hi - 1] == substring.SEP_TOKEN and not (units[lo : hi - 1] == substring.SEP_TOKEN).any()
        assert bs[hi - 1] == be[hi - 1] == len(data)  # the separator's bytes are empty, at the end
        assert bs[lo] == 0 and np.array_equal(bs[lo + 1 : hi - 1], be[lo : hi - 2])  # contiguous
        assert b"".join(data[bs[i] : be[i]] for i in range(lo, hi - 1)) == data
        for i in range(lo, hi - 1):
            piece = data[bs[i] : be[i]]
            assert piece  # no empty piece
            pieces_of.setdefault(piece, set()).add(int(units[i]))
    assert all(len(keys) == 1 for keys in pieces_of.values())  # equal pieces, equal keys
    assert len({next(iter(k)) for k in pieces_of.values()}) == len(pieces_of)  # different pieces, different keys


def test_encode_bytes_lays_documents_end_to_end():
    enc = substring.encode_bytes(NON_ASCII)
    assert enc["units"].tobytes() == b"".join(utf8(t) + b"\xff" for t in NON_ASCII)
    assert enc["starts"].tolist() == np.cumsum([0] + [len(utf8(t)) + 1 for t in NON_ASCII]).tolist()
    assert len(substring.encode_bytes([])["units"]) == 0 and len(substring.encode_tokens([])["units"]) == 0


def test_lone_surrogates_go_through_the_units_and_the_sort():
    texts = ["head \ud800 body one two three four", "tail \ud800 body one two three four", "\udcff"]
    for unit in ("bytes", "tokens"):
        enc = substring.encode(texts, unit)
        units = enc["units"]
        sep = units == (substring.SEP_BYTE if unit == "bytes" else substring.SEP_TOKEN)
        found = substring.later_copies(units, sep, 0, 4)
        assert len(found) == 1  # " \ud800 body one two three four" in the second document


# ---------------------------------------------------------------------------------------------
# 2. planted spans, end to end through the CLI


N = {"tokens": 8, "bytes": 32}


@pytest.mark.parametrize("unit", ["tokens", "bytes"])
def test_planted_spans_cut_exactly_whatever_the_shards(tmp_path, unit):
    n = N[unit]
    rows, expected, stays = planted_corpus(unit, n)
    src = write(tmp_path, rows, parts=3)
    one, many = tmp_path / "one", tmp_path / "many"
    dedup(src, one, "--unit", unit, "--min-len", str(n), "--min-doc-words", "0")
    dedup(src, many, "--unit", unit, "--min-len", str(n), "--min-doc-words", "0", "--memory", "2K", "--keep-work", "--workers", "2")
    assert not (one / "_work").exists()  # dropped after success without --keep-work
    assert n_shards(many / "_work") >= 6
    shard = shard_of_docs(many / "_work", 3)
    assert shard[1] != shard[5] != shard[6] and shard[2] != shard[4] and shard[0] != shard[7]  # copies in other shards
    want_oracle = oracle([r["text"] for r in rows], unit, n)
    for out in (one, many):
        got = by_id(read(out))
        assert set(got) == {r["id"] for r in rows}
        for i, r in enumerate(rows):
            spans = got[r["id"]]["removed_spans"]
            assert spans == expected[r["id"]], r["id"]  # every planted later copy >= N, exactly; nothing else
            assert spans == want_oracle[i]
            for s, e in stays[r["id"]]:  # first copies and copies shorter than N stay
                assert all(e <= a or b <= s for a, b in spans)
            assert got[r["id"]]["text"] == cut(r["text"], spans)
        counts = manifest(out)["counts"]["spans"]
        assert counts["substring"]["docs_cut"] == sum(bool(v) for v in expected.values()) == 4
        assert counts["substring"]["bytes"] == sum(e - s for v in expected.values() for s, e in v)
        assert counts["bytes_in"] == sum(len(utf8(r["text"])) for r in rows)
    assert read(one) == read(many)


def fuzz_rows(unit: str, seed: int, n_docs: int = 14):
    """Random text over a tiny alphabet (multi-byte characters among it): repeats everywhere."""
    rng = np.random.default_rng(seed)
    if unit == "bytes":
        # characters that share lead or continuation bytes (é ã: C3; é ѩ: A9; 😀 😁: F0 9F 98;
        # 中 丰: E4 B8; 中 席: B8 AD), so byte matches begin and end inside characters
        alphabet = ["a", "b", "é", "ã", "ѩ", "€", "😀", "😁", "中", "丰", "席", " ", "\n"]
        weights = np.array([5, 4, 3, 3, 3, 2, 2, 2, 2, 2, 2, 1, 1], float)
        texts = ["".join(rng.choice(alphabet, int(rng.integers(1, 120)), p=weights / weights.sum())) for _ in range(n_docs)]
    else:
        words = ["ab", "é", "€€", "中文", "x", "😀", "7", "'s"]
        seps = [" ", "  ", "\n", ", ", ""]
        texts = ["".join(str(rng.choice(words)) + str(rng.choice(seps, p=[0.6, 0.1, 0.1, 0.1, 0.1])) for _ in range(int(rng.integers(1, 60)))) for _ in range(n_docs)]
    texts[5] = texts[2][10:] + texts[1]  # long copies too
    return [{"id": f"f{i}", "text": t} for i, t in enumerate(texts)]


@pytest.mark.parametrize("unit,n", [("bytes", 6), ("tokens", 3)])
def test_random_text_matches_the_oracle_and_workers_and_memory_do_not_matter(tmp_path, unit, n):
    """4. identity: --workers 1 at --memory 4G and --workers 2 at a tiny --memory (many shards)
    give the same rows, and both the brute-force oracle's removed_spans."""
    rows = fuzz_rows(unit, seed=3)
    src = write(tmp_path, rows, parts=3)
    a, b = tmp_path / "a", tmp_path / "b"
    common = ["--unit", unit, "--min-len", str(n), "--min-doc-words", "0", "--keep-rejected"]
    dedup(src, a, *common, "--workers", "1", "--memory", "4G")
    dedup(src, b, *common, "--workers", "2", "--memory", "1K", "--keep-work")
    assert n_shards(b / "_work") >= 5
    assert read(a) == read(b) and read(a, "rejected") == read(b, "rejected")
    want = oracle([r["text"] for r in rows], unit, n)
    got = by_id(read(a))
    rejected = {(r["id"], r["reason"]): r for r in read(a, "rejected")}
    assert sum(map(len, want)) > 10  # the corpus is full of repeats
    for i, r in enumerate(rows):
        for s, e in want[i]:
            utf8(r["text"])[s:e].decode("utf-8")  # whole characters
        left = cut(r["text"], want[i])
        if want[i] and not left.strip():  # a document cut to blanks is dropped whatever --min-doc-words
            assert r["id"] not in got
            whole = rejected[(r["id"], "dedup.substring")]
            assert whole["text"] == r["text"] and whole["removed_spans"] == want[i]
            continue
        assert got[r["id"]]["removed_spans"] == want[i], r["id"]
        assert got[r["id"]]["text"] == left
        if want[i]:
            assert rejected[(r["id"], "dedup.spans.cut")]["text"] == "\n".join(utf8(r["text"])[s:e].decode() for s, e in want[i])
    assert len(got) + sum(reason == "dedup.substring" for _, reason in rejected) == len(rows)


# ---------------------------------------------------------------------------------------------
# 3. Unicode in bytes


def test_bytes_unit_cuts_whole_characters_when_a_match_reaches_into_one(tmp_path):
    """Each copy's neighbours share some bytes of a multi-byte character with the first copy's
    (é/ѩ end in A9, é/ã start with C3; 😀/🙀 end in 80, 😀/😁 start with F0 9F 98; 中/席 end in B8 AD,
    中/丰 start with E4 B8): the raw byte match reaches into those characters, the cut must not."""
    rng = np.random.default_rng(11)
    sp = ["Ünïcödé span € with 😀 and 中文字 in it, long enough", "second: ĉu vi ŝatas 🍕 kaj ☕? — «jes» 日本語テキスト", "third € € € ééé 한국어 문장 ok"]
    first = [("é", "é"), ("😀", "😀"), ("中", "中")]
    later = [("ѩ", "ã"), ("🙀", "😁"), ("席", "丰")]
    assert utf8("é")[-1:] == utf8("ѩ")[-1:] and utf8("é")[:1] == utf8("ã")[:1]
    assert utf8("😀")[-1:] == utf8("🙀")[-1:] and utf8("😀")[:3] == utf8("😁")[:3]
    assert utf8("中")[-2:] == utf8("席")[-2:] and utf8("中")[:2] == utf8("丰")[:2]
    texts, expected = [], []
    for d in range(4):
        text, cuts = "ßtart " + filler(rng, 10) + " ü ", []
        for k, s in enumerate(sp):
            if d in (0, 2 + k % 2):  # first copies in doc 0, later ones in docs 2 and 3
                x, y = (first if d == 0 else later)[k]
                text += x
                start = len(utf8(text))
                text += s
                if d:
                    cuts.append([start, len(utf8(text))])
                text += y + " " + filler(rng, 6) + " ø "
        texts.append(text)
        expected.append(cuts)
    rows = [{"id": f"u{i}", "text": t} for i, t in enumerate(texts)]
    out = tmp_path / "o"
    dedup(write(tmp_path, rows), out, "--unit", "bytes", "--min-len", "20", "--min-doc-words", "0", "--keep-rejected")
    got = by_id(read(out))
    cut_rows = by_id(read(out, "rejected"))
    assert [got[r["id"]]["removed_spans"] for r in rows] == expected == oracle(texts, "bytes", 20)
    for r in rows:
        data = utf8(r["text"])
        for s, e in got[r["id"]]["removed_spans"]:
            data[s:e].decode("utf-8")  # strict: a whole-character range
            data[:s].decode("utf-8")
            data[e:].decode("utf-8")
        assert got[r["id"]]["text"] == cut(r["text"], got[r["id"]]["removed_spans"])
        if got[r["id"]]["removed_spans"]:
            assert cut_rows[r["id"]]["text"] == "\n".join(data[s:e].decode() for s, e in got[r["id"]]["removed_spans"])


def test_lone_surrogate_input_does_not_crash(tmp_path):
    """A JSONL line with a lone surrogate escape is damage the reader leaves out (counted): the
    run goes on and cuts the rest."""
    span = "alpha beta gamma delta epsilon zeta eta theta iota kappa"
    lines = [
        json.dumps({"id": "a", "text": "one " + span + " two"}),
        '{"id": "s", "text": "half \\ud800 pair ' + span + '"}',
        json.dumps({"id": "b", "text": "three " + span + " four"}),
    ]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    for unit in ("bytes", "tokens"):
        out = tmp_path / unit
        dedup(tmp_path / "in.jsonl", out, "--unit", unit, "--min-len", "8", "--min-doc-words", "0")
        got = by_id(read(out))
        assert set(got) == {"a", "b"} and got["a"]["removed_spans"] == []
        assert "gamma" not in got["b"]["text"] and got["b"]["text"].endswith("four")
        assert manifest(out)["counts"]["errors"] == 1


# ---------------------------------------------------------------------------------------------
# 5. resume


def resume_corpus(tmp_path):
    rows = fuzz_rows("bytes", seed=5, n_docs=16)
    return write(tmp_path, rows, parts=4)


@pytest.mark.parametrize("phase", ["units", "repeats", "cuts"])
def test_resume_after_a_kill_in_each_substring_phase(tmp_path, phase):
    src = resume_corpus(tmp_path)
    cfg = DedupConfig(substring=True, unit="bytes", min_len=6, min_doc_words=0, memory="1K", keep_rejected=True, keep_work=True)
    clean, out = tmp_path / "clean", tmp_path / "o"
    run_dedup([str(src)], str(clean), DedupConfig(**{**cfg.__dict__, "keep_work": False}), RunOptions(workers=1))
    run_dedup([str(src)], str(out), cfg, RunOptions(workers=2))
    work = out / "_work"
    assert n_shards(work) >= 4 and len(list((work / "repeats").glob("*.npy"))) >= 7
    # the state a kill in `phase` leaves: no manifest, no filter output, later phases' files
    # gone, this phase's half done (and a dead worker's temporary)
    (out / "manifest.json").unlink()
    for p in list(out.glob("part-*.parquet")) + list((out / "rejected").glob("part-*.parquet")) + list((out / ".shards").glob("part-*.json")):
        p.unlink()
    units, repeats, cuts = (sorted((work / d).glob(f"[0-9]*.{x}")) for d, x in (("units", "npz"), ("repeats", "npy"), ("cuts", "npz")))
    gone = {
        "units": units[::2] + [work / "layout.npz"] + repeats + cuts,
        "repeats": repeats[1::2] + cuts,
        "cuts": cuts[::2],
    }[phase]
    for p in gone:
        p.unlink()
    (work / "repeats" / ".0000-0001.npy.tmp-1.npy").write_bytes(b"junk a dead worker left")
    run_dedup([str(src)], str(out), cfg, RunOptions(workers=2))
    assert all(p.exists() for p in gone)  # redone
    assert read(out) == read(clean) and read(out, "rejected") == read(clean, "rejected")
    assert any(r["removed_spans"] for r in read(out))


KILLER = textwrap.dedent(
    """
    import os, signal, sys
    from llmctl.data.dedup import spans, substring
    phase, after = sys.argv[1], int(sys.argv[2])
    calls = [0]

    def hook():
        calls[0] += 1
        if calls[0] > after:
            os.kill(os.getpid(), signal.SIGKILL)

    if phase == "repeats":  # one call per shard pair task
        real = substring.later_copies
        def later_copies(*a, **k):
            hook()
            return real(*a, **k)
        substring.later_copies = later_copies
    else:  # the units and cuts files go through spans.save_npz
        real_save = spans.save_npz
        def save(path, **arrays):
            if path.parent.name == phase:
                hook()
            return real_save(path, **arrays)
        spans.save_npz = save
    sys.argv = ["llmctl", *sys.argv[3:]]
    from llmctl.cli import main
    main()
    """
)


@pytest.mark.parametrize("phase", ["repeats", "cuts"])
def test_a_killed_run_resumes_to_the_same_result(tmp_path, phase):
    """The CLI process SIGKILLed in the middle of a phase (in-process tasks, --workers 1): the
    re-run keeps the finished tasks' files and ends with the clean run's output."""
    src = resume_corpus(tmp_path)
    flags = ["--unit", "bytes", "--min-len", "6", "--min-doc-words", "0", "--memory", "1K", "--keep-rejected", "--keep-work", "--workers", "1"]
    clean, out = tmp_path / "clean", tmp_path / "o"
    dedup(src, clean, *flags)
    p = subprocess.run([sys.executable, "-c", KILLER, phase, "2", "dedup", str(src), "-o", str(out), "--substring", "--quiet", *flags],
                       capture_output=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert p.returncode == -signal.SIGKILL, p.stderr.decode()
    assert not (out / "manifest.json").exists() and not list(out.glob("part-*.parquet"))
    ext = "npy" if phase == "repeats" else "npz"
    done = {f: f.stat().st_mtime_ns for f in (out / "_work" / phase).glob(f"*.{ext}")}
    assert len(done) == 2
    dedup(src, out, *flags)
    assert all(f.stat().st_mtime_ns == t for f, t in done.items())  # kept, not redone
    assert len(list((out / "_work" / phase).glob(f"*.{ext}"))) == len(list((clean / "_work" / phase).glob(f"*.{ext}"))) > 2
    assert read(out) == read(clean) and read(out, "rejected") == read(clean, "rejected")


# ---------------------------------------------------------------------------------------------
# 6. edge cases


def test_empty_input_and_empty_files(tmp_path):
    empty = write(tmp_path, [], name="empty")
    out = tmp_path / "e"
    dedup(empty, out, "--min-len", "3")
    assert manifest(out)["counts"]["in"] == 0 and manifest(out)["counts"]["out"] == 0 and read(out) == []
    for unit in ("tokens", "bytes"):  # nothing but empty texts, in bytes and tokens
        rows = [{"id": "n", "text": None}, {"id": "e", "text": ""}]
        out = tmp_path / f"nothing-{unit}"
        dedup(write(tmp_path, rows, name=f"nothing-{unit}-in"), out, "--unit", unit, "--min-len", "3")
        c = manifest(out)["counts"]
        assert c["in"] == 0 and c["out"] == 0 and c["skipped"] == {"null_text": 1, "empty_text": 1}


@pytest.mark.parametrize("unit", ["tokens", "bytes"])
def test_empty_rows_and_removed_documents_do_not_shift_the_cuts(tmp_path, unit):
    """Empty and null texts (left out by the reader), an exact duplicate (removed by --exact), an
    empty file between two others: each cut still lands on its own row."""
    n = N[unit]
    rows, expected, _ = planted_corpus(unit, n, seed=9)
    mixed = []
    for i, r in enumerate(rows):
        mixed.append(r)
        if i % 3 == 0:
            mixed += [{"id": f"null{i}", "text": None}, {"id": f"empty{i}", "text": ""}]
        if i == 2:
            mixed.append({"id": "dup2", "text": r["text"]})  # would be one long later copy if it survived
    src = tmp_path / "in"
    src.mkdir()
    third = len(mixed) // 2
    for k, chunk in enumerate([mixed[:third], [], mixed[third:]]):
        pq.write_table(pa.table({"id": pa.array([r["id"] for r in chunk], pa.string()), "text": pa.array([r["text"] for r in chunk], pa.string())}), src / f"p{k}.parquet")
    out = tmp_path / "o"
    dedup(src, out, "--exact", "--unit", unit, "--min-len", str(n), "--min-doc-words", "0", "--memory", "3K", "--keep-rejected")
    got = by_id(read(out))
    assert set(got) == {r["id"] for r in rows}
    for r in rows:
        assert got[r["id"]]["removed_spans"] == expected[r["id"]], r["id"]
        assert got[r["id"]]["text"] == cut(r["text"], expected[r["id"]])
    rejected = by_id(read(out, "rejected"))
    assert rejected["dup2"]["reason"] == "dedup.exact"
    c = manifest(out)["counts"]
    assert c["skipped"]["null_text"] == c["skipped"]["empty_text"] == 3 and c["out"] == len(rows)


@pytest.mark.parametrize("unit,size", [("bytes", 3_000_000), ("tokens", 1_500_000)])
def test_one_huge_one_line_document(tmp_path, unit, size):
    """A few MB on one line: its inner repeat and a later document's copy of it are cut, a short
    document is left alone; with a small --memory the huge document is a shard of its own."""
    rng = np.random.default_rng(1)
    chars = rng.choice(LETTERS, size)
    chars[rng.integers(0, 7, size) == 0] = " "
    huge = "".join(chars.tolist()).replace("  ", " a")
    a, b = huge[1_000_000 : 1_004_000], huge[size - 100_000 : size - 99_500]
    a, b = a[a.index(" ") + 1 : a.rindex(" ")], b[b.index(" ") + 1 : b.rindex(" ")]
    # each copy between spaces, as in the huge text, then brackets: the match is " " + copy, and
    # in bytes the space after too (a token is a word with the space before it)
    doc = huge + " ( " + a + " )"
    later = "later text [ " + b + " ] end"
    rows = [{"id": "huge", "text": doc}, {"id": "tiny", "text": "tiny"}, {"id": "later", "text": later}]
    out = tmp_path / "o"
    dedup(write(tmp_path, rows), out, "--unit", unit, "--min-len", "50" if unit == "bytes" else "12", "--min-doc-words", "0", "--memory", "16M", "--keep-work")
    assert n_shards(out / "_work") == 2
    got = by_id(read(out))
    tail = unit == "bytes"
    p = len(utf8(huge + " ( "))
    assert got["huge"]["removed_spans"] == [[p - 1, p + len(utf8(a)) + tail]]
    p = len("later text [ ")
    assert got["later"]["removed_spans"] == [[p - 1, p + len(utf8(b)) + tail]]
    assert got["tiny"]["text"] == "tiny" and got["tiny"]["removed_spans"] == []
    assert got["huge"]["text"] == huge + (" ()" if tail else " ( )")
    c = manifest(out)["counts"]
    assert c["in"] == 3 and c["out"] == 3 and c["spans"]["substring"]["docs_cut"] == 2


def test_documents_shorter_than_n(tmp_path):
    rows = [{"id": str(i), "text": t} for i, t in enumerate(["a b c", "a b c", "a b c d e", "é€", "é€"])]
    out = tmp_path / "o"
    for unit in ("tokens", "bytes"):
        dedup(write(tmp_path, rows, name=f"in-{unit}"), out / unit, "--unit", unit, "--min-len", "50", "--min-doc-words", "0")
        got = read(out / unit)
        assert [(r["id"], r["text"], r["removed_spans"]) for r in got] == [(r["id"], r["text"], []) for r in rows]
        assert manifest(out / unit)["counts"]["spans"]["substring"]["docs_cut"] == 0


# ---------------------------------------------------------------------------------------------
# 7. the options


def test_annotate_only_keeps_the_text_and_fills_removed_spans(tmp_path):
    rows, expected, _ = planted_corpus("tokens", 8)
    out = tmp_path / "o"
    dedup(write(tmp_path, rows), out, "--min-len", "8", "--annotate-only", "--min-doc-words", "100000", "--keep-rejected")
    got = by_id(read(out))
    assert {i: (r["text"], r["removed_spans"]) for i, r in got.items()} == {r["id"]: (r["text"], expected[r["id"]]) for r in rows}
    assert read(out, "rejected") == []  # nothing cut, nothing dropped (however short the cut would leave it)


def test_keep_rejected_writes_the_cut_text_and_min_doc_words_drops_a_document_cut_too_short(tmp_path):
    rng = np.random.default_rng(4)
    span = filler(rng, 30)
    words = lambda k: filler(rng, k)  # noqa: E731
    rows = [
        {"id": "first", "text": words(10) + " [" + span + "] " + words(10)},
        {"id": "short", "text": words(3) + " (" + span + ")"},  # 3 words and a ( left: 4 < 10
        {"id": "long", "text": words(20) + " {" + span + "} " + words(20)},
        {"id": "other", "text": words(5)},  # short, but not cut: kept
    ]
    out = tmp_path / "o"
    dedup(write(tmp_path, rows), out, "--min-len", "20", "--min-doc-words", "10", "--keep-rejected")
    got = by_id(read(out))
    assert set(got) == {"first", "long", "other"}
    rejected = {(r["id"], r["reason"]): r for r in read(out, "rejected")}
    assert set(rejected) == {("short", "dedup.substring"), ("long", "dedup.spans.cut")}
    assert rejected[("short", "dedup.substring")]["text"] == rows[1]["text"]  # the whole document, as read
    (s, e), = got["long"]["removed_spans"]
    assert utf8(rows[2]["text"])[s:e].decode() == span
    assert rejected[("long", "dedup.spans.cut")]["text"] == span
    assert got["long"]["text"] == rows[2]["text"].replace(span, "")
    c = manifest(out)["counts"]
    assert c["out"] == 3 and c["spans"]["docs_dropped_short"] == 1
    # without --keep-rejected: the same kept rows, nothing under rejected/
    out2 = tmp_path / "o2"
    dedup(write(tmp_path, rows, name="in2"), out2, "--min-len", "20", "--min-doc-words", "10")
    assert read(out2) == read(out) and read(out2, "rejected") == []


def test_a_document_cut_to_blanks_is_dropped_even_at_min_doc_words_0(tmp_path):
    """SpanCuts._too_short: nothing but blanks left after the cut drops the document (reason
    dedup.substring) whatever --min-doc-words; --annotate-only keeps it as it was."""
    rng = np.random.default_rng(6)
    span = filler(rng, 30)
    rows = [{"id": "first", "text": filler(rng, 5) + " " + span + " " + filler(rng, 5)},
            {"id": "copy", "text": " " + span + " \n "}]  # the whole copy is the span (and blanks)
    src = write(tmp_path, rows)
    out = tmp_path / "o"
    dedup(src, out, "--min-len", "20", "--min-doc-words", "0", "--keep-rejected")
    assert set(by_id(read(out))) == {"first"}
    (r,) = read(out, "rejected")
    assert (r["id"], r["reason"], r["text"]) == ("copy", "dedup.substring", rows[1]["text"])
    assert not cut(rows[1]["text"], r["removed_spans"]).strip()
    out2 = tmp_path / "o2"
    dedup(src, out2, "--min-len", "20", "--min-doc-words", "0", "--annotate-only")
    got = by_id(read(out2))
    assert got["copy"]["text"] == rows[1]["text"] and got["copy"]["removed_spans"] == r["removed_spans"]


def test_keep_rejected_joins_several_pieces_by_newlines(tmp_path):
    rows, expected, _ = planted_corpus("bytes", 32)
    out = tmp_path / "o"
    dedup(write(tmp_path, rows), out, "--unit", "bytes", "--min-len", "32", "--min-doc-words", "0", "--keep-rejected")
    cut_rows = by_id(read(out, "rejected"))
    assert set(cut_rows) == {i for i, v in expected.items() if v}
    for r in rows:
        if expected[r["id"]]:
            data = utf8(r["text"])
            assert cut_rows[r["id"]]["text"] == "\n".join(data[s:e].decode() for s, e in expected[r["id"]])
            assert cut_rows[r["id"]]["reason"] == "dedup.spans.cut"


def test_reference_spans_are_cut_from_the_input_and_references_never_written(tmp_path):
    rng = np.random.default_rng(5)
    ref_span, own = filler(rng, 25), filler(rng, 25)
    refs = [{"id": "r0", "text": filler(rng, 10) + " [" + ref_span + "] " + filler(rng, 10)},
            {"id": "r1", "text": filler(rng, 5) + " (" + ref_span + ") " + filler(rng, 5)}]  # repeats inside the reference
    rows = [{"id": "i0", "text": filler(rng, 10) + " {" + ref_span + "} " + filler(rng, 5) + " [" + own + "] " + filler(rng, 5)},
            {"id": "i1", "text": filler(rng, 10) + " (" + own + ") " + filler(rng, 10)}]
    ref = write(tmp_path, refs, name="ref")
    out = tmp_path / "o"
    dedup(write(tmp_path, rows), out, "--min-len", "20", "--min-doc-words", "0", "--reference", ref, "--keep-rejected")
    got = by_id(read(out))
    assert set(got) == {"i0", "i1"}
    assert not {r["id"] for r in read(out, "rejected")} & {"r0", "r1"}
    (s, e), = got["i0"]["removed_spans"]  # the input's first copy of a reference span is a later copy
    assert utf8(rows[0]["text"])[s:e].decode() == ref_span and own in got["i0"]["text"]
    (s, e), = got["i1"]["removed_spans"]
    assert utf8(rows[1]["text"])[s:e].decode() == own
    assert manifest(out)["counts"]["in"] == 2


# ---------------------------------------------------------------------------------------------
# 8. bad input


@pytest.mark.parametrize("args,words", [
    (["--substring", "--unit", "words"], "--unit"),
    (["--substring", "--memory", "lots"], "--memory"),
    (["--substring", "--memory", "0"], "--memory"),
    (["--exact", "--annotate-only"], "--annotate-only"),
    (["--substring", "--reference", "no/such/reference.parquet"], "no/such/reference.parquet"),
])
def test_bad_input_is_a_one_line_usage_error(tmp_path, args, words):
    src = write(tmp_path, [{"id": "a", "text": "some words here"}])
    p = llmctl("dedup", src, "-o", tmp_path / "o", *args)
    err = p.stderr.decode()
    assert p.returncode == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and words in err


# ---------------------------------------------------------------------------------------------
# 9. the OpenMP fork hang


OMP_FORK = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    import torch
    a = torch.randn(512, 512)
    (a @ a).sum()  # torch's OpenMP pool is up in this process
    from llmctl.data.dedup import substring
    u = np.random.default_rng(0).integers(0, 4, 300_000).astype(np.uint8)
    sep = np.zeros(len(u), bool)
    first = substring.later_copies(u, sep, 0, 30)  # libdivsufsort's sort, before the fork
    pid = os.fork()
    if pid == 0:
        again = substring.later_copies(u, sep, 0, 30)
        os._exit(0 if np.array_equal(first, again) else 3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, status
    # the real case: the executor forks its workers after torch's pool is up
    from llmctl.data.dedup.run import DedupConfig, run_dedup
    from llmctl.runtime.options import RunOptions
    m = run_dedup([sys.argv[1]], sys.argv[2], DedupConfig(substring=True, unit="bytes", min_len=20, memory="2K", min_doc_words=0), RunOptions(workers=2))
    print("cut", m.counts["spans"]["substring"]["docs_cut"])
    """
)


def test_sorting_after_torch_and_a_fork_does_not_hang(tmp_path):
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch not installed")
    rows, expected, _ = planted_corpus("bytes", 20, seed=2)
    src = write(tmp_path, rows, parts=2)
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # the threads the hang needs
    # its own process group: a hung fork child is killed with it, not left behind
    proc = subprocess.Popen([sys.executable, "-c", OMP_FORK, str(src), str(tmp_path / "o")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("later_copies hung in a process forked after an OpenMP parallel region (torch's libgomp)")
    assert proc.returncode == 0, stderr.decode()
    assert f"cut {sum(bool(v) for v in expected.values())}" in stdout.decode()


# ---------------------------------------------------------------------------------------------
# 10. real pages


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    warc = shared_file("web/pages-a.warc.gz")
    from llmctl.config import build_config
    from llmctl.data.crawl.extract import ExtractConfig, run_crawl_extract

    base = tmp_path_factory.mktemp("pages")
    cfg = build_config(ExtractConfig, "crawl-extract", str(ROOT / "stages/crawl-extract/default.toml"))
    run_crawl_extract([str(warc)], str(base / "docs"), cfg, RunOptions(workers=2))
    return base / "docs"


@pytest.mark.parametrize("unit,n", [("tokens", 50), ("bytes", 100)])
def test_real_pages_lose_no_bytes(pages, tmp_path, unit, n):
    """Every input text is its kept text with the cut pieces (from the cut-text row) put back at
    removed_spans: byte for byte, no byte lost or added."""
    inputs = {r["id"]: r["text"] for r in read(pages) if r["text"]}
    out = tmp_path / "o"
    dedup(pages, out, "--unit", unit, "--min-len", str(n), "--min-doc-words", "0", "--keep-rejected", "--workers", "2")
    kept = by_id(read(out))
    rejected = read(out, "rejected")
    cuts = {r["id"]: r for r in rejected if r["reason"] == "dedup.spans.cut"}
    dropped = {r["id"]: r for r in rejected if r["reason"] == "dedup.substring"}  # cut to blanks: dropped whole
    assert {r["reason"] for r in rejected} <= {"dedup.spans.cut", "dedup.substring"}
    assert set(kept) | set(dropped) == set(inputs) and not set(kept) & set(dropped)
    assert cuts and set(cuts) == {i for i, r in kept.items() if r["removed_spans"]}
    total_kept = total_cut = 0
    for i, r in dropped.items():
        assert r["text"] == inputs[i] and r["removed_spans"] and not cut(inputs[i], r["removed_spans"]).strip()
        total_cut += len(utf8(inputs[i]))
    for i, r in kept.items():
        text, spans = utf8(r["text"]), r["removed_spans"]
        total_kept += len(text)
        pieces, pos = [], 0
        if spans:
            cut_text = utf8(cuts[i]["text"])
            for k, (s, e) in enumerate(spans):
                pieces.append(cut_text[pos : pos + e - s])
                pos += e - s
                if k < len(spans) - 1:
                    assert cut_text[pos : pos + 1] == b"\n"
                    pos += 1
            assert pos == len(cut_text)
        original, at, prev = [], 0, 0
        for (s, e), piece in zip(spans, pieces):
            assert s >= prev and e > s
            original += [text[at : at + s - prev], piece]
            at += s - prev
            prev = e
            total_cut += e - s
        original.append(text[at:])
        assert b"".join(original) == utf8(inputs[i]), i
    assert total_kept + total_cut == sum(len(utf8(t)) for t in inputs.values())
    counts = manifest(out)["counts"]["spans"]
    assert counts["docs_dropped_short"] == len(dropped) and counts["substring"]["bytes"] > 0


# ---------------------------------------------------------------------------------------------
# --reference: two bugs these tests found (both failed on b039f39)


def test_a_changed_reference_file_is_a_changed_run(tmp_path):
    """The --reference files are in the run's identity and the manifest's inputs by content: a
    re-run after a reference changed never returns the old cuts as this run's."""
    rng = np.random.default_rng(8)
    span = filler(rng, 25)
    rows = [{"id": "i0", "text": filler(rng, 10) + " {" + span + "} " + filler(rng, 10)}]
    src = write(tmp_path, rows)
    ref_dir = tmp_path / "ref"
    ref_dir.mkdir()
    ref = ref_dir / "ref.parquet"
    pq.write_table(pa.table({"id": ["r0"], "text": [filler(rng, 5) + " [" + span + "] " + filler(rng, 5)]}), ref)
    out = tmp_path / "o"
    dedup(src, out, "--min-len", "20", "--min-doc-words", "0", "--reference", ref)
    assert read(out)[0]["removed_spans"]  # the reference's span was cut
    pq.write_table(pa.table({"id": ["r0"], "text": ["a reference without that span at all"]}), ref)
    p = dedup(src, out, "--min-len", "20", "--min-doc-words", "0", "--reference", ref, check=False)
    # either refused (another run's output) or done again: never the old cuts as this run's
    assert p.returncode != 0 or read(out)[0]["removed_spans"] == [], "stale output: the reference's change was not seen"


def test_a_missing_reference_is_refused_before_out_is_claimed(tmp_path):
    """A mistyped --reference exits 2 before OUT is claimed, so the corrected re-run into the
    same OUT is not refused as another config's."""
    src = write(tmp_path, [{"id": "a", "text": "some words here and there"}])
    ref = write(tmp_path, [{"id": "r", "text": "a reference text"}], name="ref")
    out = tmp_path / "o"
    p = dedup(src, out, "--reference", tmp_path / "typo", check=False)
    assert p.returncode == 2
    fixed = dedup(src, out, "--reference", ref, check=False)
    assert fixed.returncode == 0, fixed.stderr.decode()


# ---------------------------------------------------------------------------------------------
# inspect --id and the report: where a user reads what was cut


def test_inspect_shows_a_documents_removed_spans_and_the_report_its_span_table(tmp_path):
    rng = np.random.default_rng(21)
    span = filler(rng, 30)
    rows = [{"id": "first", "text": filler(rng, 60) + " " + span + " " + filler(rng, 60)},
            {"id": "later", "text": "Ünïcode " + filler(rng, 60) + " " + span + " " + filler(rng, 60)}]
    src = write(tmp_path, rows)
    out = tmp_path / "o"
    dedup(src, out, "--min-len", "20", "--min-doc-words", "0", "--keep-rejected")
    shown = llmctl("inspect", out, "--id", "later", "--json", check=True)
    doc = json.loads(shown.stdout)
    (s, e), = by_id(read(out))["later"]["removed_spans"]
    assert doc["removed_spans"] == [{"start": s, "end": e, "bytes": e - s, "text": utf8(rows[1]["text"])[s:e].decode()}]
    assert span in doc["removed_spans"][0]["text"] and span not in doc["row"]["text"]
    table = llmctl("inspect", out, "--id", "later", check=True).stdout.decode()
    assert "removed spans" in table and f"{s:,}-{e:,}" in table
    # --annotate-only: the text is still whole, so the span's text comes from it
    ann = tmp_path / "ann"
    dedup(src, ann, "--min-len", "20", "--min-doc-words", "0", "--annotate-only")
    doc = json.loads(llmctl("inspect", ann, "--id", "later", "--json", check=True).stdout)
    assert doc["removed_spans"][0]["text"] == utf8(rows[1]["text"])[s:e].decode() and doc["row"]["text"] == rows[1]["text"]
    missing = llmctl("inspect", out, "--id", "nope")
    assert missing.returncode == 2 and b"no document with id 'nope'" in missing.stderr and b"Traceback" not in missing.stderr
    # the report's dedup section carries the span table
    llmctl("report", out, "-o", tmp_path / "rep", check=True)
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "spans cut inside the surviving documents" in md and "| substring | 1 | 1 | " + f"{e - s:,}" in md
