"""One docs task's plumbing, written once for every stage that turns docs into docs (as datatrove's
BaseFilter writes it once for its filters): crawl-extract, filter, dedup's last phase, decontam.

- ShardInput: the task's input file, read through one ReadLog, so what the reader leaves out
  (damage, rows without text) is this shard's to count; a file that does not open has no schema,
  and its task writes nothing and counts the damage;
- ShardOutput: the kept shard `NAME.parquet` and, with --keep-rejected, `rejected/NAME.parquet`,
  whose rows say why they were dropped (`reason`, and whatever else the stage adds). The two are
  one output: both are renamed into place at the end, and a task that fails aborts both, so a
  failed shard leaves no temporary file behind, in OUT or in OUT/rejected;
- the task's stats for the sharded driver (runtime/sharded.py), the read log's counts and errors
  included.

What a stage computes per row stays in the stage.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from llmctl.artifacts.docs import DocsSource, ReadLog, read_source, source_schema
from llmctl.artifacts.docs_write import ShardWriter

REASON = "reason"  # the rejected rows' column that names the rule that dropped them

Fields = list[tuple[str, pa.DataType]]


def with_fields(schema: pa.Schema, fields: Fields) -> pa.Schema:
    """`schema` with these columns: one it already has takes the new type where it stands (a
    column appears once, or the Parquet file does not read back), the others go at the end."""
    for name, typ in fields:
        if name in schema.names:
            schema = schema.set(schema.get_field_index(name), pa.field(name, typ))
        else:
            schema = schema.append(pa.field(name, typ))
    return schema


class ShardInput:
    """A docs task's input file, its normalized schema (None: the file does not open) and the log
    of what its reader leaves out."""

    def __init__(self, source: DocsSource):
        self.source = source
        self.log = ReadLog()
        self.schema = source_schema(source, self.log)

    def batches(self, columns: list[str] | None = None):
        """The rows with text, in batches; the others are counted in the log."""
        return read_source(self.source, columns=columns, log=self.log, skip_empty=True)

    def stats(self, outputs: list[str], counts: dict) -> dict:
        """The task's result for the sharded driver: its outputs, its counts with the read log's."""
        return {"outputs": outputs, "counts": {**counts, **self.log.counts()}, "errors": self.log.errors}


class ShardOutput:
    """The kept shard and, when `rejected` is given (the columns the rejected rows carry besides
    `reason`, possibly none), the rejected one. As a context manager: closed together on success,
    both aborted on any error."""

    def __init__(self, out: Path, name: str, schema: pa.Schema, rejected: Fields | None = None):
        self.schema = schema
        self.outputs = [f"{name}.parquet"]
        self.rejected_schema: pa.Schema | None = None
        self._rejected: ShardWriter | None = None
        self._kept = ShardWriter(out / self.outputs[0], schema)
        if rejected is not None:
            self.rejected_schema = with_fields(schema, [(REASON, pa.string()), *rejected])
            self.outputs.append(f"rejected/{name}.parquet")
            try:
                self._rejected = ShardWriter(out / self.outputs[1], self.rejected_schema)
            except BaseException:
                self._kept.abort()
                raise

    @property
    def keeps_rejected(self) -> bool:
        return self._rejected is not None

    def write(self, kept: pa.Table | pa.RecordBatch, rejected: pa.Table | pa.RecordBatch | None = None) -> None:
        """Append rows; `rejected` goes nowhere when the stage keeps no rejected rows."""
        self._kept.write(kept)
        if self._rejected is not None and rejected is not None:
            self._rejected.write(rejected)

    def write_rows(self, kept: list[dict], rejected: list[dict] | None = None) -> None:
        """`write` for rows as dicts, each list made a table of its shard's schema."""
        self._kept.write(pa.Table.from_pylist(kept, schema=self.schema))
        if self._rejected is not None:
            self._rejected.write(pa.Table.from_pylist(rejected or [], schema=self.rejected_schema))

    def close(self) -> None:
        """Rename both shards into place (the kept one first)."""
        try:
            self._kept.close()
        except BaseException:
            if self._rejected is not None:
                self._rejected.abort()
            raise
        if self._rejected is not None:
            self._rejected.close()

    def abort(self) -> None:
        """Throw both temporary files away, the second even when the first fails to close."""
        try:
            self._kept.abort()
        finally:
            if self._rejected is not None:
                self._rejected.abort()

    def __enter__(self) -> ShardOutput:
        return self

    def __exit__(self, exc_type, *_) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
