"""JSONL(.gz) docs, read a line at a time so that no line costs more memory than the limit: the
good lines go on to pyarrow's JSON reader (the column types it infers are what they always were),
and a line that is not UTF-8, not JSON, not an object, of another type than the rows before it,
or longer than MAX_LINE_BYTES is counted as damage with its line number and left out — the lines
after it are read (pyarrow alone drops the rest of the file after a line longer than its block).

`source` is the docs reader's DocsSource (its `path`) and `log` its ReadLog (`damage(source, …)`);
artifacts/docs.py is the one caller.
"""

from __future__ import annotations

import gzip
import io
import json
import re
from collections.abc import Iterator

import numpy as np
import pyarrow.json as pajson

from llmctl.artifacts.files import DAMAGE

# The longest JSONL line read as a row, in bytes without its newline: a longer one is damage,
# counted with its line number and skipped without being held in memory, and reading goes on at
# the next line (a line of 2 GiB costs what 16 MiB does). Long web documents fit many times over
# (FineWeb's longest are a few MB of text); a reader that buffered any line would let one line
# take the machine's memory. Read at each file's opening, so a test or a library caller can set it.
MAX_LINE_BYTES = 16 << 20


# A JSON string escape of a UTF-16 surrogate: only a line holding one can decode to a lone surrogate.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")


def _json_kinds(value: dict, prefix: str = "") -> Iterator[tuple[str, str]]:
    """(path, JSON type) of every non-null value in a row, nested ones included, named as
    pyarrow's JSON reader names columns (/a/b, /list[])."""
    for k, v in value.items():
        path = f"{prefix}/{k}"
        yield from _kinds_of(path, v)


def _kinds_of(path: str, v) -> Iterator[tuple[str, str]]:
    if v is None:
        return
    if isinstance(v, str):
        yield path, "string"
    elif isinstance(v, bool):
        yield path, "boolean"
    elif isinstance(v, (int, float)):
        yield path, "number"  # pyarrow widens integers to floats within a column
    elif isinstance(v, dict):
        yield path, "object"
        yield from _json_kinds(v, path)
    else:
        yield path, "array"
        for item in v:
            yield from _kinds_of(path + "[]", item)


class GoodLines(io.RawIOBase):
    """The lines of a JSONL(.gz) file that pyarrow's JSON reader can take, as a byte stream; a
    line that is not UTF-8, not JSON, not an object, holds a lone surrogate, gives a column
    another JSON type than the rows before it (pyarrow would refuse the whole file), or is longer
    than `max_line` bytes (read past in pieces, never held whole) is left out and logged with its
    line number and byte offset (in the uncompressed text). Blank lines pass (pyarrow skips them;
    they are not rows). `skipped` lists the row numbers left out, in order."""

    def __init__(self, source, log, max_line: int | None = None):
        self.source, self.log = source, log
        self.max_line = MAX_LINE_BYTES if max_line is None else max_line
        self.file = gzip.open(source.path, "rb") if source.path.lower().endswith(".gz") else open(source.path, "rb")
        self.kinds: dict[str, str] = {}
        self.skipped: list[int] = []
        self.buffer = bytearray()
        self.offset = self.line = self.row = self.good = 0
        self.done = False

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while len(self.buffer) < len(b) and not self.done:
            self._fill()
        n = min(len(b), len(self.buffer))
        b[:n] = self.buffer[:n]
        del self.buffer[:n]
        return n

    def close(self) -> None:
        self.file.close()
        super().close()

    def _fill(self) -> None:
        """Take about a MB of lines, one at a time: a line read before a damaged gzip member is
        kept, where a bulk readlines() would lose every line of its call."""
        size = 0
        while size < 1 << 20:
            try:
                raw = self.file.readline(self.max_line + 1)  # a line within the limit ends in b"\n" or the file
                if len(raw) > self.max_line and not raw.endswith(b"\n"):
                    self._too_long(len(raw))
                    continue
            except DAMAGE as e:  # a corrupt or truncated gzip member: nothing after it can be found
                self.log.damage(self.source, f"{type(e).__name__}: {e}; the rest of the file was not read", line=self.line + 1, offset=self.offset)
                raw = b""
            if not raw:
                self.done = True
                return
            size += len(raw)
            self._take(raw)

    def _too_long(self, head: int) -> None:
        """Read past the rest of a line longer than the limit, a MB at a time, and log it."""
        n = head
        while piece := self.file.readline(1 << 20):
            n += len(piece)
            if piece.endswith(b"\n"):
                break
        length = n - 1 if piece.endswith(b"\n") else n
        self.log.damage(self.source, f"a line of {length} bytes, over the {self.max_line}-byte limit: not read",
                        line=self.line + 1, offset=self.offset)
        self.skipped.append(self.row)
        self.offset += n
        self.line += 1
        self.row += 1

    def _take(self, raw: bytes) -> None:
        start = self.offset
        self.offset += len(raw)
        self.line += 1
        if not raw.strip():
            self.buffer += raw
            return
        problem = self._problem(raw)
        if problem:
            self.log.damage(self.source, problem, line=self.line, offset=start)
            self.skipped.append(self.row)
        else:
            self.buffer += raw if raw.endswith(b"\n") else raw + b"\n"
            self.good += 1
        self.row += 1

    def _problem(self, raw: bytes) -> str | None:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            return f"not UTF-8 (byte {e.start} of the line)"
        try:
            value = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as e:
            return f"not JSON ({getattr(e, 'msg', 'nested too deep')}, column {getattr(e, 'colno', '?')})"
        if not isinstance(value, dict):
            return f"a JSON {type(value).__name__}, not an object"
        if _SURROGATE_ESCAPE.search(raw):
            try:
                json.dumps(value, ensure_ascii=False).encode("utf-8")
            except UnicodeEncodeError:
                return "a lone UTF-16 surrogate escape (not text)"
        kinds = dict(_json_kinds(value))
        for path, kind in kinds.items():
            seen = self.kinds.get(path)
            if seen is not None and seen != kind:
                return f"{path[1:]!r} is a JSON {kind} where earlier rows have a {seen}"
        for path, kind in kinds.items():
            self.kinds.setdefault(path, kind)
        return None


def jsonl_batches(source, log):
    """(batch, row numbers) of a JSONL file: its good lines through pyarrow's reader (the types
    it infers are what they always were), each batch with the file's row numbers of its rows."""
    try:
        lines = GoodLines(source, log)
    except DAMAGE as e:
        log.damage(source, e)
        return
    good = 0
    try:
        while not (lines.good or lines.done):  # pyarrow refuses a stream without a row: ask first
            lines._fill()
        if not lines.good:
            return
        # open_json streams; no line it is given is longer than a block (pyarrow refuses an object
        # that straddles two block boundaries); one thread: the line filter feeding it is Python anyway
        block = max(16 << 20, lines.max_line + (1 << 16))  # a block holds any line the filter passes
        reader = pajson.open_json(lines, read_options=pajson.ReadOptions(block_size=block, use_threads=False))
        for batch in reader:
            yield batch, _file_rows(good, batch.num_rows, lines.skipped)
            good += batch.num_rows
    except DAMAGE as e:  # what the line filter cannot foresee (a line past the block size, ...)
        rows = _file_rows(good, 1, lines.skipped)
        row = rows if isinstance(rows, int) else int(rows[0])
        log.damage(source, f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}; the rest of the file was not read", row=row)
    finally:
        lines.close()


def _file_rows(first_good: int, n: int, skipped: list[int]):
    """The file's row numbers of good rows first_good..first_good+n-1, given the (sorted) row
    numbers left out: the first one's alone when none was left out before or among them."""
    if not skipped or skipped[0] >= first_good + n:
        return first_good
    s = np.asarray(skipped, dtype=np.int64)
    # the k-th skipped row sits before good row g exactly when s[k] - k <= g
    g = np.arange(first_good, first_good + n, dtype=np.int64)
    rows = g + np.searchsorted(s - np.arange(len(s)), g, side="right")
    return rows
