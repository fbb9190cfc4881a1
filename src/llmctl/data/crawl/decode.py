"""Bytes of an HTTP response body -> HTML text, with the charset found the way browsers do.

Order: a byte-order mark; then UTF-8 if the bytes are valid UTF-8 (mislabelled UTF-8 is the
most common lie on the web, and legacy text is almost never valid UTF-8 by accident); then the
HTTP Content-Type charset; then a `<meta charset>` / `<meta http-equiv="Content-Type">` in the
first bytes of the page; then UTF-8 with replacement characters when only a few bytes are
invalid; then detection (charset_normalizer). Bodies with NUL bytes (UTF-16
without a BOM) skip the UTF-8 shortcut. Every label (header, meta, the detector's answer) is read
as the WHATWG Encoding Standard reads it and decoded with that standard's decoder (`whatwg`):
latin-1 and ascii mean windows-1252, gb2312 means gb18030, euc-kr means windows-949; a label the
standard does not know is ignored, as browsers ignore it. A `<meta>` naming UTF-16 means UTF-8 and
x-user-defined means windows-1252 (HTML's prescan rules: a page that can be read as ASCII to find
its meta tag is not UTF-16).
"""

from __future__ import annotations

import codecs
import re
from contextlib import suppress

from charset_normalizer import from_bytes

from llmctl.data.crawl import whatwg

META_SCAN_BYTES = 4096
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([a-zA-Z0-9_\-:.]+)""", re.I)
_HEADER_CHARSET = re.compile(r"""charset\s*=\s*["']?([a-zA-Z0-9_\-:.]+)""", re.I)
_BOMS = ((codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16le"), (codecs.BOM_UTF16_BE, "utf-16be"))
# HTML's "prescan a byte stream to determine its encoding": what a meta-declared encoding becomes.
_META_OVERRIDE = {"utf-16le": "utf-8", "utf-16be": "utf-8", "x-user-defined": "windows-1252"}


class UndecodableError(ValueError):
    """No charset we could find or guess turns these bytes into text."""


def _decode(body: bytes, encoding: str) -> str:
    """Strict decode with the standard's decoder, or Python's codec for a detector's answer
    outside the standard. Raises UnicodeDecodeError or LookupError."""
    if (dec := whatwg.decoder(encoding)) is not None:
        return dec(body)
    return body.decode(encoding)


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
    """Return (text, encoding used: the WHATWG name, or the Python codec the detector chose when
    it is outside the standard). Raises UndecodableError when nothing fits."""
    candidates: list[str] = []
    skip = 0
    for bom, enc in _BOMS:
        if body.startswith(bom):
            candidates.append(enc)
            skip = len(bom)
    if not candidates and b"\x00" not in body[:4096]:
        candidates.append("utf-8")
    meta = whatwg.lookup(meta_charset(body))
    for enc in (whatwg.lookup(header_charset(content_type)), _META_OVERRIDE.get(meta, meta)):
        # "replacement" (ISO-2022-KR, HZ ...) has no decoder: browsers show one U+FFFD for the page
        if enc and enc not in candidates and whatwg.decoder(enc) is not None:
            candidates.append(enc)
    for i, enc in enumerate(candidates):
        try:
            return _decode(body[skip:] if i == 0 else body, enc), enc
        except (UnicodeDecodeError, LookupError):
            continue
    if (text := _mostly_utf8(body)) is not None:
        return text, "utf-8"
    best = from_bytes(body[: 1 << 20]).best()
    if best is not None and best.encoding:
        enc = whatwg.from_python_codec(best.encoding) or best.encoding
        with suppress(UnicodeDecodeError, LookupError):  # detection guessed wrong: undecodable below
            return _decode(body, enc), enc
    raise UndecodableError(f"tried {', '.join(candidates)} and detection")
