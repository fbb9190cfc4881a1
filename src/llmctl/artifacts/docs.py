"""The docs artifact: Parquet shards (zstd) or an Arrow IPC stream when the path is `-`.

This is the one reader of documents (artifacts/docs_write.py is the one writer). Readers accept our own artifacts and
foreign data alike: any Parquet file, directory of Parquet files, Arrow IPC file, Hugging Face
`save_to_disk` folder (artifacts/hf_saved.py) or JSONL(.gz) file with a `text` column (a Hugging
Face dataset saved as Parquet or with save_to_disk, a datatrove JSONL output). When `id` is
missing it is derived from the file name and row number, so it is stable across runs.
"""

from __future__ import annotations

import bisect
import glob
import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from llmctl.artifacts.atomic import STDIO
from llmctl.artifacts.files import DAMAGE, LINK_TO_FOLDER, arrow_map, arrow_source, problem, shown
from llmctl.artifacts.hf_saved import METADATA_FILES, saved_dataset_files
from llmctl.artifacts.jsonl import jsonl_batches
from llmctl.artifacts.manifest import MANIFEST, artifact_file, input_ref, read_manifest
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

    path: str  # as the OS takes it: a name that is not UTF-8 holds surrogates (files.shown)
    fmt: str  # "parquet" | "arrow" | "jsonl"
    label: str
    problem: str | None = None  # why it is not read (a FIFO, a link loop ...): its reader logs only this


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
    path. `-` is not handled here: see `open_docs_inputs`. What a folder or a glob holds that is
    not a regular file (artifacts/files.py: a FIFO, a socket, a device, a link that loops or
    dangles, a link to a folder) comes back with its `problem`, never opened: its reader counts
    and names it. A path typed by itself must be a file or a folder.
    """
    sources: list[DocsSource] = []
    for arg in args:
        if arg == STDIO:
            raise UsageError("'-' (stdin) cannot be combined with other inputs")
        if glob.has_magic(arg):
            matches = sorted(glob.glob(arg))
            if not matches:
                raise UsageError(f"no input matches {shown(arg)!r}")
            for m in matches:
                sources.extend(_sources_of(Path(m), listed=True))
        else:
            sources.extend(_sources_of(Path(arg)))
    if not sources:
        raise UsageError("no documents to read: the inputs hold no Parquet, Arrow or JSONL files")
    return [s if s.problem else DocsSource(s.path, s.fmt, s.label, problem(s.path)) for s in sources]


def _sources_of(p: Path, listed: bool = False) -> list[DocsSource]:
    """`listed`: `p` is a glob's match, one of the files it lists rather than a path typed alone."""
    if not p.is_dir():
        return _file_sources(p, listed)
    if (p / MANIFEST).is_file():
        m = read_manifest(p)
        if m.kind != "docs":
            raise UsageError(f"{p} is a {m.kind} artifact, not docs")
        files = [(i, o["file"]) for i, o in enumerate(m.outputs) if not o["file"].startswith("rejected/")]
        return [DocsSource(str(artifact_file(p, f, f"{p / MANIFEST} outputs[{i}].file")), _fmt(f) or "parquet", f) for i, f in files]
    found = []
    for root, dirs, files in os.walk(p):  # links to folders come in dirs, and are never descended
        here = Path(root)
        saved = saved_dataset_files(here)
        if saved is not None:  # a save_to_disk folder: its state.json says which files, in which order
            dirs[:] = []
            found.extend(DocsSource(str(here / f), "arrow", shown((here / f).relative_to(p))) for f in saved)
            continue
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "rejected")
        for d in [d for d in dirs if (here / d).is_symlink()]:
            dirs.remove(d)
            found.append(DocsSource(str(here / d), "none", shown((here / d).relative_to(p)), LINK_TO_FOLDER))
        for name in sorted(files):
            if not name.startswith(".") and name not in METADATA_FILES and _fmt(name):
                full = here / name
                found.append(DocsSource(str(full), _fmt(name), shown(full.relative_to(p))))
    return found


def _file_sources(p: Path, listed: bool) -> list[DocsSource]:
    why = problem(p)
    if why is not None:
        if listed:
            return [DocsSource(str(p), _fmt(p.name) or "none", shown(p.name), why)]
        if not os.path.lexists(p):
            raise UsageError(f"input not found: {shown(p)}")
        raise UsageError(f"{shown(p)}: {why}")
    fmt = _fmt(p.name)
    if fmt is None:
        raise UsageError(f"{shown(p)}: not a docs file (expected .parquet, .arrow or .jsonl[.gz])")
    return [DocsSource(str(p), fmt, shown(p.name))]


# ---------------------------------------------------------------------------------------------
# Reading
#
# Bad input never loses good data (docs/design.md §3): a damaged spot — a JSONL line that is not
# UTF-8, not JSON or not an object, a Parquet row group or Arrow batch that does not decode, a
# file that does not open — is left out and written to the ReadLog the caller passes, with its
# file and place, and reading goes on. The reader runs inside a stage's shard task, so the log
# travels back in the shard's stats: the same skips, in the same order, whatever --workers.
# What is not damage but a usage error, found before any work starts (`source_schemas`): a file
# without a `text` column, a `text` column that does not hold strings, inputs of which no file
# opens at all (nothing good to keep).



@dataclass
class ReadLog:
    """What the readers left out of the rows they yielded, for a stage's manifest: `errors`, one
    entry per damaged spot ({file, line, offset} for a JSONL line, {file, row, rows} for Parquet
    or Arrow rows, {file} for a file that does not open; and the error), and the rows skipped
    because their text is null or empty (not damage: there is nothing to process)."""

    errors: list[dict] = field(default_factory=list)
    null_text: int = 0
    empty_text: int = 0

    def damage(self, source: DocsSource, error: BaseException | str, **where) -> None:
        if isinstance(error, BaseException):
            error = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"
        self.errors.append({"file": shown(source.path), **where, "error": error})

    def counts(self) -> dict:
        """The counts a stage adds to its manifest (summed over shards by the driver)."""
        return {"skipped": {"null_text": self.null_text, "empty_text": self.empty_text}, "errors": len(self.errors)}


def _text_column(text: pa.Array, source: DocsSource) -> pa.Array:
    """`text` as strings. Null-typed (no row has a text) and other string encodings are cast;
    anything else is refused rather than silently turned into text (numbers are not documents)."""
    t = text.type
    if pa.types.is_string(t):
        return text
    if pa.types.is_null(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t) or (
            pa.types.is_dictionary(t) and (pa.types.is_string(t.value_type) or pa.types.is_large_string(t.value_type))):
        return pc.cast(text, pa.string())
    raise UsageError(f"{source.path}: the 'text' column holds {t}, not strings")


def _normalize(batch: pa.RecordBatch, source: DocsSource, rows, log: ReadLog | None = None, skip_empty: bool = False) -> pa.RecordBatch:
    """Make a batch obey the contract: string `id` first, string `text`, other columns kept.
    `rows`: the file's row number of the batch's first row, or of each row (a JSONL file with
    lines left out), so a derived id is the row's place in its file whatever was skipped before
    it. `skip_empty` drops rows whose text is null or empty, counted in `log`."""
    names = batch.schema.names
    if "text" not in names:
        raise UsageError(f"{source.path}: no 'text' column (columns: {', '.join(names) or 'none'})")
    cols = {n: batch.column(n) for n in names}
    cols["text"] = _text_column(cols["text"], source)
    if "id" in cols:
        if not pa.types.is_string(cols["id"].type):
            try:
                cols["id"] = pc.cast(cols["id"], pa.string())
            except pa.ArrowException as e:  # any cast Arrow cannot make (invalid values, no cast kernel)
                raise UsageError(f"{source.path}: the 'id' column ({cols['id'].type}) does not convert to strings") from e
    else:
        numbers = range(rows, rows + batch.num_rows) if isinstance(rows, int) else rows.tolist()
        cols["id"] = pa.array([f"{source.label}/{i}" for i in numbers], pa.string())
    order = ["id", "text"] + [n for n in names if n not in ("id", "text")]
    out = pa.RecordBatch.from_arrays([cols[n] for n in order], names=order)
    if skip_empty and out.num_rows:
        text = cols["text"]
        nulls = text.null_count
        has_text = pc.fill_null(pc.greater(pc.binary_length(text), 0), False)
        kept = pc.sum(has_text).as_py() or 0
        if kept < out.num_rows:
            if log is not None:
                log.null_text += nulls
                log.empty_text += out.num_rows - kept - nulls
            out = out.filter(has_text)
    return out


def read_source(source: DocsSource, batch_rows: int = BATCH_ROWS, columns: list[str] | None = None,
                log: ReadLog | None = None, skip_empty: bool = False) -> Iterator[pa.RecordBatch]:
    """Yield normalized record batches of one source file. `columns` (Parquet, Arrow) reads just
    those columns plus `id` and `text`, for stages that need nothing else. Damage is left out and
    logged in `log` (module comment above). `skip_empty`: rows whose text is null or empty are
    left out and counted in `log`, for the stages that process text (cat and head copy them)."""
    log = log if log is not None else ReadLog()
    if source.problem is not None:
        log.damage(source, source.problem)
        return
    if source.fmt == "parquet":
        raw = _parquet_batches(source, batch_rows, columns, log)
    elif source.fmt == "arrow":
        raw = _arrow_source_batches(source, batch_rows, columns, log)
    else:
        raw = jsonl_batches(source, log)
    for batch, rows in raw:
        yield _normalize(batch, source, rows, log, skip_empty)


def _parquet_batches(source: DocsSource, batch_rows: int, columns: list[str] | None, log: ReadLog):
    """(batch, first row) of a Parquet file. Row groups stand alone: after a failure the rest is
    read one row group at a time, and a group that does not decode is logged with its rows."""
    with ExitStack() as opened:
        try:
            pf = pq.ParquetFile(opened.enter_context(_arrow_opened(source.path)))
        except DAMAGE as e:
            log.damage(source, e)
            return
        yield from _parquet_file_batches(pf, source, batch_rows, columns, log)


@contextmanager
def _arrow_opened(path: str):
    """What pyarrow opens for `path` (files.arrow_source), closed after when it was opened here."""
    f = arrow_source(path)
    try:
        yield f
    finally:
        if not isinstance(f, str):
            f.close()


def _parquet_file_batches(pf: pq.ParquetFile, source: DocsSource, batch_rows: int, columns: list[str] | None, log: ReadLog):
    cols = None if columns is None else [c for c in pf.schema_arrow.names if c in {"id", "text", *columns}]
    n_groups = pf.metadata.num_row_groups
    starts = [0]
    for i in range(n_groups):
        starts.append(starts[-1] + pf.metadata.row_group(i).num_rows)
    row = 0
    try:
        for batch in pf.iter_batches(batch_size=batch_rows, columns=cols):  # the whole file's batches
            yield batch, row
            row += batch.num_rows
    except DAMAGE:  # which group failed is found below: reading ahead may fail before a good group is out
        groups = range(bisect.bisect_right(starts, row) - 1, n_groups)
    else:
        return
    for group in groups:
        done = row - starts[group]  # rows of this group already yielded
        try:
            for batch in pf.iter_batches(batch_size=batch_rows, columns=cols, row_groups=[group]):
                if done >= batch.num_rows:
                    done -= batch.num_rows
                    continue
                batch, done = batch.slice(done), 0
                yield batch, row
                row += batch.num_rows
        except DAMAGE as e:
            log.damage(source, e, row=row, rows=starts[group + 1] - row)
            row = starts[group + 1]


def _open_arrow(path: str) -> pa.ipc.RecordBatchStreamReader | pa.ipc.RecordBatchFileReader:
    """An Arrow IPC file, memory-mapped so batches are read in place, not copied into memory:
    the stream format (what datasets writes) or else the random-access file format."""
    mapped = arrow_map(path)
    try:
        return pa.ipc.open_stream(mapped)
    except pa.ArrowInvalid:
        return pa.ipc.open_file(mapped)  # its own ArrowInvalid when the file is neither


def _arrow_batches(reader, batch_rows: int = BATCH_ROWS, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
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


def _arrow_source_batches(source: DocsSource, batch_rows: int, columns: list[str] | None, log: ReadLog):
    """(batch, first row) of an Arrow IPC file; a batch that does not decode ends the file (the
    stream has no boundary to pick up from), logged with the row it stopped at."""
    try:
        reader = _open_arrow(source.path)
    except DAMAGE as e:
        log.damage(source, e)
        return
    row = 0
    try:
        for batch in _arrow_batches(reader, batch_rows, columns):
            yield batch, row
            row += batch.num_rows
    except DAMAGE as e:
        log.damage(source, f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}; the rest of the file was not read", row=row)


def row_count(source: DocsSource) -> int:
    """Rows of one source (how much work its task is): from Parquet metadata, from the batch
    headers of a memory-mapped Arrow file (the columns are not read), or by reading a JSONL file
    through. A file that does not open counts 0: its task only logs it."""
    try:
        if source.problem is not None:
            return 0
        if source.fmt == "parquet":
            with _arrow_opened(source.path) as f:
                return pq.ParquetFile(f).metadata.num_rows
        if source.fmt == "arrow":
            return sum(b.num_rows for b in _arrow_batches(_open_arrow(source.path), batch_rows=sys.maxsize))
    except DAMAGE:
        return 0
    return sum(b.num_rows for b in read_source(source))


def source_schema(source: DocsSource, log: ReadLog | None = None) -> pa.Schema | None:
    """Schema after normalization, without reading the data when the file format allows; None
    when the file does not open (logged in `log` when given)."""
    if source.problem is not None:
        if log is not None:
            log.damage(source, source.problem)
        return None
    if source.fmt in ("parquet", "arrow"):
        try:
            if source.fmt == "parquet":
                with _arrow_opened(source.path) as f:
                    schema = pq.read_schema(f)
            else:
                schema = _open_arrow(source.path).schema
        except DAMAGE as e:
            if log is not None:
                log.damage(source, e)
            return None
        empty = pa.RecordBatch.from_pylist([], schema=schema)
        return _normalize(empty, source, 0).schema
    seen = ReadLog()
    for batch in read_source(source, log=seen):
        return batch.schema
    if seen.errors and seen.errors[0].keys() == {"file", "error"}:  # the file itself did not open
        if log is not None:
            log.errors.append(seen.errors[0])
        return None
    return pa.schema([("id", pa.string()), ("text", pa.string())])


def source_schemas(sources: list[DocsSource]) -> list[pa.Schema | None]:
    """Each source's schema (None: a file that does not open, which its reader will log as
    damage), checked in the driver before any work starts, so that what is a usage error is one
    (exit 2) and not a failed shard: a file without a string `text` column, or inputs of which not
    one file opens (there is no good data to keep)."""
    log = ReadLog()
    schemas = [source_schema(s, log) for s in sources]
    if sources and all(s is None for s in schemas):
        first = log.errors[0]
        raise UsageError(f"{first['file']}: unreadable ({first['error']})")
    return schemas


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
    """An opened set of inputs: the unified schema, a batch iterator (files or stdin), and the log
    of what the reading left out (complete once the batches are exhausted)."""

    schema: pa.Schema
    batches: Iterator[pa.RecordBatch]
    sources: list[DocsSource]
    log: ReadLog = field(default_factory=ReadLog)
    stdin: StdinReader | None = None  # for `-`: what was read, for the manifest (`stdin.ref`)

    def refs(self, args: list[str]) -> list[dict]:
        """The manifest's entries for these inputs; a stream's once it has been read to the end."""
        if self.stdin is not None:
            self.stdin.drain()
            return [self.stdin.ref(STREAM_FORMAT)]
        return [input_ref(p) for p in args]


def open_docs_inputs(args: list[str], stdin=None, skip_empty: bool = False) -> DocsInput:
    """Open inputs for sequential reading. `-` reads an Arrow IPC stream from stdin. `skip_empty`
    as in `read_source`."""
    if not args:
        raise UsageError("no inputs given")
    log = ReadLog()
    if args == [STDIO]:
        raw = StdinReader(stdin)
        reader = _open_stdin_stream(raw)
        label = DocsSource(STDIO, "stream", "stdin")
        first = reader.schema
        norm = _normalize(pa.RecordBatch.from_pylist([], schema=first), label, 0).schema

        def gen():
            row = 0
            try:
                for b in reader:
                    yield _normalize(b, label, row, log, skip_empty)
                    row += b.num_rows
            except DAMAGE as e:
                log.damage(label, f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}; the rest of the stream was not read", row=row)

        return DocsInput(norm, gen(), [], log, raw)
    sources = resolve_docs_inputs(args)
    schema = unify_schemas([s for s in source_schemas(sources) if s is not None])

    def gen():
        for s in sources:
            for b in read_source(s, log=log, skip_empty=skip_empty):
                yield conform(b, schema)

    return DocsInput(schema, gen(), sources, log)


def _open_stdin_stream(stream: StdinReader) -> pa.RecordBatchStreamReader:
    try:
        return pa.ipc.open_stream(stream)
    except (pa.ArrowInvalid, OSError) as e:
        raise UsageError(f"stdin is not an Arrow IPC stream of docs ({str(e).splitlines()[0]})") from e
