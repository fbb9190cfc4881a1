"""Eval task files → items, and how each item becomes a prompt.

Two item kinds:
- `MCItem`: pairs of (context, continuation) strings, one per choice, and the gold index. Cloze
  formulation (spec 001-data-eval §A10): each continuation is scored as text after its context.
  Most tasks share one context; Winogrande varies the context and keeps the continuation.
- `GenItem`: a question, the reference answer text, and the canonical target.

A task spec on the command line is `KIND:PATH` (e.g. `mc:examples/tasks/cloze.jsonl`,
`gsm8k:../shared/data/gsm8k/test.jsonl`, `loss:out/demo/tokens/val`). Native files of
HellaSwag, ARC, PIQA, Winogrande, MMLU and GSM8K are read with the prompt formats
lm-evaluation-harness uses for them, so the two tools score the same strings.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path

from llmctl.errors import UsageError
from llmctl.eval.metrics import canonical_number, extract_answer
from llmctl.eval.taskfile import read_records, where

MC_KINDS = ("mc", "hellaswag", "arc", "piqa", "winogrande", "mmlu")
GEN_KINDS = ("gsm8k", "gen")
KINDS = MC_KINDS + GEN_KINDS + ("loss",)


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


@dataclass
class TaskSpec:
    kind: str
    path: str
    name: str = ""

    def __post_init__(self):
        if not self.name:
            self.name = f"{self.kind}:{Path(self.path).stem}" if self.kind != "loss" else f"loss:{Path(self.path).name}"


def parse_task(spec: str) -> TaskSpec:
    kind, sep, path = spec.partition(":")
    if not sep or kind not in KINDS:
        raise UsageError(f"--task {spec!r}: expected KIND:PATH with KIND one of {', '.join(KINDS)}")
    if not Path(path).exists():
        raise UsageError(f"--task {spec!r}: {path} not found")
    return TaskSpec(kind, path)


# -- multiple choice -----------------------------------------------------------------------------

def _label(value, n: int, at: str) -> int:
    if isinstance(value, str):
        value = value.strip()
        value = "ABCDEFGHIJ".index(value) if len(value) == 1 and value.isalpha() else int(value)
    if not isinstance(value, int) or not 0 <= value < n:
        raise UsageError(f"{at}: label {value!r} is not one of the {n} choices")
    return value


def _hellaswag_clean(text: str) -> str:
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def _mc_item(kind: str, r: dict, at: str) -> MCItem:
    if kind == "mc":
        context, choices = r["context"], r["choices"]
        if not isinstance(choices, list) or len(choices) < 2:
            raise UsageError(f"{at}: 'choices' must be a list of at least 2 strings")
        label = _label(r["label"], len(choices), at)
        pairs = [(context, c) for c in choices]
    elif kind == "hellaswag":
        context = _hellaswag_clean(f"{r['activity_label']}: {r['ctx_a']} {r['ctx_b'].capitalize()}")
        pairs = [(context, " " + _hellaswag_clean(e)) for e in r["endings"]]
        label = _label(r["label"], len(pairs), at)
    elif kind == "arc":
        q = r["question"]
        if isinstance(q, dict):  # the original AI2 release: question.stem, question.choices
            texts, labels, stem = [c["text"] for c in q["choices"]], [c["label"] for c in q["choices"]], q["stem"]
        else:  # the Hugging Face layout: choices.text / choices.label
            texts, labels, stem = r["choices"]["text"], r["choices"]["label"], q
        context = f"Question: {stem}\nAnswer:"
        pairs = [(context, " " + t) for t in texts]
        if r["answerKey"] not in labels:
            raise UsageError(f"{at}: answerKey {r['answerKey']!r} not among {labels}")
        label = labels.index(r["answerKey"])
    elif kind == "piqa":
        context = f"Question: {r['goal']}\nAnswer:"
        pairs = [(context, " " + r["sol1"]), (context, " " + r["sol2"])]
        label = _label(r["label"], 2, at)
    elif kind == "winogrande":
        # partial scoring (Sakaguchi et al.; the harness): the context varies with the option,
        # the continuation after the blank is what is scored
        s = r["sentence"]
        i = s.index("_")
        continuation = " " + s[i + 1 :].strip()
        pairs = [(s[:i] + r["option1"], continuation), (s[:i] + r["option2"], continuation)]
        label = _label(int(r["answer"]) - 1, 2, at)
    elif kind == "mmlu":
        # multiple-choice formulation with letters, the harness's default for MMLU
        letters = "ABCD"
        body = "\n".join(f"{letters[j]}. {c}" for j, c in enumerate(r["choices"]))
        context = f"{r['question'].strip()}\n{body}\nAnswer:"
        pairs = [(context, f" {letters[j]}") for j in range(len(r["choices"]))]
        label = _label(r["answer"], len(pairs), at)
    else:  # pragma: no cover - parse_task rejects other kinds
        raise UsageError(f"unknown task kind {kind}")
    gold_context, gold_continuation = pairs[label]
    return MCItem(pairs, label, fewshot_text=gold_context + gold_continuation)


# -- generative ----------------------------------------------------------------------------------

GSM8K_PROMPT = "Question: {question}\nAnswer:"
GSM8K_STOP = ("\n\nQuestion:", "Question:", "\n\n")


def _gen_item(kind: str, r: dict, at: str) -> GenItem:
    if kind == "gsm8k":
        question, answer = r["question"], r["answer"]
        target = extract_answer(answer, "after_hash")
        if target is None:
            raise UsageError(f"{at}: GSM8K answer has no '#### N' line")
        return GenItem(question, answer, canonical_number(target),
                       fewshot_text=GSM8K_PROMPT.format(question=question) + " " + answer)
    question, answer = r["prompt"], str(r["answer"])
    return GenItem(question, answer, canonical_number(answer), fewshot_text=question + " " + answer)


def load_items(spec: TaskSpec, limit: int | None = None) -> list[MCItem] | list[GenItem]:
    records = read_records(spec.path)
    if not records:
        raise UsageError(f"{spec.path}: no items")
    build = _mc_item if spec.kind in MC_KINDS else _gen_item
    items = []
    for i, r in enumerate(records[:limit] if limit else records):
        at = where(spec.path, r, i)
        try:
            items.append(build(spec.kind, r, at))
        except KeyError as e:
            raise UsageError(f"{at}: missing field {e.args[0]!r} for a {spec.kind} item") from e
        except (TypeError, ValueError, AttributeError) as e:
            raise UsageError(f"{at}: malformed {spec.kind} item ({e})") from e
    return items


def fewshot_indices(pool: list, index: int, shots: int, seed: int) -> list[int]:
    """k examples drawn with a fixed seed from the pool, never the item itself."""
    if shots <= 0:
        return []
    rng = random.Random(seed * 1_000_003 + index)
    return rng.sample([j for j in range(len(pool)) if j != index], min(shots, len(pool) - 1))


def fewshot_prefix(pool: list, index: int, shots: int, seed: int) -> str:
    """The k solved examples written out before the item, separated by blank lines."""
    return "".join(pool[j].fewshot_text + "\n\n" for j in fewshot_indices(pool, index, shots, seed))


def chat_messages(pool: list[GenItem], index: int, shots: int, seed: int) -> list[dict]:
    """The same item for a chat model (SFT/RL checkpoints): solved examples as earlier turns."""
    msgs = []
    for j in fewshot_indices(pool, index, shots, seed):
        msgs += [{"role": "user", "content": pool[j].question}, {"role": "assistant", "content": pool[j].answer}]
    return msgs + [{"role": "user", "content": pool[index].question}]


def gen_prompt(kind: str, item: GenItem, prefix: str) -> str:
    if kind == "gsm8k":
        return prefix + GSM8K_PROMPT.format(question=item.question)
    return prefix + item.question


@dataclass
class GenScoring:
    """How a generated answer is read: the rl `math` verifier's reader, so training rewards and
    eval scores come from one checker (spec 001-posttrain-rl §A5)."""
    extract: str = "after_hash"  # after_hash | last_number | boxed
    fallback: str | None = "last_number"  # used when the main rule finds nothing

    def answer(self, text: str) -> str | None:
        from llmctl.rl.rewards import math_answer

        return math_answer(text, (self.extract,) + ((self.fallback,) if self.fallback else ()))
