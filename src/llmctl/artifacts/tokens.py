"""The tokens artifact (docs/design.md §2): flat token shards and the memory-mapped reader.

`tokens-NNNNN.bin` holds the documents' token ids back to back, each followed by the EOS id,
as little-endian uint16 when the vocabulary fits in 65,536 ids, else uint32. `tokens-NNNNN.idx`
holds the int64 start offset of each document in its shard. `tokens-NNNNN.meta.parquet`, written
when tokenize was given `--keep-column`, holds those docs columns, one row per document in `.idx`
order (a mixture upsamples by one: train/mixture.py). The reader maps every shard and serves a
document, a kept column, or a window at any global token offset, without copying the corpus.
"""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path

import numpy as np

from llmctl.artifacts.atomic import sync_dir, temp_name
from llmctl.artifacts.manifest import MANIFEST, artifact_file, file_sha256, read_manifest
from llmctl.errors import UsageError

META_SUFFIX = ".meta.parquet"  # a shard's kept docs columns: tokens-NNNNN.meta.parquet


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
                    with suppress(OSError):  # the write already failed; its temporary goes next
                        f.close()
                for _, tmp in self.paths:
                    tmp.unlink(missing_ok=True)


class TokenDataset:
    """Random access to a tokens artifact: `n_tokens`, `n_docs`, `doc(i)`, `window(offset, n)`.

    Opening checks every shard against the manifest, which records each file's bytes and sha256:
    a `.bin` whose size differs (truncated, replaced) is a usage error naming it, not a memmap
    ValueError or windows read from the wrong place; the `.idx` files are read whole anyway, so
    their sha256 is checked too, and their offsets must lie in their shard. The `.bin` bytes are
    only mapped, so their sha256 is checked by `verify()` (or `verify=True`), which train and
    eval's loss task call before the first step. Measured: the example crawl's train tokens
    (242,536 in 4 shards) open in 0.4 ms and hash in 0.3 ms more; hashing runs at ~1.5 ms per
    MB, ~30 s for 10B uint16 tokens, nothing next to the run it guards."""

    def __init__(self, path: str | os.PathLike, verify: bool = False):
        self.path = Path(path)
        if not (self.path / "manifest.json").is_file():
            raise UsageError(f"{path} is not a tokens artifact (no manifest.json)")
        m = read_manifest(self.path)
        if m.kind != "tokens":
            raise UsageError(f"{path} is a {m.kind} artifact, not tokens")
        self.manifest = m
        try:
            self.dtype = np.dtype(m.config["dtype"])
            self.eos_id = m.config.get("eos_id")
            self.vocab_size = int(m.config["vocab_size"])
        except (KeyError, TypeError, ValueError) as e:
            raise UsageError(f"{self.path / 'manifest.json'}: corrupt tokens manifest (config: {type(e).__name__}: {e})") from e
        self.entries = {o["file"]: o for o in m.outputs}
        bins = [o["file"] for o in m.outputs if o["file"].endswith(".bin")]
        self.shards = [self._map(b) for b in bins]
        self.starts = [self._offsets(b.replace(".bin", ".idx"), len(shard)) for b, shard in zip(bins, self.shards)]
        sizes = np.array([len(s) for s in self.shards], dtype=np.int64)
        self.shard_offset = np.concatenate(([0], np.cumsum(sizes)))  # global token offset of each shard
        docs = np.array([len(s) for s in self.starts], dtype=np.int64)
        self.doc_offset = np.concatenate(([0], np.cumsum(docs)))
        self.n_tokens = int(self.shard_offset[-1])
        self.n_docs = int(self.doc_offset[-1])
        self.kept_columns: list[str] = list(m.config.get("keep_columns") or [])
        self._bins = bins
        self._columns: dict[str, np.ndarray] = {}
        if verify:
            self.verify()

    def _checked_size(self, name: str) -> int:
        """The file's size, which must be what the manifest recorded; the file must lie inside the
        artifact (a link out of it is a usage error, like a manifest naming `../`)."""
        f = artifact_file(self.path, name, f"{self.path / MANIFEST} outputs")
        try:
            size = f.stat().st_size
        except FileNotFoundError:
            raise UsageError(f"{f}: missing (the manifest lists it); re-run tokenize") from None
        want = self.entries.get(name, {}).get("bytes")
        if want is not None and size != want:
            raise UsageError(f"{f}: {size:,} bytes where the manifest records {want:,} (truncated or replaced); re-run tokenize")
        return size

    def _map(self, name: str) -> np.ndarray:
        size = self._checked_size(name)
        if size % self.dtype.itemsize:
            raise UsageError(f"{self.path / name}: {size:,} bytes is not a whole number of {self.dtype} tokens")
        return np.memmap(self.path / name, dtype=self.dtype, mode="r") if size else np.zeros(0, self.dtype)

    def _offsets(self, name: str, n_tokens: int) -> np.ndarray:
        self._checked_size(name)
        data = (self.path / name).read_bytes()
        self._check_sha256(name, hashlib.sha256(data).hexdigest())
        if len(data) % 8:
            raise UsageError(f"{self.path / name}: {len(data):,} bytes is not a whole number of int64 offsets")
        starts = np.frombuffer(data, dtype="<i8")
        if len(starts) and (starts[0] != 0 or np.any(np.diff(starts) <= 0) or starts[-1] >= n_tokens):
            raise UsageError(f"{self.path / name}: document offsets out of order or past the end of their shard; re-run tokenize")
        return starts

    def _check_sha256(self, name: str, got: str) -> None:
        want = self.entries.get(name, {}).get("sha256")
        if want is not None and got != want:
            raise UsageError(f"{self.path / name}: sha256 differs from the manifest's (corrupt or replaced); re-run tokenize")

    def verify(self) -> None:
        """Check each token shard's sha256 against the manifest (the sizes were checked on open)."""
        for name in self.entries:
            if name.endswith(".bin"):
                self._check_sha256(name, file_sha256(self.path / name))

    def doc_starts(self) -> np.ndarray:
        """Global token offset of every document's first token, in order (n_docs + 1 entries: the
        last is n_tokens, so document i spans [starts[i], starts[i + 1]) with its EOS)."""
        parts = [st + off for st, off in zip(self.starts, self.shard_offset[:-1].tolist())]
        return np.concatenate(parts + [np.array([self.n_tokens], dtype=np.int64)]).astype(np.int64)

    def doc_column(self, name: str) -> np.ndarray:
        """A docs column kept with the tokens (`tokenize --keep-column NAME`), one value per
        document in order, as numpy (nulls: NaN in a numeric column, None in others). Each meta
        file is checked against the manifest's sha256 as it is read."""
        if name in self._columns:
            return self._columns[name]
        import io

        import pyarrow as pa
        import pyarrow.parquet as pq

        if name not in self.kept_columns:
            kept = ", ".join(self.kept_columns) or "none"
            raise UsageError(f"{self.path}: column {name!r} was not kept with the tokens (kept: {kept}); "
                             f"re-run tokenize with --keep-column {name}")
        tables = []
        for b in self._bins:
            meta = b[: -len(".bin")] + META_SUFFIX
            self._checked_size(meta)
            data = (self.path / meta).read_bytes()
            self._check_sha256(meta, hashlib.sha256(data).hexdigest())
            tables.append(pq.read_table(io.BytesIO(data), columns=[name]))
        column = pa.concat_tables(tables, promote_options="permissive").column(name) if tables else pa.chunked_array([], pa.null())
        if len(column) != self.n_docs:
            raise UsageError(f"{self.path}: column {name!r} has {len(column):,} rows for {self.n_docs:,} documents; re-run tokenize")
        self._columns[name] = column.to_numpy()
        return self._columns[name]

    def doc(self, i: int) -> np.ndarray:
        """Tokens of document i, without its trailing EOS."""
        if not 0 <= i < self.n_docs:
            raise IndexError(i)
        s = int(np.searchsorted(self.doc_offset, i, side="right") - 1)
        k = i - int(self.doc_offset[s])
        start = int(self.starts[s][k])
        end = int(self.starts[s][k + 1]) if k + 1 < len(self.starts[s]) else len(self.shards[s])
        return np.asarray(self.shards[s][start : end - 1])

    def window(self, offset: int, length: int, out: np.ndarray | None = None) -> np.ndarray:
        """`length` tokens from global offset `offset` (crossing shard ends as needed), as int64,
        written into `out` when given (a row of a batch: no second copy)."""
        if offset < 0 or offset + length > self.n_tokens:
            raise IndexError(f"window [{offset}, {offset + length}) outside 0..{self.n_tokens}")
        if out is None:
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
