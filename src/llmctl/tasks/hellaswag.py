"""HellaSwag (Zellers et al. 2019): `{activity_label, ctx_a, ctx_b, ctx, endings, label}` —
which of four endings continues a video caption or a WikiHow passage.

- eval (kind `hellaswag`): lm-evaluation-harness's preprocessing — context "activity_label:
  ctx_a Ctx_b", each ending after a space; " [title]" becomes ". " and other [bracketed] tags
  are dropped — scored as cloze continuations.
- decontam: the context (`ctx`, or `ctx_a` + `ctx_b`) followed by each ending, WikiHow's
  [title] / [header] / [step] tags replaced by spaces (lowercase words in brackets only, so the
  passage keeps any other bracketed text).
"""

from __future__ import annotations

import re

from llmctl.tasks.base import Family, MCItem, choice_label, join, mc_item, text_or_none
from llmctl.tasks.freeform import QUESTION_KEYS, context_passages, first_text

_TAG = re.compile(r"\[[a-z ]+\]", re.I)  # WikiHow's [title], [header], [step] tags


def _clean(text: str) -> str:
    """The harness's `preprocess` of a HellaSwag text."""
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def item(r: dict, at: str) -> MCItem:
    context = _clean(f"{r['activity_label']}: {r['ctx_a']} {r['ctx_b'].capitalize()}")
    pairs = [(context, " " + _clean(e)) for e in r["endings"]]
    return mc_item(pairs, choice_label(r["label"], len(pairs), at))


def _untag(text: str) -> str:
    return _TAG.sub(" ", text)


def passages(rec: dict, at: str) -> list[str] | None:
    if not any(k in rec for k in ("ctx", "ctx_a", "ctx_b", "endings")):
        return None
    ctx = text_or_none(rec.get("context")) or text_or_none(rec.get("ctx")) or join(text_or_none(rec.get("ctx_a")), text_or_none(rec.get("ctx_b"))) or None
    if ctx is not None and ("ctx" in rec or "ctx_a" in rec):
        ctx = _untag(ctx)
    ctx = ctx or first_text(rec, QUESTION_KEYS)
    return context_passages(rec, at, ctx, _untag if "endings" in rec else None)


FAMILY = Family(name="hellaswag", order=40, kind_order=20, kinds=("hellaswag",), item_kind="mc", item=item, passages=passages)
