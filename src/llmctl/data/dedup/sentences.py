"""dedup --sentences: datatrove's sentence-span dedup (SentenceDedupSignature ->
SentenceFindDedups -> SentenceDedupFilter, datatrove 0.10.1, pipeline/dedup/sentence_dedup.py),
as pure functions that dedup's span phases call (spans.py).

What it mirrors, decision for decision:
- Sentences are spaCy's: spacy.blank("en") plus its rule-based sentencizer, which is what
  datatrove's English word tokenizer runs for sent_tokenize / span_tokenize. A sentence starts at
  the first token that is not punctuation after a token that is one of the sentencizer's
  end characters; whitespace runs other than one space are tokens of their own (they can start a
  sentence, so a sentence may begin with "\\n\\n"; the trailing "\\n\\n" of a text can be a sentence
  of its own). Hashing uses the sentences stripped, blank ones left out (sent_tokenize); cutting
  uses all spans (span_tokenize). Only a text's last sentence can be blank, so both number the
  sentences alike.
- Window i covers sentences i .. i+n-1; a text with fewer than n non-blank sentences has no
  window. Its key hashes the n sentences each simplified as datatrove's simplify_text does
  (lowercase, digit runs -> "0", datatrove's PUNCTUATION -> spaces, whitespace runs -> one space,
  NFD with nonspacing marks dropped, stripped), joined by one space. A window whose joined text
  is blank is not hashed (datatrove skips it; here its key is SKIP and never a duplicate).
- A window is a duplicate when its key was seen before in (document, window) order: in an
  earlier document, or earlier in the same document (datatrove's heap pops equal hashes by
  document, then sentence index, and marks every one after the first).
- A duplicate window removes its n sentences. datatrove rebuilds the text from the kept sentences,
  each with the whitespace that precedes it, joins them with "" and lstrips the result; the text
  after the last sentence (a single trailing space) goes too. removed_char_spans returns exactly the
  complement of that, so cutting its ranges gives datatrove's text character for character.
- A document that was cut is kept when its new text is not empty, has >= min_doc_words words
  (spaCy tokens, whitespace tokens left out) and >= min_num_sentences (3) sentences
  (keep_document); a document nothing was cut from is kept as it is, unless it is empty.

Why by hand: datatrove's three steps run spaCy three times per document and pass every window
through a heap in one process; here sentences come from llmctl's own spaCy-compatible splitter
(data/filters/doc.py: spaCy's tokenizer rules without spaCy, the same splitter for every
language the filter chain handles) and duplicates come from one numpy sort.

Where it differs: the hash is llmctl's h64 (blake2b-64), not datatrove's xxhash64, so the key
values differ while the decisions do not (up to 64-bit collisions); a real hash of 0 becomes 1,
since 0 is SKIP. datatrove stores a window's index as uint16 and fails outright on a document with
more than 65,536 windows; here any length works. Not mirrored: split_sentences=False (split on
lines), min_words_to_remove_span (default 0, off) and the index of another data set.
"""

from __future__ import annotations

import re
import sys
import unicodedata
from functools import lru_cache

import numpy as np
import regex

from llmctl.data.filters.doc import tokenize
from llmctl.hashing import h64

SKIP = 0  # the key of a window datatrove does not hash (its simplified text is blank)

# spaCy's Sentencizer.default_punct_chars (3.8): the characters that end a sentence. An older
# Unicode's Sentence_Terminal: doc.is_terminal (today's) has 44 more, e.g. U+061D, U+2024, U+FE12.
SENT_END = frozenset(
    "!.?։؟۔܀܁܂߹।॥၊။።፧፨᙮᜵᜶᠃᠉᥄᥅᪨᪩᪪᪫᭚᭛᭞᭟᰻᰼᱾᱿‼‽⁇⁈⁉⸮⸼꓿꘎꘏꛳꛷꡶꡷꣎꣏꤯꧈꧉꩝꩞꩟꫰꫱꯫﹒﹖﹗！．？"
    "𐩖𐩗𑁇𑁈𑂾𑂿𑃀𑃁𑅁𑅂𑅃𑇅𑇆𑇍𑇞𑇟𑈸𑈹𑈻𑈼𑊩𑑋𑑌𑗂𑗃𑗉𑗊𑗋𑗌𑗍𑗎𑗏𑗐𑗑𑗒𑗓𑗔𑗕𑗖𑗗𑙁𑙂𑜼𑜽𑜾𑩂𑩃𑪛𑪜𑱁𑱂𖩮𖩯𖫵𖬷𖬸𖭄𛲟𝪈｡。"
)

# datatrove's PUNCTUATION (utils/text.py), the characters simplify_text turns into spaces: a
# hand-picked string and the control characters but tab, newline and carriage return. Its terminal
# punctuation of other scripts is not in it (doc._DATATROVE_PUNCTUATION adds that set).
_PUNCTUATION = '!/—”:％１〈&(、━\\【#%「」，】；+^]~“《„\';’{|∶´[=-`*．（–？！：$～«〉,><》)?）。…@_."}►»' + "".join(
    chr(x) for a, b in ((0, 9), (11, 13), (13, 32), (127, 160)) for x in range(a, b)
)
_PUNCT_TO_SPACE = str.maketrans(_PUNCTUATION, " " * len(_PUNCTUATION))
_NUMBERS = regex.compile(r"\p{Nd}+([.,،٫⎖⎗⎘]\p{Nd}+)?")  # a number in any script, one decimal part
_WS = re.compile(r"\s+")
_WS_RUNS = re.compile(r"(\s+)")  # str.isspace() runs, as spaCy (and doc.tokenize) split on them
_IS_PUNCT: dict[str, bool] = {}


@lru_cache(maxsize=1)
def _drop_marks() -> dict[int, None]:
    """str.translate table deleting unicodedata's nonspacing marks (category Mn)."""
    return {c: None for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) == "Mn"}


def _is_punct(w: str) -> bool:
    """spaCy's is_punct: every character in a Unicode P* category."""
    p = _IS_PUNCT.get(w)
    if p is None:
        p = _IS_PUNCT[w] = all(unicodedata.category(c)[0] == "P" for c in w)
    return p


def _spans_and_words(text: str) -> tuple[list[tuple[int, int]], int]:
    """spaCy's sentence spans of `text` (start, end characters) and its word count."""
    if not text:
        return [], 0
    words = tokenize(text)  # spaCy's tokens without the whitespace ones; they tile each chunk
    spans: list[tuple[int, int]] = []
    start = last_end = pos = wi = 0
    seen_end = False
    for k, part in enumerate(_WS_RUNS.split(text)):
        if k & 1:  # a whitespace run: after a token, its first space belongs to that token
            end = pos + len(part)
            s = pos + 1 if pos and part[0] == " " else pos
            if s < end:  # a whitespace token: not punctuation, so it can start a sentence
                if seen_end:
                    spans.append((start, last_end))
                    start, seen_end = s, False
                last_end = end
            pos = end
        elif part:
            end = pos + len(part)
            while pos < end:
                w = words[wi]
                wi += 1
                if w in SENT_END:
                    seen_end = True
                elif seen_end and not _is_punct(w):
                    spans.append((start, last_end))
                    start, seen_end = pos, False
                pos += len(w)
                last_end = pos
    spans.append((start, last_end))
    return spans, len(words)


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """[start, end) characters of each sentence of `text`, as datatrove's span_tokenize gives them
    for English (spaCy's sentencizer): whitespace between sentences is in no span, except a
    whitespace token that starts a sentence; the last span ends at the last token."""
    return _spans_and_words(text)[0]


@lru_cache(maxsize=1 << 16)
def simplify(sentence: str) -> str:
    """datatrove's simplify_text with its default TextNormConfig."""
    s = _NUMBERS.sub("0", sentence.lower()).translate(_PUNCT_TO_SPACE)
    s = _WS.sub(" ", s.strip())
    if not s.isascii():  # NFD of ASCII is itself, with no marks
        s = unicodedata.normalize("NFD", s).translate(_drop_marks())
    return s.strip()


def window_keys(text: str, n_sentences: int) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """(keys, spans): keys[i] (uint64) hashes the window of sentences i .. i+n_sentences-1, i.e.
    spans[i : i+n_sentences] (non-blank sentences are numbered as spans; only the last span can be
    blank); SKIP where the window's simplified text is blank. No window (an empty array) when the
    text has fewer than n_sentences non-blank sentences. spans: sentence_spans(text)."""
    spans = sentence_spans(text)
    sents = [simplify(t) for s, e in spans if (t := text[s:e].strip())]
    n_windows = len(sents) - n_sentences + 1
    if n_windows <= 0:
        return np.zeros(0, np.uint64), spans
    keys = []
    for i in range(n_windows):
        w = " ".join(sents[i : i + n_sentences])
        keys.append((h64(w) or 1) if w.strip() else SKIP)
    return np.array(keys, dtype=np.uint64), spans


def duplicate_windows(keys: np.ndarray, docs: np.ndarray) -> np.ndarray:
    """True for every window whose key occurred before: in a document with a smaller number, or
    earlier in the same document (datatrove marks every occurrence but the first). A document's
    windows must appear in `keys` in window order; documents may come in any order. SKIP keys are
    never duplicates. One stable sort by (key, document): O(n log n), millions of windows at once."""
    keys = np.asarray(keys, dtype=np.uint64)
    dup = np.zeros(len(keys), dtype=bool)
    if len(keys) < 2:
        return dup
    order = np.lexsort((np.asarray(docs), keys))  # stable: equal (key, doc) keep window order
    k = keys[order]
    dup[order[1:]] = k[1:] == k[:-1]
    dup &= keys != SKIP
    return dup


def removed_char_spans(text: str, spans: list[tuple[int, int]], dup_window_mask, n_sentences: int) -> list[tuple[int, int]]:
    """Sorted, merged [start, end) character ranges whose removal turns `text` into the text
    datatrove's SentenceDedupFilter outputs: each sentence in a duplicate window with the whitespace
    before it, the leading whitespace of what is left (lstrip), and whatever follows the last
    sentence. Nothing when no window is a duplicate (datatrove leaves such a text untouched)."""
    mask = np.asarray(dup_window_mask, dtype=bool)
    if not mask.any():
        return []
    drop = np.zeros(len(spans) + n_sentences, dtype=bool)
    for i in np.flatnonzero(mask).tolist():
        drop[i : i + n_sentences] = True
    cut: list[tuple[int, int]] = []
    prev, leading = 0, True
    for idx, (_, e) in enumerate(spans):
        a, prev = prev, e  # a sentence's piece starts where the one before it ended
        if drop[idx]:
            cut.append((a, e))
        elif leading:
            piece = text[a:e]
            ws = len(piece) - len(piece.lstrip())
            if ws:
                cut.append((a, a + ws))
            leading = ws == len(piece)
    cut.append((prev, len(text)))
    merged: list[tuple[int, int]] = []
    for s, e in cut:
        if s >= e:
            continue
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(e, merged[-1][1]))
        else:
            merged.append((s, e))
    return merged


def cut(text: str, ranges: list[tuple[int, int]]) -> str:
    """`text` without the (sorted, disjoint) character ranges."""
    out, pos = [], 0
    for s, e in ranges:
        out.append(text[pos:s])
        pos = e
    out.append(text[pos:])
    return "".join(out)


def word_count(text: str) -> int:
    """Words as datatrove's min_doc_words counts them: spaCy's tokens, whitespace tokens left out."""
    return len(tokenize(text)) if text else 0


def keep_document(text: str, new_text: str, min_doc_words: int = 50, min_num_sentences: int = 3) -> bool:
    """datatrove's SentenceDedupFilter decision: an unchanged document is kept unless it is empty; a
    cut one needs a non-empty text with >= min_doc_words words and >= min_num_sentences sentences
    (either check off when <= 0)."""
    if not new_text:
        return False
    if new_text == text:
        return True
    spans, words = _spans_and_words(new_text)
    return (min_doc_words <= 0 or words >= min_doc_words) and (min_num_sentences <= 0 or len(spans) >= min_num_sentences)


def dedup_texts(texts: list[str], n_sentences: int = 3, min_doc_words: int = 50, min_num_sentences: int = 3) -> list[str | None]:
    """The whole method in memory, documents numbered in list order: each text as it comes out,
    or None where it is dropped (the reference the tests and the benchmark hold the stage to)."""
    windows = [window_keys(t, n_sentences) for t in texts]
    keys = [k for k, _ in windows]
    docs = [np.full(len(k), d, dtype=np.int64) for d, k in enumerate(keys)]
    dup = duplicate_windows(np.concatenate(keys or [np.zeros(0, np.uint64)]), np.concatenate(docs or [np.zeros(0, np.int64)]))
    out: list[str | None] = []
    lo = 0
    for text, (k, spans) in zip(texts, windows):
        new = cut(text, removed_char_spans(text, spans, dup[lo : lo + len(k)], n_sentences))
        lo += len(k)
        out.append(new if keep_document(text, new, min_doc_words, min_num_sentences) else None)
    return out
