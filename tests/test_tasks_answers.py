"""Answer extraction and canonical numbers (tasks/answers.py): the rules, against real GSM8K
references (spec 001-data-eval §A10)."""

from __future__ import annotations

import json

import pytest
from conftest import shared_file

from llmctl.errors import UsageError
from llmctl.tasks.answers import canonical_number, extract_answer, last_boxed, math_answer, reference_answer

# --- answer extraction ----------------------------------------------------------------------


def test_extract_rules():
    gen = "She sells 9 eggs.\nShe makes 9 * 2 = $18.\n#### 18\n\nQuestion: next one #### 99 apples"
    assert extract_answer(gen, "after_hash") == "99 apples"
    assert extract_answer("so #### $1,000.\nmore", "after_hash") == "$1,000."
    assert extract_answer("no marker 42", "after_hash") is None
    assert extract_answer("#### ", "after_hash") is None
    assert extract_answer("The total is 1,250 and then 3.50 dollars.", "last_number") == "3.50"
    assert extract_answer("16-3 leaves 13, and -4 is negative", "last_number") == "-4"
    assert extract_answer("16-3", "last_number") == "3"
    assert extract_answer("half is 1/2", "last_number") == "1/2"
    assert extract_answer("no digits here", "last_number") is None
    assert extract_answer(r"so \boxed{2} or \boxed{\frac{1}{2}}", "boxed") == r"\frac{1}{2}"
    assert extract_answer(r"\boxed{\{a, \{b\}\}} then \boxed{3", "boxed") == r"\{a, \{b\}\}"
    assert extract_answer("none", "boxed") is None
    with pytest.raises(UsageError, match="unknown answer extraction rule"):
        extract_answer("x", "first_word")


@pytest.mark.parametrize(
    "raw, canon",
    [
        ("1,000", "1000"), ("3.50", "3.5"), ("-0", "0"), ("$18.00", "18"), ("18.", "18"),
        (" 50% ", "50"), ("+7", "7"), ("\u22125", "-5"), ("1/2", "0.5"), ("4/2", "2"),
        ("2/6", "1/3"), (r"\frac{3}{4}", "0.75"), (r"\dfrac{1}{3}", "1/3"), ("0.050", "0.05"),
        ("-1,234,567.10", "-1234567.1"), ("1e3", "1000"), ("  Paris ", "Paris"), ("1,2", "1,2"),
        ("1/0", "1/0"), ("", ""),
    ],
)
def test_canonical_number(raw, canon):
    assert canonical_number(raw) == canon


def test_predictions_match_references_numerically():
    pred = extract_answer(r"The answer is \boxed{1,000.0}", "boxed")
    assert canonical_number(pred) == canonical_number(extract_answer("#### 1000", "after_hash"))


def test_gsm8k_references_canonicalize_to_numbers():
    path = shared_file("gsm8k/test.jsonl")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()[:200]]
    assert len(rows) == 200
    for row in rows:
        ref = extract_answer(row["answer"], "after_hash")
        canon = canonical_number(ref)
        assert canon.lstrip("-").replace(".", "", 1).isdigit(), (ref, canon)
    # on a reference solution, `last_number` finds the same answer as `after_hash`
    last = sum(canonical_number(extract_answer(r["answer"], "last_number")) ==
               canonical_number(extract_answer(r["answer"], "after_hash")) for r in rows)
    assert last == 200


def test_math_answer_and_reference_answer_read_boxed_with_nested_braces():
    assert last_boxed(r"\boxed{1} then \boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert math_answer(r"so \boxed{\frac{1}{2}}", ("boxed",)) == "0.5"
    assert reference_answer(r"x \boxed{\dfrac{3}{4}}") == "0.75" and reference_answer("#### 1,000") == "1000"
    assert reference_answer(7) == "7" and reference_answer(True) is None and reference_answer(" ") is None
