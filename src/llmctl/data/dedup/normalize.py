"""Normalization before hashing, so trivial differences do not hide duplicates (spec
001-data-eval §A5: "normalize first (lowercase, strip punctuation and accents) to raise recall").

`normalized_words` is the definition, one document at a time. `normalized_codes` gives the same
words for a whole batch of documents as one array of code points, which the MinHash stage hashes
with numpy; it is what the dedup stage runs, and tests/test_dedup.py checks it against the
definition."""

from __future__ import annotations

import re
import unicodedata

import numpy as np
import regex
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

_MARKS = regex.compile(r"\p{Mn}+")  # combining marks: the accents NFKD splits off
_PUNCT = re.compile(r"[^\w\s]|_")
_DIGITS = re.compile(r"\d")
# query parameters that say where a click came from, not which page it is
TRACKING = re.compile(r"^(utm_\w+|fbclid|gclid|dclid|msclkid|mc_cid|mc_eid|yclid|igshid|_hsenc|_hsmi|ref|ref_src|spm)$", re.I)
DEFAULT_PORTS = {"http": 80, "https": 443}


def normalized_words(text: str) -> list[str]:
    """The words of the text lowercased, accents and punctuation stripped, digits folded to 0."""
    text = text.lower()
    if not text.isascii():  # accents only exist outside ASCII; skip the slow path for the rest
        text = _MARKS.sub("", unicodedata.normalize("NFKD", text))
    return _DIGITS.sub("0", _PUNCT.sub(" ", text)).split()


# The batch path maps each character on its own through the steps of normalized_words, with one
# table lookup in numpy. That is exact wherever those steps act on one character at a time, which
# they do but for the few characters that _char_code sends to the per-document path (_SLOW).
_SLOW = 0xFFFFFFFF
_SPLICE = 0xFFFFFFFE  # the character becomes several characters, or none: see _EXPANSIONS
_UNSEEN = 0xFFFFFFFD
_TABLE = np.full(0x110000, _UNSEEN, dtype=np.uint32)  # code point -> its code, filled as first seen
_EXPANSIONS: dict[int, np.ndarray] = {}


def _char_code(c: str) -> int | list[int]:
    """What normalized_words makes of the character c on its own, as codes (0 for a word break):
    one code, a list of them (™ -> T M, ½ -> 0 0 0, a stripped combining mark -> none), or _SLOW
    where one character does not tell: Σ (lower() gives ς or σ by its neighbours) and marks that
    survive the stripping (NFKD may reorder them with their neighbours)."""
    if c == "\u03a3":
        return _SLOW
    low = c.lower()
    if not low.isascii():
        low = unicodedata.normalize("NFKD", low)
    if any(unicodedata.combining(x) and unicodedata.category(x) != "Mn" for x in low):
        return _SLOW
    out = _DIGITS.sub("0", _PUNCT.sub(" ", _MARKS.sub("", low)))
    if out and out.isspace():
        return 0  # a run of breaks is one break
    codes = [0 if x.isspace() else ord(x) for x in out]
    return codes[0] if len(codes) == 1 else codes


def _learn(cps: np.ndarray) -> None:
    for cp in np.unique(cps).tolist():
        code = _char_code(chr(cp))
        if isinstance(code, list):
            _EXPANSIONS[cp], code = np.array(code, dtype=np.uint32), _SPLICE
        _TABLE[cp] = code


def _codes_of_chars(cps: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Writes each code point's code into out; returns the positions of _SLOW and _SPLICE ones."""
    np.take(_TABLE, cps, out=out)
    odd = np.flatnonzero(out >= _UNSEEN)
    unseen = odd[out[odd] == _UNSEEN]
    if len(unseen):
        _learn(cps[unseen])
        out[unseen] = _TABLE[cps[unseen]]
        odd = odd[out[odd] >= _SPLICE]
    return odd


def _utf32(text: str) -> np.ndarray:
    # surrogatepass: a lone surrogate (undecodable bytes, escaped) stays one code point
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


def _reference_codes(text: str) -> np.ndarray:
    codes = _utf32(" ".join(normalized_words(text)) + " ").copy()
    codes[codes == ord(" ")] = 0
    return codes


def normalized_codes(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(codes, starts): the normalized texts as uint32 code points, 0 between words. Document i
    is codes[starts[i]:starts[i + 1]] and ends with a 0; splitting it at the 0s gives exactly
    normalized_words(texts[i])."""
    starts = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)) + 1, out=starts[1:])
    codes = np.zeros(starts[-1], dtype=np.uint32)  # the last 0 closes the last document
    cps = _utf32(" ".join(texts))  # " " -> 0 closes the others
    odd = _codes_of_chars(cps, codes[:-1])
    if len(odd) == 0:
        return codes, starts
    return _splice(codes, starts, _replacements(texts, cps, codes, starts, odd))


def _replacements(texts, cps, codes, starts, odd) -> list[tuple[int, int, np.ndarray]]:
    """(lo, hi, new codes for codes[lo:hi]), in order: a document with a _SLOW character whole,
    through normalized_words; elsewhere each _SPLICE character by its expansion."""
    docs = np.searchsorted(starts, odd, side="right") - 1
    slow = set(docs[codes[odd] == _SLOW].tolist())
    out, done = [], -1
    for p, d in zip(odd.tolist(), docs.tolist()):
        if d not in slow:
            out.append((p, p + 1, _EXPANSIONS[int(cps[p])]))
        elif d != done:
            out.append((int(starts[d]), int(starts[d + 1]), _reference_codes(texts[d])))
            done = d
    return out


def _splice(codes, starts, replacements) -> tuple[np.ndarray, np.ndarray]:
    pieces, prev = [], 0
    for lo, hi, new in replacements:
        pieces += [codes[prev:lo], new]
        prev = hi
    pieces.append(codes[prev:])
    # a document starts later by what the replacements before it added
    los = np.array([lo for lo, _, _ in replacements])
    grown = np.cumsum([0] + [len(new) - (hi - lo) for lo, hi, new in replacements])
    return np.concatenate(pieces), starts + grown[np.searchsorted(los, starts, side="left")]


def normalize_text(text: str) -> str:
    """The normalized words joined by single spaces."""
    return " ".join(normalized_words(text))


def normalize_url(url: str) -> str:
    """Scheme-insensitive, host lower-cased, default port and fragment dropped, tracking
    parameters removed, remaining parameters sorted, trailing slash of the path dropped."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return url.strip()
    host = (parts.hostname or "").lower().removeprefix("www.")
    if port and port != DEFAULT_PORTS.get(parts.scheme.lower()):
        host = f"{host}:{port}"
    query = urlencode(sorted((k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if not TRACKING.match(k)))
    path = parts.path.rstrip("/") or "/"
    return urlunsplit(("", host, path, query, ""))
