"""What every sharded stage's `run_*` opens first, written once (crawl-extract, filter, dedup,
decontam, tokenize):

- the run's one `executor_scope`, opened before OUT is touched, around all its phases (so Ray is
  reached once, and a library caller's --executor reaches every phase; runtime/sharded.py runs
  inside it and opens none);
- a temporary directory that outlives the tasks: a spooled stdin, an index, dedup's work when the
  output is a stream;
- the docs inputs: files as they are, `-` spooled (artifacts/docs_write.py `sharded_inputs`), with
  their manifest entries, and one task per input file, weighted by its rows.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from llmctl.artifacts.atomic import STDIO
from llmctl.artifacts.docs import DocsSource, part_name, row_count
from llmctl.artifacts.docs_write import sharded_inputs
from llmctl.runtime.executor import Task
from llmctl.runtime.options import RunOptions, executor_scope


@dataclass
class StageRun:
    tmp: Path  # removed when the run ends
    sources: list[DocsSource] = field(default_factory=list)
    refs: list[dict] = field(default_factory=list)  # the manifest's entries for `sources`
    stream_key: str | None = None  # the sha256 of a stream read on stdin, else None

    def read_inputs(self, inputs: list[str], spool: str | None = None, stdin=None) -> tuple[list[DocsSource], list[dict]]:
        """The docs to shard over and their manifest entries; `-` is spooled into `tmp` (or its
        subdirectory `spool`). Columns are checked here, before any work."""
        self.sources, self.refs = sharded_inputs(inputs, self.tmp / spool if spool else self.tmp, stdin=stdin)
        self.stream_key = self.refs[0]["sha256"] if inputs == [STDIO] else None
        return self.sources, self.refs

    def tasks(
        self,
        name: Callable[[int], str] = lambda i: part_name(i, ""),
        payload: Callable[[int, DocsSource], dict] = lambda i, s: asdict(s),
        weights: list[int] | None = None,
        key: str | None = None,
    ) -> list[Task]:
        """One task per input file: named `part-NNNNN` unless `name` says otherwise, weighted by the
        file's rows unless `weights` says otherwise; `key` see Task.key."""
        weights = weights if weights is not None else [row_count(s) for s in self.sources]
        return [Task(i, name(i), payload(i, s), weight=weights[i], key=key) for i, s in enumerate(self.sources)]


@contextmanager
def stage_run(opts: RunOptions, prefix: str) -> Iterator[StageRun]:
    """The run's executor scope and its temporary directory (named `prefix`...)."""
    with executor_scope(opts), tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        yield StageRun(Path(tmp))
