"""embed: add an `embedding` column to every document (docs -> docs).

The vectors are what `dedup --semantic` clusters (SemDeDup, Abbas et al. 2023) and what a
retrieval or a diversity measure reads: one list<float32> per row (list<float16> with `dtype =
"float16"`, half the bytes, about three significant digits), every other column passed through.
The encoders (data/embedders.py; llmctl checkpoints in model/embed.py) embed a document from its
first tokens up to the model's limit — 256 word pieces for the default all-MiniLM-L6-v2 — and count
the documents they cut as `truncated`; a row whose text is null or empty is left out and counted
under `skipped`, as every text stage does (artifacts/docs.py).

How it runs: one task per input file through the sharded driver (resume by shard, --workers,
--shard-index, --executor ray, `-o -`), the texts of each read batch embedded `batch_size` at a
time, progress advanced after each of those. The model is loaded once in this process (one torch
thread: data/embedders.py says why) to read its dimension, and workers forked afterwards inherit
it. Each task runs torch on the cores its pool leaves it, as tokenize does for tiktoken: all of them
for one input file, one each when there are as many files as workers (a Ray task: its
--cpus-per-task). The vectors of a document do not depend on the workers: a task's batches are
made from its file alone, and minilm's forward gives the same bits at one and two torch threads
(tests/test_embed.py checks both; torch does not promise it for every model and kernel, so a
backend that differs would make the bytes of a run with fewer files than workers depend on them).

The manifest's config records the embedder (as named, its folder, the sha256 of its weights),
the dimension, the token limit, the pooling and the dtype; they are also the run's identity, so
a resumed run with other weights is refused.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from llmctl.artifacts.docs import DocsSource
from llmctl.artifacts.docs_shard import ShardInput, ShardOutput, with_fields
from llmctl.artifacts.manifest import Manifest
from llmctl.data.embedders import Embedder, parse_spec, sentence_embedder, torch_threads
from llmctl.errors import UsageError
from llmctl.runtime.executor import Task
from llmctl.runtime.options import RunOptions, cores_per_task
from llmctl.runtime.progress import Progress
from llmctl.runtime.sharded import run_sharded
from llmctl.runtime.stage import stage_run

STAGE = "embed"
COLUMN = "embedding"
DTYPES = {"float32": (pa.float32(), np.float32), "float16": (pa.float16(), np.float16)}


@dataclass
class EmbedConfig:
    embedder: str = "minilm"  # minilm | sentence-transformers:MODEL | llmctl:CKPT
    dtype: str = "float32"  # float32 | float16: the values of the embedding column
    batch_size: int = 32  # documents per forward (sentence-transformers' default)

    def check(self) -> EmbedConfig:
        parse_spec(self.embedder)
        if self.dtype not in DTYPES:
            raise UsageError(f"--dtype must be one of {', '.join(DTYPES)}, not {self.dtype!r}")
        return self


def embedding_type(dtype: str) -> pa.DataType:
    return pa.list_(DTYPES[dtype][0])


def vectors_column(matrix: np.ndarray, dtype: str) -> pa.ListArray:
    """Rows of `matrix` as a list array of `dtype` (built from one flat buffer, no Python floats)."""
    arrow_type, numpy_type = DTYPES[dtype]
    n, d = matrix.shape
    offsets = pa.array(np.arange(0, (n + 1) * d, d, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(matrix.astype(numpy_type).ravel(), type=arrow_type))


def with_column(batch: pa.RecordBatch, name: str, values: pa.Array) -> pa.RecordBatch:
    """`batch` with column `name` set to `values` (replaced where it stands, else appended)."""
    i = batch.schema.get_field_index(name)
    return batch.set_column(i, name, values) if i >= 0 else batch.append_column(name, values)


# ---------------------------------------------------------------------------------------------
# One shard (one input file)


@dataclass
class _ShardFn:
    cfg: EmbedConfig
    embedder: Embedder
    threads: int

    def __call__(self, task: Task, out: Path, report) -> dict:
        return embed_shard(task, out, report, self.cfg, self.embedder, self.threads)


def embed_shard(task: Task, out: Path, report, cfg: EmbedConfig, embedder: Embedder, threads: int) -> dict:
    inp = ShardInput(DocsSource(**task.payload))
    if inp.schema is None:  # the file does not open: nothing to write, the damage is counted
        return inp.stats([], {"in": 0, "out": 0, "truncated": 0})
    schema = with_fields(inp.schema, [(COLUMN, embedding_type(cfg.dtype))])
    n = truncated = chars = 0
    with torch_threads(threads), ShardOutput(out, task.name, schema) as shard:
        for batch in inp.batches():  # rows with text only: the reader counts the others
            texts = batch.column("text").to_pylist()
            parts = []
            for i in range(0, len(texts), cfg.batch_size):
                vectors, cut = embedder.embed(texts[i : i + cfg.batch_size])
                if vectors.shape != (len(cut), embedder.dim):
                    raise RuntimeError(f"{embedder.name} gave vectors of shape {vectors.shape}, not ({len(cut)}, {embedder.dim})")
                parts.append(vectors)
                truncated += sum(cut)
                report(len(cut))
            if not parts:
                continue
            shard.write(with_column(batch, COLUMN, vectors_column(np.concatenate(parts), cfg.dtype)))
            n += batch.num_rows
            chars += sum(len(t) for t in texts)
    return inp.stats(shard.outputs, {"in": n, "out": n, "truncated": truncated, "chars_in": chars})


# ---------------------------------------------------------------------------------------------
# The stage


def run_embed(inputs: list[str], out: str, cfg: EmbedConfig, opts: RunOptions | None = None,
              progress: Progress | None = None, embedder: Embedder | None = None, stdout=None) -> Manifest:
    """Embed the documents of `inputs` into `out` (a directory, or `-` for an Arrow stream).
    `embedder` is the one `cfg.embedder` names, when the caller has made it (an llmctl checkpoint's
    comes from llmctl.model.embed.make_embedder); None makes a minilm or sentence-transformers one."""
    cfg.check()
    opts = opts or RunOptions()
    if embedder is not None and embedder.name != cfg.embedder:
        raise UsageError(f"the embedder given ({embedder.name}) is not the config's ({cfg.embedder})")
    with stage_run(opts, "llmctl-embed-in-") as run:
        _, refs = run.read_inputs(inputs)  # columns checked before the model is loaded
        embedder = (embedder or sentence_embedder(cfg.embedder)).prepare()
        tasks = run.tasks(key=run.stream_key)  # a resumed run reuses parts of this stream only
        config = {**asdict(cfg), **embedder.identity()}
        return run_sharded(
            stage=STAGE,
            kind="docs",
            out=out,
            tasks=tasks,
            fn=_ShardFn(cfg, embedder, cores_per_task(opts, len(tasks))),
            config=config,
            inputs=refs,
            opts=opts,
            progress=progress,
            stdout=stdout,
            unit="docs",
        )


__all__ = ["EmbedConfig", "run_embed", "embed_shard", "STAGE", "COLUMN", "DTYPES"]
