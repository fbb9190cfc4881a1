"""`cat` and `head` over docs: the plumbing that lets stages chain before any stage exists.

Both read any docs input (artifact, foreign Parquet/JSONL, or `-`), conform rows to one schema
(the union of the inputs' columns), and write an artifact or a stream. They run in one process:
they are I/O bound, and `head` must stop reading as soon as it has its rows.

They copy: a row whose text is null or empty is kept (the stages that read text skip it). A
damaged spot in the input is left out, counted under `errors` and logged, as in every stage.

Run again into its own OUT (artifacts/rerun.py) a killed cat or head starts over, and a finished
one is a no-op that returns the manifest there.

`copy_docs` is that whole run — inputs, run identity, sink, manifest — with what is read and what
is written of it left to the caller (a `Copy`): cat, head and `sample` (data/sample.py) are each
one `Copy`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa

from llmctl.artifacts.atomic import STDIO
from llmctl.artifacts.card import CARD
from llmctl.artifacts.lock import output_lock
from llmctl.artifacts.docs import open_docs_inputs
from llmctl.artifacts.docs_write import DocsSink
from llmctl.artifacts.manifest import Manifest, error_place, input_ref, read_manifest, write_manifest
from llmctl.artifacts.rerun import claim_out, run_identity, running
from llmctl.errors import StageFailed, UsageError
from llmctl.runtime.progress import Progress

Batches = Iterator[pa.RecordBatch]


@dataclass
class CatConfig:
    limit: int | None = None  # stop after this many rows (head)
    rows_per_part: int = 1_000_000
    overwrite: bool = False
    strict: bool = False  # damaged input fails the run (exit 1) instead of being skipped and counted


@dataclass
class Copy:
    """One single-process docs-to-docs command, for `copy_docs`: its name and config (the run
    identity and the manifest's), and two hooks on the stream of batches. `take` cuts what is read
    (head stops reading at its rows; a command with a `take` has its stdin named without a hash,
    since it may not read it all); `keep` chooses what is written of what was read (sample)."""

    stage: str
    config: dict
    overwrite: bool = False
    strict: bool = False
    rows_per_part: int = 1_000_000
    take: Callable[[Batches], Batches] | None = None
    keep: Callable[[Batches], Batches] | None = None
    total: int | None = None  # for the progress bar: rows expected, when known


def run_cat(inputs: list[str], out: str, cfg: CatConfig, progress: Progress | None = None, stdin=None, stdout=None) -> Manifest:
    if cfg.limit is not None and cfg.limit < 0:
        raise UsageError("-n must be >= 0")
    head = cfg.limit is not None
    job = Copy(stage="head" if head else "cat", config={"limit": cfg.limit, "rows_per_part": cfg.rows_per_part},
               overwrite=cfg.overwrite, strict=cfg.strict, rows_per_part=cfg.rows_per_part,
               take=(lambda batches: _first(batches, cfg.limit)) if head else None, total=cfg.limit)
    return copy_docs(inputs, out, job, progress, stdin, stdout)


def _first(batches: Batches, limit: int) -> Batches:
    """The first `limit` rows, reading no batch past the one that completes them."""
    taken = 0
    for batch in batches:
        batch = batch.slice(0, limit - taken)
        taken += batch.num_rows
        yield batch
        if taken >= limit:
            return


def copy_docs(inputs: list[str], out: str, job: Copy, progress: Progress | None = None, stdin=None, stdout=None) -> Manifest:
    """Read the docs `inputs`, pass them through `job`'s hooks, write OUT (an artifact or `-`) and
    its manifest: counts `in` (rows read), `out` (rows written), `errors` (damage left out)."""
    with output_lock(out):
        return _copy_docs(inputs, out, job, progress or Progress(), stdin, stdout)


def _copy_docs(inputs: list[str], out: str, job: Copy, progress: Progress, stdin, stdout) -> Manifest:
    if job.rows_per_part < 1:
        raise UsageError(f"--rows-per-part must be >= 1, got {job.rows_per_part}")
    t0 = time.perf_counter()
    stage = job.stage
    docs = open_docs_inputs(inputs, stdin=stdin)  # a usage error in the inputs leaves OUT untouched
    streamed = inputs == [STDIO]
    refs = None if streamed else docs.refs(inputs)  # hashed once: the run identity's and the manifest's
    ident = run_identity(stage, job.config, [input_ref(STDIO)] if streamed else refs)
    if claim_out(out, ident, job.overwrite, own=("part-*.parquet", CARD)):  # what DocsSink and the card leave before the manifest
        progress.log(f"{stage}: {out} already holds this {stage}'s finished output; nothing to do")
        return _strict(read_manifest(out), job)
    with running(out):  # what a failure leaves is an unfinished run, which a re-run clears
        sink = DocsSink(out, docs.schema, rows_per_part=job.rows_per_part, stdout=stdout)
        progress.start(job.total, "docs", stage)
        read = [0]

        def counted(batches: Batches) -> Batches:
            for batch in batches:
                read[0] += batch.num_rows
                progress.advance(batch.num_rows)
                yield batch

        batches = docs.batches if job.take is None else job.take(docs.batches)
        batches = counted(batches)
        try:
            for batch in batches if job.keep is None else job.keep(batches):
                sink.write(batch)
            sink.close()
        except BaseException:
            sink.abort()
            raise
        progress.finish()
        # a command that may stop reading early names its stream without the hash of a part of it
        if streamed:
            refs = [input_ref(STDIO)] if job.take is not None else docs.refs(inputs)
        for e in docs.log.errors:
            progress.log(f"{stage}: skipped damage in {error_place(e)}: {e['error']}")
        manifest = Manifest(
            kind="docs",
            stage=stage,
            config=job.config,
            inputs=refs,
            outputs=sink.outputs,
            counts={"in": read[0], "out": sink.rows, "errors": len(docs.log.errors)},
            errors=docs.log.errors,
            wall_seconds=round(time.perf_counter() - t0, 3),
        )
        if out != STDIO:
            write_manifest(out, manifest)
    return _strict(manifest, job)


def _strict(manifest: Manifest, job: Copy) -> Manifest:
    if job.strict and manifest.counts.get("errors"):
        raise StageFailed(f"{manifest.counts['errors']} damaged input record(s) skipped (--strict)")
    return manifest
