"""Gopher's repetition and quality rules (Rae et al. 2021, Table A1; spec 001-data-eval §A3).

Thresholds are the published ones, as datatrove ships them; the statistics are computed the way
datatrove computes them, so decisions agree document by document (benchmarks/filter.py).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from llmctl.data.filters.base import Step, ratio
from llmctl.data.filters.doc import Doc, is_symbol_word

STOP_WORDS = ["the", "be", "to", "of", "and", "that", "have", "with"]  # Gopher's list


def duplicates(items: list[str]) -> tuple[int, int]:
    """(number of items seen before, their total characters)."""
    seen: set[str] = set()
    n = chars = 0
    for x in items:
        if x in seen:
            n += 1
            chars += len(x)
        else:
            seen.add(x)
    return n, chars


def top_ngram_chars(words: list[str], n: int) -> int:
    """Characters covered by the most frequent word n-gram: len(n-gram) x its count."""
    grams = Counter(" ".join(words[i : i + n]) for i in range(len(words) - n + 1))
    if not grams:
        return 0
    gram, count = grams.most_common(1)[0]
    return len(gram) * count


def duplicated_ngram_chars(words: list[str], n: int) -> int:
    """Characters in n-grams that repeat an earlier one, without counting overlaps twice
    (after a repeat the scan jumps n words, as in Gopher and datatrove)."""
    seen: set[str] = set()
    chars, i, end = 0, 0, len(words) - n + 1
    while i < end:
        gram = "".join(words[i : i + n])
        if gram in seen:
            chars += len(gram)
            i += n
        else:
            seen.add(gram)
            i += 1
    return chars


@dataclass
class GopherRepetition(Step):
    name = "gopher_repetition"
    dup_line_frac: float = 0.3
    dup_para_frac: float = 0.3
    dup_line_char_frac: float = 0.2
    dup_para_char_frac: float = 0.2
    top_n_grams: list = field(default_factory=lambda: [[2, 0.20], [3, 0.18], [4, 0.16]])
    dup_n_grams: list = field(default_factory=lambda: [[5, 0.15], [6, 0.14], [7, 0.13], [8, 0.12], [9, 0.11], [10, 0.10]])

    def checks(self, doc: Doc):
        text_len = len(doc.text)
        yield "empty", float(text_len == 0), text_len > 0
        paras = doc.paragraphs
        n, chars = duplicates(paras)
        yield "dup_para_frac", ratio(n, len(paras)), ratio(n, len(paras)) <= self.dup_para_frac
        yield "dup_para_char_frac", ratio(chars, text_len), ratio(chars, text_len) <= self.dup_para_char_frac
        lines = doc.newline_lines
        n, chars = duplicates(lines)
        yield "dup_line_frac", ratio(n, len(lines)), ratio(n, len(lines)) <= self.dup_line_frac
        yield "dup_line_char_frac", ratio(chars, text_len), ratio(chars, text_len) <= self.dup_line_char_frac
        words = doc.words
        for n, frac in self.top_n_grams:
            value = ratio(top_ngram_chars(words, int(n)), text_len)
            yield f"top_{int(n)}_gram", value, value <= frac
        for n, frac in self.dup_n_grams:
            value = ratio(duplicated_ngram_chars(words, int(n)), text_len)
            yield f"dup_{int(n)}_gram", value, value <= frac


@dataclass
class GopherQuality(Step):
    name = "gopher_quality"
    min_doc_words: int = 50
    max_doc_words: int = 100_000
    min_avg_word_length: float = 3.0
    max_avg_word_length: float = 10.0
    max_symbol_word_ratio: float = 0.1
    max_bullet_lines_ratio: float = 0.9
    max_ellipsis_lines_ratio: float = 0.3
    min_alpha_words_ratio: float = 0.8
    min_stop_words: int = 2
    stop_words: list = field(default_factory=lambda: list(STOP_WORDS))

    def checks(self, doc: Doc):
        text, words = doc.text, doc.words
        n_words = len(words)
        content = [w for w in words if not is_symbol_word(w)]
        n = len(content)
        yield "n_words", n, n >= self.min_doc_words
        yield "n_words", n, n <= self.max_doc_words
        avg = ratio(sum(map(len, content)), n)
        yield "avg_word_length", avg, avg >= self.min_avg_word_length
        yield "avg_word_length", avg, avg <= self.max_avg_word_length
        hashes = ratio(text.count("#"), n_words)
        yield "hash_ratio", hashes, hashes <= self.max_symbol_word_ratio
        ellipses = ratio(text.count("...") + text.count("…"), n_words)
        yield "ellipsis_ratio", ellipses, ellipses <= self.max_symbol_word_ratio
        lines = doc.lines
        bullets = ratio(sum(ln.lstrip().startswith(("•", "-")) for ln in lines), len(lines))
        yield "bullet_lines", bullets, bullets <= self.max_bullet_lines_ratio
        trailing = ratio(sum(ln.rstrip().endswith(("...", "…")) for ln in lines), len(lines))
        yield "ellipsis_lines", trailing, trailing <= self.max_ellipsis_lines_ratio
        alpha = ratio(sum(any(c.isalpha() for c in w) for w in words), n_words)
        yield "alpha_words", alpha, alpha >= self.min_alpha_words_ratio
        stops = len(set(self.stop_words).intersection(words))
        yield "stop_words", stops, stops >= self.min_stop_words
