"""Winogrande (Sakaguchi et al. 2020): `{sentence, option1, option2, answer}` — a sentence with a
blank "_" and the two names or nouns that could fill it; `answer` is "1" or "2".

- eval (kind `winogrande`): partial scoring, as in the paper and lm-evaluation-harness — the
  context is the sentence up to the blank with each option filled in, and the continuation after
  the blank (the same for both) is what is scored.
- decontam: the sentence with the blank filled by each option.
"""

from __future__ import annotations

from llmctl.tasks.base import Family, MCItem, choice_label, join, mc_item, text_or_none


def item(r: dict, at: str) -> MCItem:
    s = r["sentence"]
    i = s.index("_")
    continuation = " " + s[i + 1 :].strip()
    pairs = [(s[:i] + r["option1"], continuation), (s[:i] + r["option2"], continuation)]
    return mc_item(pairs, choice_label(int(r["answer"]) - 1, 2, at))


def passages(rec: dict, at: str) -> list[str] | None:
    if not (text_or_none(rec.get("sentence")) and "option1" in rec):
        return None
    s = rec["sentence"]
    opts = [str(rec[k]) for k in ("option1", "option2") if rec.get(k) is not None]
    return [s.replace("_", o, 1) if "_" in s else join(s, o) for o in opts] or [s]


FAMILY = Family(name="winogrande", order=10, kind_order=50, kinds=("winogrande",), item_kind="mc", item=item, passages=passages)
