"""Eval task specs: `KIND:PATH` on the command line, and the items, prompts and stop strings of a
task, looked up in the task-family registry (llmctl.tasks).

Two item kinds (llmctl/tasks/base.py):
- `MCItem`: pairs of (context, continuation) strings, one per choice, and the gold index. Cloze
  formulation (spec 001-data-eval §A10): each continuation is scored as text after its context.
  Most tasks share one context; Winogrande varies the context and keeps the continuation.
- `GenItem`: a question, the reference answer text, and the canonical target.

A task spec is `KIND:PATH` (e.g. `mc:examples/tasks/cloze.jsonl`, `gsm8k:data/gsm8k/test.jsonl`,
`loss:out/demo/tokens/val`): KIND is a family's eval kind (`eval_kinds()`: native files of
HellaSwag, ARC, PIQA, Winogrande, MMLU, GSM8K and MATH are read with the prompt formats
lm-evaluation-harness uses for them, so the two tools score the same strings), or `loss` for a
tokens artifact.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llmctl.errors import UsageError
from llmctl.tasks import registry
from llmctl.tasks.base import GenItem, MCItem

LOSS = "loss"


def kinds() -> tuple[str, ...]:
    """Every KIND of `--task KIND:PATH`: the families' eval kinds, then loss."""
    return registry.eval_kinds() + (LOSS,)


@dataclass
class TaskSpec:
    kind: str
    path: str
    name: str = ""

    def __post_init__(self):
        if not self.name:
            self.name = f"{self.kind}:{Path(self.path).stem}" if self.kind != LOSS else f"loss:{Path(self.path).name}"


def parse_task(spec: str) -> TaskSpec:
    kind, sep, path = spec.partition(":")
    if not sep or kind not in kinds():
        raise UsageError(f"--task {spec!r}: expected KIND:PATH with KIND one of {', '.join(kinds())}")
    if not Path(path).exists():
        raise UsageError(f"--task {spec!r}: {path} not found")
    return TaskSpec(kind, path)


def load_items(spec: TaskSpec, limit: int | None = None) -> list[MCItem] | list[GenItem]:
    return registry.load_items(spec.kind, spec.path, limit)


def gen_prompt(kind: str, item: GenItem, prefix: str) -> str:
    """The plain (not chat) prompt of a generative item, after its few-shot prefix."""
    return prefix + registry.family_for_kind(kind).prompt(item)


def gen_stop(kind: str) -> tuple[str, ...]:
    """Where a plain-prompt generation of this kind stops."""
    return registry.family_for_kind(kind).stop


def gen_extract(kind: str) -> str:
    """The answer extraction rule that fits this kind's answers (`####` for GSM8K, `\\boxed{}` for MATH)."""
    return registry.family_for_kind(kind).extract


def prompt_format(kind: str) -> str:
    """The plain prompt format of a generative kind, as the eval report writes it."""
    return registry.family_for_kind(kind).prompt_format
