"""The registry of task families: every module of llmctl/tasks/ that defines `FAMILY` is found
with pkgutil, so a new family is one new file. Its users look families up here:

- eval: `family_for_kind(kind)`, `eval_kinds()`, `load_items(kind, path, limit)`;
- decontam: `record_passages(rec, at)` (the first family, in `order`, whose `passages` reads it);
- rl: `load_prompts(path)` / `rl_prompt(rec, at)`, and `read_prompts(path)`, which also names
  the family that read each prompt (its plain prompt and stop strings are rl's without a chat template);
- SFT: `to_messages(rec, at)`.

A record of unknown kind goes to the families in `order`; the first that answers (not None)
decides, and an error it raises is the record's error (tasks/base.py).
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

from llmctl.errors import UsageError
from llmctl.tasks.base import Family, GenItem, MCItem, either
from llmctl.tasks.files import read_records, where

_FAMILIES: list[Family] | None = None


def families() -> list[Family]:
    """Every family, in `order` (found once, on first use)."""
    global _FAMILIES
    if _FAMILIES is None:
        found: list[Family] = []
        for m in pkgutil.iter_modules([str(Path(__file__).parent)]):
            if m.name.startswith("_"):
                continue
            family = getattr(importlib.import_module(f"{__package__}.{m.name}"), "FAMILY", None)
            if isinstance(family, Family):
                found.append(family)
        names: dict[str, str] = {}
        for f in found:
            if f.rl_prompt is not None and f.rl_plain_prompt is None:
                raise RuntimeError(f"llmctl.tasks: family {f.name} reads rl prompts but gives no rl_plain_prompt")
            for key in (f"family {f.name}", *(f"eval kind {k}" for k in f.kinds)):
                if key in names:
                    raise RuntimeError(f"llmctl.tasks: two families define {key}")
                names[key] = f.name
        _FAMILIES = sorted(found, key=lambda f: (f.order, f.name))
    return _FAMILIES


def _answer(hook: str, rec: dict, at: str) -> tuple[Family, object] | None:
    """The first family (in `order`) whose `hook` reads the record, and what it made of it."""
    for f in families():
        fn = getattr(f, hook)
        if fn is not None:
            got = fn(rec, at)
            if got is not None:
                return f, got
    return None


def _ask(hook: str, rec: dict, at: str):
    got = _answer(hook, rec, at)
    return None if got is None else got[1]


def _shapes(attr: str) -> list[str]:
    return [s for f in families() for s in getattr(f, attr)]


# ---------------------------------------------------------------------------------------------
# eval


def eval_kinds() -> tuple[str, ...]:
    """The `--task KIND:PATH` kinds that read task files, in listing order."""
    with_kinds = sorted((f for f in families() if f.kinds), key=lambda f: (f.order if f.kind_order is None else f.kind_order, f.name))
    return tuple(k for f in with_kinds for k in f.kinds)


def family_for_kind(kind: str) -> Family:
    for f in families():
        if kind in f.kinds:
            return f
    raise UsageError(f"unknown task kind {kind!r} (choose from {', '.join(eval_kinds())})")


def load_items(kind: str, path: str, limit: int | None = None) -> list[MCItem] | list[GenItem]:
    """The eval items of a task file of this kind (the first `limit`); a record that does not fit
    raises UsageError naming file:line and the missing field."""
    family = family_for_kind(kind)
    records = read_records(path)
    if not records:
        raise UsageError(f"{path}: no items")
    items = []
    for i, r in enumerate(records[:limit] if limit else records):
        at = where(path, r, i)
        try:
            items.append(family.item(r, at))
        except KeyError as e:
            raise UsageError(f"{at}: missing field {e.args[0]!r} for a {kind} item") from e
        except (TypeError, ValueError, AttributeError) as e:
            raise UsageError(f"{at}: malformed {kind} item ({e})") from e
    return items


# ---------------------------------------------------------------------------------------------
# decontam, rl, SFT: records of unknown kind


def record_passages(rec: dict, at: str) -> list[str]:
    """The passages of one eval record: its question or context followed by an answer or by each
    choice (each family module says how it writes its records out)."""
    got = _ask("passages", rec, at)
    if got is None:
        keys = ", ".join(k for k in rec if k != "_line") or "none"
        raise UsageError(f"{at}: no eval text found (the record has: {keys})")
    return got


def _rl_prompt(rec: dict, at: str) -> tuple[Family, dict]:
    got = _answer("rl_prompt", rec, at)
    if got is None:
        raise UsageError(f"{at}: expected a non-empty {either(_shapes('rl_shapes'))} string")
    return got


def rl_prompt(rec: dict, at: str) -> dict:
    """{"prompt": str, "reference": ...} for one rl prompt record."""
    return _rl_prompt(rec, at)[1]


def read_prompts(path: str | Path) -> tuple[list[dict], list[Family]]:
    """load_prompts' prompts, and the family that read each of them."""
    records = read_records(path)
    read = [_rl_prompt(rec, where(path, rec, i)) for i, rec in enumerate(records)]
    if not read:
        raise UsageError(f"{path}: no prompts")
    return [p for _, p in read], [f for f, _ in read]


def load_prompts(path: str | Path) -> list[dict]:
    """RL prompts as ``[{"prompt": str, "reference": ...}]`` from JSONL (.jsonl/.json/.gz) or
    Parquet, each record read by the first family that takes it: ``{prompt, answer}`` (or
    ``reference`` / ``tests``), GSM8K native ``{question, answer}`` whose answer ends with ``#### n``
    (the whole solution is kept as the reference; the math verifier reads the number after ####),
    MATH ``{problem, solution}`` (tasks/math.py). A bad line raises UsageError naming file:line."""
    return read_prompts(path)[0]


def to_messages(record: dict, where: str) -> list[dict]:
    """A record as a list of {role, content}, by the first family that reads it: a `messages`
    list, GSM8K's {question, answer} (the assistant says the full solution, "#### n" included),
    {prompt, answer}, MATH's {problem, solution}."""
    if not isinstance(record, dict):
        raise UsageError(f"{where}: expected an object, got {type(record).__name__}")
    got = _ask("conversation", record, where)
    if got is None:
        keys = ", ".join(sorted(k for k in record if not k.startswith("_"))) or "none"
        raise UsageError(f"{where}: expected {either(_shapes('conversation_shapes'))} (keys: {keys})")
    return got
