"""Normalization before hashing, so trivial differences do not hide duplicates (spec
001-data-eval §A5: "normalize first (lowercase, strip punctuation and accents) to raise recall")."""

from __future__ import annotations

import re
import unicodedata

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
