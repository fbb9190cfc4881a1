"""ARC, the AI2 Reasoning Challenge (Clark et al. 2018): science questions with 3-5 choices and an
`answerKey` letter (or digit), in two layouts — the original AI2 release `{question: {stem,
choices: [{text, label}]}, answerKey}` and the Hugging Face one `{question, choices: {text: [...],
label: [...]}, answerKey}`.

- eval (kind `arc`): lm-evaluation-harness's cloze prompt "Question: {stem}\\nAnswer:", each
  choice's text after a space.
- decontam: the stem followed by each choice (the AI2 layout here; the Hugging Face layout is
  the free-form question + choices, tasks/freeform.py).
"""

from __future__ import annotations

from llmctl.errors import UsageError
from llmctl.tasks.base import Family, MCItem, join, mc_item, read_choices, text_or_none


def item(r: dict, at: str) -> MCItem:
    q = r["question"]
    if isinstance(q, dict):  # the original AI2 release: question.stem, question.choices
        texts, labels, stem = [c["text"] for c in q["choices"]], [c["label"] for c in q["choices"]], q["stem"]
    else:  # the Hugging Face layout: choices.text / choices.label
        texts, labels, stem = r["choices"]["text"], r["choices"]["label"], q
    context = f"Question: {stem}\nAnswer:"
    pairs = [(context, " " + t) for t in texts]
    if r["answerKey"] not in labels:
        raise UsageError(f"{at}: answerKey {r['answerKey']!r} not among {labels}")
    return mc_item(pairs, labels.index(r["answerKey"]))


def passages(rec: dict, at: str) -> list[str] | None:
    q = rec.get("question")
    if not isinstance(q, dict):
        return None
    stem = q.get("stem")
    if not text_or_none(stem):
        raise UsageError(f"{at}: 'question' has no 'stem' text")
    return [join(stem, c) for c in (read_choices(q, at) or [])] or [stem]


FAMILY = Family(name="arc", order=30, kinds=("arc",), item_kind="mc", item=item, passages=passages)
