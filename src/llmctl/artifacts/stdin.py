"""stdin as an input: read once, and named in the manifest by what was read.

A file input is recorded by its sha256 (artifacts/manifest.py `input_ref`); a stream has no path
to hash afterwards, so its bytes are counted and hashed as they pass through, and the manifest
records `{"path": "-", "kind": "stream", "format", "bytes", "sha256"}`: enough to tell whether
two runs read the same stream.
"""

from __future__ import annotations

import hashlib
import io
import sys

from llmctl.errors import UsageError


class StdinReader(io.RawIOBase):
    """A binary stream that hashes and counts what is read through it."""

    def __init__(self, stream=None, what: str = "an llmctl stream"):
        super().__init__()
        stream = stream if stream is not None else sys.stdin.buffer
        if hasattr(stream, "isatty") and stream.isatty():
            raise UsageError(f"input is '-' but stdin is a terminal; pipe {what} into it")
        self._stream = stream
        self._sha = hashlib.sha256()
        self.bytes = 0

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        data = self._stream.read(n if n is not None else -1) or b""
        self._sha.update(data)
        self.bytes += len(data)
        return data

    def read1(self, n: int = -1) -> bytes:
        """What one read of the pipe gives (at least a byte unless the stream has ended)."""
        read1 = getattr(self._stream, "read1", None)
        data = (read1(n) if read1 is not None else self._stream.read(n)) or b""
        self._sha.update(data)
        self.bytes += len(data)
        return data

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def drain(self) -> None:
        """Read what is left (bytes after the end a reader stops at count too)."""
        while self.read(1 << 20):
            pass

    def ref(self, fmt: str) -> dict:
        """The manifest's entry for this input, once it has been read to the end."""
        return {"path": "-", "kind": "stream", "format": fmt, "bytes": self.bytes, "sha256": self._sha.hexdigest()}
