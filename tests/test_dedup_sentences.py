"""dedup --sentences' core (data/dedup/sentences.py): datatrove's sentence-span dedup, decision for
decision. Hand-made documents here; the live comparisons with spaCy and datatrove run where they are
installed (.venv-bench), on fuzzed strings, hand-made documents and the extracted pages of
pages-a.warc.gz."""

from __future__ import annotations

import os
import random
import string

import numpy as np
import pytest

from conftest import ROOT, shared_file
from llmctl.data.dedup import sentences as S

WORDS = ("amber basil cedar delta ember fjord grove harbor island juniper kettle lantern meadow nectar "
         "orchard pepper quartz river saffron timber umber velvet willow yarrow zephyr").split()  # fmt: skip


def sentence(k: int, length: int = 8) -> str:
    """A distinct sentence per k (no digits: they all simplify to 0)."""
    rng = random.Random(k)
    return " ".join(rng.choice(WORDS) for _ in range(length)).capitalize() + f" {WORDS[k % len(WORDS)]}{WORDS[k // len(WORDS) % len(WORDS)]}."


def doc(*ks: int) -> str:
    return " ".join(sentence(k) for k in ks)


# ---------------------------------------------------------------------------------------------
# sentences


def test_sentence_spans_are_spacys():
    # expected spans from spaCy 3.8.18: spacy.blank("en") + sentencizer, as datatrove's span_tokenize
    text = "  Hello world. This is \n\n it!  Bye.\n\n"
    assert S.sentence_spans(text) == [(0, 14), (15, 29), (30, 35), (35, 37)]  # a leading run and a trailing "\n\n" are tokens
    assert S.sentence_spans("One. Two! Three? four") == [(0, 4), (5, 9), (10, 16), (17, 21)]
    assert S.sentence_spans("Version 3.5 of U.S. law.") == [(0, 24)]  # "U." "S." no split: special case
    assert S.sentence_spans('He said "Stop!" Then left.') == [(0, 15), (16, 26)]  # closing quote stays with its sentence
    assert S.sentence_spans("End.\nNext line\nmore") == [(0, 4), (4, 19)]  # "\n" is a token: it starts the next sentence
    assert S.sentence_spans("Bye. ") == [(0, 4)]  # one trailing space is the last token's
    assert S.sentence_spans("") == [] and S.sentence_spans("   ") == [(0, 3)]


def test_sentence_spans_other_scripts():
    assert S.sentence_spans("今日は晴れ。 明日は雨。") == [(0, 6), (7, 12)]
    assert S.sentence_spans("今日は晴れ。明日は雨。") == [(0, 11)]  # no space: one chunk, "。" inside it ends nothing
    assert S.sentence_spans("यह पहला है। यह दूसरा है।") == [(0, 11), (12, 24)]
    assert S.sentence_spans("هل أنت بخير؟ نعم") == [(0, 12), (13, 16)]
    # U+2024 ONE DOT LEADER is Sentence_Terminal today but not in spaCy's list: no split
    assert S.sentence_spans("a\u2024 b") == [(0, 4)]


def test_simplify_is_datatroves_normalization():
    assert S.simplify("  The  Year 1,999.5 was\tFINE!! ") == "the year 0 0 was fine"  # one decimal part per number
    assert S.simplify("Café crème — déjà vu") == "cafe creme deja vu"
    assert S.simplify("١٢٣ items") == "0 items"  # digits of any script
    assert S.simplify("...!?") == ""
    assert S.simplify("ΟΔΟΣ") == "οδος"  # final sigma: lower() per sentence, then marks dropped


# ---------------------------------------------------------------------------------------------
# windows


def test_window_keys_cover_consecutive_sentences():
    text = doc(1, 2, 3, 4, 5)
    keys, spans = S.window_keys(text, 3)
    assert len(spans) == 5 and len(keys) == 3 and keys.dtype == np.uint64
    for i in range(3):  # key i is the window of sentences i, i+1, i+2
        alone, _ = S.window_keys(" ".join(text[s:e] for s, e in spans[i : i + 3]), 3)
        assert alone.tolist() == [keys[i]]
    assert len(set(keys.tolist())) == 3 and S.SKIP not in keys
    # simplification: case, numbers, punctuation and accents do not change a key
    a, _ = S.window_keys("The year 1999 was fine. Crème brûlée! It rained.", 3)
    b, _ = S.window_keys("the YEAR 2024 was fine! Creme brulee? It  rained", 3)
    assert a.tolist() == b.tolist()
    assert S.window_keys(text, 1)[0].size == 5 and S.window_keys(text, 5)[0].size == 1


def test_fewer_than_n_sentences_and_empty_text():
    keys, spans = S.window_keys(doc(1, 2), 3)
    assert keys.size == 0 and len(spans) == 2
    keys, spans = S.window_keys("", 3)
    assert keys.size == 0 and spans == []
    keys, spans = S.window_keys("One. Two.\n\n", 3)  # the trailing blank sentence is not counted
    assert keys.size == 0 and len(spans) == 3


def test_blank_windows_are_skipped():
    # punctuation never starts a sentence, but a whitespace token does: "\n!" simplifies to ""
    keys, _ = S.window_keys(BLANKS, 3)
    assert len(keys) == 3 and keys.tolist()[1] == S.SKIP and S.SKIP not in keys.tolist()[::2]
    other = BLANKS.replace("Hello there", "Good day").replace("Bye", "Ciao")  # shares only the blank window
    assert S.dedup_texts([BLANKS, other], 3, 0) == [BLANKS, other]
    dup = S.duplicate_windows(np.array([S.SKIP, S.SKIP, 7], np.uint64), np.array([0, 1, 1]))
    assert dup.tolist() == [False, False, False]


BLANKS = "Hello there.\n!\n?\n.\nBye now."


def test_one_huge_line():
    line = " ".join(WORDS * 8000)  # 200,000 words, no sentence end
    keys, spans = S.window_keys(line, 3)
    assert spans == [(0, len(line))] and keys.size == 0
    many = " ".join(sentence(k % 50, 4) for k in range(70_000))  # more windows than datatrove's uint16 holds
    keys, spans = S.window_keys(many, 3)
    assert len(spans) == 70_000 and keys.size == 69_998
    dup = S.duplicate_windows(keys, np.zeros(len(keys), np.int64))
    assert not dup[:48].any() and dup[50:].all()  # the sentences repeat every 50


# ---------------------------------------------------------------------------------------------
# duplicates


def test_duplicate_windows_earlier_document_wins():
    keys = np.array([5, 6, 7, 5, 6, 9], np.uint64)
    assert S.duplicate_windows(keys, np.array([0, 0, 0, 1, 1, 1])).tolist() == [False] * 3 + [True, True, False]
    # document numbers, not positions, say which is earlier
    assert S.duplicate_windows(keys, np.array([1, 1, 1, 0, 0, 0])).tolist() == [True, True, False] + [False] * 3


def test_duplicate_windows_within_a_document():
    # datatrove marks every occurrence after the first, in the same document too
    keys = np.array([5, 6, 5, 5, 8, 6], np.uint64)
    assert S.duplicate_windows(keys, np.array([0, 0, 0, 0, 1, 1])).tolist() == [False, False, True, True, False, True]


def test_duplicate_windows_matches_a_dict_at_scale():
    rng = np.random.default_rng(0)
    docs = np.sort(rng.integers(0, 20_000, 300_000))
    keys = rng.integers(1, 50_000, 300_000).astype(np.uint64)
    perm = np.lexsort((np.arange(len(keys)), -docs))  # documents last to first; each one's windows in order
    got = S.duplicate_windows(keys[perm], docs[perm])
    seen, want = set(), []
    for k in keys.tolist():
        want.append(k in seen)
        seen.add(k)
    assert got.tolist() == np.array(want)[perm].tolist()


# ---------------------------------------------------------------------------------------------
# cutting and the drop rule


def test_repeat_across_documents_is_cut_from_the_later_only():
    first = doc(*range(1, 12))
    second = doc(50, 51) + "\n\n" + doc(3, 4, 5) + "\n" + doc(*range(52, 60))
    out = S.dedup_texts([first, second], 3, 50)
    assert out[0] == first
    assert out[1] == doc(50, 51) + "\n" + doc(*range(52, 60))  # the cut takes the whitespace before each sentence
    again = S.dedup_texts([second, first], 3, 50)  # the other order: the other copy goes
    assert again[0] == second and again[1] == doc(1, 2) + " " + doc(*range(6, 12))


def test_within_document_repeat_is_cut():
    text = doc(1, 2, 3, 4) + " " + doc(1, 2, 3) + " " + doc(*range(5, 12))
    assert S.dedup_texts([text], 3, 0) == [doc(1, 2, 3, 4) + " " + doc(*range(5, 12))]


def test_overlapping_windows_and_lstrip():
    a = doc(*range(1, 10))
    b = "\n  " + doc(1, 2, 3, 4) + " " + doc(*range(20, 30)) + " "  # leading window cut; then lstrip; the trailing space goes
    out = S.dedup_texts([a, b], 3, 0)
    assert out[1] == doc(*range(20, 30))
    keys, spans = S.window_keys(b, 3)
    mask = np.zeros(len(keys), bool)
    mask[[0, 1]] = True
    assert S.removed_char_spans(b, spans, mask, 3) == [(0, spans[3][1] + 1), (len(b) - 1, len(b))]
    assert S.removed_char_spans(b, spans, np.zeros(len(keys), bool), 3) == []  # untouched: trailing space stays


def test_min_doc_words_and_sentences_decide_the_drop():
    a = doc(*range(1, 12))
    b = doc(1, 2, 3) + " " + doc(40, 41, 42)  # 30 words left after the cut
    assert S.dedup_texts([a, b], 3, 50) == [a, None]
    assert S.dedup_texts([a, b], 3, 30) == [a, doc(40, 41, 42)]
    assert S.dedup_texts([a, b], 3, 31) == [a, None]
    assert S.dedup_texts([a, b], 3, 0, min_num_sentences=4) == [a, None]  # datatrove's min_num_sentences (3)
    short = doc(70, 71)  # unchanged documents are kept however short
    assert S.dedup_texts([a, short], 3, 50)[1] == short
    assert S.keep_document("", "", 50) is False  # datatrove drops an empty text
    assert S.word_count("Don't stop, U.S.!  ok") == 7 and S.word_count("") == 0


def unicode_docs() -> list[str]:
    ja = "\n".join(f"これは{w}の文です。" for w in WORDS[:8])  # no spaces: a sentence ends at a line's end only
    hi = " ".join(f"यह {w} वाक्य है।" for w in WORDS[:8])
    later = "前置き。\n" + "\n".join(f"これは{w}の文です。" for w in WORDS[2:6]) + "\n最後の文。\n終わり。"
    fr1 = "Le café est chaud. Il fait beau. Nous partons. Fin de l'histoire."
    fr2 = "Début. LE CAFE EST CHAUD! il fait beau? Nous partons!! Autre chose. Encore une."  # accents do not matter
    return [ja, hi, later, hi, fr1, fr2]


def test_unicode_documents():
    ja, hi, later, _, fr1, fr2 = texts = unicode_docs()
    assert S.dedup_texts(texts, 3, 0) == [ja, hi, "前置き。\n最後の文。\n終わり。", None, fr1, "Début. Autre chose. Encore une."]


# ---------------------------------------------------------------------------------------------
# real pages


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """The texts `llmctl crawl-extract` makes from pages-a.warc.gz (many languages)."""
    import glob

    import pyarrow.parquet as pq

    from llmctl.config import build_config
    from llmctl.data.crawl.extract import ExtractConfig, run_crawl_extract
    from llmctl.runtime.options import RunOptions

    warc = shared_file("web/pages-a.warc.gz")
    out = tmp_path_factory.mktemp("sentences") / "pages"
    cfg = build_config(ExtractConfig, "crawl-extract", str(ROOT / "stages/crawl-extract/default.toml"))
    with pytest.MonkeyPatch.context() as mp:
        lid = ROOT / ".venv" / "share" / "llmctl" / "lid.176.ftz"  # in .venv-bench, the product venv's model
        if lid.exists() and "LLMCTL_LANGID_MODEL" not in os.environ:
            mp.setenv("LLMCTL_LANGID_MODEL", str(lid))
        run_crawl_extract([str(warc)], str(out), cfg, RunOptions(workers=1))
    return [t for p in sorted(glob.glob(str(out / "part-*.parquet"))) for t in pq.read_table(p).column("text").to_pylist()]


def planted(texts: list[str], seed: int = 0) -> list[str]:
    """The texts with 1-3 lines of another text (earlier or later) pasted into 40% of them."""
    rng = random.Random(seed)
    out = list(texts)
    for i in range(len(texts)):
        if rng.random() < 0.4:
            lines = texts[rng.randrange(len(texts))].split("\n")
            k = rng.randrange(len(lines))
            mine = out[i].split("\n")
            j = rng.randrange(len(mine) + 1)
            out[i] = "\n".join(mine[:j] + lines[k : k + rng.randint(1, 3)] + mine[j:])
    return out


def test_real_pages_spans_cover_the_text(pages):
    assert len(pages) > 400
    for text in pages:
        spans = S.sentence_spans(text)
        assert spans[0][0] == 0 and all(s < e for s, e in spans)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
        gaps = [text[a[1] : b[0]] for a, b in zip(spans, spans[1:])] + [text[spans[-1][1] :]]
        assert all(g in ("", " ") for g in gaps)  # between sentences only the one space a token owns


def test_real_pages_planted_repeats_are_cut(pages):
    texts = planted(pages)
    out = S.dedup_texts(texts, 3, 50)
    changed = sum(o != t for o, t in zip(out, texts))
    assert 80 <= changed <= 200, changed
    # a copy vanishes entirely, unless it has fewer than 3 sentences (no window: left as it is)
    want = [None if len(S.window_keys(t, 3)[0]) else t for t in pages]
    assert S.dedup_texts(pages + pages, 3, 0)[len(pages) :] == want and want.count(None) > 400


# ---------------------------------------------------------------------------------------------
# live: spaCy and datatrove themselves (.venv-bench)


def test_sentence_end_characters_are_spacys():
    spacy = pytest.importorskip("spacy")
    from spacy.pipeline.sentencizer import Sentencizer

    assert S.SENT_END == frozenset(Sentencizer.default_punct_chars), spacy.__version__


def fuzzed(n: int, seed: int = 1) -> list[str]:
    pieces = ["Hello", "world", ".", "!", "?", " ", "  ", "\n", "\n\n", "\t", " \n ", "U.S.", "e.g.", ":)", "8):",
              "don't", "...", "…", "。", "।", "؟", "\u2024", "\u00a0", "\u3000", '"', "'", "(", ")", "Ünïcödé", "Σ",
              "ΟΔΟΣ", "3.5", "١٢٣", "http://x.com/a.b", "—", "a.b", "Mr.", "\u0301", "İ", "\x0b", "\x1c", "?!", "‽"]  # fmt: skip
    rng = random.Random(seed)
    return ["".join(rng.choice(pieces) + rng.choice(("", " ")) for _ in range(rng.randint(0, 25))) for _ in range(n)] + [
        "".join(rng.choice(string.printable) for _ in range(200)) for _ in range(n // 10)
    ]


def test_live_spacy_sentences_and_words():
    pytest.importorskip("spacy")
    datatrove = pytest.importorskip("datatrove")
    from datatrove.utils.text import PUNCTUATION, simplify_text
    from datatrove.utils.word_tokenizers import load_word_tokenizer

    assert S._PUNCTUATION == PUNCTUATION, datatrove.__version__
    tok = load_word_tokenizer("eng")
    bad = []
    for text in fuzzed(3000):
        spans = S.sentence_spans(text)
        sents = [t for s, e in spans if (t := text[s:e].strip())]
        if (spans != [tuple(x) for x in tok.span_tokenize(text)] or sents != tok.sent_tokenize(text)
                or [S.simplify(x) for x in sents] != [simplify_text(x) for x in sents]
                or S.word_count(text) != len(tok.word_tokenize(text))):  # fmt: skip
            bad.append(text)
    assert not bad, bad[:5]


def datatrove_dedup(texts: list[str], tmp, n: int = 3, min_doc_words: int = 50) -> list[str | None]:
    """datatrove's three steps on `texts` (one task: documents numbered in list order)."""
    from datatrove.data import Document
    from datatrove.pipeline.dedup.sentence_dedup import SentDedupConfig, SentenceDedupFilter, SentenceDedupSignature, SentenceFindDedups

    cfg = SentDedupConfig(n_sentences=n, min_doc_words=min_doc_words)

    def docs():
        return iter([Document(text=t, id=str(i)) for i, t in enumerate(texts)])

    SentenceDedupSignature(output_folder=str(tmp / "sig"), config=cfg).run(docs())
    SentenceFindDedups(data_folder=str(tmp / "sig"), output_folder=str(tmp / "dup"), config=cfg).run()
    kept = {d.id: d.text for d in SentenceDedupFilter(data_folder=str(tmp / "dup"), config=cfg).run(docs())}
    return [kept.get(str(i)) for i in range(len(texts))]


def hand_made() -> list[str]:
    a = doc(*range(1, 12))
    return [a, doc(50, 51) + "\n\n" + doc(3, 4, 5) + "\n" + doc(*range(52, 60)), doc(1, 2, 3, 4) + " " + doc(1, 2, 3) + " " + doc(*range(5, 12)),
            "\n  " + doc(1, 2, 3, 4) + " " + doc(*range(20, 30)) + " ", doc(1, 2, 3) + " " + doc(40, 41, 42), doc(70, 71),
            BLANKS, BLANKS.replace("Hello there", "Good day").replace("Bye", "Ciao"), BLANKS.replace("Bye", "Ciao"), BLANKS + " " + BLANKS, a + "\n\n", " " + a, "One. Two.\n\n"] + unicode_docs()  # fmt: skip


def test_live_datatrove_hand_made(tmp_path):
    pytest.importorskip("datatrove")
    texts = hand_made() + fuzzed(300, seed=2)
    for n, words in ((3, 50), (2, 0), (1, 10)):
        assert S.dedup_texts(texts, n, words) == datatrove_dedup(texts, tmp_path / f"{n}-{words}", n, words)


def test_live_datatrove_real_pages(pages, tmp_path):
    pytest.importorskip("datatrove")
    for name, texts in (("pages", pages), ("planted", planted(pages))):
        ours, theirs = S.dedup_texts(texts, 3, 50), datatrove_dedup(texts, tmp_path / name)
        differ = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
        assert not differ, (name, differ[:10])


# ---------------------------------------------------------------------------------------------
# the stage: dedup --sentences through run_dedup, alone and after the document-level methods


def _write_parts(path, rows, parts):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.mkdir()
    step = -(-len(rows) // parts)
    for p in range(parts):
        pq.write_table(pa.Table.from_pylist(rows[p * step : (p + 1) * step]), path / f"p{p}.parquet")
    return str(path)


def _read(out, sub=""):
    import pyarrow.parquet as pq

    return [r for p in sorted((out / sub).glob("part-*.parquet")) for r in pq.read_table(p).to_pylist()]


def _stage_docs() -> list[str]:
    rng = random.Random(7)
    texts = []
    for i in range(40):
        ks = list(range(1000 + 20 * i, 1000 + 20 * i + rng.randint(3, 14)))
        if i and rng.random() < 0.6:  # a run of sentences of an earlier document, somewhere inside
            j = rng.randrange(i)
            start = 1000 + 20 * j + rng.randint(0, 2)
            at = rng.randint(0, len(ks))
            ks[at:at] = list(range(start, start + rng.randint(2, 6)))
        texts.append(doc(*ks))
    return texts


@pytest.mark.parametrize("workers", [1, 2])
def test_stage_gives_the_reference_text_at_any_worker_count(tmp_path, workers):
    from llmctl.data.dedup.run import DedupConfig, run_dedup
    from llmctl.runtime.options import RunOptions

    texts = _stage_docs()
    src = _write_parts(tmp_path / "in", [{"id": f"d{i}", "text": t} for i, t in enumerate(texts)], parts=3)
    cfg = DedupConfig(sentences=True, n_sentences=3, min_doc_words=30, keep_rejected=True)
    m = run_dedup([src], str(tmp_path / "o"), cfg, RunOptions(workers=workers))
    want = S.dedup_texts(texts, 3, 30)
    kept = {r["id"]: r for r in _read(tmp_path / "o")}
    assert {k: r["text"] for k, r in kept.items()} == {f"d{i}": t for i, t in enumerate(want) if t is not None}
    changed = sum(w != t for w, t in zip(want, texts))
    assert changed >= 10 and m.counts["spans"]["sentences"]["docs_cut"] >= changed - want.count(None)
    rejected = _read(tmp_path / "o", "rejected")
    assert sorted(r["id"] for r in rejected if r["reason"] == "dedup.sentences") == sorted(f"d{i}" for i, t in enumerate(want) if t is None)
    # nothing is lost: every kept text with its cut text (rejected/, dedup.spans.cut) rebuilds the input
    cut_text = {r["id"]: r["text"].split("\n") for r in rejected if r["reason"] == "dedup.spans.cut"}
    for i, text in enumerate(texts):
        row = kept.get(f"d{i}")
        if row is None or not row["removed_spans"]:
            continue
        data, pieces, pos, rebuilt = text.encode(), iter(cut_text[f"d{i}"]), 0, []
        for s, e in row["removed_spans"]:
            assert data[s:e].decode() == next(pieces)
            rebuilt.append(data[pos:s])
            pos = e
        assert b"".join(rebuilt + [data[pos:]]).decode() == row["text"]


def test_span_methods_see_only_the_documents_that_survive(tmp_path):
    """A passage whose first copy is in a document exact dedup removed is first seen in the
    survivor of that document, so later copies are cut and the survivor's is kept."""
    from llmctl.data.dedup.run import DedupConfig, run_dedup
    from llmctl.runtime.options import RunOptions

    passage = doc(1, 2, 3, 4)
    a = doc(10, 11, 12) + " " + passage + " " + doc(13, 14, 15, 16)
    rows = [{"id": "a", "text": a}, {"id": "a-copy", "text": a}, {"id": "b", "text": doc(20, 21) + " " + passage + " " + doc(*range(22, 30))}]
    src = _write_parts(tmp_path / "in", rows, parts=1)
    run_dedup([src], str(tmp_path / "o"), DedupConfig(exact=True, sentences=True, substring=True, min_len=10, min_doc_words=0), RunOptions(workers=1))
    out = {r["id"]: r for r in _read(tmp_path / "o")}
    assert set(out) == {"a", "b"} and out["a"]["text"] == a and out["a"]["removed_spans"] == []
    # the repeat starts at the "." before the passage: a's copy has one there too
    assert passage not in out["b"]["text"] and doc(20, 21)[:-1] in out["b"]["text"] and doc(*range(22, 30)) in out["b"]["text"]


def test_annotate_only_marks_and_keeps(tmp_path):
    from llmctl.data.dedup.run import DedupConfig, run_dedup
    from llmctl.runtime.options import RunOptions

    texts = _stage_docs()
    src = _write_parts(tmp_path / "in", [{"id": f"d{i}", "text": t} for i, t in enumerate(texts)], parts=2)
    run_dedup([src], str(tmp_path / "o"), DedupConfig(sentences=True, annotate_only=True), RunOptions(workers=2))
    rows = _read(tmp_path / "o")
    assert [r["text"] for r in rows] == texts  # nothing cut, nothing dropped
    want = S.dedup_texts(texts, 3, 0, min_num_sentences=0)
    assert sum(bool(r["removed_spans"]) for r in rows) >= 10
    for r, t, w in zip(rows, texts, want):  # ASCII text: byte offsets are character offsets
        assert S.cut(t, [tuple(s) for s in r["removed_spans"]]) == w
