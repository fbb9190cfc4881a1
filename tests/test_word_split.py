"""The filter's word splitting against spaCy's English tokenizer (data/filters/doc.py).

datatrove's Gopher and FineWeb rules count words with spacy.blank("en"), whitespace tokens
dropped; doc.tokenize runs spaCy's algorithm on spaCy's rules (filters/spacy_en.py) without spaCy.
The expected splits below were generated once with spaCy 3.8.18 (spacy.blank("en"), tokens
stripped, whitespace tokens dropped, as datatrove's word_tokenize does) and written down, so these
tests need no spaCy; the last tests compare against spaCy live where it is importable (the bench
venv) and are skipped elsewhere.
"""

import random

import pytest

from llmctl.data.filters import spacy_en
from llmctl.data.filters.doc import tokenize

# fmt: off
SPACY_SPLITS = [
    ('Das ist sauber!« sagte er.', ['Das', 'ist', 'sauber', '!', '«', 'sagte', 'er', '.']),
    ('»Hallo«, rief sie.', ['»', 'Hallo', '«', ',', 'rief', 'sie', '.']),
    ('»Nein!«, »Doch?«', ['»', 'Nein', '!', '«', ',', '»', 'Doch', '?', '«']),
    ('„Ja“, sagte er.', ['„', 'Ja', '“', ',', 'sagte', 'er', '.']),
    ('„Ja?“ – „Nein.“', ['„', 'Ja', '?', '“', '–', '„', 'Nein', '.', '“']),
    ('‚nein‘.', ['‚', 'nein', '‘', '.']),
    ('›so‹! ‹a›.', ['›so‹', '!', '‹a›.']),
    ('«Bonjour», dit-il.', ['«', 'Bonjour', '»', ',', 'dit', '-', 'il', '.']),
    ('«sauber!»', ['«', 'sauber', '!', '»']),
    ('“Yes.” ‘No.’', ['“', 'Yes', '.', '”', '‘', 'No', '.', '’']),
    ('(„Test“)', ['(', '„', 'Test', '“', ')']),
    ('d’«Hummel„ passen‚', ['d’«Hummel', '„', 'passen', '‚']),
    ('Schergen« Ausbruch«.', ['Schergen', '«', 'Ausbruch', '«', '.']),
    ('l’homme ’Tis', ['l’homme', '’', 'Tis']),
    ('”odd“ ‘quoted’,', ['”', 'odd', '“', '‘', 'quoted', '’', ',']),
    ('20°C 20 °C -5°F 1.5°C. 2°C, 350°F.', ['20', '°', 'C', '20', '°', 'C', '-5', '°', 'F', '1.5', '°', 'C', '.', '2', '°', 'C', ',', '350', '°', 'F', '.']),
    ('10 cm³. 10cm³ 5 m², 5m² 3 km/h 100km/h.', ['10', 'cm³.', '10', 'cm³', '5', 'm²', ',', '5', 'm²', '3', 'km', '/', 'h', '100', 'km/h', '.']),
    ('50% 50 %. 3,5° °C.', ['50', '%', '50', '%', '.', '3,5', '°', '°', 'C', '.']),
    ('25$ $25 €5 5€ 80TB 75kb 500M 4am 10pm 5kg. 12mm)', ['25', '$', '$', '25', '€', '5', '5', '€', '80', 'TB', '75', 'kb', '500', 'M', '4', 'am', '10', 'pm', '5', 'kg', '.', '12', 'mm', ')']),
    ('US$5 C$10 ¥100 ±3 ~5 5x 2h 3min.', ['US$', '5', 'C$', '10', '¥', '100', '±3', '~5', '5x', '2h', '3min', '.']),
    ('f(x): a); b), c). [1]: x]; {y}. 8): (a): (see above); (e.g.), ),"', ['f(x', '):', 'a', ')', ';', 'b', ')', ',', 'c', ')', '.', '[', '1', ']', ':', 'x', ']', ';', '{', 'y', '}', '.', '8)', ':', '(', 'a', '):', '(', 'see', 'above', ')', ';', '(', 'e.g.', ')', ',', ')', ',', '"']),
    ('Fußball„): Sieg). Ende].', ['Fußball', '„', '):', 'Sieg', ')', '.', 'Ende', ']', '.']),
    ('(8) :) ;) ): :( ;-) :-P <3 </3 (= =)', ['(', '8)', ':)', ';)', '):', ':(', ';-)', ':-P', '<3', '</3', '(=', '=)']),
    ('Wait... what?! Really!!! ?» —¿Qué –que Sandinista– —agregó—', ['Wait', '...', 'what', '?', '!', 'Really', '!', '!', '!', '?', '»', '—', '¿', 'Qué', '–', 'que', 'Sandinista', '–', '—', 'agregó', '—']),
    ('e.g., U.S.A. Ph.D. i.d. o.g. z.B. usw. Rev. u. vs.', ['e.g.', ',', 'U.S.A.', 'Ph.D.', 'i.d', '.', 'o.g', '.', 'z.', 'B.', 'usw', '.', 'Rev.', 'u.', 'vs.']),
    ("and/or well-known don't Can't won't I'm y'all gonna", ['and/or', 'well', '-', 'known', 'do', "n't", 'Ca', "n't", 'wo', "n't", 'I', "'m", "y'", 'all', 'gon', 'na']),
    ('http://example.com/a. (www.example.com) https://doi.org/10.6078/D1Q11H.', ['http://example.com/a', '.', '(', 'www.example.com', ')', 'https://doi.org/10.6078/D1Q11H.']),
    ('B* __init__.py nggGallery::i18n( function(x) ~/.local `openssl` +++ 100+ ©iStock TSM®-Manier Vulkania®', ['B', '*', '_', '_', 'init__.py', 'nggGallery::i18n', '(', 'function(x', ')', '~/.local', '`', 'openssl', '`', '+', '+', '+', '100', '+', '©', 'iStock', 'TSM', '®', '-Manier', 'Vulkania', '®']),
    ('السودان؟ المحلية، ；12月 。2006年 🇨🇺 💁🏻\u200d♀️ 3G 155M', ['السودان', '؟', 'المحلية', '،', '；', '12月', '。', '2006年', '🇨', '🇺', '💁', '🏻\u200d', '♀', '️', '3', 'G', '155', 'M']),
    ('‘’ ’’ … …… .... 1,000.50 3.5 -3 +3 5-8 2+2 a=b a<b x>=y =>', ['‘', '’', '’’', '…', '…', '…', '....', '1,000.50', '3.5', '-3', '+3', '5', '-', '8', '2', '+', '2', 'a', '=', 'b', 'a', '<', 'b', 'x>=y', '=', '>']),
    ('( :)»km/h', ['(', ':', ')', '»', 'km', '/', 'h']),
    ('*；:) :).a‹=', ['*', '；', ':)', ':', ')', '.a‹=']),
    ('}:) )。!', ['}', ':)', ')', '。', '!']),
    ('[ :)›', ['[', ':', ')', '›']),
    ('a  :)', ['a', ':)']),
    ('x\n:)', ['x', ':)']),
]
# fmt: on


@pytest.mark.parametrize("text,expected", SPACY_SPLITS, ids=[t[:24] for t, _ in SPACY_SPLITS])
def test_split_is_spacys(text, expected):
    assert tokenize(text) == expected


def test_families_from_the_issue():
    # German quotes, units and a closing bracket before a colon: each was split otherwise before
    assert tokenize("sauber!«") == ["sauber", "!", "«"]
    assert tokenize("1.5°C.") == ["1.5", "°", "C", "."]
    assert tokenize("10 cm³.") == ["10", "cm³."]  # spaCy keeps this one whole: no suffix rule for ³
    assert tokenize("f(x):") == ["f(x", "):"]  # "):" is one of spaCy's emoticons
    assert tokenize("(8) :)") == ["(", "8)", ":)"]


def test_special_case_match_across_a_space_blocks_but_changes_nothing():
    # ":)»k" splits into ":", ")", "»", "k"; spaCy's special-case matcher then sees "(" ":" across the
    # space (the emoticon "(:"), takes it first (same length, further left), changes nothing since
    # "( :" is no special case, and so ":)" is not merged; with two spaces or a newline a
    # whitespace token sits between and ":)" is merged
    assert tokenize("( :)»k") == ["(", ":", ")", "»", "k"]
    assert tokenize("(  :)»k") == ["(", ":)", "»", "k"]
    assert tokenize("(\n:)»k") == ["(", ":)", "»", "k"]


def _fuzz_texts(n: int, seed: int = 0) -> list[str]:
    pieces = list("aAbZz09.,;:!?()[]{}\"'«»‹›„“”‚‘’-–—/°%$€&*#@+=<>~_`^|\\…·¿¡。，；：") + [
        "°C", "cm³", "m²", "km/h", "n't", "'s", "U.S.", "e.g.", ":)", "8)", "http://x.org/a", "www.a.de",
        "Dr.", "über", "ß", "١٢", "中文", "🙂", " ", " ", " ", "  ", "\n",
    ]  # fmt: skip
    rng = random.Random(seed)
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 12))) for _ in range(n)]


def test_live_spacy_agrees():
    spacy = pytest.importorskip("spacy")
    nlp = spacy.blank("en")
    texts = [t for t, _ in SPACY_SPLITS] + _fuzz_texts(3000)
    differ = [t for t in texts if tokenize(t) != [w.text.strip() for w in nlp(t) if w.text.strip()]]
    assert not differ, f"{len(differ)} texts split otherwise than spaCy {spacy.__version__}, e.g. {differ[:5]}"


def test_rules_are_the_installed_spacys():
    spacy = pytest.importorskip("spacy")
    tok = spacy.blank("en").tokenizer
    assert (spacy_en.PREFIX, spacy_en.SUFFIX, spacy_en.INFIX, spacy_en.URL) == (
        tok.prefix_search.__self__.pattern, tok.suffix_search.__self__.pattern,
        tok.infix_finditer.__self__.pattern, tok.url_match.__self__.pattern,
    ), f"spaCy {spacy.__version__} changed its rules: run examples/make_spacy_rules.py"  # fmt: skip
    assert set(spacy_en.SPECIAL_CASES) == set(tok.rules)


def test_symbol_words_are_datatroves():
    # Gopher's symbol words use datatrove's hand-picked punctuation set, not Unicode's categories
    from llmctl.data.filters.doc import is_symbol_word

    assert is_symbol_word("...") and is_symbol_word("#") and is_symbol_word("►") and is_symbol_word("１")
    assert not any(is_symbol_word(w) for w in ("‘", "‚", "¿", "§", "•", "a.", "°"))


def test_symbol_set_is_the_installed_datatroves():
    text = pytest.importorskip("datatrove.utils.text")
    from llmctl.data.filters import doc

    assert doc._DATATROVE_PUNCTUATION == text.PUNCTUATION_SET
