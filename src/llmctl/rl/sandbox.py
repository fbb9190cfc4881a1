"""Run untrusted Python (a model's completion) against test cases in a confined subprocess.

One run: a fresh temp dir as cwd, ``python -I -S`` (isolated: no PYTHON* variables, no user or
site packages, no cwd on sys.path), an environment with nothing but PATH/LANG/HOME/TMPDIR (no
proxies, no credentials), stdin at /dev/null, its own process group (killed whole at the end),
and a harness (``_sandbox_child.py``, whose docstring has the details) that, before the code runs:

- sets RLIMIT_CPU (SIGXCPU at the limit, SIGKILL one second later), RLIMIT_AS (memory),
  RLIMIT_NPROC (processes/threads of the user), RLIMIT_FSIZE (largest file written), RLIMIT_CORE 0
  and RLIMIT_NOFILE;
- enforces Landlock (``landlock.py``): reads only beneath the Python install, the loaded shared
  objects' directories and the system lib dirs; reads and writes only beneath its temp dir; no
  program executed anywhere;
- when this process runs as root, drops to an unprivileged uid/gid (``user``: by default
  ``nobody``, else 65534) with no supplementary groups and no capabilities; the temp dir is
  chowned to it;
- installs a seccomp filter (Linux x86_64/aarch64) that refuses exec, new processes (threads are
  allowed), sockets, raising the limits, signals to other processes, ptrace, mount and namespaces.

The result's ``isolation`` says what the run had, e.g. ``landlock+seccomp+rlimits+uid 65534``.
A protection the host lacks makes the harness refuse (the sample is masked) unless ``unsafe``;
``missing_protections()`` tells at start-up what this host lacks, without running anything.

The parent enforces a wall-clock deadline (SIGKILL to the process group), keeps at most
``max_output_bytes`` of stdout and of stderr (the rest is read and dropped, so the child never
blocks) and reads the per-test results from a separate pipe tagged with a per-run random nonce,
so printing cannot forge a pass.

What this does not guarantee: code can defeat its own checks in Python (an ``__eq__`` that is
always true, reading the harness's frames or the nonce, rewriting the tests' globals); the
verdict is about the tests, not about adversarial code. It can ``stat`` any path (Landlock does
not control lookups) and sees the host's kernel, CPU count and clock. Threads count against
RLIMIT_NPROC of the sandbox uid, which concurrent runs share. The kernel is the boundary: a
kernel exploit through an allowed system call is out of scope.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from llmctl.rl import landlock
from llmctl.rl._sandbox_child import ARCHES

_CHILD_SOURCE = (Path(__file__).with_name("_sandbox_child.py")).read_text(encoding="utf-8")
_LANDLOCK_SOURCE = Path(landlock.__file__).read_text(encoding="utf-8")  # the harness runs it to confine itself
_MIB = 1 << 20


@dataclass(frozen=True)
class Limits:
    cpu_seconds: float = 5.0  # RLIMIT_CPU (rounded up to whole seconds)
    wall_seconds: float = 10.0  # wall-clock deadline, then SIGKILL to the process group
    memory_mb: int = 512  # RLIMIT_AS
    max_procs: int = 64  # RLIMIT_NPROC (counts every process and thread of the user)
    max_file_bytes: int = 16 * _MIB  # RLIMIT_FSIZE
    max_output_bytes: int = 64 * 1024  # kept of stdout and of stderr, each
    max_open_files: int = 256  # RLIMIT_NOFILE

    def rlimits(self) -> dict[str, tuple[int, int]]:
        cpu = max(1, math.ceil(self.cpu_seconds))
        return {
            "RLIMIT_CPU": (cpu, cpu + 1),
            "RLIMIT_AS": (self.memory_mb * _MIB, self.memory_mb * _MIB),
            "RLIMIT_NPROC": (self.max_procs, self.max_procs),
            "RLIMIT_FSIZE": (self.max_file_bytes, self.max_file_bytes),
            "RLIMIT_CORE": (0, 0),
            "RLIMIT_NOFILE": (self.max_open_files, self.max_open_files),
        }


@dataclass
class SandboxResult:
    started: bool = False  # the harness reached the code; False = infrastructure failure
    error: str | None = None  # why it did not start (spawn failure, harness error, bad test)
    bad_test: bool = False  # a test case does not compile (the reference is unusable)
    crash: str | None = None  # the code itself raised (at definition time)
    passed: list[bool] = field(default_factory=list)  # per test, in order, as reported
    failures: list[str] = field(default_factory=list)  # "test N: ExcType: message"
    finished: bool = False  # every test ran and the harness said so
    timed_out: bool = False  # the wall-clock deadline hit
    returncode: int | None = None  # negative: killed by that signal
    stdout: bytes = b""
    stderr: bytes = b""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    isolation: str = ""  # what the run had, e.g. "landlock+seccomp+rlimits+uid 65534"
    elapsed: float = 0.0

    @property
    def signal_name(self) -> str | None:
        if self.returncode is None or self.returncode >= 0:
            return None
        try:
            return signal.Signals(-self.returncode).name
        except ValueError:
            return f"signal {-self.returncode}"


class _Capped:
    def __init__(self, cap: int):
        self.cap, self.buf, self.total = cap, bytearray(), 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.cap - len(self.buf)
        if room > 0:
            self.buf += chunk[:room]


def _reap_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _exited(pid: int) -> bool:
    """True once the child has exited, without reaping it (its pid keeps naming the group)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def missing_protections() -> list[str]:
    """What this host lacks of the sandbox's protections (empty: all there), checked in this
    process without starting one: Linux, Landlock, seccomp and a filter for this architecture."""
    if not sys.platform.startswith("linux"):
        return [f"not Linux ({sys.platform}): no Landlock, no seccomp"]
    missing = []
    if landlock.abi_version() < 1:
        missing.append("no Landlock: a kernel without it, or Landlock not in the lsm= boot list")
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            has_seccomp = any(line.startswith("Seccomp:") for line in f)
    except OSError:
        has_seccomp = False
    if not has_seccomp:
        missing.append("no seccomp: a kernel built without it")
    elif os.uname().machine not in ARCHES:
        missing.append(f"no seccomp filter for {os.uname().machine}")
    return missing


def sandbox_ids(user: str | int | None = None) -> tuple[int, int] | None:
    """The (uid, gid) the code runs as when it must change: ``user`` when given (a name or a
    uid), else, when this process is root, ``nobody`` (its group) or 65534/65534 where there is
    no such user. None: no change (not root, no ``user``)."""
    if user is None and os.geteuid() != 0:
        return None
    import pwd

    if isinstance(user, int):
        try:
            pw = pwd.getpwuid(user)
        except KeyError:  # a uid with no passwd entry: its own number as the group
            return user, user
    else:
        try:
            pw = pwd.getpwnam(user or "nobody")
        except KeyError:
            if user is not None:
                raise  # a named user that does not exist: the caller's mistake, not a fallback
            return 65534, 65534  # the conventional overflow uid/gid (nobody, nogroup)
    return pw.pw_uid, pw.pw_gid


def run_python(code: str, tests: Sequence[str], limits: Limits = Limits(), python: str | None = None,
               user: str | int | None = None, unsafe: bool = False) -> SandboxResult:
    """Run ``code`` then each test (Python source, usually an ``assert``) in its namespace, as
    ``user`` (see ``sandbox_ids``). ``unsafe``: run even where a protection is missing.

    Never raises for anything the code does; an infrastructure failure (no interpreter, harness
    error, a missing protection, a test that does not compile) comes back with ``started=False``
    and ``error`` set."""
    res = SandboxResult()
    t0 = time.monotonic()
    nonce = secrets.token_hex(16)
    workdir = tempfile.mkdtemp(prefix="llmctl-sandbox-")
    read_fd = write_fd = -1
    proc = None
    try:
        drop = sandbox_ids(user)
        payload = {"nonce": nonce, "code": code, "tests": list(tests), "limits": limits.rlimits(),
                   "landlock": _LANDLOCK_SOURCE, "drop": drop, "unsafe": bool(unsafe)}
        payload_path = os.path.join(workdir, ".payload.json")
        with open(payload_path, "w", encoding="utf-8") as f:
            json.dump(payload, f)
        if drop is not None and os.geteuid() == 0:  # the harness reads the payload before it drops
            os.chown(workdir, *drop)
        read_fd, write_fd = os.pipe()
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
               "HOME": workdir, "TMPDIR": workdir}
        # The interpreter starts as this process's user: the harness drops privileges itself, once
        # it has read what only that user can (a Python under /root, the payload).
        proc = subprocess.Popen(
            [python or sys.executable, "-I", "-S", "-c", _CHILD_SOURCE, str(write_fd), str(os.getpid())],
            cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            pass_fds=(write_fd,), start_new_session=True,
        )
    except (OSError, subprocess.SubprocessError, ValueError, KeyError, TypeError) as e:
        res.error = f"could not start the sandbox: {type(e).__name__}: {e}"
        for fd in (read_fd, write_fd):
            if fd >= 0:
                os.close(fd)
        shutil.rmtree(workdir, ignore_errors=True)
        res.elapsed = time.monotonic() - t0
        return res
    os.close(write_fd)
    out, err, report = _Capped(limits.max_output_bytes), _Capped(limits.max_output_bytes), _Capped(4 * _MIB)
    sinks = {proc.stdout.fileno(): out, proc.stderr.fileno(): err, read_fd: report}
    sel = selectors.DefaultSelector()
    for fd in sinks:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    deadline = t0 + limits.wall_seconds
    drain_until = None  # once the main process is gone: a short grace to read what is left
    try:
        while sel.get_map():
            now = time.monotonic()
            if drain_until is None and _exited(proc.pid):
                _reap_group(proc.pid)  # leftovers holding the pipes open
                drain_until = now + 1.0
            elif drain_until is None and now >= deadline:
                res.timed_out = True
                _reap_group(proc.pid)
                drain_until = now + 1.0
            if drain_until is not None and now >= drain_until:
                break
            limit = (drain_until if drain_until is not None else deadline) - now
            for key, _ in sel.select(timeout=max(0.0, min(0.05, limit))):
                try:
                    chunk = os.read(key.fd, 1 << 16)
                except BlockingIOError:
                    continue
                if chunk:
                    sinks[key.fd].add(chunk)
                else:
                    sel.unregister(key.fd)
    finally:
        sel.close()
        _reap_group(proc.pid)
        res.returncode = proc.wait()
        proc.stdout.close()
        proc.stderr.close()
        os.close(read_fd)
        shutil.rmtree(workdir, ignore_errors=True)
    res.elapsed = time.monotonic() - t0
    res.stdout, res.stdout_truncated = bytes(out.buf), out.total > len(out.buf)
    res.stderr, res.stderr_truncated = bytes(err.buf), err.total > len(err.buf)
    _parse_report(bytes(report.buf), nonce, res)
    return res


def _parse_report(raw: bytes, nonce: str, res: SandboxResult) -> None:
    for line in raw.decode("utf-8", "replace").splitlines():
        head, _, rest = line.partition(" ")
        if head != nonce:
            continue
        event, _, detail = rest.partition(" ")
        if event == "ready" and not res.started:
            res.started, res.isolation = True, detail
        elif event in ("herror", "badtest") and not res.started:
            res.error, res.bad_test = detail, event == "badtest"
        elif not res.started or res.finished:
            continue
        elif event == "crash" and res.crash is None:
            res.crash = detail
        elif event == "pass":
            res.passed.append(True)
        elif event == "fail":
            index, _, why = detail.partition(" ")
            res.passed.append(False)
            res.failures.append(f"test {int(index) + 1 if index.isdigit() else index}: {why}")
        elif event == "done":
            res.finished = True
    if not res.started and res.error is None:
        tail = res.stderr.decode("utf-8", "replace").strip().splitlines()
        how = "timed out" if res.timed_out else f"exited with {res.signal_name or res.returncode}"
        res.error = f"the harness {how} before running the code" + (f": {tail[-1]}" if tail else "")
