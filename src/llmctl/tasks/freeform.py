"""Free-form eval records: decontam's reader for every record no more specific family claims.

A record's passages are its question or context — the first text among `context`, `question`,
`prompt`, `query`, `problem`, `input` — followed by each of its choices (`choices` / `options`:
strings, {text} objects or {text: [...]}), or else by its answer (`answer`, else `solution`, else
`target`; a number written out, GSM8K calculator annotations removed); a record with neither is
its `text`. That covers generic multiple choice {context, choices}, generic generative {prompt,
answer}, GSM8K {question, answer}, MMLU {question, choices}, ARC in the Hugging Face layout and
MATH {problem, solution}. Asked last, it reads a record or says why not (file:line, with the
record's keys).
"""

from __future__ import annotations

from collections.abc import Callable

from llmctl.errors import UsageError
from llmctl.tasks.base import Family, join, read_choices, text_or_none
from llmctl.tasks.gsm8k import strip_calculator

QUESTION_KEYS = ("question", "prompt", "query", "problem", "input")  # tried after a family's own context field


def first_text(rec: dict, keys: tuple[str, ...]) -> str | None:
    """The first of `keys` whose value is a string with some text."""
    for k in keys:
        t = text_or_none(rec.get(k))
        if t:
            return t
    return None


def context_passages(rec: dict, at: str, ctx: str | None, clean: Callable[[str], str] | None = None) -> list[str]:
    """`ctx` followed by each choice (each passed through `clean`), else by the answer, else the
    record's text."""
    choices = read_choices(rec, at)
    if choices:
        if clean is not None:
            choices = [clean(c) for c in choices]
        return [join(ctx, c) for c in choices]
    answer = rec.get("answer", rec.get("solution", rec.get("target")))
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        answer = str(answer)  # a generative item's numeric answer (MMLU's index went with its choices)
    answer = strip_calculator(answer) if isinstance(answer, str) else None
    if ctx is not None:
        return [join(ctx, answer)]
    if text_or_none(rec.get("text")):
        return [rec["text"]]
    keys = ", ".join(k for k in rec if k != "_line") or "none"
    raise UsageError(
        f"{at}: no eval text found (expected one of context/choices, prompt/answer, question/answer, ctx/endings, "
        f"goal/sol1/sol2, sentence/option1/option2, text; the record has: {keys})"
    )


def passages(rec: dict, at: str) -> list[str]:
    return context_passages(rec, at, text_or_none(rec.get("context")) or first_text(rec, QUESTION_KEYS))


FAMILY = Family(name="freeform", order=1000, passages=passages)
