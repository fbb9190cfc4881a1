"""Generic multiple choice `{context, choices, label}` (eval kind `mc`): each choice is scored as
the continuation of the shared context (the cloze formulation, spec 001-data-eval §A10); `label`
is the gold choice's index (or letter).

For decontam the record is read by the free-form reader (tasks/freeform.py): the context
followed by each choice.
"""

from __future__ import annotations

from llmctl.errors import UsageError
from llmctl.tasks.base import Family, MCItem, choice_label, mc_item


def item(r: dict, at: str) -> MCItem:
    context, choices = r["context"], r["choices"]
    if not isinstance(choices, list) or len(choices) < 2:
        raise UsageError(f"{at}: 'choices' must be a list of at least 2 strings")
    label = choice_label(r["label"], len(choices), at)
    return mc_item([(context, c) for c in choices], label)


FAMILY = Family(name="mc", order=50, kind_order=10, kinds=("mc",), item_kind="mc", item=item)
