"""The filter step interface and the registry of steps.

A step is a small dataclass: its fields are its parameters (from a `[[steps]]` table of a filter
config), and `checks(doc)` yields `(statistic, value, passes)` in the order the rule checks them.
The filter stops at the first statistic that fails and names it in the `reason` column
(`gopher_quality.stop_words`); `--annotate-only` drains every step's checks and keeps the
values as `stats.<step>.<statistic>` columns. Steps that rewrite the text (C4's line cleaning,
PII masking) do it in `transform`, after their checks pass. The chain runs a batch of documents
through one step at a time, so a step that runs a model sees them together (`prepare_batch`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import ClassVar

from llmctl.data.filters.doc import Doc
from llmctl.errors import UsageError

Check = tuple[str, float, bool]
STEPS: dict[str, type["Step"]] = {}


def ratio(a: float, b: float) -> float:
    """a / b, NaN when b is 0 (NaN fails every threshold, and is a visible value in stats)."""
    return a / b if b else float("nan")


class Step:
    name: ClassVar[str] = ""

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if cls.name:
            STEPS[cls.name] = cls

    def checks(self, doc: Doc) -> Iterator[Check]:
        return iter(())

    def transform(self, doc: Doc) -> None:
        """Rewrite doc.text (most steps only look)."""

    def prepare(self, texts) -> None:
        """A pass over all documents before filtering (steps that need corpus-wide figures)."""

    needs_prepare: ClassVar[bool] = False

    def prepare_batch(self, docs: list[Doc]) -> None:
        """Called with the documents about to be checked, before their checks: a step that runs a
        model scores them here in a few large calls rather than one call a document."""

    def use_cores(self, n: int) -> None:
        """The cores each worker of the run may give this step's own threads (a model's)."""


def build_step(spec: dict) -> Step:
    """A step from its config table: {"name": "gopher_quality", "min_doc_words": 50, ...}."""
    spec = dict(spec)
    name = spec.pop("name", None)
    if name not in STEPS:
        raise UsageError(f"unknown filter step {name!r} (known: {', '.join(sorted(STEPS))})")
    cls = STEPS[name]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(spec) - set(fields))
    if unknown:
        raise UsageError(f"filter step {name!r}: unknown parameter(s) {', '.join(unknown)} (known: {', '.join(sorted(fields))})")
    for k, v in spec.items():
        default = fields[k].default
        if isinstance(default, float) and isinstance(v, int) and not isinstance(v, bool):
            spec[k] = float(v)
        elif default is not dataclasses.MISSING and default is not None and not isinstance(v, type(default)):
            if not (isinstance(default, (list, tuple)) and isinstance(v, (list, tuple))):
                raise UsageError(f"filter step {name!r}: {k} should be {type(default).__name__}, got {v!r}")
    return cls(**spec)


def first_failure(step: Step, doc: Doc) -> str | None:
    for stat, _, ok in step.checks(doc):
        if not ok:
            return stat
    return None


def all_stats(step: Step, doc: Doc) -> tuple[dict[str, float], str | None]:
    stats: dict[str, float] = {}
    failed = None
    for stat, value, ok in step.checks(doc):
        stats[stat] = float(value)
        if not ok and failed is None:
            failed = stat
    return stats, failed
