"""Atomic writes and output preparation: the one place that knows how llmctl makes a file or a
directory appear whole or not at all (docs/design.md §3).

Everything is written under a hidden temporary name in the same directory — `.NAME.tmp-PID`
(plus the suffix a writer insists on, e.g. numpy's `.npy`) — and renamed into place with
`os.replace`, which is atomic within one filesystem. A killed writer leaves only such hidden
names, which `remove_stale_temps` (or a shard's own clean-up) deletes on the next run.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from llmctl.errors import UsageError

STDIO = "-"  # the path that means "a stream on stdin/stdout" instead of a directory


def temp_name(path: Path, suffix: str = "") -> Path:
    """The hidden name a file is written under before it is renamed to `path`."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}{suffix}")


@contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path next to `path`; on a clean exit it is renamed to `path`, on an
    exception it is deleted (a file or a directory). `suffix` keeps writers that append their
    own extension (np.save, np.savez) writing exactly the yielded name."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(final, suffix)
    _remove(tmp)
    try:
        yield tmp
    except BaseException:
        _remove(tmp)
        raise
    if tmp.is_dir() and final.is_dir():  # re-writing a directory (a checkpoint step saved twice)
        shutil.rmtree(final)
    os.replace(tmp, final)


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Atomically write a UTF-8 text file."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def remove_stale_temps(out_dir: Path) -> None:
    """A killed writer leaves `.NAME.tmp-PID` behind; they are never visible data, just clutter."""
    for p in out_dir.rglob(".*.tmp-*"):
        _remove(p)


def prepare_new_out(out: str | os.PathLike, overwrite: bool) -> None:
    """An output directory for a single-process command: it must be new or empty, or go with
    --overwrite (then it is removed). `-` (a stream) needs nothing."""
    if str(out) == STDIO:
        return
    p = Path(out)
    if p.exists() and overwrite:
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    if p.exists() and (not p.is_dir() or any(p.iterdir())):
        raise UsageError(f"output {p} already exists; use --overwrite to replace it")


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)
