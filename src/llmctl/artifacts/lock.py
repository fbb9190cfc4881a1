"""One writer per output: an advisory lock on OUT for every command that writes it.

The lock is `flock` on `OUT/.llmctl.lock`, so the kernel releases it when the holder dies, however
it dies (kill -9 included): a crash never leaves OUT locked. The holder writes its pid into the
file; a second writer finds the lock taken and stops with exit 2, "OUT is being written by pid N".

Slices of one array job (`--shard-index I --num-shards N`) write into the same OUT at once by
design: each takes the lock shared, plus an exclusive lock of its own slice
(`.llmctl.lock-I-of-N`), so two jobs of the same slice, or a whole run beside a slice, still
exclude each other.

The holder of an exclusive lock deletes the file when it is done (an artifact keeps no stray
file). That is safe because taking the lock checks, once it holds it, that the path still names
the file it locked; a file deleted under a waiter is simply tried again. An output that is
replaced whole by a rename (`llmctl export`) is locked beside it, as `.NAME.llmctl.lock` in
its parent, since a directory holding a lock file could not be renamed onto.

Within one process the lock is reentrant (a stage function called under another that already
holds OUT), counted per path. Under torchrun only rank 0 locks.
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from llmctl.errors import UsageError

LOCK = ".llmctl.lock"


@dataclass
class _Held:
    fds: list[tuple[int, Path, bool]]  # (fd, path, unlink when released)
    depth: int = 1
    created: Path | None = None  # OUT, when taking the lock created it


_held: dict[str, _Held] = {}


def lock_file(out: Path, beside: bool = False) -> Path:
    return out.parent / f".{out.name}{LOCK}" if beside else out / LOCK


def _take(path: Path, mode: int, out: Path) -> int:
    """flock `path` (LOCK_EX or LOCK_SH), not waiting; the fd, or a UsageError naming the holder."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            raise UsageError(f"{out} is being written by {_holder(path)}; wait for it, or write elsewhere") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # deleted by the previous holder between our open and our lock: again


def _holder(path: Path) -> str:
    try:
        pid = path.read_text().strip()
    except OSError:
        pid = ""
    return f"pid {pid}" if pid.isdigit() else "another llmctl process (the slices of an array job)"


@contextmanager
def output_lock(out: str | os.PathLike, slice_: tuple[int, int] | None = None, beside: bool = False,
                enabled: bool = True) -> Iterator[None]:
    """Hold OUT for the block. `slice_` (index, count) for one job of an array; `beside` for an
    output that appears by a rename; `enabled=False` (a torchrun rank other than 0, a stream) does nothing."""
    if not enabled or str(out) == "-":
        yield
        return
    out = Path(out)
    key = os.path.realpath(out)
    if key in _held:
        _held[key].depth += 1
        try:
            yield
        finally:
            _held[key].depth -= 1
        return
    created = None
    if out.is_symlink() and not out.exists():  # mkdir would fail on it, a rename would replace it
        raise UsageError(f"output {out} is a link to {os.readlink(out)}, which does not exist; remove it or pick another -o")
    if beside:
        out.parent.mkdir(parents=True, exist_ok=True)
    elif not out.is_dir():
        if out.exists():
            raise UsageError(f"output {out} exists and is not a directory")
        out.mkdir(parents=True, exist_ok=True)
        created = out
    main = lock_file(out, beside)
    held = _Held([])
    try:
        if slice_ is not None and slice_[1] > 1:
            held.fds.append((_take(main, fcntl.LOCK_SH, out), main, False))
            part = main.with_name(f"{main.name}-{slice_[0]}-of-{slice_[1]}")
            held.fds.append((_take(part, fcntl.LOCK_EX, out), part, True))
        else:
            fd = _take(main, fcntl.LOCK_EX, out)
            held.fds.append((fd, main, True))
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
    except BaseException:
        _release(held)
        _remove_if_empty(created)
        raise
    held.created = created
    _held[key] = held
    try:
        yield
    finally:
        del _held[key]
        _release(held)
        _remove_if_empty(created)


def _release(held: _Held) -> None:
    for fd, path, unlink in reversed(held.fds):
        if unlink:
            path.unlink(missing_ok=True)  # while still held: see the module docstring
        os.close(fd)


def _remove_if_empty(created: Path | None) -> None:
    """A command that stopped before writing anything leaves no empty OUT behind."""
    if created is not None:
        try:
            created.rmdir()
        except OSError:
            pass


def is_lock(name: str) -> bool:
    """Whether a name in OUT is a lock file (not part of the artifact, not a reason OUT is 'not empty')."""
    return name == LOCK or name.startswith(LOCK + "-")
