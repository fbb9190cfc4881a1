"""`cat` and `head` over docs: the plumbing that lets stages chain before any stage exists.

Both read any docs input (artifact, foreign Parquet/JSONL, or `-`), conform rows to one schema
(the union of the inputs' columns), and write an artifact or a stream. They run in one process:
they are I/O bound, and `head` must stop reading as soon as it has its rows.

They copy: a row whose text is null or empty is kept (the stages that read text skip it). A
damaged spot in the input is left out, counted under `errors` and logged, as in every stage.

Run again into its own OUT (artifacts/rerun.py) a killed cat or head starts over, and a finished
one is a no-op that returns the manifest there.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from llmctl.artifacts.atomic import STDIO
from llmctl.artifacts.card import CARD
from llmctl.artifacts.lock import output_lock
from llmctl.artifacts.docs import open_docs_inputs
from llmctl.artifacts.docs_write import DocsSink
from llmctl.artifacts.manifest import Manifest, error_place, input_ref, read_manifest, write_manifest
from llmctl.artifacts.rerun import claim_out, run_identity, running
from llmctl.errors import StageFailed, UsageError
from llmctl.runtime.progress import Progress


@dataclass
class CatConfig:
    limit: int | None = None  # stop after this many rows (head)
    rows_per_part: int = 1_000_000
    overwrite: bool = False
    strict: bool = False  # damaged input fails the run (exit 1) instead of being skipped and counted


def run_cat(inputs: list[str], out: str, cfg: CatConfig, progress: Progress | None = None, stdin=None, stdout=None) -> Manifest:
    with output_lock(out):
        return _run_cat(inputs, out, cfg, progress, stdin, stdout)


def _run_cat(inputs: list[str], out: str, cfg: CatConfig, progress: Progress | None, stdin, stdout) -> Manifest:
    progress = progress or Progress()
    if cfg.limit is not None and cfg.limit < 0:
        raise UsageError("-n must be >= 0")
    if cfg.rows_per_part < 1:
        raise UsageError(f"--rows-per-part must be >= 1, got {cfg.rows_per_part}")
    t0 = time.perf_counter()
    stage = "head" if cfg.limit is not None else "cat"
    config = {"limit": cfg.limit, "rows_per_part": cfg.rows_per_part}
    docs = open_docs_inputs(inputs, stdin=stdin)  # a usage error in the inputs leaves OUT untouched
    streamed = inputs == [STDIO]
    refs = None if streamed else docs.refs(inputs)  # hashed once: the run identity's and the manifest's
    ident = run_identity(stage, config, [input_ref(STDIO)] if streamed else refs)
    if claim_out(out, ident, cfg.overwrite, own=("part-*.parquet", CARD)):  # what DocsSink and the card leave before the manifest
        progress.log(f"{stage}: {out} already holds this {stage}'s finished output; nothing to do")
        return _strict(read_manifest(out), cfg)
    with running(out):  # what a failure leaves is an unfinished cat, which a re-run clears
        sink = DocsSink(out, docs.schema, rows_per_part=cfg.rows_per_part, stdout=stdout)
        progress.start(cfg.limit, "docs", stage)
        rows_in = 0
        try:
            for batch in docs.batches:
                if cfg.limit is not None:
                    batch = batch.slice(0, cfg.limit - sink.rows)
                rows_in += batch.num_rows
                sink.write(batch)
                progress.advance(batch.num_rows)
                if cfg.limit is not None and sink.rows >= cfg.limit:
                    break
            sink.close()
        except BaseException:
            sink.abort()
            raise
        progress.finish()
        # head stops reading early by design: its stream is named without the hash of a part of it
        if streamed:
            refs = [input_ref(STDIO)] if stage == "head" else docs.refs(inputs)
        for e in docs.log.errors:
            progress.log(f"{stage}: skipped damage in {error_place(e)}: {e['error']}")
        manifest = Manifest(
            kind="docs",
            stage=stage,
            config=config,
            inputs=refs,
            outputs=sink.outputs,
            counts={"in": rows_in, "out": sink.rows, "errors": len(docs.log.errors)},
            errors=docs.log.errors,
            wall_seconds=round(time.perf_counter() - t0, 3),
        )
        if out != STDIO:
            write_manifest(out, manifest)
    return _strict(manifest, cfg)


def _strict(manifest: Manifest, cfg: CatConfig) -> Manifest:
    if cfg.strict and manifest.counts.get("errors"):
        raise StageFailed(f"{manifest.counts['errors']} damaged input record(s) skipped (--strict)")
    return manifest
