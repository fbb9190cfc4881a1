"""PIQA, Physical Interaction QA (Bisk et al. 2020): `{goal, sol1, sol2, label}` — which of two
solutions reaches the goal.

- eval (kind `piqa`): lm-evaluation-harness's cloze prompt "Question: {goal}\\nAnswer:", each
  solution after a space.
- decontam: the goal followed by each solution.
"""

from __future__ import annotations

from llmctl.tasks.base import Family, MCItem, choice_label, join, mc_item, text_or_none


def item(r: dict, at: str) -> MCItem:
    context = f"Question: {r['goal']}\nAnswer:"
    pairs = [(context, " " + r["sol1"]), (context, " " + r["sol2"])]
    return mc_item(pairs, choice_label(r["label"], 2, at))


def passages(rec: dict, at: str) -> list[str] | None:
    if not text_or_none(rec.get("goal")):
        return None
    sols = [rec[k] for k in ("sol1", "sol2") if text_or_none(rec.get(k))]
    return [join(rec["goal"], s) for s in sols] or [rec["goal"]]


FAMILY = Family(name="piqa", order=20, kind_order=40, kinds=("piqa",), item_kind="mc", item=item, passages=passages)
