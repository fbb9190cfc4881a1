"""Which paths in an input folder are files llmctl reads as data, and how a name that is not
UTF-8 is shown and opened (docs/design.md §3, "Bad input never loses good data").

The one rule for what a folder, a glob or a path list holds: a *regular file* is read, found
by following symbolic links; anything else is never opened, so it cannot hang a reader (a FIFO
blocks its reader until a writer comes) or feed it endless bytes (a device): `problem` names it,
and the caller counts and names the skip. Inside an input folder a link to a folder is not
descended (a folder link can loop back or lead out of the tree); a folder the user names,
through a link or not, is read.

Names are what the file system holds, bytes; Python hands a name that is not UTF-8 over with its
stray bytes as lone surrogates (PEP 383), which opens the file but cannot be written as UTF-8:
`shown` is the text every manifest, log line and derived id uses instead (`part-\\xe9.parquet`),
and `arrow_source` what pyarrow, which takes only UTF-8 paths, is given to open one.
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
import zlib
from typing import BinaryIO

import pyarrow as pa

# What pyarrow, gzip and the OS raise on bytes that are not what they should be: a reader counts
# it as damage (artifacts/docs.py, artifacts/jsonl.py) rather than failing the run.
DAMAGE = (pa.ArrowException, OSError, EOFError, zlib.error)

LINK_TO_FOLDER = "a symbolic link to a folder (not followed inside an input folder)"


def shown(path: str | os.PathLike) -> str:
    """`path` as text that encodes as UTF-8: a byte of a name that is not UTF-8 as `\\xNN`."""
    text = os.fspath(path)
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def utf8_safe(value):
    """`value` (JSON-shaped: dicts, lists, strings, numbers) with every string `shown`, for a file
    that must be UTF-8 (a manifest) holding paths the user typed or a folder held."""
    if isinstance(value, str):
        return shown(value)
    if isinstance(value, dict):
        return {shown(k) if isinstance(k, str) else k: utf8_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [utf8_safe(v) for v in value]
    return value


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def problem(path: str | os.PathLike) -> str | None:
    """None for a regular file (after following links); else why it is not read as data, in
    words for a log line. Only metadata is read: nothing is opened."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "a symbolic link loop"
        if e.errno in (errno.ENOENT, errno.ENOTDIR) and os.path.islink(path):
            return "a dangling symbolic link"
        return f"does not open ({e.strerror or type(e).__name__})"
    if stat.S_ISREG(mode):
        return None
    return f"{_kind(mode)}, not a regular file: not opened"


def utf8_path(path: str) -> bool:
    try:
        path.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def arrow_source(path: str) -> str | BinaryIO:
    """What pyarrow's readers open for `path`: the path itself, or for a name that is not UTF-8
    the file opened here (the caller closes it)."""
    return path if utf8_path(path) else open(path, "rb")


def arrow_map(path: str) -> pa.NativeFile:
    """`path` memory-mapped for pyarrow, whatever its name: pyarrow maps a UTF-8 path itself;
    another is mapped here (the map lives as long as the buffer pyarrow reads from it)."""
    if utf8_path(path):
        return pa.memory_map(path)
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:  # mmap refuses an empty file; Arrow says what it is
            return pa.BufferReader(b"")
        return pa.BufferReader(pa.py_buffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)))
