"""MATH (Hendrycks et al. 2021, "Measuring Mathematical Problem Solving With the MATH Dataset"):
competition problems `{problem, solution, level, type}` whose answer is the last \\boxed{...} of
the worked solution, braces nested to any depth (\\boxed{\\frac{1}{2}}). Copies that name the
fields `question` and `answer` (a bare final answer, as in MATH-500) are read too.

- eval (kind `math`): lm-evaluation-harness's hendrycks_math prompt "Problem: {problem}\\nAnswer:",
  stopping at the next "Problem:"; answers are read with `boxed` (tasks/answers.py), and the
  target is the reference read the same way, so "0.5", "1/2" and \\frac{1}{2} score alike.
- rl: the problem is the prompt; the reference is the solution (the `math` verifier reads its
  last \\boxed{}), or a bare answer written as \\boxed{answer}, so that it is read like a
  prediction. A checkpoint without a chat template is given eval's prompt and stop strings.
- SFT: one exchange — the user gives the problem, the assistant the worked solution (or the
  bare answer).
- decontam: the problem followed by the answer (else the solution), read by the free-form reader
  (tasks/freeform.py).

In rl and SFT, where the kind is not named, MATH is asked after tasks/prompt_answer.py (so a
record the generic reader takes is read as it always was) and reads a record with a `problem`
or a `solution` field.
"""

from __future__ import annotations

from llmctl.errors import UsageError
from llmctl.tasks.answers import last_boxed, reference_answer
from llmctl.tasks.base import Family, GenItem, exchange, text_or_none

PROMPT = "Problem: {problem}\nAnswer:"
STOP = ("Problem:",)


def _is_math(rec: dict) -> bool:
    return "problem" in rec or "solution" in rec


def _field(rec: dict, keys: tuple[str, str], at: str) -> str:
    """The first of `keys` the record has."""
    for k in keys:
        if k in rec and rec[k] is not None:
            return k
    raise UsageError(f"{at}: a MATH record needs a '{keys[0]}' (or '{keys[1]}')")


def _problem(rec: dict, at: str) -> str:
    text = text_or_none(rec.get(_field(rec, ("problem", "question"), at)))
    if text is None:
        raise UsageError(f"{at}: the MATH problem must be a non-empty string")
    return text


def reference(rec: dict, at: str) -> str:
    """The reference as the `math` verifier reads it: the solution when it has a \\boxed{} answer,
    else the bare `answer` as \\boxed{answer}."""
    solution, answer = rec.get("solution"), rec.get("answer")
    if isinstance(solution, str) and last_boxed(solution) is not None:
        return solution
    if isinstance(answer, str) and last_boxed(answer) is not None:
        return answer
    if isinstance(answer, (str, int, float)) and not isinstance(answer, bool) and str(answer).strip():
        return f"\\boxed{{{answer}}}"
    raise UsageError(f"{at}: a MATH record needs a solution with a \\boxed{{...}} answer, or an 'answer'")


def item(r: dict, at: str) -> GenItem:
    problem, ref = _problem(r, at), reference(r, at)
    target = reference_answer(ref)
    if target is None:
        raise UsageError(f"{at}: the MATH answer \\boxed{{}} is empty")
    solution = r.get("solution")
    shown = solution if isinstance(solution, str) else str(r["answer"])  # as written: few-shot text, chat turn
    return GenItem(problem, shown, target, fewshot_text=plain_prompt(problem) + " " + shown)


def plain_prompt(problem: str) -> str:
    return PROMPT.format(problem=problem)


def prompt(it: GenItem) -> str:
    return plain_prompt(it.question)


def rl_prompt(rec: dict, at: str) -> dict | None:
    if not _is_math(rec):
        return None
    return {"prompt": _problem(rec, at), "reference": reference(rec, at)}


def conversation(rec: dict, at: str) -> list[dict] | None:
    if not _is_math(rec):
        return None
    ask, say = _field(rec, ("problem", "question"), at), _field(rec, ("solution", "answer"), at)
    return exchange(rec[ask], rec[say], at, ask, say)


FAMILY = Family(
    name="math", order=90, kinds=("math",),
    item_kind="gen", item=item, prompt=prompt, prompt_format="Problem: {problem}\\nAnswer:", stop=STOP, extract="boxed",
    rl_prompt=rl_prompt, rl_shapes=("MATH 'problem'",), rl_plain_prompt=plain_prompt,
    conversation=conversation, conversation_shapes=("'problem'+'solution'",),
)
