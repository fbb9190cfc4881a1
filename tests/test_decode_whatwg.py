"""Charset labels read as the WHATWG Encoding Standard reads them (data/crawl/whatwg.py, data/crawl/decode.py).

Expected characters are the standard's: its index files (indexes.json of whatwg/encoding) and
its encodings.json label table, looked up by hand for each byte below."""

import codecs

import pytest
import webencodings

from llmctl.data.crawl import whatwg
from llmctl.data.crawl.decode import decode_html

CHINESE = "北京是中华人民共和国的首都，也是全国的政治中心和文化中心。" * 4


def page(body: str, head: str = "") -> str:
    return f"<html><head>{head}</head><body><p>{body}</p></body></html>"


def test_gb2312_label_decodes_as_gb18030():
    # GB 2312 A1AA is the dash: U+2014 for browsers (gb18030), U+2015 in Python's gb2312 codec
    body = page(CHINESE).encode("gb18030").replace(b"<p>", b"<p>\xa1\xaa")
    assert b"\xa1\xaa".decode("gb2312") == "\u2015"  # the codec a plain Python lookup would pick
    html, enc = decode_html(body, "text/html; charset=gb2312")
    assert enc == "gbk" and "<p>\u2014北京" in html
    # a header that lies (UTF-8) and a meta tag that tells the truth
    meta = page(CHINESE, '<meta charset="GB2312">').encode("gb18030").replace(b"<p>", b"<p>\xa1\xaa")
    html, enc = decode_html(meta, "text/html; charset=utf-8")
    assert enc == "gbk" and "<p>\u2014北京" in html
    # no label at all: the detector's answer (a Python codec name) is read as a label too
    html, enc = decode_html(body, "text/html")
    assert enc in ("gbk", "gb18030") and "<p>\u2014北京" in html


def test_latin1_label_is_windows_1252():
    body = page("\x93quoted\x94 \x80 5").encode("latin-1")  # the raw bytes 0x93 0x94 0x80
    html, enc = decode_html(body, "text/html; charset=ISO-8859-1")
    assert enc == "windows-1252" and "“quoted” € 5" in html
    # bytes Windows leaves unassigned decode to C1 controls instead of failing over to detection
    html, enc = decode_html(page("caf\xe9 \x81").encode("latin-1"), "text/html; charset=latin1")
    assert enc == "windows-1252" and "café \x81" in html


def test_ascii_label_is_windows_1252():
    html, enc = decode_html(page("\x93x\x94 na\xefve").encode("latin-1"), "text/html; charset=us-ascii")
    assert enc == "windows-1252" and "“x” naïve" in html
    # a lying ASCII header still loses to bytes that are valid UTF-8
    assert decode_html("naïve".encode(), "text/html; charset=ascii") == ("naïve", "utf-8")


def test_meta_charset_label():
    # iso-8859-9 means windows-1254: 0xFD is dotless i (in latin-1 it would be ý), 0x80 the euro
    body = page("Kad\xfdn \x80").encode("latin-1")
    html, enc = decode_html(b'<meta http-equiv="Content-Type" content="text/html; charset=ISO-8859-9">' + body)
    assert enc == "windows-1254" and "Kadın €" in html
    # HTML's prescan: a meta tag naming UTF-16 or x-user-defined means UTF-8 or windows-1252
    html, enc = decode_html(b'<meta charset="x-user-defined">' + page("\x93").encode("latin-1"))
    assert enc == "windows-1252" and "“" in html


@pytest.mark.parametrize("label", ["x-klingon", "cp850", "utf-32", "iso-2022-kr"])
def test_unknown_or_unusable_label_falls_back(label):
    # labels outside the standard (cp850 and utf-32 are Python's, not browsers') and "replacement"
    # labels are ignored: the page decodes exactly as it would with no label
    body = page("Grüße “Café” für 5 € " * 3).encode("cp1252")
    assert decode_html(body, f"text/html; charset={label}") == decode_html(body, "text/html")
    assert decode_html(b"<p>plain</p>", f"text/html; charset={label}") == ("<p>plain</p>", "utf-8")


def test_bom_wins_and_is_dropped():
    text = page("Grüße")
    assert decode_html(codecs.BOM_UTF16_LE + text.encode("utf-16-le"), "text/html; charset=windows-1252") == (text, "utf-16le")
    assert decode_html(codecs.BOM_UTF8 + text.encode(), None) == (text, "utf-8")


def test_label_table_covers_the_standard():
    # encodings.json (2026): 228 labels naming 40 encodings; every one must reach a decoder
    labels = webencodings.LABELS
    assert len(labels) == 228 and len(set(labels.values())) == 40
    for label, name in labels.items():
        assert whatwg.lookup(label) == name
        assert whatwg.lookup(f" {label.upper()}\t") == name  # ASCII whitespace and case, as the standard says
        if name == "replacement":
            assert whatwg.decoder(name) is None
            continue
        dec = whatwg.decoder(name)
        assert dec is not None, label
        sample = "utf-16le" if name == "utf-16le" else "utf-16be" if name == "utf-16be" else None
        data = "ab<p>".encode(sample) if sample else b"ab<p>"
        assert dec(data) == "ab<p>", label  # every other encoding is ASCII-compatible
    for name in whatwg._SINGLE_BYTE.values():
        codecs.lookup(name)  # each Python codec beneath is there
    for name in whatwg._MULTI_BYTE.values():
        codecs.lookup(name)
    for label, expected in {"gb2312": "gbk", "iso-8859-9": "windows-1254", "x-sjis": "shift_jis", "ks_c_5601-1987": "euc-kr",
                            "euc-kr": "euc-kr", "tis-620": "windows-874", "latin1": "windows-1252", "ascii": "windows-1252",
                            "us-ascii": "windows-1252", "iso-8859-1": "windows-1252", "unicode": "utf-16le"}.items():  # fmt: skip
        assert whatwg.lookup(label) == expected
    assert whatwg.lookup("latin-1") is None and whatwg.lookup("utf_8") is None  # Python's aliases, not the standard's


@pytest.mark.parametrize(
    "encoding,data,expected",
    [
        ("windows-1252", b"\x81\x8d\x8f\x90\x9d\x93", "\x81\x8d\x8f\x90\x9d“"),
        ("windows-1255", b"\xca", "\u05ba"),
        ("windows-874", b"\x81\xa1", "\x81\u0e01"),
        ("koi8-u", b"\xae\xbe", "\u045e\u040e"),
        ("x-user-defined", b"a\x80\xff", "a\uf780\uf7ff"),
        ("gbk", b"\xa1\xaa\x80\xa6\xd9\xfe\x59\xa8\xbc\x81\x35\xf4\x37", "\u2014€\ufe10\u9fb4\u1e3f\ue7c7"),
        ("gb18030", b"\xa3\xa0\x84\x31\x82\x36", "\u3000\ufe10"),
        ("euc-jp", b"\xad\xa1\xfc\xee\xa1\xc1\xa1\xdd\xa2\xcc\x8e\xb1\xa4\xa2", "①\u9ed1～－￢ｱあ"),
        ("iso-2022-jp", b"\x1b$B!A\x1b(I1\x1b(B", "～ｱ"),
        ("shift_jis", b"\x87\x40\x81\x60\xb1", "①～ｱ"),
        ("euc-kr", b"\x81\x41\xb0\xa1", "갂가"),
        ("big5", b"\xa4\x40\x88\x62", "一\u00ca\u0304"),
    ],
)
def test_decoders_follow_the_standard_index(encoding, data, expected):
    assert whatwg.decoder(encoding)(data) == expected


def test_decoders_stay_strict():
    # invalid bytes raise, so decode_html goes on to its next candidate
    for encoding, data in [("iso-8859-3", b"\xa5"), ("gbk", b"\xff\x30"), ("euc-jp", b"\xad"), ("utf-8", b"\xc3")]:
        with pytest.raises(UnicodeDecodeError):
            whatwg.decoder(encoding)(data)


def test_detector_names_map_into_the_standard():
    assert whatwg.from_python_codec("gb2312") == "gbk"
    assert whatwg.from_python_codec("latin_1") == "windows-1252"
    assert whatwg.from_python_codec("euc_kr") == "euc-kr"
    assert whatwg.from_python_codec("cp949") == "euc-kr"
    assert whatwg.from_python_codec("mac_roman") == "macintosh"
    assert whatwg.from_python_codec("cp037") is None and whatwg.from_python_codec("iso2022_kr") is None
