"""Bytes of an HTTP response body -> HTML text, with the charset found the way browsers do.

Order: a byte-order mark; then UTF-8 if the bytes are valid UTF-8 (mislabelled UTF-8 is the
most common lie on the web, and legacy text is almost never valid UTF-8 by accident); then the
HTTP Content-Type charset; then a `<meta charset>` / `<meta http-equiv="Content-Type">` in the
first bytes of the page; then UTF-8 with replacement characters when only a few bytes are
invalid; then detection (charset_normalizer). Bodies with NUL bytes (UTF-16
without a BOM) skip the UTF-8 shortcut. Legacy labels are mapped as the WHATWG encoding standard
does (latin-1 and ascii mean windows-1252).
"""

from __future__ import annotations

import codecs
import re

from charset_normalizer import from_bytes

META_SCAN_BYTES = 4096
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([a-zA-Z0-9_\-:.]+)""", re.I)
_HEADER_CHARSET = re.compile(r"""charset\s*=\s*["']?([a-zA-Z0-9_\-:.]+)""", re.I)
# WHATWG: these labels are decoded as windows-1252 by every browser.
_WHATWG_ALIASES = {"iso-8859-1": "cp1252", "latin1": "cp1252", "latin-1": "cp1252", "us-ascii": "cp1252", "ascii": "cp1252", "iso8859-1": "cp1252"}
_BOMS = ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


class UndecodableError(ValueError):
    """No charset we could find or guess turns these bytes into text."""


def _norm(label: str | None) -> str | None:
    if not label:
        return None
    label = label.strip().lower()
    label = _WHATWG_ALIASES.get(label, label)
    try:
        return codecs.lookup(label).name
    except LookupError:
        return None


def header_charset(content_type: str | None) -> str | None:
    m = _HEADER_CHARSET.search(content_type or "")
    return m.group(1) if m else None


def meta_charset(body: bytes) -> str | None:
    m = _META_CHARSET.search(body[:META_SCAN_BYTES])
    return m.group(1).decode("ascii", "ignore") if m else None


def _mostly_utf8(body: bytes, ratio: int = 10) -> str | None:
    """UTF-8 text with a few stray legacy bytes (a common CMS accident) decodes as browsers do it:
    UTF-8 with U+FFFD for the bad bytes. Guessing a legacy charset instead would turn every
    correct character into mojibake (seen on pages-a.warc.gz: 3 bad bytes, 103 good characters)."""
    text = body.decode("utf-8", "replace")
    bad = text.count("\ufffd")
    good = sum(1 for ch in text if ord(ch) > 127) - bad
    return text if bad and good >= ratio * bad else None


def decode_html(body: bytes, content_type: str | None = None) -> tuple[str, str]:
    """Return (text, encoding used). Raises UndecodableError when nothing fits."""
    candidates: list[str] = []
    for bom, enc in _BOMS:
        if body.startswith(bom):
            candidates.append(enc)
    if not candidates and b"\x00" not in body[:4096]:
        candidates.append("utf-8")
    for label in (header_charset(content_type), meta_charset(body)):
        if (enc := _norm(label)) and enc not in candidates:
            candidates.append(enc)
    for enc in candidates:
        try:
            return body.decode(enc), enc
        except (UnicodeDecodeError, LookupError):
            continue
    if (text := _mostly_utf8(body)) is not None:
        return text, "utf-8"
    best = from_bytes(body[: 1 << 20]).best()
    if best is not None and best.encoding:
        try:
            return body.decode(best.encoding), best.encoding
        except (UnicodeDecodeError, LookupError):
            pass
    raise UndecodableError(f"tried {', '.join(candidates)} and detection")
