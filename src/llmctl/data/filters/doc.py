"""One document as the filter steps see it: the text split once, shared by every step.

datatrove re-tokenizes the text in each filter; here lines, paragraphs and words are computed
lazily, once per version of the text, and reused by every step that asks (a step that rewrites
the text, like C4's line cleaning, starts a new version).

Words come from `tokenize`, which follows the English spaCy tokenizer (the one datatrove uses)
on its main decisions, at about 7x its speed: split on whitespace; peel opening punctuation off
the front and closing punctuation, contractions ('s, n't, 're ...) and sentence periods off the
back; split hyphens and slashes inside words; keep URLs, numbers like 3.5 and 1,000, single
letters with a period and listed abbreviations (U.S., e.g., Dr.) whole. On the 452 pages of
pages-a.warc.gz it gives the same token count to 0.02%; it lacks spaCy's emoticon and unit
lists, so "):" or "80TB" come out split differently. Scripts written without spaces (Chinese,
Japanese, Thai) give one word per whitespace-separated run, as spaCy's English tokenizer does.
"""

from __future__ import annotations

import re
import string
import unicodedata
from functools import cached_property

import regex

# Unicode's Sentence_Terminal property: the characters that end a sentence in any script
# (the set datatrove's TERMINAL_PUNCTUATION was built from).
_TERMINAL = regex.compile(r"\p{Sentence_Terminal}")
_TERMINAL_CACHE: dict[str, bool] = {}
_PARAGRAPH = re.compile(r"\n{2,}")
_LINES = re.compile(r"\n+")


def is_punct_char(c: str) -> bool:
    """ASCII punctuation, Unicode punctuation (P*) and control characters; not symbols such as
    €, ©, ° or emoji, which datatrove's punctuation set also leaves out (they count as words)."""
    return c in string.punctuation or unicodedata.category(c)[0] == "P" or unicodedata.category(c) in ("Cc", "Zs")


_PUNCT_CACHE: dict[str, bool] = {}


def is_terminal(c: str) -> bool:
    """Is `c` (one character) sentence-final punctuation?"""
    t = _TERMINAL_CACHE.get(c)
    if t is None:
        t = _TERMINAL_CACHE[c] = len(c) == 1 and _TERMINAL.match(c) is not None
    return t


def is_symbol_word(w: str) -> bool:
    """True when every character is punctuation ('...', '#', '--')."""
    for c in w:
        p = _PUNCT_CACHE.get(c)
        if p is None:
            p = _PUNCT_CACHE[c] = is_punct_char(c) or c == "_"
        if not p:
            return False
    return True


_PREFIX = frozenset("\"'([{“‘”’«»¿¡$£€¥#*&<~`„‚§,（【「『《〈")
_SUFFIX = frozenset(",;:!?)]}\"'”’‘»%“）】」』》〉™°。！？।")
_INFIX = re.compile(
    r"(?<=[^\W_])(?:-|–|—|/|:|=|<|>)(?=[^\W\d_])"  # well-known, and/or between letters
    r"|(?<=[^\W\d_]),(?=[^\W\d_])"  # a,b
    r"|(?<=\d)[-+*^](?=[\d-])"  # 5-8, 2+2
    r"|(?<=[a-z]\.)(?=[A-Z])"  # z.B. -> z. B. (the period stays on the left)
    r"|(?<=[<>=])(?=[<>=])"  # >>> and => come apart, one character each
    r"|\.{2,}|…"
)
_ONLY_DOTS = re.compile(r"^\.+$")
_DOTS_START = re.compile(r"^\.{3,}(?=[^.])")
_DOTS_END = re.compile(r"(?<=[^.])\.{2,}$")
_URL = re.compile(r"^(?:https?://|www\.)\S+|^\S+\.(?:com|org|net|edu|gov|io|de|uk|fr)(?:/\S*)?$", re.I)
_KEEP_PERIOD = re.compile(
    r"^[^\W\d_]\.$|^(?:[A-Z]\.)+$"  # z.  U.S.
    r"|^(?:Dr|Mr|Mrs|Ms|St|Prof|Jr|Sr|vs|Inc|Ltd|Co|Corp|Mt|Gen|Gov|Sen|Rep|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec|e\.g|i\.e|a\.m|p\.m)\.$"
)
_CONTRACTION = re.compile(r"(?i)(?<=\w)(?:['’](?:s|m|re|ve|ll|d)|n['’]t)$")
_UNIT = re.compile(r"(?<=\d)(?:km|cm|mm|m|kg|mg|g|lbs?|TB|GB|MB|KB|kB|mph|ms|min|h)$")
# spaCy's exceptions for contractions written without an apostrophe
_SPECIAL = {
    "im": ["i", "m"], "Im": ["I", "m"], "cannot": ["can", "not"], "Cannot": ["Can", "not"],
    "dont": ["do", "nt"], "Dont": ["Do", "nt"], "doesnt": ["does", "nt"], "didnt": ["did", "nt"],
    "isnt": ["is", "nt"], "wasnt": ["was", "nt"], "cant": ["ca", "nt"], "wont": ["wo", "nt"],
    "youre": ["you", "re"], "Ive": ["I", "ve"], "ive": ["i", "ve"], "thats": ["that", "s"],
    "can't": ["ca", "n't"], "won't": ["wo", "n't"], "Can't": ["Ca", "n't"], "Won't": ["Wo", "n't"],
}  # fmt: skip


def _split_period(chunk: str) -> bool:
    """spaCy splits a final period after a lower-case letter, a digit, punctuation or two capitals."""
    if _KEEP_PERIOD.match(chunk):
        return False
    c = chunk[-2]
    # lower-case and caseless letters (Arabic, Hebrew, Bengali ...) alike
    return (c.isalpha() and not c.isupper()) or c.isdigit() or not c.isalnum() or (len(chunk) > 2 and c.isupper() and chunk[-3].isupper())


def tokenize(text: str) -> list[str]:
    """Words and punctuation tokens of `text` (see the module docstring)."""
    out: list[str] = []
    for chunk in text.split():
        pre: list[str] = []
        suf: list[str] = []
        url = False
        while len(chunk) > 1:
            if _ONLY_DOTS.match(chunk):  # "..." or "...." stands alone as one token
                break
            if _URL.match(chunk):
                url = True
                while chunk and chunk[-1] in ".,;:!?)\"'":
                    suf.append(chunk[-1])
                    chunk = chunk[:-1]
                break
            if chunk in _SPECIAL:
                first, *rest = _SPECIAL[chunk]
                suf.extend(reversed(rest))
                chunk = first
                break
            if chunk[0] in _PREFIX:
                pre.append(chunk[0])
                chunk = chunk[1:]
            elif m := _DOTS_START.match(chunk):
                pre.append(m.group(0))
                chunk = chunk[m.end() :]
            elif m := _DOTS_END.search(chunk):
                suf.append(m.group(0))
                chunk = chunk[: m.start()]
            elif chunk[-1] in _SUFFIX:
                suf.append(chunk[-1])
                chunk = chunk[:-1]
            elif chunk[-1] == "." and _split_period(chunk):
                suf.append(".")
                chunk = chunk[:-1]
            elif m := (_CONTRACTION.search(chunk) or _UNIT.search(chunk)):
                suf.append(m.group(0))
                chunk = chunk[: m.start()]
            else:
                break
        out.extend(pre)
        if url:
            out.append(chunk)
        elif chunk:
            pos = 0
            for m in _INFIX.finditer(chunk):
                if m.start() > pos:
                    out.append(chunk[pos : m.start()])
                if m.group(0):  # zero-width splits add no token of their own
                    out.append(m.group(0))
                pos = m.end()
            if pos < len(chunk):
                out.append(chunk[pos:])
        out.extend(reversed(suf))
    return out


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
