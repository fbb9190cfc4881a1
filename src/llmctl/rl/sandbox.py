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
blocks) and reads what the harness reports from a separate pipe that only the child holds.

The verdict is never the child's: the child is asked only for the values of the parts of each
test that need the code (``testplan.py``), sent back by value (``plain.py``), and never sees the
expected values. The parent compares plain values to literals itself; any other assert goes to
a second run of the harness, the judge, confined the same way and running no code of the
policy's. So an ``__eq__`` that is always true, a subclass of ``int`` that lies, a patched
harness, a forged line on the report pipe or an early exit can at most report wrong values —
which fail. What is still trusted: the tests themselves (see ``testplan.py``).

What this does not guarantee: the code can ``stat`` any path (Landlock does not control lookups)
and sees the host's kernel, CPU count and clock. Threads count against RLIMIT_NPROC of the
sandbox uid, which concurrent runs share. The kernel is the boundary: a kernel exploit through
an allowed system call is out of scope.
"""

from __future__ import annotations

import ast
import json
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

from llmctl.rl import landlock, plain
from llmctl.rl._sandbox_child import ARCHES
from llmctl.rl.testplan import BadTest, TestPlan, judge_here, plan_tests

_CHILD_SOURCE = (Path(__file__).with_name("_sandbox_child.py")).read_text(encoding="utf-8")
# the harness runs these to confine itself and to send values
_LANDLOCK_SOURCE = Path(landlock.__file__).read_text(encoding="utf-8")
_PLAIN_SOURCE = Path(plain.__file__).read_text(encoding="utf-8")
_MIB = 1 << 20
_REPORT_BYTES = 64 * _MIB  # the values of one run, kept: more is cut (the tests that need the rest fail)


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
    passed: list[bool] = field(default_factory=list)  # per test, in order (once finished)
    failures: list[str] = field(default_factory=list)  # "test N: why"
    finished: bool = False  # every step ran and the harness said so
    evaluated: int = 0  # tests whose values all came back (of a run that did not finish: how far it got)
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
    with suppress(ProcessLookupError, PermissionError):  # already gone, or its leftovers are
        os.killpg(pid, signal.SIGKILL)


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
    """Run ``code`` then each test (Python source with top-level ``assert`` statements) against it,
    as ``user`` (see ``sandbox_ids``). ``unsafe``: run even where a protection is missing.

    Never raises for anything the code does; an infrastructure failure (no interpreter, harness
    error, a missing protection, a test the verifier cannot use) comes back with
    ``started=False`` and ``error`` set."""
    try:
        plan = plan_tests(list(tests))
    except BadTest as e:
        return SandboxResult(error=str(e), bad_test=True)
    res, raw = _run_harness({"mode": "run", "code": code, "steps": plan.child}, limits, python, user, unsafe)
    values, setup_failed = _read_run(raw, res)
    res.evaluated = _evaluated(plan, values, setup_failed)
    if res.finished:
        _decide(plan, values, setup_failed, res, limits, python, user, unsafe)
    return res


def _run_harness(payload: dict, limits: Limits, python: str | None, user: str | int | None,
                 unsafe: bool) -> tuple[SandboxResult, bytes]:
    """One confined run of the harness with this payload: the result's process facts (started is
    decided by the caller from the report) and the raw report."""
    res = SandboxResult()
    t0 = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="llmctl-sandbox-")
    read_fd = write_fd = -1
    proc = None
    try:
        drop = sandbox_ids(user)
        payload = {**payload, "limits": limits.rlimits(), "landlock": _LANDLOCK_SOURCE, "plain": _PLAIN_SOURCE,
                   "drop": drop, "unsafe": bool(unsafe)}
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
        return res, b""
    os.close(write_fd)
    out, err, report = _Capped(limits.max_output_bytes), _Capped(limits.max_output_bytes), _Capped(_REPORT_BYTES)
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
    return res, bytes(report.buf)


def _events(raw: bytes, res: SandboxResult):
    """The report's events after ``ready`` (what came before it sets ``error``/``bad_test``)."""
    for line in raw.decode("utf-8", "replace").splitlines():
        event, _, detail = line.partition(" ")
        if not res.started:
            if event == "ready":
                res.started, res.isolation = True, detail
            elif event in ("herror", "badtest") and res.error is None:
                res.error, res.bad_test = detail, event == "badtest"
            continue
        if event == "done":
            res.finished = True
            return
        yield event, detail


def _read_run(raw: bytes, res: SandboxResult) -> tuple[dict[int, tuple[bool, object]], dict[int, str]]:
    """Leaf values ({k: (True, value) | (False, why)}) and setup failures ({test: why}) of a run;
    the first word on a leaf counts (the code could write any of these lines itself: all it can
    say is a value of its own, which is all the harness would have said)."""
    values: dict[int, tuple[bool, object]] = {}
    setup_failed: dict[int, str] = {}
    for event, detail in _events(raw, res):
        head, _, rest = detail.partition(" ")
        if event == "crash" and res.crash is None:
            res.crash = detail
        elif event in ("value", "raise") and head.isdigit() and int(head) not in values:
            if event == "raise":
                values[int(head)] = (False, f"raised {rest}")
                continue
            try:
                values[int(head)] = (True, plain.loads(rest))
            except plain.NotPlain as e:
                values[int(head)] = (False, f"sent no plain value ({e})")
        elif event == "setup" and head.isdigit():
            setup_failed.setdefault(int(head), rest)
    _not_started(res)
    return values, setup_failed


def _not_started(res: SandboxResult) -> None:
    if not res.started and res.error is None:
        tail = res.stderr.decode("utf-8", "replace").strip().splitlines()
        how = "timed out" if res.timed_out else f"exited with {res.signal_name or res.returncode}"
        res.error = f"the harness {how} before running the code" + (f": {tail[-1]}" if tail else "")


def _leaves_of(plan: TestPlan) -> dict[int, tuple[int, str]]:
    return {step[2]: (step[0], step[3]) for step in plan.child if step[1] == "eval"}


def _evaluated(plan: TestPlan, values: dict, setup_failed: dict) -> int:
    """Tests, from the first, whose values all came back (or whose setup raised)."""
    missing = {test for k, (test, _) in _leaves_of(plan).items() if k not in values and test not in setup_failed}
    return next((i for i in range(plan.n_tests) if i in missing), plan.n_tests)


def _decide(plan: TestPlan, values: dict, setup_failed: dict, res: SandboxResult, limits: Limits,
            python: str | None, user: str | int | None, unsafe: bool) -> None:
    """Each assert's verdict, here or by the judge; then each test's (all its asserts pass)."""
    leaves = _leaves_of(plan)

    def value(k: int):
        came, v = values.get(k, (False, "sent no value"))
        if not came:
            raise AssertionError(v)
        return v

    verdicts: dict[int, tuple[bool, str]] = {}
    pending = []
    for j, a in enumerate(plan.asserts):
        if a.test in setup_failed:
            continue
        ok = judge_here(a.expr, value)
        if ok is None:
            pending.append(j)
        else:
            verdicts[j] = (ok, "")
    if pending:
        judged = _judge(plan, pending, values, limits, python, user, unsafe, res)
        if judged is None:  # the judge is infrastructure: its failure masks the sample
            return
        verdicts.update(judged)
    failures: dict[int, str] = {i: f"test {i + 1}: {why}" for i, why in setup_failed.items()}
    for j, a in enumerate(plan.asserts):
        ok, why = verdicts.get(j, (True, ""))
        if a.test in failures or ok:
            continue
        said = "; ".join(_said(leaves[k][1], values.get(k)) for k in a.leaves)
        failures[a.test] = f"test {a.test + 1}: AssertionError: {a.source}" + (f" ({said})" if said else "") + (f": {why}" if why else "")
    res.passed = [i not in failures for i in range(plan.n_tests)]
    res.failures = [failures[i] for i in sorted(failures)]


def _said(source: str, got) -> str:
    if got is None:
        return f"{source} sent no value"
    came, v = got
    text = repr(v) if came else str(v)  # not came: "raised ...", "sent no plain value (...)"
    text = text if len(text) <= 80 else text[:77] + "..."
    return f"{source} gave {text}" if came else f"{source} {text}"


def _judge(plan: TestPlan, pending: list[int], values: dict, limits: Limits, python: str | None,
           user: str | int | None, unsafe: bool, res: SandboxResult) -> dict[int, tuple[bool, str]] | None:
    """The asserts the parent could not decide, in a second harness run that runs no code of the
    policy's: {assert: (passed, why)}; None when the judge itself failed (res.error says why)."""
    wanted = set(pending)
    steps, needed = [], set()
    for step in plan.judge:
        if step[1] == "exec":
            steps.append(step)
        elif step[2] in wanted:
            steps.append([*step, ast.unparse(plan.asserts[step[2]].expr)])
            needed |= set(plan.asserts[step[2]].leaves)
    sent = {}
    for k in needed:
        came, v = values.get(k, (False, "sent no value"))
        sent[str(k)] = ["value", plain.encode(v)] if came else ["raise", v]
    judge, raw = _run_harness({"mode": "judge", "steps": steps, "values": sent}, limits, python, user, unsafe)
    verdicts: dict[int, tuple[bool, str]] = {}
    for event, detail in _events(raw, judge):
        head, _, rest = detail.partition(" ")
        if event == "judged" and head.isdigit() and int(head) in wanted:
            outcome, _, why = rest.partition(" ")
            verdicts.setdefault(int(head), (outcome == "pass", why))
    res.elapsed += judge.elapsed
    if not judge.started:
        _not_started(judge)
        res.started, res.error = False, f"the judge: {judge.error}"
        return None
    stopped = "timed out" if judge.timed_out else f"exited with {judge.signal_name or judge.returncode}"
    for j in pending:
        verdicts.setdefault(j, (False, f"the judge {stopped} before deciding it"))
    return verdicts
