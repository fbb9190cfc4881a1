"""filter: run an ordered chain of steps over docs; keep what a pretraining corpus wants.

A config is an ordered list of steps (`[[steps]]` tables; data/filters/ has them). A document
goes through the steps in order; the first step whose check fails drops it, and its `reason`
names the step and the statistic (`gopher_quality.stop_words`). Steps that rewrite text (C4's
line cleaning, PII masking) do so for the steps after them.

`annotate_only` drops nothing: every step's statistics become `stats.<step>.<statistic>`
columns and `reason` says what the filter would have done, for choosing thresholds
(`llmctl filter stats` plots them).

The funnel — documents and characters removed by each step, with the share of the original —
goes into the manifest and the end-of-run table (spec 001-data-eval §A3: "report tokens
removed next to every score"). Work is one task per input Parquet/JSONL file.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import pyarrow as pa

from llmctl.artifacts.docs import DocsSource, read_source
from llmctl.artifacts.docs_shard import ShardInput, ShardOutput
from llmctl.artifacts.manifest import Manifest
from llmctl.data.filters import STEPS, Doc, Step, all_stats, build_step, first_failure
from llmctl.errors import UsageError
from llmctl.runtime.executor import Task
from llmctl.runtime.progress import Progress
from llmctl.runtime.options import RunOptions, cores_per_task
from llmctl.runtime.sharded import run_sharded
from llmctl.runtime.stage import stage_run

STAGE = "filter"


def default_steps() -> list[dict]:
    """The FineWeb chain, as stages/filter/fineweb.toml defines it (the one definition)."""
    from llmctl.config import find_config, read_toml

    return read_toml(find_config(STAGE, "fineweb"))["steps"]


@dataclass
class FilterConfig:
    steps: list[dict] = field(default_factory=default_steps)
    annotate_only: bool = False
    keep_rejected: bool = False


def step_labels(steps: list[dict]) -> list[str]:
    """Names that tell steps apart in reasons and the funnel (a second `c4` becomes `c4_2`)."""
    seen: dict[str, int] = {}
    labels = []
    for s in steps:
        name = s.get("name", "?")
        seen[name] = seen.get(name, 0) + 1
        labels.append(name if seen[name] == 1 else f"{name}_{seen[name]}")
    return labels


def build_steps(cfg: FilterConfig) -> list[Step]:
    if not cfg.steps:
        raise UsageError("the filter config has no steps")
    for s in cfg.steps:
        if not isinstance(s, dict):
            raise UsageError(f"each filter step must be a table with a name, got {s!r}")
    return [build_step(s) for s in cfg.steps]


# ---------------------------------------------------------------------------------------------
# One document through the chain


@dataclass
class Outcome:
    reason: str | None  # "<step>.<statistic>" of the first failure, None when kept
    step_index: int | None  # which step dropped it
    text: str  # the text after the rewriting steps it went through
    stats: dict[str, float]  # annotate mode only
    rewritten: list[int]  # characters removed by each step's rewrite


def run_chain(steps: list[Step], labels: list[str], rows: list[dict], annotate: bool) -> list[Outcome]:
    """Each row through the chain: a step at a time over the documents still in it (all of them
    with `annotate`), so a step can score them together (Step.prepare_batch). A document's outcome
    is what it would be alone: it stops at its first failing step, or in annotate mode goes on."""
    docs = [Doc(row.get("text") or "", row) for row in rows]
    out = [Outcome(None, None, "", {}, [0] * len(steps)) for _ in docs]
    for i, (step, label) in enumerate(zip(steps, labels)):
        live = [j for j, o in enumerate(out) if annotate or o.reason is None]
        step.prepare_batch([docs[j] for j in live])
        for j in live:
            doc, o = docs[j], out[j]
            if annotate:
                values, failed = all_stats(step, doc)
                o.stats.update({f"stats.{label}.{k}": v for k, v in values.items()})
            else:
                failed = first_failure(step, doc)
            if failed and o.reason is None:
                o.reason, o.step_index = f"{label}.{failed}", i
                if not annotate:
                    continue
            before = len(doc.text)
            step.transform(doc)
            o.rewritten[i] = before - len(doc.text)
    for doc, o in zip(docs, out):
        o.text = doc.text
    return out


# ---------------------------------------------------------------------------------------------
# Schema


def extra_columns(steps: list[Step]) -> dict[str, pa.DataType]:
    cols: dict[str, pa.DataType] = {}
    for s in steps:
        cols.update(getattr(s, "output_columns", {}))
    return cols


def stats_columns(steps: list[Step], labels: list[str]) -> list[str]:
    """The stats.* column names, found by draining every step's checks on an empty document
    (every check yields on every document in annotate mode, so the set is fixed)."""
    names: list[str] = []
    probe_row = {"id": "", "text": "", "url": "", "lang": "", "lang_score": 0.0}
    for step, label in zip(steps, labels):
        values, _ = all_stats(step, Doc("", dict(probe_row)))
        names += [f"stats.{label}.{k}" for k in values if f"stats.{label}.{k}" not in names]
    return names


def output_schema(input_schema: pa.Schema, steps, labels, annotate: bool) -> pa.Schema:
    schema = input_schema
    for name, typ in extra_columns(steps).items():  # a column the input has already is the step's now
        i = schema.get_field_index(name)
        schema = schema.append(pa.field(name, typ)) if i < 0 else schema.set(i, pa.field(name, typ))
    if annotate:
        for name in stats_columns(steps, labels):
            schema = schema.append(pa.field(name, pa.float64()))
        schema = schema.append(pa.field("reason", pa.string()))
    return schema


# ---------------------------------------------------------------------------------------------
# One shard (one input file)


@dataclass
class _ShardFn:
    cfg: FilterConfig
    steps: list[Step]

    def __call__(self, task: Task, out: Path, report) -> dict:
        return filter_shard(task, out, report, self.cfg, self.steps)


def filter_shard(task: Task, out: Path, report, cfg: FilterConfig, steps: list[Step]) -> dict:
    inp = ShardInput(DocsSource(**task.payload))
    labels = step_labels(cfg.steps)
    if inp.schema is None:  # the file does not open: nothing to write, the damage is counted
        return inp.stats([], {"in": 0, "out": 0, "kept": 0})
    schema = output_schema(inp.schema, steps, labels, cfg.annotate_only)
    funnel = {label: {"docs_removed": 0, "chars_removed": 0, "chars_rewritten": 0} for label in labels}
    rejected_by: dict[str, int] = {}
    n_in = n_out = n_kept = chars_in = chars_kept = 0
    with ShardOutput(out, task.name, schema, rejected=[] if cfg.keep_rejected and not cfg.annotate_only else None) as shard:
        for batch in inp.batches():
            kept_rows, rej_rows = [], []
            rows = batch.to_pylist()
            for row, o in zip(rows, run_chain(steps, labels, rows, cfg.annotate_only)):
                original = row.get("text") or ""
                n_in += 1
                chars_in += len(original)
                # the funnel is the same in both modes; annotate-only just writes every row
                for label, removed in zip(labels, o.rewritten):
                    funnel[label]["chars_rewritten"] += removed
                if o.reason is None:
                    n_kept += 1
                    chars_kept += len(o.text)
                else:
                    label = labels[o.step_index]
                    funnel[label]["docs_removed"] += 1
                    funnel[label]["chars_removed"] += len(o.text)
                    rejected_by[o.reason] = rejected_by.get(o.reason, 0) + 1
                if cfg.annotate_only:
                    row.update(o.stats)
                    row["reason"] = o.reason
                    kept_rows.append(row)
                elif o.reason is None:
                    row["text"] = o.text
                    kept_rows.append(row)
                elif shard.keeps_rejected:
                    row["reason"] = o.reason
                    rej_rows.append(row)
            n_out += len(kept_rows)
            shard.write_rows(kept_rows, rej_rows)
            report(batch.num_rows)
    return inp.stats(
        shard.outputs,
        {
            "in": n_in,
            "out": n_out,  # rows written: the kept ones, or all of them with annotate_only
            "kept": n_kept,
            "chars_in": chars_in,
            "chars_kept": chars_kept,
            "rejected": rejected_by,
            "funnel": funnel,
        },
    )


# ---------------------------------------------------------------------------------------------
# The stage


def _texts_reaching(before: list[Step], labels: list[str], sources: list[DocsSource]):
    """The texts that get through `before`, as they arrive (DCLM took its top fraction after the
    heuristic filters, not of the raw crawl)."""
    for s in sources:
        for b in read_source(s, skip_empty=True):  # the shards count what is left out
            for o in run_chain(before, labels, b.to_pylist(), annotate=False):
                if o.reason is None:
                    yield o.text



def run_filter(inputs: list[str], out: str, cfg: FilterConfig, opts: RunOptions | None = None, progress: Progress | None = None) -> Manifest:
    opts = opts or RunOptions()
    with stage_run(opts, "llmctl-filter-in-") as run:
        steps = build_steps(cfg)
        sources, refs = run.read_inputs(inputs)
        labels = step_labels(cfg.steps)
        for k, step in enumerate(steps):
            if step.needs_prepare:  # corpus-wide figures (a top-fraction threshold) before any shard
                step.prepare(_texts_reaching(steps[:k], labels[:k], sources))
        tasks = run.tasks(key=run.stream_key)  # a resumed run reuses parts of this stream only
        for step in steps:
            step.use_cores(cores_per_task(opts, len(tasks)))
        config = asdict(cfg)
        config["step_labels"] = step_labels(cfg.steps)
        models = {label: s.identity() for label, s in zip(labels, steps) if hasattr(s, "identity")}
        if models:  # a model's content, not only its path, is part of what a resume must share
            config["step_models"] = models
        return run_sharded(
            stage=STAGE,
            kind="docs",
            out=out,
            tasks=tasks,
            fn=_ShardFn(cfg, steps),
            config=config,
            inputs=refs,
            opts=opts,
            progress=progress,
            unit="docs",
        )


def funnel_rows(manifest: Manifest) -> list[dict]:
    """The funnel in step order: what each step removed, as counts and shares of the input."""
    c = manifest.counts
    docs_in, chars_in = c.get("in", 0), c.get("chars_in", 0)
    rows, docs_left, chars_left = [], docs_in, chars_in
    for label in manifest.config.get("step_labels", []):
        f = c.get("funnel", {}).get(label, {})
        removed = f.get("docs_removed", 0)
        chars = f.get("chars_removed", 0) + f.get("chars_rewritten", 0)
        docs_left -= removed
        chars_left -= chars
        rows.append(
            {
                "step": label,
                "docs_removed": removed,
                "docs_removed_pct": 100 * removed / docs_in if docs_in else 0.0,
                "chars_removed": chars,
                "chars_removed_pct": 100 * chars / chars_in if chars_in else 0.0,
                "docs_left": docs_left,
                "chars_left": chars_left,
            }
        )
    return rows


__all__ = ["FilterConfig", "run_filter", "funnel_rows", "default_steps", "STEPS"]
