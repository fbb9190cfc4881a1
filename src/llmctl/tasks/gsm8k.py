"""GSM8K (Cobbe et al. 2021): `{question, answer}` grade-school word problems whose answer is a
worked solution ending in a line "#### N", with calculator annotations such as <<48/2=24>>.

- eval (kind `gsm8k`): the prompt "Question: {question}\\nAnswer:" and the stop strings of
  lm-evaluation-harness, so the two tools score the same strings; the target is N, canonical;
  answers are read with `after_hash` (tasks/answers.py).
- decontam: the question followed by the solution with its calculator annotations removed
  (`strip_calculator`; the free-form reader, tasks/freeform.py, applies it to any answer, since
  datasets derived from GSM8K keep them).
- rl and SFT: a `{question, answer}` record is a prompt with its reference, read by
  tasks/prompt_answer.py (the whole solution is the reference, and the assistant's turn), which
  gives a checkpoint without a chat template this module's prompt and stop strings.
"""

from __future__ import annotations

import re

from llmctl.errors import UsageError
from llmctl.tasks.answers import canonical_number, extract_answer
from llmctl.tasks.base import Family, GenItem

PROMPT = "Question: {question}\nAnswer:"
STOP = ("\n\nQuestion:", "Question:", "\n\n")

_CALC = re.compile(r"<<[^<>]*>>")


def strip_calculator(text: str) -> str:
    """The solution without GSM8K's calculator annotations <<...>>."""
    return _CALC.sub("", text)


def item(r: dict, at: str) -> GenItem:
    question, answer = r["question"], r["answer"]
    target = extract_answer(answer, "after_hash")
    if target is None:
        raise UsageError(f"{at}: GSM8K answer has no '#### N' line")
    return GenItem(question, answer, canonical_number(target), fewshot_text=plain_prompt(question) + " " + answer)


def plain_prompt(question: str) -> str:
    return PROMPT.format(question=question)


def prompt(it: GenItem) -> str:
    return plain_prompt(it.question)


FAMILY = Family(
    name="gsm8k", order=70, kinds=("gsm8k",),
    item_kind="gen", item=item, prompt=prompt, prompt_format="Question: {question}\\nAnswer:", stop=STOP, extract="after_hash",
)
