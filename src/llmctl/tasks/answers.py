"""Answers: how a final answer is read out of a solution or a generation, and the one canonical
spelling of a number, shared by eval scoring, the rl `math` verifier and the task families' targets
(spec 001-data-eval §A10; one checker for training and eval, spec 001-posttrain-rl §A5).

- `extract_answer(text, rule)`: the raw answer string by one rule (after_hash | last_number | boxed);
- `canonical_number(s)`: "1,000" / "1000.0" / "\\frac{1}{2}" compare equal as strings;
- `math_answer(text, rules)`: rules in order, then canonical, the reader of `GenScoring` and of
  rl's MathVerifier; `reference_answer(ref)`: the same for a reference (GSM8K '#### n', \\boxed{},
  a bare answer or a number);
- `flexible_extract(text)`: lm-evaluation-harness's GSM8K `flexible-extract` filter, the last
  number-like string, as that harness reads it;
- `GenScoring`: eval's two readings of a generation, strict (the family's rule) and flexible.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from llmctl.errors import UsageError

_NUMBER = re.compile(r"(?:(?<![\w.])-)?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?")
_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_FRAC = re.compile(r"^\\d?frac\{([^{}]+)\}\{([^{}]+)\}$")
EXTRACT_RULES = ("after_hash", "last_number", "boxed")

# lm-evaluation-harness 0.4.13, lm_eval/tasks/gsm8k/gsm8k.yaml, filter_list "flexible-extract":
#   - function: "regex", group_select: -1, regex_pattern: "(-?[$0-9.,]{2,})|(-?[0-9]+)"
#   - function: "take_first"
# (its "strict-match" is regex_pattern "#### (\-?[0-9\.\,]+)", group_select 0: the first '#### n')
LM_EVAL_FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")


def last_boxed(text: str) -> str | None:
    """Content of the last complete \\boxed{...}, braces nested to any depth."""
    found = None
    start = text.find("\\boxed{")
    while start != -1:
        i, depth = start + len("\\boxed{"), 1
        for j in range(i, len(text)):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            if depth == 0:
                found = text[i:j]
                break
        start = text.find("\\boxed{", start + 1)
    return found



def extract_answer(text: str, rule: str) -> str | None:
    """The answer string in a generation, or None when the rule finds nothing.

    - ``after_hash``: the rest of the line after the last ``####`` (GSM8K's answer format);
    - ``last_number``: the last number in the text (1,000 / -3 / 2.5 / 3/4; a '-' glued to a
      preceding word or digit, as in "16-3", is read as an operator, not a sign);
    - ``boxed``: the content of the last complete ``\\boxed{...}``, nested braces allowed.
    The result is not canonicalized; pass it through ``canonical_number`` before comparing."""
    if rule == "after_hash":
        if "####" not in text:
            return None
        rest = text.rsplit("####", 1)[1].strip()
        return rest.splitlines()[0].strip() if rest else None
    if rule == "last_number":
        found = _NUMBER.findall(text)
        return found[-1] if found else None
    if rule == "boxed":
        return last_boxed(text)
    raise UsageError(f"unknown answer extraction rule {rule!r} (choose from {', '.join(EXTRACT_RULES)})")


def flexible_extract(text: str) -> str | None:
    """lm-evaluation-harness's GSM8K `flexible-extract` (LM_EVAL_FLEXIBLE), as its RegexFilter
    (lm_eval/filters/extraction.py) applies it: `findall`, the match at group_select -1 (the last),
    of a tuple the first non-empty group, stripped; None where the harness writes "[invalid]".

    The string is the harness's, character for character ("72." and "$18" included: its
    exact_match drops a trailing '.', '$' and ',' before comparing; canonical_number does the same
    and more). Unlike `last_number`, a '-' glued to a digit is a sign ("16-3" gives "-3")."""
    found = LM_EVAL_FLEXIBLE.findall(text)
    if not found:
        return None
    groups = [g for g in found[-1] if g]
    return groups[0].strip() if groups else None


def _render(q: Fraction) -> str:
    """Integer → "12"; terminating decimal → "3.5"; otherwise the reduced fraction "1/3"."""
    if q.denominator == 1:
        return str(q.numerator)
    d = q.denominator
    twos = fives = 0
    while d % 2 == 0:
        d, twos = d // 2, twos + 1
    while d % 5 == 0:
        d, fives = d // 5, fives + 1
    if d != 1:
        return f"{q.numerator}/{q.denominator}"
    places = max(twos, fives)
    scaled = abs(q.numerator) * 10**places // q.denominator
    digits = str(scaled).rjust(places + 1, "0")
    sign = "-" if q < 0 else ""
    return f"{sign}{digits[:-places]}.{digits[-places:]}"


def canonical_number(s: str) -> str:
    """One spelling per number, so numerically equal answers compare equal as strings.

    Strips spaces, '$', '%', thousands commas (only in the 1,234,567 pattern), a leading '+'
    and trailing '.'; reads a unicode minus as '-'; reads fractions "a/b" and LaTeX \\frac{a}{b}.
    The value is rendered as an integer ("1,000" → "1000", "3.00" → "3", "-0" → "0"), a
    terminating decimal ("3.50" → "3.5", "1/2" → "0.5") or, when the decimal would not
    terminate, the reduced fraction ("2/6" → "1/3"). A string that is not a number comes back
    stripped and otherwise unchanged."""
    raw = s.strip()
    t = raw.replace("\u2212", "-").replace("$", "").replace("%", "").replace(" ", "")
    t = t.rstrip(".").removeprefix("+")
    if _THOUSANDS.fullmatch(t):
        t = t.replace(",", "")
    frac = _FRAC.match(t)
    if frac:
        t = f"{frac.group(1)}/{frac.group(2)}"
    try:
        if "/" in t:
            num, den = t.split("/")
            value = Fraction(Fraction(num), Fraction(den))
        else:
            value = Fraction(t)
    except (ValueError, ZeroDivisionError):
        return raw
    return _render(value)


# ---------------------------------------------------------------------------------------------
# The final answer of a solution (the rl `math` verifier's reader)


_CANONICAL_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")
DEFAULT_MATH_RULES = ("after_hash", "boxed", "last_number")


def _is_number(canon: str) -> bool:
    return _CANONICAL_NUMBER.fullmatch(canon) is not None


def math_answer(text: str, rules: Sequence[str] = DEFAULT_MATH_RULES) -> str | None:
    """The canonical final answer of a solution, or None when no rule finds one.

    Rules are tried in order (``extract_answer``); the first that finds something decides. If what
    it found is not a number as a whole ("18 dollars", "x = 5"), the last number inside it is
    taken; a found string with no number at all ("\\frac{\\pi}{2}") is returned as is, stripped."""
    for rule in rules:
        got = extract_answer(text, rule)
        if got is None or not got.strip():
            continue
        canon = canonical_number(got)
        if _is_number(canon):
            return canon
        inner = extract_answer(got, "last_number")
        return canonical_number(inner) if inner is not None else canon
    return None


def reference_answer(reference: Any) -> str | None:
    """The canonical answer of a reference: a GSM8K solution ("...#### 18"), a \\boxed{} solution,
    a bare answer ("1,000", "3/4") or a number."""
    if isinstance(reference, bool) or reference is None:
        return None
    if isinstance(reference, (int, float)):
        reference = repr(reference)
    if not isinstance(reference, str):
        return None
    if "####" in reference:
        return math_answer(reference, ("after_hash",))
    if "\\boxed{" in reference:
        return math_answer(reference, ("boxed",))
    return canonical_number(reference) if reference.strip() else None


@dataclass
class GenScoring:
    """A generation read two ways (spec 001-data-eval §A10), each canonical:

    - ``strict``: the task family's rule alone (``extract``: after_hash for GSM8K's '#### n',
      boxed for MATH's \\boxed{}), read by `math_answer`, the reader rl's `math` verifier calls
      too (one checker for training and eval, spec 001-posttrain-rl §A5; the verifier tries
      after_hash, boxed, then last_number). An answer it finds makes the generation *well-formed*;
    - ``flexible``: lm-evaluation-harness's GSM8K `flexible-extract`, the last number-like string
      (`flexible_extract`), whatever the answer line looks like: a score blind to the answer
      format, though not to the ending (a last line that ends in another number is read as that
      number). It reads numbers only, so an answer that is not one (MATH's \\frac{\\pi}{2}) it
      never gets right."""
    extract: str = "after_hash"  # after_hash | last_number | boxed

    def strict(self, text: str) -> str | None:
        return math_answer(text, (self.extract,))

    def flexible(self, text: str) -> str | None:
        found = flexible_extract(text)
        return canonical_number(found) if found is not None else None
