"""A WARC on stdin, cut into windows for the worker pool: read once, front to back, by this process.

A pipe can be read only once, by one process, so the main process reads it and the workers
parse and extract (`aws s3 cp s3://…warc.gz - | llmctl crawl-extract - -o OUT`). The stream is
cut where a file holding the same bytes is cut into byte ranges: range starts come from
runtime/split.py `stream_range_starts`, and each window begins at the first record boundary at or
after its range start, found by the same search (warc.py `find_member` / `find_plain`) a file
task uses to find its own first record. So window k holds exactly the records task k would read
from the file, and a stream up to 64 MiB gives the output of the on-disk run (beyond that, file
ranges grow with the file's size, which a stream does not know; the cut still depends on the
bytes alone, so every `--workers` gives the same output).

Memory: the reader holds the window it is cutting and a read-ahead block; the executor keeps at
most a few windows in flight (runtime/executor.py). A record longer than a range makes its
window that much longer.

Legacy ARC has no record marker to cut at, so an ARC stream is copied to a temporary file and
read whole by one task, as an ARC file is.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
from collections.abc import Iterator

from llmctl.artifacts.docs import STDIO, part_name
from llmctl.artifacts.stdin import StdinReader
from llmctl.data.crawl.warc import READ_BLOCK, SNIFF_BYTES, find_member, find_plain, sniff_head, splittable
from llmctl.runtime.executor import Task
from llmctl.runtime.split import stream_range_starts

LOOKBEHIND = 2  # bytes before a range start that find_plain reads (is the line before it ended?)


class _Forward:
    """The stream as a file the boundary search can seek in: bytes are pulled from the stream on
    demand and kept from the window being cut onwards; everything before it is dropped."""

    def __init__(self, src):
        self.src = src
        self.buf = bytearray()
        self.base = 0  # stream offset of buf[0]
        self.pos = 0
        self.eof = False

    @property
    def size(self) -> int:
        """Bytes seen so far; the stream's length once `eof`."""
        return self.base + len(self.buf)

    def _pull(self) -> None:
        # what the pipe has now (at least a byte, or its end), not a full block: a window is
        # handed out as soon as its end is found, even if the producer pauses right after it
        block = self.src.read1(READ_BLOCK)
        if block:
            self.buf += block
        else:
            self.eof = True

    def fill(self, upto: float) -> None:
        """Read until `upto` bytes have been seen or the stream ends."""
        while not self.eof and self.size < upto:
            self._pull()

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        if whence != io.SEEK_SET or pos < self.base:
            raise io.UnsupportedOperation(f"seek to {pos}: the stream was dropped before {self.base}")
        self.pos = pos
        return pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> bytes:
        """Up to `n` bytes, fewer when that is what the pipe has (as a raw file's read may);
        b"" only at the end of the stream. The boundary searches accept short reads."""
        if n < 0:
            self.fill(float("inf"))
        elif self.pos >= self.size:
            self.fill(self.pos + 1)
        end = self.size if n < 0 else min(self.size, self.pos + n)
        data = self.take(self.pos, end) if end > self.pos else b""
        self.pos += len(data)
        return data

    def take(self, start: int, end: int) -> bytes:
        with memoryview(self.buf) as view:  # one copy, and the view is released before buf resizes
            return bytes(view[start - self.base : end - self.base])

    def drop_before(self, pos: int) -> None:
        keep = max(self.base, pos - LOOKBEHIND)
        del self.buf[: keep - self.base]
        self.base = keep


class WarcStream:
    """The tasks of a WARC stream, made as it is read (iterate once). `fmt` is known after the
    first task; `input_ref()` names the stream in the manifest once it has been read."""

    def __init__(self, src: StdinReader, spool_dir: str, starts: Iterator[int] | None = None):
        self.src = src
        self.spool_dir = spool_dir  # where an ARC stream is copied; lives as long as the run
        self.starts = starts
        self.fmt = "warc.gz"

    def input_ref(self) -> dict:
        self.src.drain()
        return self.src.ref(self.fmt)

    def __iter__(self) -> Iterator[Task]:
        f = _Forward(self.src)
        f.fill(SNIFF_BYTES)
        self.fmt = sniff_head(f.take(0, min(SNIFF_BYTES, f.size)))
        if not splittable(self.fmt):
            yield self._spooled(f)
            return
        find = find_member if self.fmt == "warc.gz" else find_plain
        starts = iter(self.starts if self.starts is not None else stream_range_starts())
        next(starts)  # 0: window 0 starts at the stream's first byte, as a file's task 0 does
        index, begin = 0, 0  # the window being cut: its task index and first byte
        empty: list[int] = []  # tasks after it whose range holds no record start (a giant record)
        last: int | None = 0  # the boundary found last
        for k, start in enumerate(starts, start=1):
            if f.eof and start >= f.size:
                break  # a file this long has no range k
            # no record starts between a range start and the boundary found after it, so a range
            # that starts before the last boundary found begins at that boundary too
            at = last if last is not None and start <= last else find(f, start)
            if at is None:
                if f.eof and start >= f.size:
                    break
                empty.append(k)
                last = None
                continue
            yield self._window(f, index, begin, at)
            yield from self._empties(empty)
            f.drop_before(at)
            index, begin, last = k, at, at
        f.fill(float("inf"))  # (a finite `starts` ends the loop before the stream ends)
        yield self._window(f, index, begin, f.size)
        yield from self._empties(empty)

    def _window(self, f: _Forward, index: int, start: int, end: int) -> Task:
        data = f.take(start, end)
        key = f"{start}:{hashlib.sha256(data).hexdigest()}"
        payload = {"path": STDIO, "fmt": self.fmt, "start": start, "end": end, "data": data}
        return Task(index, part_name(index, ""), payload, weight=max(1, end - start), key=key)

    def _empties(self, indexes: list[int]) -> Iterator[Task]:
        for k in indexes:
            yield Task(k, part_name(k, ""), {"path": STDIO, "fmt": self.fmt, "start": 0, "end": 0, "data": b""}, key="empty")
        indexes.clear()

    def _spooled(self, f: _Forward) -> Task:
        path = os.path.join(self.spool_dir, "stdin.arc")
        with open(path, "wb") as out:
            out.write(f.take(0, f.size))  # what the sniffing read ahead, then the rest
            shutil.copyfileobj(self.src, out, READ_BLOCK)
        size = os.path.getsize(path)
        key = f"0:{self.src.ref(self.fmt)['sha256']}"
        return Task(0, part_name(0, ""), {"path": path, "label": STDIO, "start": 0, "end": size}, weight=max(1, size), key=key)
