"""`sample`: a seeded uniform sample of N documents, read in one pass with memory for O(N) rows.

The sample is a *bottom-k* sample: every row gets a key, the 64-bit hash (`hashing.h64`) of the
seed and its `id`, and the N rows with the smallest keys are kept (ties, two rows with one id, go
to the earlier row). Since a key depends on nothing but the seed and the row, not on where a batch
starts, how many batches or files there are, or how many rows come before, the sample is the same
whatever the batch boundaries, and a plain reservoir sampler (Vitter's algorithm R), whose choices
depend on the order of its random draws, would not be. Keyed by `id` rather than by the row's
place, it is also *consistent*: a document in the sample of a corpus is in the sample, with the
same seed and N, of any part of that corpus that holds it (a filtered or deduplicated copy, one
shard), so samples taken at two stages of a pipeline line up. Each row is in the sample with
probability N/rows, and any N-subset equally likely, as far as the hash is uniform (blake2b).

Memory: the candidates are held as Arrow rows and cut back to the N best whenever they pass 2N, so
at most 2N rows and one batch are in memory. The rows are written in input order.

It runs in one process, like cat and head (data/cat.py, whose `copy_docs` it is: the inputs, the run
identity, resume and no-op re-runs, `-o -`, damage counted under `errors`): a sample is I/O bound,
and its output is the same whatever the batching, so there is no `--workers`. N larger than the
input keeps every row (`in` = `out` in the counts).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from llmctl.artifacts.manifest import Manifest
from llmctl.data.cat import Batches, Copy, copy_docs
from llmctl.errors import UsageError
from llmctl.hashing import h64
from llmctl.runtime.progress import Progress


@dataclass
class SampleConfig:
    n: int = 10  # rows in the sample
    seed: int = 0
    overwrite: bool = False
    strict: bool = False  # damaged input fails the run (exit 1) instead of being skipped and counted


def row_keys(ids: pa.Array, seed: int, first: int) -> np.ndarray:
    """The sample key of each row: h64 of the seed and the id; a row with a null id (a foreign
    file's) is keyed by its place in the input, `first` being the place of the batch's first row."""
    return np.fromiter((h64(f"{seed}\x1f{i}" if i is not None else f"{seed}\x1e{first + k}") for k, i in enumerate(ids.to_pylist())),
                       dtype=np.uint64, count=len(ids))


class BottomK:
    """The `n` rows with the smallest (key, place) of all the batches fed to it, in O(n) memory."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed = n, seed
        self.rows = 0  # rows fed so far: the place of the next one
        self.kept: list[pa.RecordBatch] = []
        self.keys = np.empty(0, np.uint64)
        self.places = np.empty(0, np.int64)
        self.bar: int | None = None  # a key that n kept rows are below or at: larger ones never enter

    def feed(self, batch: pa.RecordBatch) -> None:
        keys = row_keys(batch.column("id"), self.seed, self.rows)
        places = np.arange(self.rows, self.rows + batch.num_rows, dtype=np.int64)
        self.rows += batch.num_rows
        if self.bar is not None:  # a later row ties with an earlier one's key and loses to it
            enter = keys < np.uint64(self.bar)
            keys, places, batch = keys[enter], places[enter], batch.filter(pa.array(enter))
        if not batch.num_rows:
            return
        self.kept.append(batch)
        self.keys = np.concatenate([self.keys, keys])
        self.places = np.concatenate([self.places, places])
        if len(self.keys) > 2 * self.n:
            self._cut()

    def _cut(self) -> None:
        """Keep the n best candidates, in input order."""
        best = np.sort(np.lexsort((self.places, self.keys))[: self.n])  # sorted indices: input order
        table = pa.Table.from_batches(self.kept).take(pa.array(best))
        self.kept = table.combine_chunks().to_batches() or []
        self.keys, self.places = self.keys[best], self.places[best]
        if len(self.keys) == self.n:
            self.bar = int(self.keys.max())

    def result(self) -> list[pa.RecordBatch]:
        """The sample, in input order."""
        if len(self.keys) > self.n:
            self._cut()
        return self.kept


def run_sample(inputs: list[str], out: str, cfg: SampleConfig, progress: Progress | None = None, stdin=None, stdout=None) -> Manifest:
    if cfg.n < 1:
        raise UsageError(f"-n must be >= 1, got {cfg.n}")

    def keep(batches: Batches) -> Batches:
        chosen = BottomK(cfg.n, cfg.seed)
        for batch in batches:
            chosen.feed(batch)
        yield from chosen.result()

    job = Copy(stage="sample", config={"n": cfg.n, "seed": cfg.seed}, overwrite=cfg.overwrite, strict=cfg.strict, keep=keep)
    return copy_docs(inputs, out, job, progress, stdin, stdout)
