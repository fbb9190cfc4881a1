"""The docs artifact's writer: Parquet shards (zstd), or an Arrow IPC stream when the path is `-`.

Writes are atomic: rows go to a hidden temporary file that is renamed into place only when the
shard is complete, so a crash never leaves a half shard that looks finished. The reader is
artifacts/docs.py.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from llmctl.artifacts.atomic import STDIO, sync_dir, sync_file, temp_name
from llmctl.artifacts.docs import COMPRESSION, DocsSource, conform, open_docs_inputs, part_name, resolve_docs_inputs, source_schemas
from llmctl.artifacts.manifest import input_ref, output_entry
from llmctl.errors import UsageError


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
        """Finish, fsync and rename the shard; on any failure (a full disk) the temporary goes."""
        try:
            self._writer.close()
            sync_file(self.tmp)
            os.replace(self.tmp, self.path)
        except BaseException:
            self.tmp.unlink(missing_ok=True)
            raise
        sync_dir(self.path.parent)
        return self.path

    def abort(self) -> None:
        try:
            self._writer.close()
        finally:  # a writer that cannot finish (a full disk) still leaves no temporary behind
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
        if rows_per_part < 1:  # `write` fills parts of this many rows: 0 would never fill one
            raise UsageError(f"rows per part must be >= 1, got {rows_per_part}")
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


def spool_stdin(tmpdir: str | os.PathLike, rows_per_part: int = 100_000, stdin=None) -> tuple[list[DocsSource], dict]:
    """A stream on stdin becomes Parquet parts in `tmpdir`, so a multi-process stage can shard
    it like files (a pipe can only be read once, by one process). Returns the parts and the
    stream's manifest entry. Rows keep the ids they were read with (`stdin/ROW` when the stream
    has none), not ids of the parts. Rows without text are kept (the stage's shards skip and count
    them); a stream that breaks off is a usage error, since the parts have no manifest to count it in."""
    inp = open_docs_inputs([STDIO], stdin=stdin)
    sink = DocsSink(Path(tmpdir), inp.schema, rows_per_part=rows_per_part)
    for b in inp.batches:
        sink.write(b)
    sink.close()
    if inp.log.errors:
        raise UsageError(f"stdin: {inp.log.errors[0]['error']}")
    sources = [DocsSource(str(Path(tmpdir) / o["file"]), "parquet", f"stdin/{o['file']}") for o in sink.outputs]
    return sources, inp.refs([STDIO])[0]


def sharded_inputs(args: list[str], spool_dir: str | os.PathLike, stdin=None) -> tuple[list[DocsSource], list[dict]]:
    """What a multi-process docs stage shards over, and its manifest's entries for them: files
    as they are; `-` (alone) spooled into `spool_dir`, which must outlive the stage's tasks. Their
    columns are checked here, in the driver (`source_schemas`), before any work."""
    if args == [STDIO]:
        sources, ref = spool_stdin(spool_dir, stdin=stdin)
        refs = [ref]
    else:
        sources, refs = resolve_docs_inputs(args), [input_ref(p) for p in args]
    source_schemas(sources)
    return sources, refs
