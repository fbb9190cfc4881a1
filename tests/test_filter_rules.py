"""Every filter rule on hand-made documents just inside and just outside its threshold."""

import pytest

from llmctl.data.filters import Doc, build_step
from llmctl.data.filters.doc import sentence_count, tokenize
from llmctl.data.filters.simple import max_ngram_repeats


def verdict(step_spec: dict, text: str, stat: str, row: dict | None = None) -> tuple[float, bool]:
    """(value, passes) of one statistic, however the step's other checks come out."""
    step = build_step(step_spec)
    found = [(v, ok) for s, v, ok in step.checks(Doc(text, row or {})) if s == stat]
    assert found, f"{stat} not produced"
    return found[0][0], all(ok for _, ok in found)


def words(n: int, word: str = "word") -> str:
    return " ".join(f"{word}{i}" for i in range(n))


def sentence(i: int) -> str:
    return f"Sentence number {i} talks about the river and the old mill."


# (step, statistic, document just inside, document just outside)
CASES = [
    # Gopher repetition (Rae et al. 2021, Table A1)
    ("gopher_repetition", "dup_para_frac", "\n\n".join([sentence(i) for i in range(7)] + [sentence(0)] * 3), "\n\n".join([sentence(i) for i in range(6)] + [sentence(0)] * 4)),
    ("gopher_repetition", "dup_line_frac", "\n".join([sentence(i) for i in range(6)] + ["ok"] * 4), "\n".join([sentence(i) for i in range(5)] + ["ok"] * 5)),
    # 80 duplicated chars over 162 + N: <= 0.2 needs N >= 238
    ("gopher_repetition", "dup_line_char_frac", "\n".join(["x" * 80] * 2 + ["y" * 238]), "\n".join(["x" * 80] * 2 + ["y" * 237])),
    # 80 over 164 + N: N >= 236
    ("gopher_repetition", "dup_para_char_frac", "\n\n".join(["x" * 80] * 2 + ["y" * 236]), "\n\n".join(["x" * 80] * 2 + ["y" * 235])),
    # "ab cd" x 4 covers 20 chars of 24 + L: <= 0.2 needs L >= 76
    ("gopher_repetition", "top_2_gram", "ab cd " * 4 + "z" * 76, "ab cd " * 4 + "z" * 75),
    # the second "a b c d e" repeats 5 chars of 20 + L: <= 0.15 needs L >= 14
    ("gopher_repetition", "dup_5_gram", "a b c d e " * 2 + "z" * 14, "a b c d e " * 2 + "z" * 13),
    # Gopher quality
    ("gopher_quality", "n_words", "the and " + words(48), "the and " + words(47)),
    ("gopher_quality", "avg_word_length", " ".join(["the", "and"] + ["abc"] * 60), " ".join(["the", "and"] + ["ab"] * 60)),
    ("gopher_quality", "hash_ratio", "the and " + words(88) + " #" * 10, "the and " + words(86) + " #" * 12),
    ("gopher_quality", "ellipsis_ratio", "the and " + words(88) + " x..." * 10, "the and " + words(80) + " x..." * 12),
    ("gopher_quality", "bullet_lines", "\n".join(["- the and " + words(10)] * 9 + ["plain line"]), "\n".join(["- the and " + words(10)] * 10)),
    ("gopher_quality", "ellipsis_lines", "\n".join([words(10) + " the and ..."] * 3 + [words(10)] * 7), "\n".join([words(10) + " the and ..."] * 4 + [words(10)] * 6)),
    ("gopher_quality", "alpha_words", "the and " + words(78) + " 1" * 20, "the and " + words(76) + " 1" * 22),
    ("gopher_quality", "stop_words", "the and " + words(60), "the The AND " + words(60)),
    # C4 (document level)
    ("c4", "sentences", "\n".join(sentence(i) for i in range(5)), "\n".join(sentence(i) for i in range(4))),
    ("c4", "lorem_ipsum", "\n".join(sentence(i) for i in range(6)) + "\nlorem", "\n".join(sentence(i) for i in range(6)) + "\nLorem ipsum dolor sit amet."),
    ("c4", "curly_bracket", "\n".join(sentence(i) for i in range(6)) + "\n{short}", "\n".join(sentence(i) for i in range(6)) + "\nThe set {a, b} is small."),
    # FineWeb
    ("fineweb", "line_punct_ratio", "\n".join(["A line that ends well."] + ["a line without an end mark here ok"] * 7), "\n".join(["A line that ends well."] + ["a line without an end mark here ok"] * 8)),
    ("fineweb", "short_line_ratio", "\n".join(["short one."] * 2 + [sentence(1) + "x", sentence(2)]), "\n".join(["short one." + str(i) for i in range(3)] + [sentence(1)])),
    ("fineweb", "char_dup_ratio", "\n".join([sentence(i) for i in range(200)] + [sentence(0)]), "\n".join([sentence(i) for i in range(10)] + [sentence(0)])),
    ("fineweb", "list_ratio", "\n".join(["one two three four."] * 1 + ["alpha beta gamma."] * 0), "\n".join(["a."] * 5)),
]


@pytest.mark.parametrize("step, stat, inside, outside", CASES, ids=[f"{c[0]}.{c[1]}" for c in CASES])
def test_threshold_inside_and_outside(step, stat, inside, outside):
    spec = {"name": step} if step != "c4" else {"name": "c4", "filter_no_terminal_punct": False}
    v_in, ok_in = verdict(spec, inside, stat)
    v_out, ok_out = verdict(spec, outside, stat)
    assert ok_in, f"{stat}={v_in} should pass"
    assert not ok_out, f"{stat}={v_out} should fail"


def test_worked_values():
    # 3 duplicate lines of 10 -> exactly the 0.3 threshold, which passes (the rule is "> 0.3 drops")
    text = "\n".join([sentence(i) for i in range(6)] + ["ok"] * 4)
    assert verdict({"name": "gopher_repetition"}, text, "dup_line_frac") == (0.3, True)
    # 50 content words: the minimum passes
    assert verdict({"name": "gopher_quality"}, "the and " + words(48), "n_words") == (50, True)
    # the FineWeb newline-to-word ratio: 4 newlines over 5 tokens ("a." is one token, as in spaCy)
    assert verdict({"name": "fineweb"}, "\n".join(["a."] * 5), "list_ratio") == (0.8, False)
    assert verdict({"name": "fineweb"}, "\n".join(["ab."] * 5), "list_ratio") == (0.4, False)


def test_c4_line_cleaning_and_rewritten_text():
    step = build_step({"name": "c4"})
    text = "\n".join(
        [
            "This line is fine and ends well.",
            "This one mentions Javascript so it goes.",
            "too short.",
            "No terminal punctuation here at all",
            "We use cookies to improve the site.",
            "Citations are removed from this line.[1]",
            "Another fine line with words.",
            "A third fine line is here.",
            "And a fourth fine one.",
        ]
    )
    doc = Doc(text)
    assert all(ok for _, _, ok in step.checks(doc))
    step.transform(doc)
    assert doc.text.splitlines() == [
        "This line is fine and ends well.",
        "Citations are removed from this line.",
        "Another fine line with words.",
        "A third fine line is here.",
        "And a fourth fine one.",
    ]
    loose = build_step({"name": "c4", "filter_no_terminal_punct": False})
    doc = Doc(text)
    list(loose.checks(doc))
    loose.transform(doc)
    assert "No terminal punctuation here at all" in doc.text


def test_repeated_ngrams_olmo_rule():
    assert max_ngram_repeats(["255", ","] * 31) == 31
    assert verdict({"name": "repeated_ngrams"}, "255, " * 31 + "end", "max_repeats")[1] is True
    assert verdict({"name": "repeated_ngrams"}, "255, " * 32 + "end", "max_repeats")[1] is False
    assert verdict({"name": "repeated_ngrams"}, " ".join(["a b c d e f g h i j k l m"] * 32), "max_repeats")[1] is False
    assert verdict({"name": "repeated_ngrams"}, words(500), "max_repeats") == (1, True)


def test_language_and_url_steps(tmp_path):
    spec = {"name": "language", "languages": ["en"], "threshold": 0.65}
    assert verdict(spec, "x", "lang_score", {"lang": "en", "lang_score": 0.65}) == (0.65, True)
    assert verdict(spec, "x", "lang_score", {"lang": "en", "lang_score": 0.64})[1] is False
    assert verdict(spec, "x", "lang", {"lang": "de", "lang_score": 0.99})[1] is False
    # no lang column (foreign data): lid.176 scores the text itself
    assert verdict(spec, "The quick brown fox jumps over the lazy dog near the river bank.", "lang")[1] is True
    block = tmp_path / "b.txt"
    block.write_text("spam.example\n")
    url = {"name": "url", "blocklist_files": [str(block)]}
    assert verdict(url, "x", "blocked", {"url": "https://a.spam.example/x"})[1] is False
    assert verdict(url, "x", "blocked", {"url": "https://ham.example/x"})[1] is True


def test_pii_masks_emails_and_public_ips_only():
    step = build_step({"name": "pii"})
    doc = Doc("Mail jane.doe@corp.com or ops@x.org; server 8.8.8.8, router 192.168.1.1, local 127.0.0.1.")
    step.transform(doc)
    assert doc.text == "Mail email@example.com or email@example.com; server 192.0.2.1, router 192.168.1.1, local 127.0.0.1."


def test_tokenizer_follows_spacy_on_common_cases():
    assert tokenize("Hello, world! It's 3.5 km (U.S. roads) well-known... Isn't it? e.g. Dr. Smith") == [
        "Hello", ",", "world", "!", "It", "'s", "3.5", "km", "(", "U.S.", "roads", ")", "well", "-", "known",
        "...", "Is", "n't", "it", "?", "e.g.", "Dr.", "Smith",
    ]  # fmt: skip
    assert tokenize("see https://example.com/a.html.") == ["see", "https://example.com/a.html", "."]
    assert sentence_count(tokenize("One. Two! Three? four")) == 4
    assert sentence_count(tokenize("Version 3.5 of U.S. law")) == 1


def test_bad_step_configs():
    from llmctl.errors import UsageError

    with pytest.raises(UsageError, match="unknown filter step"):
        build_step({"name": "nope"})
    with pytest.raises(UsageError, match="unknown parameter"):
        build_step({"name": "fineweb", "bogus": 1})
    with pytest.raises(UsageError, match="should be"):
        build_step({"name": "fineweb", "line_punct_thr": "high"})
