"""The index of eval n-grams, and the lookup of a batch of documents in it (spec 001-data-eval
§A12; the method is GPT-3's word n-gram overlap).

- Words: `decontam_words` — lowercase, accents and punctuation stripped, like dedup's
  `normalized_words`, but digits are KEPT: dedup folds every digit to 0 so that "12 apples" and
  "34 apples" count as the same sentence, which for decontamination would flag every arithmetic
  word problem that shares a template with a test question but has other numbers.
- Hashes: 64-bit word hashes (`llmctl.hashing.h64`, the same in every process), and polynomial
  n-gram hashes with the length folded into the seed, so a 5-word gram and a 13-gram hash apart.
- An item's n-grams are those of all its passages (context n-grams shared by its choices count
  once); passages are never concatenated with each other. A passage with fewer than n words (but
  at least one) becomes ONE gram of all its words, matched against every run of that many words
  in the documents (`item_short`): short questions are not silently skipped.
- `build_index`: the eval n-grams as a sorted array with, for each, the items it comes from;
  `match_docs`: per batch, every window's hash looked up with one `searchsorted`, and the
  (doc, item) pairs where the doc holds at least min(min_overlap, the item's n-gram count)
  distinct n-grams of the item.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import regex

from llmctl.hashing import h64

if TYPE_CHECKING:
    from llmctl.data.decontam.against import EvalTask

# ---------------------------------------------------------------------------------------------
# Words and hashes

_MARKS = regex.compile(r"\p{Mn}+")  # combining marks: the accents NFKD splits off
_PUNCT = re.compile(r"[^\w\s]|_")


def decontam_words(text: str) -> list[str]:
    """The words of `text`: lowercased, accents and punctuation stripped, digits kept."""
    text = text.lower()
    if not text.isascii():  # accents only exist outside ASCII
        text = _MARKS.sub("", unicodedata.normalize("NFKD", text))
    return _PUNCT.sub(" ", text).split()


_P = np.uint64(0x9E3779B97F4A7C15)  # odd, so multiplying by it loses nothing mod 2^64
_WORD_CACHE: dict[str, int] = {}
_CACHE_MAX = 2_000_000


def word_hashes(words: list[str]) -> np.ndarray:
    """Stable 64-bit hashes (the same in every process, unlike hash()), as uint64."""
    cache = _WORD_CACHE
    if len(cache) > _CACHE_MAX:
        cache.clear()
    for w in set(words).difference(cache):
        cache[w] = h64(w)
    return np.fromiter(map(cache.__getitem__, words), dtype=np.uint64, count=len(words))


def _seed(length: int) -> np.uint64:
    return np.uint64((length * 0xC2B2AE3D27D4EB4F + 0x165667B19E3779F9) % (1 << 64))


def window_hashes(w: np.ndarray, length: int) -> np.ndarray:
    """The hash of w[s:s+length] for every s (uint64 arithmetic wraps mod 2^64)."""
    m = len(w) - length + 1
    if m <= 0:
        return np.zeros(0, np.uint64)
    h = np.full(m, _seed(length), dtype=np.uint64)
    for j in range(length):
        h *= _P
        h += w[j : j + m]
    return h


def _concat_words(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(hashes, starts): text i's word hashes are hashes[starts[i]:starts[i + 1]]."""
    words: list[str] = []
    starts = np.zeros(len(texts) + 1, dtype=np.int64)
    for i, t in enumerate(texts):
        ws = decontam_words(t or "")
        words += ws
        starts[i + 1] = starts[i] + len(ws)
    return word_hashes(words), starts


# ---------------------------------------------------------------------------------------------
# The index of eval n-grams


@dataclass
class EvalIndex:
    """keys: sorted unique gram hashes; key_ptr/key_items: the items of key k are
    key_items[key_ptr[k]:key_ptr[k + 1]]; item_task: task number per item; item_grams: distinct
    grams per item; need: grams a doc must share with the item; lengths: gram lengths in use."""

    keys: np.ndarray
    key_ptr: np.ndarray
    key_items: np.ndarray
    item_task: np.ndarray
    item_grams: np.ndarray
    need: np.ndarray
    lengths: np.ndarray
    item_short: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))

    def prefilter(self) -> tuple[np.ndarray, np.uint64]:
        """A table of bools over the top bits of the hashes, true where some key falls: about 32
        slots per key (at most 2^27), so one lookup rejects ~97% of the windows that are no key."""
        if getattr(self, "_table", None) is None:
            bits = int(min(27, max(16, np.ceil(np.log2(max(len(self.keys), 1) * 32)))))
            shift = np.uint64(64 - bits)
            table = np.zeros(1 << bits, dtype=bool)
            table[self.keys >> shift] = True
            self._table = (table, shift)
        return self._table

    def save(self, path: Path) -> None:
        np.savez(path, **{k: getattr(self, k) for k in self.__dataclass_fields__})

    @classmethod
    def load(cls, path: str | Path) -> EvalIndex:
        with np.load(path) as z:
            return cls(**{k: z[k] for k in cls.__dataclass_fields__})


def build_index(tasks: list[EvalTask], ngram: int, min_overlap: int) -> EvalIndex:
    grams, items, item_task, short = [], [], [], []
    lengths = {ngram}  # the n-gram length plus the lengths of short passages
    first_item = 0
    for t_no, task in enumerate(tasks):
        flat = [p for ps in task.passages for p in ps]
        p_item = np.repeat(np.arange(len(task.passages), dtype=np.int64) + first_item, [len(ps) for ps in task.passages])
        w, starts = _concat_words(flat)
        counts = np.diff(starts)
        # full windows that stay inside their passage
        h = window_hashes(w, ngram)
        if len(h):
            ends = np.repeat(starts[1:], counts)[: len(h)]
            ok = np.arange(len(h)) + ngram <= ends
            grams.append(h[ok])
            items.append(np.repeat(p_item, counts)[: len(h)][ok])
        # short passages: one gram of all their words
        is_short = (counts > 0) & (counts < ngram)
        short_lengths = np.unique(counts[is_short]).tolist()
        lengths.update(short_lengths)
        for length in short_lengths:
            ps = np.flatnonzero(is_short & (counts == length))
            grams.append(window_hashes(w, length)[starts[ps]])
            items.append(p_item[ps])
        item_short = np.zeros(len(task.passages), bool)
        item_short[p_item[is_short] - first_item] = True
        short.append(item_short)
        item_task.append(np.full(len(task.passages), t_no, np.int32))
        first_item += len(task.passages)
    g = np.concatenate(grams) if grams else np.zeros(0, np.uint64)
    it = np.concatenate(items) if items else np.zeros(0, np.int64)
    pairs = np.unique(np.stack([g, it.astype(np.uint64)], axis=1), axis=0) if len(g) else np.zeros((0, 2), np.uint64)
    keys, key_start = np.unique(pairs[:, 0], return_index=True)
    key_ptr = np.append(key_start, len(pairs)).astype(np.int64)
    key_items = pairs[:, 1].astype(np.int64)
    item_grams = np.bincount(key_items, minlength=first_item).astype(np.int64)
    return EvalIndex(
        keys=keys.astype(np.uint64),
        key_ptr=key_ptr,
        key_items=key_items,
        item_task=np.concatenate(item_task) if item_task else np.zeros(0, np.int32),
        item_grams=item_grams,
        need=np.minimum(item_grams, min_overlap),
        lengths=np.array(sorted(lengths), dtype=np.int64),
        item_short=np.concatenate(short) if short else np.zeros(0, bool),
    )


def match_docs(index: EvalIndex, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The eval grams and items each text holds.

    Returns (gram_doc, gram_key, item_doc, item): distinct (doc, n-gram number) pairs found, and
    the (doc, item) pairs where the doc holds at least `need` of the item's grams."""
    empty = np.zeros(0, np.int64)
    if not len(index.keys) or not texts:
        return empty, empty, empty, empty
    w, starts = _concat_words(texts)
    counts = np.diff(starts)
    doc_of = np.repeat(np.arange(len(texts), dtype=np.int64), counts)
    end_of = np.repeat(starts[1:], counts)
    docs, keys = [], []
    last = len(index.keys) - 1
    table, shift = index.prefilter()
    for length in index.lengths.tolist():
        h = window_hashes(w, length)
        if not len(h):
            continue
        s = np.flatnonzero(table[h >> shift])  # one lookup rules out almost every window
        pos = np.minimum(np.searchsorted(index.keys, h[s]), last)
        found = index.keys[pos] == h[s]
        s, pos = s[found], pos[found]
        inside = s + length <= end_of[s]  # the window stays inside its document
        docs.append(doc_of[s[inside]])
        keys.append(pos[inside])
    if not docs or not sum(len(d) for d in docs):
        return empty, empty, empty, empty
    combined = np.unique(np.concatenate(docs) * len(index.keys) + np.concatenate(keys))
    gram_doc, gram_key = combined // len(index.keys), combined % len(index.keys)
    # each (doc, gram) pair -> (doc, item) for every item the gram belongs to
    lo, hi = index.key_ptr[gram_key], index.key_ptr[gram_key + 1]
    n = hi - lo
    offsets = np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)
    items = index.key_items[np.repeat(lo, n) + offsets]
    n_items = len(index.item_task)
    pair, held = np.unique(np.repeat(gram_doc, n) * n_items + items, return_counts=True)
    item_doc, item = pair // n_items, pair % n_items
    hit = held >= index.need[item]
    return gram_doc, gram_key, item_doc[hit], item[hit]


__all__ = ["decontam_words", "word_hashes", "window_hashes", "EvalIndex", "build_index", "match_docs"]
