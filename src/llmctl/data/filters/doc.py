"""One document as the filter steps see it: the text split once, shared by every step.

datatrove re-tokenizes the text in each filter; here lines, paragraphs and words are computed
lazily, once per version of the text, and reused by every step that asks (a step that rewrites
the text, like C4's line cleaning, starts a new version).

Words come from `tokenize`, which is spaCy's tokenizer algorithm (the one datatrove's Gopher and
FineWeb filters run, through spacy.blank("en")) in plain Python over spaCy's own English rules,
exported to `spacy_en` by examples/make_spacy_rules.py: split on whitespace; peel prefixes and
suffixes off each chunk until a special case (U.S., e.g., :), don't, °C.) or nothing is left;
keep URLs whole; split the rest on infixes; then merge token runs that spell a special case the
affix rules split ("8):" -> "8", "):"; a run across one space merges nothing but, as in
spaCy's matcher, blocks the runs it overlaps).
spaCy itself is not a dependency of the product, and this keeps the filters' word counts equal to
datatrove's: on the 452 documents of pages-a.warc.gz every document splits into exactly spaCy's
tokens (tests/test_word_split.py checks fuzzed strings against spaCy where it is installed).
Chunks repeat (Zipf), so each chunk's affix split is cached, as spaCy caches it; on pages-a's
texts this runs about 4x faster than datatrove's spaCy call.
"""

from __future__ import annotations

import re
import unicodedata
from functools import cached_property, lru_cache

import regex

from llmctl.data.filters import spacy_en

# Unicode's Sentence_Terminal property: the characters that end a sentence in any script
# (the set datatrove's TERMINAL_PUNCTUATION was built from).
_TERMINAL = regex.compile(r"\p{Sentence_Terminal}")
_TERMINAL_CACHE: dict[str, bool] = {}
_PARAGRAPH = re.compile(r"\n{2,}")
_LINES = re.compile(r"\n+")


# Gopher's "symbol words" as datatrove counts them: words made only of its PUNCTUATION_SET
# (datatrove/utils/text.py, 0.10.1): a hand-picked PUNCTUATION string, the control characters but
# tab and newline, and its TERMINAL_PUNCTUATION list. Copied, not derived from Unicode categories:
# it holds "１" and "►" and lacks "‘", "‚", "¿", "§" and "•", which decided the word count and mean
# word length of 68 of pages-a's 452 documents.
_DATATROVE_PUNCTUATION = frozenset(
    '!/—”:％１〈&(、━\\【#%「」，】；+^]~“《„\';’{|∶´[=-`*．（–？！：$～«〉,><》)?）。…@_."}►»'
    + "".join(chr(x) for a, b in ((0, 9), (11, 13), (13, 32), (127, 160)) for x in range(a, b))
    + '!.?։؝؞؟۔܀܁܂߹࠷࠹࠽࠾।॥၊။።፧፨᙮᜵᜶។៕៖៙៚᠃᠉᥄᥅᪨᪩᪪᪫᭚᭛᭞᭟᭽᭾᰻᰼᱾᱿‼‽⁇⁈⁉⸮⸼⹓⹔。꓿꘎꘏꛳꛷꡶꡷꣎꣏꤯꧈꧉꩝꩞꩟꫰꫱꯫﹒﹖﹗！．？｡𐩖𐩗𐽕𐽖𐽗𐽘𐽙𐾆𐾇𐾈𐾉𑁇𑁈𑂾𑂿𑃀𑃁𑅁𑅂𑅃𑇅𑇆𑇍𑇞𑇟𑈸𑈹𑈻𑈼𑊩𑑋𑑌𑗂𑗃𑗉𑗊𑗋𑗌𑗍𑗎𑗏𑗐𑗑𑗒𑗓𑗔𑗕𑗖𑗗𑙁𑙂𑜼𑜽𑜾𑥄𑥆𑩂𑩃𑪛𑪜𑱁𑱂𑻷𑻸\U00011f43\U00011f44𖩮𖩯𖫵𖬷𖬸𖭄𖺘𛲟𝪈'
)


def is_terminal(c: str) -> bool:
    """Is `c` (one character) sentence-final punctuation?"""
    t = _TERMINAL_CACHE.get(c)
    if t is None:
        t = _TERMINAL_CACHE[c] = len(c) == 1 and _TERMINAL.match(c) is not None
    return t


def is_symbol_word(w: str) -> bool:
    """True when every character is in datatrove's punctuation set ('...', '#', '--')."""
    return all(c in _DATATROVE_PUNCTUATION for c in w)


_prefix_search = re.compile(spacy_en.PREFIX).search
_suffix_search = re.compile(spacy_en.SUFFIX).search
_infix_finditer = re.compile(spacy_en.INFIX).finditer
_url_match = re.compile(spacy_en.URL).match
_SPECIALS = spacy_en.SPECIAL_CASES


def _split_affixes(chunk: str, specials: bool) -> tuple[list[str], str, list[str]]:
    """spaCy's Tokenizer._split_affixes: peel prefixes and suffixes off until none is left or
    what is left is a special case."""
    prefixes: list[str] = []
    suffixes: list[str] = []
    last = -1
    while chunk and len(chunk) != last:
        if specials and chunk in _SPECIALS:
            break
        last = len(chunk)
        m = _prefix_search(chunk)
        pre = m.end() - m.start() if m else 0
        if pre:
            minus_pre = chunk[pre:]
            if minus_pre and specials and minus_pre in _SPECIALS:
                prefixes.append(chunk[:pre])
                chunk = minus_pre
                break
        m = _suffix_search(chunk[pre:])
        suf = m.end() - m.start() if m else 0
        if suf:
            minus_suf = chunk[:-suf]
            if minus_suf and specials and minus_suf in _SPECIALS:
                suffixes.append(chunk[-suf:])
                chunk = minus_suf
                break
        if pre and suf and pre + suf <= len(chunk):
            prefixes.append(chunk[:pre])
            suffixes.append(chunk[-suf:])
            chunk = chunk[pre:-suf]
        elif pre:
            prefixes.append(chunk[:pre])
            chunk = chunk[pre:]
        elif suf:
            suffixes.append(chunk[-suf:])
            chunk = chunk[:-suf]
    return prefixes, chunk, suffixes


def _affix_tokens(chunk: str, specials: bool) -> list[str]:
    """spaCy's Tokenizer._tokenize for one whitespace-free chunk: affixes, then a special case, a
    URL, or infix splits of what is left."""
    prefixes, chunk, suffixes = _split_affixes(chunk, specials)
    out = prefixes
    if chunk:
        if specials and chunk in _SPECIALS:
            out.extend(_SPECIALS[chunk])
        elif _url_match(chunk):
            out.append(chunk)
        else:
            start = 0
            for m in _infix_finditer(chunk):
                if m.start() == 0:  # spaCy skips an infix at the very start
                    continue
                if m.start() != start:
                    out.append(chunk[start : m.start()])
                if m.start() != m.end():  # zero-width infixes split without a token of their own
                    out.append(m.group())
                start = m.end()
            if chunk[start:]:
                out.append(chunk[start:])
    out.extend(reversed(suffixes))
    return out


def _special_patterns() -> dict[tuple[str, ...], str]:
    """spaCy's special-case matcher: a special case that the affix rules would split (':)' from
    '8):' becomes ')', ':') is found again among a chunk's tokens and merged back."""
    patterns = {}
    for key in _SPECIALS:
        if _prefix_search(key) or _suffix_search(key) or next(_infix_finditer(key), None):
            patterns[tuple(_affix_tokens(key, False))] = key
    return patterns


_SPECIAL_PATTERNS = _special_patterns()
# first token -> the lengths of the patterns that start with it
_SPECIAL_FIRST = {first: sorted({len(p) for p in _SPECIAL_PATTERNS if p[0] == first}) for first in {p[0] for p in _SPECIAL_PATTERNS}}
_WHITESPACE = re.compile(r"(\s+)")  # str.isspace() whitespace, as spaCy splits on


def _apply_special_cases(tokens: list[str | None], chunk_starts: set[int]) -> list[str]:
    """spaCy's Tokenizer._apply_special_cases. `tokens` holds None where whitespace other than one
    space separates chunks (spaCy keeps a whitespace token there, which no pattern matches);
    `chunk_starts` marks tokens that follow a single space. Matches are taken longest first, then
    leftmost; one is kept when its first and last tokens are not part of a match taken before.
    A match across a space spells no special case, so it changes nothing, but it still blocks the
    matches it overlaps, as in spaCy."""
    n_tokens = len(tokens)
    matches = [
        (n, i)
        for i, tok in enumerate(tokens)
        if tok in _SPECIAL_FIRST
        for n in _SPECIAL_FIRST[tok]
        if i + n <= n_tokens and tuple(tokens[i : i + n]) in _SPECIAL_PATTERNS
    ]
    if not matches:
        return [t for t in tokens if t is not None]
    seen: set[int] = set()
    kept = {}
    for n, i in sorted(matches, key=lambda m: (-m[0], m[1])):
        if i not in seen and i + n - 1 not in seen and not any(j in chunk_starts for j in range(i + 1, i + n)):
            kept[i] = n
        seen.update(range(i, i + n))
    out: list[str] = []
    i = 0
    while i < n_tokens:
        if i in kept:
            out.extend(_SPECIALS["".join(tokens[i : i + kept[i]])])
            i += kept[i]
        else:
            if tokens[i] is not None:
                out.append(tokens[i])
            i += 1
    return out


@lru_cache(maxsize=1 << 16)
def _chunk_tokens(chunk: str) -> tuple[str, ...]:
    if chunk in _SPECIALS:
        return _SPECIALS[chunk]
    return tuple(_affix_tokens(chunk, True))


def tokenize(text: str) -> list[str]:
    """Words and punctuation tokens of `text`, as datatrove's English word tokenizer gives them
    (spaCy's tokens, whitespace tokens dropped; see the module docstring)."""
    tokens: list[str | None] = []
    chunk_starts: set[int] = set()
    parts = _WHITESPACE.split(text)  # chunk, separator, chunk, ... (the first and last may be "")
    for k in range(0, len(parts), 2):
        if k:
            if parts[k - 1] == " ":
                chunk_starts.add(len(tokens))
            else:
                tokens.append(None)
        if chunk := parts[k]:
            tokens.extend(_chunk_tokens(chunk))
    return _apply_special_cases(tokens, chunk_starts)


class Doc:
    """A document's text and row, with lazily computed views of the text."""

    __slots__ = ("row", "text", "__dict__")

    def __init__(self, text: str, row: dict | None = None):
        self.row = row or {}
        self.text = text or ""

    def replace_text(self, text: str) -> None:
        """A step rewrote the text: later steps see the new text and fresh views."""
        self.text = text
        self.__dict__.clear()

    @cached_property
    def words(self) -> list[str]:
        return tokenize(self.text)

    @cached_property
    def lines(self) -> list[str]:
        """str.splitlines(): every line, empty ones too (Gopher's and C4's view)."""
        return self.text.splitlines()

    @cached_property
    def newline_lines(self) -> list[str]:
        """Lines split on runs of newlines (Gopher repetition's view)."""
        return _LINES.split(self.text)

    @cached_property
    def nonblank_lines(self) -> list[str]:
        """Lines split on '\\n' without the blank ones (FineWeb's view)."""
        return [ln for ln in self.text.split("\n") if ln.strip()]

    @cached_property
    def paragraphs(self) -> list[str]:
        return _PARAGRAPH.split(self.text.strip())


def sentence_count(words: list[str]) -> int:
    """Sentences in a run of words, as spaCy's sentencizer counts them: a new sentence starts at
    any word that is not all punctuation (symbols and emoji do start one) after a sentence end."""
    if not words:
        return 0
    n, seen_end = 1, False
    for w in words:
        if len(w) == 1 and is_terminal(w):
            seen_end = True
        elif seen_end and not all(unicodedata.category(c)[0] == "P" for c in w):  # spaCy's is_punct
            n += 1
            seen_end = False
    return n
