"""Atomic writes and output preparation: the one place that knows how llmctl makes a file or a
directory appear whole or not at all (docs/design.md §3).

Everything is written under a hidden temporary name in the same directory — `.NAME.tmp-PID`
(plus the suffix a writer insists on, e.g. numpy's `.npy`) — and renamed into place with
`os.replace`, which is atomic within one filesystem. A killed writer leaves only such hidden
names, which `remove_stale_temps` (or a shard's own clean-up) deletes on the next run.

Before the rename the temporary file (or every file of a temporary directory) is fsync'd, and
after it the directory holding the name: a name only ever points at bytes that reached the disk,
and a full disk (ENOSPC, EFBIG, EDQUOT, EIO), whether a write or the flush reports it, fails the
write with the temporary deleted — never a short file under its final name. `disk_error` turns
such an OSError into the one-line failure the CLI prints (exit 1).
"""

from __future__ import annotations

import errno
import fnmatch
import json
import os
import re
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from llmctl.artifacts.lock import is_lock
from llmctl.errors import StageFailed, UsageError

DISK_ERRNOS = {errno.ENOSPC: "no space left on the device", errno.EFBIG: "file too large for the device or its limit",
               errno.EDQUOT: "disk quota exceeded", errno.EIO: "input/output error", errno.EROFS: "read-only file system"}

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
    remove_entry(tmp)
    try:
        yield tmp
        sync_tree(tmp)
    except BaseException:
        remove_entry(tmp)
        raise
    if tmp.is_dir() and final.is_dir():  # re-writing a directory (a checkpoint step saved twice)
        shutil.rmtree(final)
    os.replace(tmp, final)
    sync_dir(final.parent)


def sync_file(path: str | os.PathLike) -> None:
    """fsync a written file by name (what a library writer such as pyarrow or safetensors closed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_dir(path: str | os.PathLike) -> None:
    """fsync a directory, so a rename in it survives a crash. Filesystems that cannot (some
    network mounts) say EINVAL; the rename itself is still atomic there."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def sync_tree(path: Path) -> None:
    """fsync a file, or every file and directory under a directory."""
    if not path.exists():
        return
    if path.is_dir():
        for p in sorted(path.rglob("*")):
            if p.is_file():
                sync_file(p)
        for d in [*sorted(p for p in path.rglob("*") if p.is_dir()), path]:
            sync_dir(d)
    else:
        sync_file(path)


# How writers that are not Python file objects report the same errors: pyarrow (an OSError
# without errno), safetensors (Rust's io::Error in the text), torch.save (a RuntimeError).
_DISK_TEXT = {"No space left on device": errno.ENOSPC, "StorageFull": errno.ENOSPC, "code: 28": errno.ENOSPC,
              "Errno 28]": errno.ENOSPC, "File too large": errno.EFBIG, "FileTooLarge": errno.EFBIG,
              "code: 27": errno.EFBIG, "Errno 27]": errno.EFBIG, "Disk quota exceeded": errno.EDQUOT,
              "file write failed": errno.EIO, "os error 28": errno.ENOSPC, "os error 27": errno.EFBIG}


def check_write(path: str | os.PathLike, error: BaseException) -> None:
    """After a library writer failed on `path` with an error that does not say why (torch.save's
    "unexpected pos"), ask the disk: appending one byte to the file fails with the errno it ran
    into when it is full (ENOSPC) or at a size limit (EFBIG). Raise that, else `error` itself."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    except OSError:
        raise error
    try:
        os.write(fd, b"\0")
    except OSError as e:
        if e.errno in DISK_ERRNOS:
            raise OSError(e.errno, os.strerror(e.errno), str(path)) from error
        raise error
    finally:
        os.close(fd)
    raise error


def disk_error(e: BaseException | str) -> StageFailed | None:
    """The one-line failure for an error (or a worker's error text) that means the disk, not the
    input, failed; else None."""
    code = e.errno if isinstance(e, OSError) and e.errno in DISK_ERRNOS else None
    if code is None and not isinstance(e, (UsageError, StageFailed)):
        code = next((c for text, c in _DISK_TEXT.items() if text in str(e)), None)
    if code is None:
        return None
    name = getattr(e, "filename", None)
    where = f" writing {name}" if name else ""
    return StageFailed(f"{DISK_ERRNOS[code]}{where} (errno {errno.errorcode[code]}); nothing partial was "
                       "left under a final name: free space and re-run to resume")


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
        remove_entry(p)


def entries(out: Path) -> list[str]:
    """The names in OUT that belong to an artifact (not its lock file)."""
    return sorted(p.name for p in out.iterdir() if not is_lock(p.name)) if out.is_dir() else []


# --overwrite replaces only what llmctl wrote (docs/design.md §3). An OUT is llmctl's whole when
# it holds llmctl's manifest.json (a finished artifact or run), a sharded stage's `.shards/` or a
# single-process command's `.llmctl-run.json` (one under way); else each entry must be one the command writes on its way to its manifest (`own`,
# glob patterns the caller names: cat's parts, a run's checkpoints/), a hidden temporary
# (`.NAME.tmp-PID`) or the lock. Anything else is someone's data, and the command refuses to
# touch it, naming it.
MANIFEST = "manifest.json"  # what marks an artifact complete (artifacts/manifest.py writes it)
SHARDS_DIR = ".shards"
RUN_FILE = ".llmctl-run.json"  # a single-process command's run identity, written first (artifacts/rerun.py)
_TEMP = re.compile(r"\..+\.tmp-\d+.*", re.DOTALL)


def is_temp(name: str) -> bool:
    """A hidden temporary (`.NAME.tmp-PID`): what a write killed before its rename leaves."""
    return bool(_TEMP.fullmatch(name))


def is_llmctl_manifest(path: Path) -> bool:
    """Whether `path` is a manifest llmctl wrote: a JSON object with its kind, stage and version
    (a web app's or another tool's manifest.json is not one)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(data, dict) and all(isinstance(data.get(k), str) for k in ("kind", "stage", "llmctl_version"))


def foreign_entries(out: Path, own: Iterable[str] = ()) -> list[str]:
    """The entries of the directory OUT that llmctl did not write (see above); [] for an OUT that
    is llmctl's, or empty."""
    names = entries(out)
    if SHARDS_DIR in names or RUN_FILE in names or (MANIFEST in names and is_llmctl_manifest(out / MANIFEST)):
        return []
    return unowned_entries(out, own)


def unowned_entries(out: Path, own: Iterable[str] = ()) -> list[str]:
    """The entries of OUT that are neither named by `own` (glob patterns) nor a hidden temporary
    (`.NAME.tmp-PID`) nor the lock: what a command that writes only `own` did not write."""
    own = tuple(own)
    return [n for n in entries(out) if not is_temp(n) and not any(fnmatch.fnmatchcase(n, pat) for pat in own)]


def check_overwrite(out: Path, own: Iterable[str] = ()) -> None:
    """Refuse --overwrite on an OUT that is not llmctl's: a file, or a folder holding entries
    llmctl did not write (through a symlink too: what is checked is what would be removed)."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"output {out} is a file, not a directory llmctl wrote; --overwrite replaces only llmctl's "
                         "own outputs: remove it or pick another -o")
    foreign = foreign_entries(out, own)
    if foreign:
        shown = ", ".join(foreign[:5]) + (", …" if len(foreign) > 5 else "")
        n = len(foreign)
        raise UsageError(f"output {out} holds {n} entr{'y' if n == 1 else 'ies'} llmctl did not write ({shown}); "
                         "--overwrite replaces only llmctl's own outputs: remove them or pick another -o")


def clear_dir(out: Path, own: Iterable[str] = ()) -> None:
    """Empty OUT for --overwrite, keeping the lock file this command holds on it; an OUT that
    is not llmctl's (check_overwrite) is refused, with nothing removed."""
    check_overwrite(out, own)
    for name in entries(out):
        remove_entry(out / name)


def prepare_new_out(out: str | os.PathLike, overwrite: bool, own: Iterable[str] = ()) -> None:
    """An output directory for a single-process command: it must be new or empty, or go with
    --overwrite (then it is emptied, when it is llmctl's: `own` as for `foreign_entries`). `-`
    (a stream) needs nothing."""
    if str(out) == STDIO:
        return
    p = Path(out)
    if p.exists() and not p.is_dir():
        raise UsageError(f"output {p} exists and is not a directory; remove it or pick another -o")
    if p.exists() and overwrite:
        clear_dir(p, own)
    if p.exists() and entries(p):
        check_overwrite(p, own)  # someone's files: --overwrite would not remove them either
        raise UsageError(f"output {p} already exists; use --overwrite to replace it")


def directory_only(out: str | os.PathLike, what: str) -> None:
    """Refuse `-o -` for a command whose output is a folder (a run, a model, plots): without
    this it would make a folder named `-`."""
    if str(out) == STDIO:
        raise UsageError(f"{what} is written to a directory, not to '-' (a stream): give -o a folder")


def remove_entry(p: Path) -> None:
    """Delete a file, a link or a directory tree; nothing there is fine."""
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)
