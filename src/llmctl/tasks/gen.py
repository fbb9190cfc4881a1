"""Generic generative items `{prompt, answer}` (eval kind `gen`): the prompt is given to the model
as written, and the answer (a number or a short string) is the target, canonical
(tasks/answers.py). A plain prompt stops where GSM8K's does.

For decontam, rl and SFT such a record is read by the free-form reader (tasks/freeform.py) and by
tasks/prompt_answer.py.
"""

from __future__ import annotations

from llmctl.tasks.answers import canonical_number
from llmctl.tasks.base import Family, GenItem
from llmctl.tasks.gsm8k import STOP


def item(r: dict, at: str) -> GenItem:
    question, answer = r["prompt"], str(r["answer"])
    return GenItem(question, answer, canonical_number(answer), fewshot_text=question + " " + answer)


def prompt(it: GenItem) -> str:
    return it.question


FAMILY = Family(
    name="gen", order=80, kinds=("gen",),
    item_kind="gen", item=item, prompt=prompt, prompt_format="{prompt}", stop=STOP, extract="after_hash",
)
