"""The shapes every task family shares: the eval item types, the `Family` record a family module
exports, and the small record-reading helpers several families use.

A family module (one file under llmctl/tasks/) defines `FAMILY = Family(...)`; the registry
(tasks/registry.py) finds it by itself. Every hook is optional, and each is asked about a record
whose kind nobody named (a decontam `--against` file, an rl `--prompts` file, an SFT chats file):
it answers None when the record is not of its family's shape, raises UsageError (naming file:line)
when it is but cannot be read, and otherwise returns what its user needs. The registry asks the
families in `order` and takes the first answer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from llmctl.errors import UsageError


@dataclass
class MCItem:
    pairs: list[tuple[str, str]]  # (context, continuation) per choice
    label: int
    fewshot_text: str = ""  # this item written out with its answer, for k-shot prompts


@dataclass
class GenItem:
    question: str
    answer: str  # the reference as written (a GSM8K solution ends in "#### N")
    target: str  # canonical answer the prediction must equal
    fewshot_text: str = ""


Record = dict  # one task-file record, as tasks/files.py reads it


@dataclass(frozen=True)
class Family:
    """What one dataset family tells each of its users; a hook left None is a use it has no part in."""

    name: str
    order: int  # when a record's kind is unknown, families are asked in this order: specific shapes first
    kinds: tuple[str, ...] = ()  # eval `--task KIND:PATH` names read by `item`
    kind_order: int | None = None  # where those kinds stand in listings (default: `order`)
    # eval
    item_kind: str = ""  # "mc" or "gen"
    item: Callable[[Record, str], MCItem | GenItem] | None = None  # may raise KeyError / TypeError / ValueError
    prompt: Callable[[GenItem], str] | None = None  # gen: the item's plain prompt (the few-shot prefix goes before it)
    prompt_format: str = ""  # gen: the plain prompt format, as written in the eval report
    stop: tuple[str, ...] = ()  # gen and rl: where a plain-prompt generation stops
    extract: str = "after_hash"  # gen: the answer extraction rule that fits this family's answers
    # decontam: the passages of a record (question/context followed by an answer or each choice)
    passages: Callable[[Record, str], list[str] | None] | None = None
    # rl: {"prompt": str, "reference": ...}
    rl_prompt: Callable[[Record, str], dict | None] | None = None
    rl_shapes: tuple[str, ...] = ()  # the prompt fields it reads, for the error when no family reads a record
    # rl on a checkpoint without a chat template: the text the model is given for a prompt (it stops at `stop`)
    rl_plain_prompt: Callable[[str], str] | None = None
    # SFT: a conversation, [{"role", "content"}]
    conversation: Callable[[Record, str], list[dict] | None] | None = None
    conversation_shapes: tuple[str, ...] = ()  # the fields it reads, for the same error


# ---------------------------------------------------------------------------------------------
# Record helpers


def either(parts: Sequence[str]) -> str:
    """'a', 'a or b', 'a, b or c'."""
    parts = list(parts)
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " or " + parts[-1]


def text_or_none(v) -> str | None:
    """`v` when it is a string with some non-space text, else None."""
    return v if isinstance(v, str) and v.strip() else None


def join(*parts) -> str:
    """The non-empty parts, separated by single spaces."""
    return " ".join(p for p in parts if p)


def choice_label(value, n: int, at: str) -> int:
    """A gold choice index from an int, a digit string or a letter (A, B, …)."""
    if isinstance(value, str):
        value = value.strip()
        value = "ABCDEFGHIJ".index(value) if len(value) == 1 and value.isalpha() else int(value)
    if not isinstance(value, int) or not 0 <= value < n:
        raise UsageError(f"{at}: label {value!r} is not one of the {n} choices")
    return value


def mc_item(pairs: list[tuple[str, str]], label: int) -> MCItem:
    """An MCItem whose few-shot text is its gold (context, continuation) written out."""
    gold_context, gold_continuation = pairs[label]
    return MCItem(pairs, label, fewshot_text=gold_context + gold_continuation)


def read_choices(rec: dict, at: str) -> list[str] | None:
    """Choice texts from the shapes in use: a list of strings, a list of {text}, or {text: [...]}
    under `choices`, `endings` or `options`; None when the record has none of them."""
    for key in ("choices", "endings", "options"):
        v = rec.get(key)
        if v is None:
            continue
        if isinstance(v, dict) and isinstance(v.get("text"), list):
            v = v["text"]
        if not isinstance(v, list):
            raise UsageError(f"{at}: '{key}' must be a list, got {type(v).__name__}")
        out = []
        for c in v:
            if isinstance(c, dict):
                c = c.get("text")
            if isinstance(c, (int, float)) and not isinstance(c, bool):
                c = str(c)
            if not isinstance(c, str):
                raise UsageError(f"{at}: '{key}' holds a {type(c).__name__}, expected text")
            out.append(c)
        return out
    return None


def message_text(value, where: str, key: str) -> str:
    """A conversation turn's content: a string, or a number written out."""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise UsageError(f"{where}: {key!r} must be a string, got {type(value).__name__}")


def exchange(question, answer, where: str, ask: str, say: str) -> list[dict]:
    """A one-turn conversation: the user asks `question`, the assistant answers `answer`."""
    return [{"role": "user", "content": message_text(question, where, ask)},
            {"role": "assistant", "content": message_text(answer, where, say)}]
