"""Reading WARC (and legacy ARC) files by byte range, surviving damage.

Common Crawl WARCs are gzipped record by record, so a file is a chain of gzip members and any
byte range can be read on its own: seek to the range start, find the next gzip member that holds
a WARC record, and read every record that *starts* before the range end. Ranges are what let one
1 GB file keep every core busy (see runtime/split.py).

Damage never ends a file early: a corrupt member or an unparsable record is reported as a
`WarcError` with its byte offset, and reading resumes at the next record boundary. Record
parsing itself (headers, chunked transfer, content-encoding) is warcio's.

Paths may be local files or, when fsspec is installed, any URL it knows (s3://, https://...).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from warcio.archiveiterator import ArchiveIterator
from warcio.recordloader import ArchiveLoadFailed

# warcio logs fixes it makes to odd headers (spaces in a target URI) with no handler configured,
# which Python then prints to stderr; those fixes are harmless and not the user's business.
logging.getLogger("warcio").addHandler(logging.NullHandler())

GZIP_MAGIC = b"\x1f\x8b\x08"
READ_BLOCK = 1 << 20
# Reads while decompressing members: Common Crawl members are a few KiB compressed, so a small
# block keeps the copy of what is left over after each member (zlib's unused_data) cheap.
MEMBER_BLOCK = 64 << 10
SNIFF_BYTES = 4096  # enough of a gzip member to see the "WARC/" its content starts with
# How far past a range start we look for the next record before deciding the range holds none.
# A single WARC record larger than this (a big video) just means the range's task finds nothing.
RESYNC_LIMIT = 256 << 20


class _QuietArchiveIterator(ArchiveIterator):
    """warcio writes 'record not followed by newline' warnings straight to stderr; library code
    must not print, and the damage it warns about is harmless to the records we read."""

    def _consume_blanklines(self):
        with contextlib.redirect_stderr(io.StringIO()):
            return super()._consume_blanklines()


@dataclass
class WarcRecord:
    offset: int  # byte offset in the file where the record (or its gzip member) starts
    record: object  # warcio ArcWarcRecord; read its content before asking for the next item


@dataclass
class WarcError:
    offset: int
    message: str


def open_binary(path: str):
    """A seekable binary file for a local path or an fsspec URL."""
    if "://" in path and not path.startswith("file://"):
        try:
            import fsspec
        except ImportError as e:
            raise OSError(f"{path}: remote paths need fsspec (pip install fsspec)") from e
        return fsspec.open(path, "rb").open()
    return open(path.removeprefix("file://"), "rb")


def file_size(path: str) -> int:
    if "://" in path and not path.startswith("file://"):
        import fsspec

        fs, p = fsspec.core.url_to_fs(path)
        return fs.size(p)
    return os.path.getsize(path.removeprefix("file://"))


def sniff(path: str) -> str:
    """'warc.gz' (gzip members), 'warc' (plain), 'arc' / 'arc.gz' (legacy, read whole only)."""
    with open_binary(path) as f:
        return sniff_head(f.read(SNIFF_BYTES))


def sniff_head(head: bytes) -> str:
    """The format from the first SNIFF_BYTES of a file or stream (see `sniff`)."""
    if head.startswith(GZIP_MAGIC[:2]):
        try:
            first = zlib.decompressobj(31).decompress(head[:SNIFF_BYTES], 16)
        except zlib.error:
            first = b""
        return "arc.gz" if first and not first.startswith(b"WARC/") else "warc.gz"
    return "warc" if head.startswith(b"WARC/") else "arc"


def splittable(fmt: str) -> bool:
    return fmt in ("warc.gz", "warc")


def iter_records(path: str, start: int = 0, end: int | None = None) -> Iterator[WarcRecord | WarcError]:
    """Records of `path` whose offset lies in [start, end), and errors met along the way."""
    fmt = sniff(path)
    if not splittable(fmt) and start != 0:
        return  # legacy ARC: no safe boundaries to split on, the task at 0 reads it all
    with open_binary(path) as f:
        yield from _read(f, fmt, start, end)


def iter_window(data: bytes, base: int, fmt: str) -> Iterator[WarcRecord | WarcError]:
    """Every record in `data`, a window a stream reader cut out at `base` (data/crawl/warcstream.py):
    it starts on a record boundary and ends where the next window's first record starts. Offsets
    are the stream's, and damage inside is handled as in a file."""
    if data:  # an empty window (a range no record starts in) holds nothing, not a truncated member
        yield from _read(_Window(data, base), fmt, base, None)


def _read(f, fmt: str, start: int, end: int | None) -> Iterator[WarcRecord | WarcError]:
    """Records of the open file `f` from `start` on: at its first byte, `start` is a record
    boundary; anywhere else, reading begins at the first boundary found after it."""
    first = start == _origin(f)
    if fmt == "warc.gz":
        yield from _iter_gzip(f, start if first else find_member(f, start), end)
    else:
        yield from _iter_plain(f, start if first else find_plain(f, start), end, resync=splittable(fmt))


class _Window(io.BytesIO):
    """Bytes held in memory that sit at `origin` in a longer stream, read and sought with the
    stream's offsets, so the readers below work on them as on the whole file."""

    def __init__(self, data: bytes, origin: int):
        super().__init__(data)
        self.origin = origin

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            pos -= self.origin
        return super().seek(pos, whence) + self.origin

    def tell(self) -> int:
        return super().tell() + self.origin


def _origin(f) -> int:
    """The offset of `f`'s first byte: 0 for a file, a window's place in its stream."""
    return getattr(f, "origin", 0)


# ---------------------------------------------------------------------------------------------
# gzip-per-record files


def find_member(f, pos: int, limit: int = RESYNC_LIMIT) -> int | None:
    """Offset of the first gzip member at or after `pos` whose content starts with a WARC header."""
    f.seek(pos)
    base, buf = pos, b""
    while base + len(buf) - pos < limit:
        block = f.read(READ_BLOCK)
        if not block:
            break
        buf += block
        i = 0
        while (j := buf.find(GZIP_MAGIC, i)) >= 0:
            if j + SNIFF_BYTES > len(buf) and block:
                # read more first: a candidate is always judged on SNIFF_BYTES (or all up to the
                # end), so where reads happen to stop (a pipe's anywhere) never changes the answer
                break
            with contextlib.suppress(zlib.error):  # gzip magic inside a body, not a member start: look further
                if zlib.decompressobj(31).decompress(buf[j : j + SNIFF_BYTES], 16).startswith(b"WARC/"):
                    return base + j
            i = j + 1
        keep = max(i, len(buf) - SNIFF_BYTES)
        base, buf = base + keep, buf[keep:]
    # the tail: the last candidates, judged on what is left of the file
    j = buf.find(GZIP_MAGIC)
    while j >= 0:
        with contextlib.suppress(zlib.error):  # gzip magic inside a body, not a member start: look further
            if zlib.decompressobj(31).decompress(buf[j:], 16).startswith(b"WARC/"):
                return base + j
        j = buf.find(GZIP_MAGIC, j + 1)
    return None


def _read_member(f, offset: int, head: bytes = b"") -> tuple[bytes, int, bytes]:
    """Decompress the gzip member at `offset`; return (content, offset of the next member, the
    bytes already read past this member). `head`: bytes already read from `offset` on (what the
    previous member's read left over), so a file of small members is read once, in MEMBER_BLOCK
    reads, instead of once per member."""
    if not head:
        f.seek(offset)
        head = f.read(MEMBER_BLOCK)
    d = zlib.decompressobj(31)
    out = []
    consumed = 0
    block = head
    while True:
        if not block:
            raise EOFError("gzip member is truncated (file ends inside it)")
        out.append(d.decompress(block))
        if d.eof:
            rest = d.unused_data
            return b"".join(out), offset + consumed + len(block) - len(rest), rest
        consumed += len(block)
        block = f.read(MEMBER_BLOCK)


def _iter_gzip(f, pos: int | None, end: int | None) -> Iterator[WarcRecord | WarcError]:
    size = _size(f)
    rest = b""
    while pos is not None and (end is None or pos < end):
        try:
            content, nxt, rest = _read_member(f, pos, rest)
        except (zlib.error, EOFError) as e:
            yield WarcError(pos, f"damaged gzip member: {e}")
            pos, rest = find_member(f, pos + 1), b""
            continue
        if content:
            yield from records_in(content, pos)
        pos = nxt if nxt < size else None


def _size(f) -> int:
    cur = f.tell()
    size = f.seek(0, io.SEEK_END)
    f.seek(cur)
    return size


def records_in(content: bytes, offset: int) -> Iterator[WarcRecord | WarcError]:
    """Every record in one member's content (normally one; a few writers put several)."""
    it = _QuietArchiveIterator(io.BytesIO(content), arc2warc=True, check_digests=False)
    try:
        while (rec := next(it, None)) is not None:
            yield WarcRecord(offset, rec)
    except (ArchiveLoadFailed, ValueError, EOFError, zlib.error) as e:
        yield WarcError(offset, f"unparsable record: {_first_line(e)}")


# ---------------------------------------------------------------------------------------------
# plain (uncompressed) WARC and ARC files


def find_plain(f, pos: int, limit: int = RESYNC_LIMIT) -> int | None:
    """Offset of the next line starting 'WARC/1.' at or after `pos`."""
    back = min(2, pos - _origin(f))  # what precedes the file's first byte counts as a line end
    f.seek(pos - back)
    prefix = (b"\n\n" + _read_full(f, back))[-2:]
    base, buf = pos, b""
    while base - pos < limit:
        block = f.read(READ_BLOCK)
        if not block:
            break
        buf = buf + block
        i = 0
        while (j := buf.find(b"WARC/1.", i)) >= 0:
            before = (prefix + buf)[j : j + 2]
            if before.endswith(b"\n"):
                return base + j
            i = j + 1
        keep = max(0, len(buf) - 8)
        prefix, base, buf = buf[keep - 2 : keep] if keep >= 2 else prefix, base + keep, buf[keep:]
    return None


def _read_full(f, n: int) -> bytes:
    """`n` bytes, fewer only at the end (a stream's reads may come back short)."""
    data = b""
    while len(data) < n and (more := f.read(n - len(data))):
        data += more
    return data


def _iter_plain(f, pos: int | None, end: int | None, resync: bool) -> Iterator[WarcRecord | WarcError]:
    """`resync`: after damage, look for the next record (WARC); legacy ARC has no marker to find."""
    while pos is not None and (end is None or pos < end):
        f.seek(pos)
        it = _QuietArchiveIterator(f, arc2warc=True, check_digests=False)
        last = pos
        try:
            while (rec := next(it, None)) is not None:
                last = it.offset  # start of this record; get_record_offset() would consume it
                if end is not None and last >= end:
                    return
                yield WarcRecord(last, rec)
            return
        except (ArchiveLoadFailed, ValueError, EOFError, zlib.error) as e:
            err_at = getattr(it, "offset", last)
            yield WarcError(max(last, min(err_at, _size(f))), f"unparsable record: {_first_line(e)}")
            pos = find_plain(f, max(last, err_at) + 1) if resync else None


def _first_line(e: Exception) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__
