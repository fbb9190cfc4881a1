"""`cat` and `head` over docs: the plumbing that lets stages chain before any stage exists.

Both read any docs input (artifact, foreign Parquet/JSONL, or `-`), conform rows to one schema
(the union of the inputs' columns), and write an artifact or a stream. They run in one process:
they are I/O bound, and `head` must stop reading as soon as it has its rows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from llmctl.artifacts.atomic import STDIO, prepare_new_out
from llmctl.artifacts.docs import DocsSink, open_docs_inputs
from llmctl.artifacts.manifest import Manifest, input_ref, write_manifest
from llmctl.errors import UsageError
from llmctl.runtime.progress import Progress


@dataclass
class CatConfig:
    limit: int | None = None  # stop after this many rows (head)
    rows_per_part: int = 1_000_000
    overwrite: bool = False


def run_cat(inputs: list[str], out: str, cfg: CatConfig, progress: Progress | None = None, stdin=None, stdout=None) -> Manifest:
    progress = progress or Progress()
    if cfg.limit is not None and cfg.limit < 0:
        raise UsageError("-n must be >= 0")
    t0 = time.perf_counter()
    stage = "head" if cfg.limit is not None else "cat"
    prepare_new_out(out, cfg.overwrite)
    docs = open_docs_inputs(inputs, stdin=stdin)
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
    refs = [input_ref(STDIO)] if stage == "head" and inputs == [STDIO] else docs.refs(inputs)
    manifest = Manifest(
        kind="docs",
        stage=stage,
        config={"limit": cfg.limit, "rows_per_part": cfg.rows_per_part},
        inputs=refs,
        outputs=sink.outputs,
        counts={"in": rows_in, "out": sink.rows},
        wall_seconds=round(time.perf_counter() - t0, 3),
    )
    if out != STDIO:
        write_manifest(out, manifest)
    return manifest
