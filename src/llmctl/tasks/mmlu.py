"""MMLU (Hendrycks et al. 2021, "Measuring Massive Multitask Language Understanding"):
`{question, subject, choices: [4 strings], answer: 0-3}`.

- eval (kind `mmlu`): the multiple-choice formulation with letters, lm-evaluation-harness's
  default for MMLU — the question, the choices as "A. …" lines, then "Answer:"; the scored
  continuations are " A" … " D".
- decontam: the question followed by each choice, read by the free-form reader
  (tasks/freeform.py).
"""

from __future__ import annotations

from llmctl.tasks.base import Family, MCItem, choice_label, mc_item

LETTERS = "ABCD"


def item(r: dict, at: str) -> MCItem:
    body = "\n".join(f"{LETTERS[j]}. {c}" for j, c in enumerate(r["choices"]))
    context = f"{r['question'].strip()}\n{body}\nAnswer:"
    pairs = [(context, f" {LETTERS[j]}") for j in range(len(r["choices"]))]
    return mc_item(pairs, choice_label(r["answer"], len(pairs), at))


FAMILY = Family(name="mmlu", order=60, kinds=("mmlu",), item_kind="mc", item=item)
