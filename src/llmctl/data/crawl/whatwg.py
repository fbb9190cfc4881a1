"""Charset labels and decoders as the WHATWG Encoding Standard defines them (what browsers do).

A page's label (HTTP header, `<meta>`, a detector's guess) names one of the standard's 40
encodings, and the label table is not Python's: "gb2312" means gb18030 (A1AA is U+2014 EM DASH,
where Python's gb2312 codec gives U+2015), "latin-1", "iso-8859-1" and "ascii" mean
windows-1252 (0x93 is a curly quote, not a C1 control), "iso-8859-9" means windows-1254,
"tis-620" windows-874, "ks_c_5601-1987" and "euc-kr" windows-949, "x-sjis" Shift_JIS.

The label table comes from `webencodings` (kept in step with the standard's encodings.json:
all 228 labels of the 2026 standard, checked label by label). Its codecs are plain Python ones,
with the same gaps as above, so this module maps each standard encoding to a decoder of its own,
checked against the standard's indexes (indexes.json, whatwg/encoding at a985b62, 2026-05-21):

- single-byte: Python's codec as a charmap table, patched where the standard's index differs:
  windows-874 and windows-1250..1258 decode the bytes Python leaves undefined in 0x80-0x9F to the
  C1 control of the same number; KOI8-U is the standard's KOI8-RU variant (0xAE, 0xBE are
  Belarusian/Ukrainian short u); windows-1255 0xCA is U+05BA. Exact on every byte.
- GBK and gb18030 (one decoder in the standard): Python's gb18030 plus the GB18030-2022 code
  points the standard adopted (20 two-byte sequences leave the private use area; 8135F437 and
  A8BC swap U+1E3F and U+E7C7) and a lone 0x80 as the euro sign. Exact on the index.
- EUC-KR: cp949 (Unified Hangul Code). Exact on the index.
- Shift_JIS: cp932. Exact on the index; cp932 also decodes the single bytes 0xA0 and 0xFD-0xFF
  (to private-use U+F8F0-U+F8F3), which the standard rejects.
- EUC-JP: Python's euc_jp plus the standard's Microsoft-flavoured JIS X 0208 index: the NEC and
  IBM rows (457 characters, e.g. circled digits) Python rejects are read through the same index
  pointer in cp932, and 6 characters (WAVE DASH, DOUBLE VERTICAL LINE, MINUS SIGN, ¢ £ ¬) come
  out as their fullwidth forms. One difference is left: JIS X 0212 8FA2B7 is "~" in Python and
  U+FF5E in the standard.
- ISO-2022-JP: Python's iso2022_jp_ext (it reads the half-width katakana escape the standard
  allows) with the same 6 fullwidth forms; it rejects the NEC/IBM rows and accepts JIS X 0212,
  which the standard does not.
- Big5: big5hkscs. The standard's index is HKSCS-2008: 192 of its characters (added after
  HKSCS-2004) make Python's codec fail, and 11 punctuation marks differ (A145 U+2022 for U+2027 ...).
- UTF-8, UTF-16LE, UTF-16BE: Python's codecs.
- x-user-defined: bytes 0x80-0xFF to U+F780-U+F7FF, as the standard says.
- replacement (the labels of ISO-2022-KR, ISO-2022-CN and HZ-GB-2312): the standard decodes any
  body to one U+FFFD on purpose, so no text can be had from the label; `decoder` returns None
  and the caller goes on to the next candidate (Python's iso2022_kr exists, but browsers refuse
  to run it).
"""

from __future__ import annotations

import codecs
import re
from contextlib import suppress
from collections.abc import Callable

import webencodings

# Python's codec beneath each single-byte encoding of the standard.
_SINGLE_BYTE = {
    "ibm866": "cp866", "iso-8859-2": "iso8859_2", "iso-8859-3": "iso8859_3", "iso-8859-4": "iso8859_4",
    "iso-8859-5": "iso8859_5", "iso-8859-6": "iso8859_6", "iso-8859-7": "iso8859_7", "iso-8859-8": "iso8859_8",
    "iso-8859-8-i": "iso8859_8", "iso-8859-10": "iso8859_10", "iso-8859-13": "iso8859_13",
    "iso-8859-14": "iso8859_14", "iso-8859-15": "iso8859_15", "iso-8859-16": "iso8859_16", "koi8-r": "koi8_r",
    "koi8-u": "koi8_u", "macintosh": "mac_roman", "x-mac-cyrillic": "mac_cyrillic", "windows-874": "cp874",
    "windows-1250": "cp1250", "windows-1251": "cp1251", "windows-1252": "cp1252", "windows-1253": "cp1253",
    "windows-1254": "cp1254", "windows-1255": "cp1255", "windows-1256": "cp1256", "windows-1257": "cp1257",
    "windows-1258": "cp1258",
}  # fmt: skip
# Where the standard's index names a byte that Python's codec leaves undefined or reads otherwise.
_C1_FILL = frozenset(k for k in _SINGLE_BYTE if k.startswith("windows-"))
_SINGLE_BYTE_PATCH = {"koi8-u": {0xAE: 0x045E, 0xBE: 0x040E}, "windows-1255": {0xCA: 0x05BA}}
# Python's decoders for the multi-byte and Unicode encodings (fixed up below where noted).
_MULTI_BYTE = {
    "utf-8": "utf-8", "utf-16le": "utf-16-le", "utf-16be": "utf-16-be", "gbk": "gb18030", "gb18030": "gb18030",
    "big5": "big5hkscs", "euc-jp": "euc_jp", "iso-2022-jp": "iso2022_jp_ext", "shift_jis": "cp932", "euc-kr": "cp949",
}  # fmt: skip
# gb18030: the standard's index (GB18030-2022) against Python's (GB18030-2005). Python's codec is
# one-to-one, so each of these code points comes from one byte sequence only and can be remapped.
_GB18030_2022 = {
    0xE5E5: 0x3000, 0xE78D: 0xFE10, 0xE78E: 0xFE12, 0xE78F: 0xFE11, 0xE790: 0xFE13, 0xE791: 0xFE14,
    0xE792: 0xFE15, 0xE793: 0xFE16, 0xE794: 0xFE17, 0xE795: 0xFE18, 0xE796: 0xFE19, 0xE81E: 0x9FB4,
    0xE826: 0x9FB5, 0xE82B: 0x9FB6, 0xE82C: 0x9FB7, 0xE832: 0x9FB8, 0xE843: 0x9FB9, 0xE854: 0x9FBA,
    0xE864: 0x9FBB, 0xE7C7: 0x1E3F, 0x1E3F: 0xE7C7,
}  # fmt: skip
# JIS X 0208 as the standard indexes it (Microsoft's mapping) against Python's JIS mapping; in
# Python's euc_jp and iso2022_jp_ext each of these comes from one sequence only.
_JIS0208_MS = {0x301C: 0xFF5E, 0x2016: 0x2225, 0x2212: 0xFF0D, 0x00A2: 0xFFE0, 0x00A3: 0xFFE1, 0x00AC: 0xFFE2}


def lookup(label: str | None) -> str | None:
    """The standard's "get an encoding": the encoding a label names (lower case), or None."""
    if not label:
        return None
    enc = webencodings.lookup(label)
    return enc.name if enc is not None else None


def _single_byte_table(name: str) -> str:
    table = []
    for b in range(256):
        try:
            table.append(bytes([b]).decode(_SINGLE_BYTE[name]))
        except UnicodeDecodeError:
            # the standard's windows-* indexes map the bytes Windows leaves unassigned to C1 controls
            table.append(chr(b) if name in _C1_FILL and 0x80 <= b <= 0x9F else "\ufffe")  # U+FFFE: undefined
    for b, cp in _SINGLE_BYTE_PATCH.get(name, {}).items():
        table[b] = chr(cp)
    return "".join(table)


def _gb18030_error(exc: UnicodeError) -> tuple[str, int]:
    """The standard's gb18030 decoder reads a lone 0x80 as the euro sign (as Windows' cp936 does)."""
    if isinstance(exc, UnicodeDecodeError) and exc.object[exc.start] == 0x80:
        return "\u20ac", exc.start + 1
    raise exc


def _euc_jp_error(exc: UnicodeError) -> tuple[str, int]:
    """A JIS X 0208 pair Python's euc_jp rejects (NEC row 13, IBM rows 89-92) is read through the
    same index pointer in Shift_JIS form by cp932, which carries the standard's jis0208 index."""
    if isinstance(exc, UnicodeDecodeError):
        pair = exc.object[exc.start : exc.start + 2]
        if len(pair) == 2 and 0xA1 <= pair[0] <= 0xFE and 0xA1 <= pair[1] <= 0xFE:
            pointer = (pair[0] - 0xA1) * 94 + pair[1] - 0xA1
            lead, offset = divmod(pointer, 188)
            sjis = bytes([lead + (0x81 if lead < 0x1F else 0xC1), offset + (0x40 if offset < 0x3F else 0x41)])
            with suppress(UnicodeDecodeError):  # not Shift_JIS either: the original error stands
                return sjis.decode("cp932"), exc.start + 2
    raise exc


codecs.register_error("llmctl-whatwg-gb18030", _gb18030_error)
codecs.register_error("llmctl-whatwg-euc-jp", _euc_jp_error)
_GB_FIX = re.compile("[" + "".join(map(chr, _GB18030_2022)) + "]")
_JIS_FIX = re.compile("[" + "".join(map(chr, _JIS0208_MS)) + "]")


def _fixed(codec: str, errors: str, pattern: re.Pattern, table: dict[int, int]) -> Callable[[bytes], str]:
    def decode(data: bytes) -> str:
        text = data.decode(codec, errors)
        return text.translate(table) if pattern.search(text) else text

    return decode


def _charmap(table: str) -> Callable[[bytes], str]:
    return lambda data: codecs.charmap_decode(data, "strict", table)[0]


def _build() -> dict[str, Callable[[bytes], str]]:
    out: dict[str, Callable[[bytes], str]] = {name: _charmap(_single_byte_table(name)) for name in _SINGLE_BYTE}
    out["x-user-defined"] = _charmap("".join(chr(b if b < 0x80 else 0xF780 + b - 0x80) for b in range(256)))
    for name, codec in _MULTI_BYTE.items():
        out[name] = lambda data, codec=codec: data.decode(codec)
    for name in ("gbk", "gb18030"):
        out[name] = _fixed("gb18030", "llmctl-whatwg-gb18030", _GB_FIX, _GB18030_2022)
    out["euc-jp"] = _fixed("euc_jp", "llmctl-whatwg-euc-jp", _JIS_FIX, _JIS0208_MS)
    out["iso-2022-jp"] = _fixed("iso2022_jp_ext", "strict", _JIS_FIX, _JIS0208_MS)
    return out


DECODERS = _build()
# The standard's names for the encodings Python's codecs registry calls otherwise (for mapping a
# detector's answer, which is a Python codec name, back into the standard).
_FROM_PYTHON = {"mac-roman": "macintosh", "mac-cyrillic": "x-mac-cyrillic", "cp874": "windows-874", "cp932": "shift_jis",
                "cp949": "euc-kr", "cp950": "big5", "utf-16-le": "utf-16le", "utf-16-be": "utf-16be",
                "iso2022_jp": "iso-2022-jp", "iso2022_jp_ext": "iso-2022-jp", "utf-8-sig": "utf-8"}  # fmt: skip


def decoder(encoding: str) -> Callable[[bytes], str] | None:
    """Strict decoder (raises UnicodeDecodeError) for one of the standard's encodings; None for
    "replacement", which has no text to give."""
    return DECODERS.get(encoding)


def from_python_codec(name: str) -> str | None:
    """The standard's encoding that a Python codec name (a detector's answer) stands for, as a
    browser would read that name as a label: "gb2312" -> gbk, "latin_1" -> windows-1252, "euc_kr"
    -> euc-kr; None for codecs outside the standard (cp037, cp850, hz ...)."""
    try:
        canonical = codecs.lookup(name).name
    except LookupError:
        return None
    for candidate in (name, name.replace("_", "-"), canonical, canonical.replace("_", "-")):
        if (enc := _FROM_PYTHON.get(candidate) or lookup(candidate)) and enc != "replacement":
            return enc
    return None
