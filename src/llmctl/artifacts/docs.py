"""The docs artifact: Parquet shards (zstd) or an Arrow IPC stream when the path is `-`.

This is the one reader and the one writer of documents. Readers accept our own artifacts and
foreign data alike: any Parquet file, directory of Parquet files, Arrow IPC file, Hugging Face
`save_to_disk` folder (artifacts/hf_saved.py) or JSONL(.gz) file with a `text` column (a Hugging
Face dataset saved as Parquet or with save_to_disk, a datatrove JSONL output). When `id` is
missing it is derived from the file name and row number, so it is stable across runs.

Writers are atomic: rows go to a hidden temporary file that is renamed into place only when the
shard is complete, so a crash never leaves a half shard that looks finished.
"""

from __future__ import annotations

import glob
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson
import pyarrow.parquet as pq

from llmctl.artifacts.atomic import STDIO, temp_name
from llmctl.artifacts.hf_saved import METADATA_FILES, saved_dataset_files
from llmctl.artifacts.manifest import MANIFEST, input_ref, output_entry, read_manifest
from llmctl.artifacts.stdin import StdinReader
from llmctl.errors import UsageError

PARQUET_SUFFIXES = (".parquet", ".pq")
ARROW_SUFFIXES = (".arrow",)  # Arrow IPC, stream or file format: what datasets' save_to_disk writes
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".ndjson", ".ndjson.gz")
STREAM_FORMAT = "arrow"  # what a docs stream on stdin is: Arrow IPC, as `-o -` writes it
COMPRESSION = "zstd"
BATCH_ROWS = 8192


@dataclass(frozen=True)
class DocsSource:
    """One readable file of documents. `label` names it in derived ids (path relative to the
    argument the user gave, so ids do not depend on the working directory)."""

    path: str
    fmt: str  # "parquet" | "arrow" | "jsonl"
    label: str


def part_name(index: int, suffix: str = ".parquet") -> str:
    return f"part-{index:05d}{suffix}"


# ---------------------------------------------------------------------------------------------
# Finding inputs


def _fmt(path: str) -> str | None:
    low = path.lower()
    if low.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if low.endswith(ARROW_SUFFIXES):
        return "arrow"
    if low.endswith(JSONL_SUFFIXES):
        return "jsonl"
    return None


def resolve_docs_inputs(args: Iterable[str]) -> list[DocsSource]:
    """Expand the paths a user typed (files, directories, globs) into readable sources, in order.

    A docs artifact directory contributes its parts in manifest order; a save_to_disk folder its
    Arrow files in its own order; any other directory its Parquet/Arrow/JSONL files sorted by
    path. `-` is not handled here: see `open_docs_inputs`.
    """
    sources: list[DocsSource] = []
    for arg in args:
        if arg == STDIO:
            raise UsageError("'-' (stdin) cannot be combined with other inputs")
        matches = sorted(glob.glob(arg)) if glob.has_magic(arg) else [arg]
        if not matches:
            raise UsageError(f"no input matches {arg!r}")
        for m in matches:
            sources.extend(_sources_of(Path(m)))
    if not sources:
        raise UsageError("no documents to read: the inputs hold no Parquet, Arrow or JSONL files")
    return sources


def _sources_of(p: Path) -> list[DocsSource]:
    if not p.exists():
        raise UsageError(f"input not found: {p}")
    if p.is_file():
        fmt = _fmt(p.name)
        if fmt is None:
            raise UsageError(f"{p}: not a docs file (expected .parquet, .arrow or .jsonl[.gz])")
        return [DocsSource(str(p), fmt, p.name)]
    if (p / MANIFEST).is_file():
        m = read_manifest(p)
        if m.kind != "docs":
            raise UsageError(f"{p} is a {m.kind} artifact, not docs")
        files = [o["file"] for o in m.outputs if not o["file"].startswith("rejected/")]
        return [DocsSource(str(p / f), _fmt(f) or "parquet", f) for f in files]
    found = []
    for root, dirs, files in os.walk(p):
        here = Path(root)
        saved = saved_dataset_files(here)
        if saved is not None:  # a save_to_disk folder: its state.json says which files, in which order
            dirs[:] = []
            found.extend(DocsSource(str(here / f), "arrow", str((here / f).relative_to(p))) for f in saved)
            continue
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "rejected")
        for name in sorted(files):
            if not name.startswith(".") and name not in METADATA_FILES and _fmt(name):
                full = here / name
                found.append(DocsSource(str(full), _fmt(name), str(full.relative_to(p))))
    return found


# ---------------------------------------------------------------------------------------------
# Reading


def _normalize(batch: pa.RecordBatch, source: DocsSource, first_row: int) -> pa.RecordBatch:
    """Make a batch obey the contract: string `id` first, string `text`, other columns kept."""
    names = batch.schema.names
    if "text" not in names:
        raise UsageError(f"{source.path}: no 'text' column (columns: {', '.join(names) or 'none'})")
    cols = {n: batch.column(n) for n in names}
    if not pa.types.is_string(cols["text"].type):
        cols["text"] = pc.cast(cols["text"], pa.string())
    if "id" in cols:
        if not pa.types.is_string(cols["id"].type):
            cols["id"] = pc.cast(cols["id"], pa.string())
    else:
        rows = range(first_row, first_row + batch.num_rows)
        cols["id"] = pa.array([f"{source.label}/{i}" for i in rows], pa.string())
    order = ["id", "text"] + [n for n in names if n not in ("id", "text")]
    return pa.RecordBatch.from_arrays([cols[n] for n in order], names=order)


def read_source(source: DocsSource, batch_rows: int = BATCH_ROWS, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
    """Yield normalized record batches of one source file. `columns` (Parquet, Arrow) reads just
    those columns plus `id` and `text`, for stages that need nothing else."""
    row = 0
    try:
        if source.fmt == "parquet":
            pf = pq.ParquetFile(source.path)
            cols = None if columns is None else [c for c in pf.schema_arrow.names if c in {"id", "text", *columns}]
            batches = pf.iter_batches(batch_size=batch_rows, columns=cols)
        elif source.fmt == "arrow":
            batches = _arrow_batches(source.path, batch_rows, columns)
        else:
            batches = _jsonl_batches(source.path)
        for batch in batches:
            yield _normalize(batch, source, row)
            row += batch.num_rows
    except (pa.ArrowInvalid, OSError) as e:
        if isinstance(e, FileNotFoundError):
            raise UsageError(f"input not found: {source.path}") from e
        raise UsageError(f"{source.path}: unreadable ({str(e).splitlines()[0]})") from e


def _open_arrow(path: str) -> pa.ipc.RecordBatchStreamReader | pa.ipc.RecordBatchFileReader:
    """An Arrow IPC file, memory-mapped so batches are read in place, not copied into memory:
    the stream format (what datasets writes) or else the random-access file format."""
    mapped = pa.memory_map(path)
    try:
        return pa.ipc.open_stream(mapped)
    except pa.ArrowInvalid:
        return pa.ipc.open_file(mapped)  # its own ArrowInvalid when the file is neither


def _arrow_batches(path: str, batch_rows: int = BATCH_ROWS, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
    reader = _open_arrow(path)
    if isinstance(reader, pa.ipc.RecordBatchFileReader):
        batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
    else:
        batches = iter(reader)
    keep = None if columns is None else [c for c in reader.schema.names if c in {"id", "text", *columns}]
    for batch in batches:
        if keep is not None:
            batch = batch.select(keep)
        for start in range(0, batch.num_rows, batch_rows):  # zero-copy slices, as Parquet's batches are sized
            yield batch.slice(start, batch_rows)


def _jsonl_batches(path: str) -> Iterator[pa.RecordBatch]:
    # open_json streams; block_size large enough for long web documents on one line.
    stream = pa.input_stream(path, compression="detect")
    reader = pajson.open_json(stream, read_options=pajson.ReadOptions(block_size=16 << 20))
    yield from reader


def row_count(source: DocsSource) -> int:
    """Rows of one source: from Parquet metadata, from the batch headers of a memory-mapped Arrow
    file (the columns are not read), or by reading a JSONL file through."""
    if source.fmt == "parquet":
        return pq.ParquetFile(source.path).metadata.num_rows
    if source.fmt == "arrow":
        try:
            return sum(b.num_rows for b in _arrow_batches(source.path, batch_rows=sys.maxsize))
        except (pa.ArrowInvalid, OSError) as e:
            raise UsageError(f"{source.path}: unreadable ({str(e).splitlines()[0]})") from e
    return sum(b.num_rows for b in read_source(source))


def source_schema(source: DocsSource) -> pa.Schema:
    """Schema after normalization, without reading the data when the file format allows."""
    if source.fmt in ("parquet", "arrow"):
        try:
            schema = pq.read_schema(source.path) if source.fmt == "parquet" else _open_arrow(source.path).schema
        except (pa.ArrowInvalid, OSError) as e:
            raise UsageError(f"{source.path}: unreadable ({str(e).splitlines()[0]})") from e
        empty = pa.RecordBatch.from_pylist([], schema=schema)
        return _normalize(empty, source, 0).schema
    for batch in read_source(source):
        return batch.schema
    return pa.schema([("id", pa.string()), ("text", pa.string())])


def unify_schemas(schemas: list[pa.Schema]) -> pa.Schema:
    """One schema that every input conforms to: union of columns, first-seen order, id/text first."""
    try:
        return pa.unify_schemas(schemas, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise UsageError(f"inputs have incompatible columns: {e}") from e


def conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """Reorder/cast a batch to `schema`, filling columns it lacks with nulls."""
    if batch.schema.equals(schema):
        return batch
    cols = []
    for f in schema:
        if f.name in batch.schema.names:
            col = batch.column(f.name)
            cols.append(col if col.type == f.type else pc.cast(col, f.type))
        else:
            cols.append(pa.nulls(batch.num_rows, f.type))
    return pa.RecordBatch.from_arrays(cols, schema=schema)


@dataclass
class DocsInput:
    """An opened set of inputs: the unified schema plus a batch iterator (files or stdin)."""

    schema: pa.Schema
    batches: Iterator[pa.RecordBatch]
    sources: list[DocsSource]
    stdin: StdinReader | None = None  # for `-`: what was read, for the manifest (`stdin.ref`)

    def refs(self, args: list[str]) -> list[dict]:
        """The manifest's entries for these inputs; a stream's once it has been read to the end."""
        if self.stdin is not None:
            self.stdin.drain()
            return [self.stdin.ref(STREAM_FORMAT)]
        return [input_ref(p) for p in args]


def open_docs_inputs(args: list[str], stdin=None) -> DocsInput:
    """Open inputs for sequential reading. `-` reads an Arrow IPC stream from stdin."""
    if not args:
        raise UsageError("no inputs given")
    if args == [STDIO]:
        raw = StdinReader(stdin)
        reader = _open_stdin_stream(raw)
        label = DocsSource(STDIO, "stream", "stdin")
        first = reader.schema
        norm = _normalize(pa.RecordBatch.from_pylist([], schema=first), label, 0).schema

        def gen():
            row = 0
            for b in reader:
                yield _normalize(b, label, row)
                row += b.num_rows

        return DocsInput(norm, gen(), [], raw)
    sources = resolve_docs_inputs(args)
    schema = unify_schemas([source_schema(s) for s in sources])

    def gen():
        for s in sources:
            for b in read_source(s):
                yield conform(b, schema)

    return DocsInput(schema, gen(), sources)


def _open_stdin_stream(stream: StdinReader) -> pa.RecordBatchStreamReader:
    try:
        return pa.ipc.open_stream(stream)
    except (pa.ArrowInvalid, OSError) as e:
        raise UsageError(f"stdin is not an Arrow IPC stream of docs ({str(e).splitlines()[0]})") from e


def spool_stdin(tmpdir: str | os.PathLike, rows_per_part: int = 100_000, stdin=None) -> tuple[list[DocsSource], dict]:
    """A stream on stdin becomes Parquet parts in `tmpdir`, so a multi-process stage can shard
    it like files (a pipe can only be read once, by one process). Returns the parts and the
    stream's manifest entry. Rows keep the ids they were read with (`stdin/ROW` when the stream
    has none), not ids of the parts."""
    inp = open_docs_inputs([STDIO], stdin=stdin)
    sink = DocsSink(Path(tmpdir), inp.schema, rows_per_part=rows_per_part)
    for b in inp.batches:
        sink.write(b)
    sink.close()
    sources = [DocsSource(str(Path(tmpdir) / o["file"]), "parquet", f"stdin/{o['file']}") for o in sink.outputs]
    return sources, inp.refs([STDIO])[0]


def sharded_inputs(args: list[str], spool_dir: str | os.PathLike, stdin=None) -> tuple[list[DocsSource], list[dict]]:
    """What a multi-process docs stage shards over, and its manifest's entries for them: files
    as they are; `-` (alone) spooled into `spool_dir`, which must outlive the stage's tasks."""
    if args == [STDIO]:
        sources, ref = spool_stdin(spool_dir, stdin=stdin)
        return sources, [ref]
    return resolve_docs_inputs(args), [input_ref(p) for p in args]


# ---------------------------------------------------------------------------------------------
# Writing


class ShardWriter:
    """Writes one Parquet shard atomically: hidden temp file, renamed on `close()`."""

    def __init__(self, path: str | os.PathLike, schema: pa.Schema):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = temp_name(self.path)
        self.schema = schema
        self.rows = 0
        self._writer = pq.ParquetWriter(self.tmp, schema, compression=COMPRESSION)

    def write(self, data: pa.RecordBatch | pa.Table) -> None:
        if data.num_rows == 0:
            return
        if isinstance(data, pa.RecordBatch):
            data = pa.Table.from_batches([conform(data, self.schema)])
        self._writer.write_table(data)
        self.rows += data.num_rows

    def close(self) -> Path:
        self._writer.close()
        os.replace(self.tmp, self.path)
        return self.path

    def abort(self) -> None:
        self._writer.close()
        self.tmp.unlink(missing_ok=True)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *_):
        if exc_type is None:
            self.close()
        else:
            self.abort()


class DocsSink:
    """Sequential docs output: an artifact directory of parts, or an Arrow stream for `-`.

    Used by the single-process commands (cat, head) and by the stage driver when it streams
    finished shards to stdout. `outputs` lists the written parts for the manifest.
    """

    def __init__(self, out: Path | str, schema: pa.Schema, rows_per_part: int = 1_000_000, stdout=None):
        self.schema = schema
        self.rows_per_part = rows_per_part
        self.rows = 0
        self.outputs: list[dict] = []
        self._stream = None
        self._shard: ShardWriter | None = None
        if str(out) == STDIO:
            self.out = None
            self._stream = pa.ipc.new_stream(stdout if stdout is not None else sys.stdout.buffer, schema)
        else:
            self.out = Path(out)
            self.out.mkdir(parents=True, exist_ok=True)

    def write(self, batch: pa.RecordBatch) -> None:
        batch = conform(batch, self.schema)
        if self._stream is not None:
            if batch.num_rows:
                self._stream.write_batch(batch)
            self.rows += batch.num_rows
            return
        while batch.num_rows:
            if self._shard is None:
                self._shard = ShardWriter(self.out / part_name(len(self.outputs)), self.schema)
            room = self.rows_per_part - self._shard.rows
            head, batch = batch.slice(0, room), batch.slice(room)
            self._shard.write(head)
            self.rows += head.num_rows
            if self._shard.rows >= self.rows_per_part:
                self._finish_shard()

    def _finish_shard(self) -> None:
        rows = self._shard.rows
        path = self._shard.close()
        self.outputs.append(output_entry(path, rows, self.out))
        self._shard = None

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            return
        if self._shard is not None or not self.outputs:
            if self._shard is None:  # an empty result is still a valid artifact with one empty part
                self._shard = ShardWriter(self.out / part_name(0), self.schema)
            self._finish_shard()

    def abort(self) -> None:
        if self._shard is not None:
            self._shard.abort()
