"""The tokens artifact (docs/design.md §2): flat token shards and the memory-mapped reader.

`tokens-NNNNN.bin` holds the documents' token ids back to back, each followed by the EOS id,
as little-endian uint16 when the vocabulary fits in 65,536 ids, else uint32. `tokens-NNNNN.idx`
holds the int64 start offset of each document in its shard. The reader maps every shard and
serves a document, or a window at any global token offset, without copying the corpus.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from llmctl.artifacts.atomic import sync_dir, temp_name
from llmctl.artifacts.manifest import read_manifest
from llmctl.errors import UsageError


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def write_shard(bin_path: Path, idx_path: Path, docs: Sequence[Sequence[int]], eos: int, dtype: np.dtype) -> tuple[int, int]:
    """Write one shard atomically; return (documents, tokens including the EOS after each).
    `docs` holds each document's ids, as lists or (faster: no Python ints) numpy arrays."""
    with TokenShardWriter(bin_path, idx_path, eos, dtype) as shard:
        shard.add(docs)
    return shard.n_docs, shard.n_tokens


class TokenShardWriter:
    """Streams documents into one shard, batch by batch, so a shard never has to fit in memory:
    `add` appends to temporary files; a clean exit from the `with` block checks that each file
    holds exactly the bytes meant, fsyncs it and renames it into place, and any failure (a full
    disk included) deletes them: nothing half-written is ever visible. The arrays are written
    through Python's file objects, which raise on a short write; numpy's `tofile` lost its
    buffer's tail on a full disk without a word."""

    def __init__(self, bin_path: Path, idx_path: Path, eos: int, dtype: np.dtype):
        self.eos, self.dtype = eos, np.dtype(dtype)
        self.paths = [(p, temp_name(p)) for p in (bin_path, idx_path)]
        self.files = [open(tmp, "wb") for _, tmp in self.paths]
        self.n_docs = self.n_tokens = 0

    def add(self, docs: Sequence[Sequence[int]]) -> None:
        ends = np.cumsum(np.fromiter((len(d) + 1 for d in docs), dtype=np.int64, count=len(docs)))
        starts = np.zeros(len(docs), dtype="<i8")
        starts[1:] = ends[:-1]
        flat = np.empty(int(ends[-1]) if len(docs) else 0, dtype=self.dtype)
        for d, start, end in zip(docs, starts.tolist(), ends.tolist()):
            flat[start : end - 1] = d  # one C-level copy (and cast) per document
        flat[ends - 1] = self.eos
        self.files[0].write(memoryview(flat).cast("B"))
        self.files[1].write(memoryview(starts + self.n_tokens).cast("B"))
        self.n_docs += len(docs)
        self.n_tokens += len(flat)

    def __enter__(self) -> TokenShardWriter:
        return self

    def __exit__(self, exc_type, *_) -> None:
        committed = False
        try:
            if exc_type is None:
                meant = (self.n_tokens * self.dtype.itemsize, self.n_docs * 8)
                for f, size, (path, _) in zip(self.files, meant, self.paths):
                    f.flush()
                    os.fsync(f.fileno())
                    on_disk = os.fstat(f.fileno()).st_size
                    if on_disk != size:
                        raise OSError(errno.EIO, f"{on_disk} bytes on disk where {size} were meant", str(path))
                    f.close()
                for path, tmp in self.paths:
                    os.replace(tmp, path)
                committed = True
                sync_dir(self.paths[0][0].parent)
        finally:
            if not committed:
                for f in self.files:
                    try:
                        f.close()
                    except OSError:
                        pass  # the write already failed; its temporary goes next
                for _, tmp in self.paths:
                    tmp.unlink(missing_ok=True)


class TokenDataset:
    """Random access to a tokens artifact: `n_tokens`, `n_docs`, `doc(i)`, `window(offset, n)`."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not (self.path / "manifest.json").is_file():
            raise UsageError(f"{path} is not a tokens artifact (no manifest.json)")
        m = read_manifest(self.path)
        if m.kind != "tokens":
            raise UsageError(f"{path} is a {m.kind} artifact, not tokens")
        self.manifest = m
        self.dtype = np.dtype(m.config["dtype"])
        self.eos_id = m.config.get("eos_id")
        self.vocab_size = m.config["vocab_size"]
        bins = [o["file"] for o in m.outputs if o["file"].endswith(".bin")]
        self.shards = [np.memmap(self.path / b, dtype=self.dtype, mode="r") if (self.path / b).stat().st_size else np.zeros(0, self.dtype) for b in bins]
        self.starts = [np.fromfile(self.path / b.replace(".bin", ".idx"), dtype="<i8") for b in bins]
        sizes = np.array([len(s) for s in self.shards], dtype=np.int64)
        self.shard_offset = np.concatenate(([0], np.cumsum(sizes)))  # global token offset of each shard
        docs = np.array([len(s) for s in self.starts], dtype=np.int64)
        self.doc_offset = np.concatenate(([0], np.cumsum(docs)))
        self.n_tokens = int(self.shard_offset[-1])
        self.n_docs = int(self.doc_offset[-1])

    def doc(self, i: int) -> np.ndarray:
        """Tokens of document i, without its trailing EOS."""
        if not 0 <= i < self.n_docs:
            raise IndexError(i)
        s = int(np.searchsorted(self.doc_offset, i, side="right") - 1)
        k = i - int(self.doc_offset[s])
        start = int(self.starts[s][k])
        end = int(self.starts[s][k + 1]) if k + 1 < len(self.starts[s]) else len(self.shards[s])
        return np.asarray(self.shards[s][start : end - 1])

    def window(self, offset: int, length: int) -> np.ndarray:
        """`length` tokens from global offset `offset` (crossing shard ends as needed)."""
        if offset < 0 or offset + length > self.n_tokens:
            raise IndexError(f"window [{offset}, {offset + length}) outside 0..{self.n_tokens}")
        out = np.empty(length, dtype=np.int64)
        got = 0
        s = int(np.searchsorted(self.shard_offset, offset, side="right") - 1)
        while got < length:
            local = offset + got - int(self.shard_offset[s])
            take = min(length - got, len(self.shards[s]) - local)
            out[got : got + take] = self.shards[s][local : local + take]
            got += take
            s += 1
        return out
