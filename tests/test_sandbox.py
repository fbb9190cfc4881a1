"""The python verifier's sandbox holds as root (issue 20): Landlock, the uid drop, seccomp, rlimits.

Each hostile solution attacks first and then defines a correct ``add``: its 0 means the attack
was refused (the detail names the refusal), not that the code was wrong. Written for root (CI's
case, where the uid drop is on) and for any other user; a protection the host lacks skips the
tests that need it, with the reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from llmctl.rl import sandbox
from llmctl.rl.rewards import PythonVerifier
from llmctl.rl.sandbox import Limits, missing_protections, run_python
from test_rewards import _leftovers

MISSING = missing_protections()
needs_sandbox = pytest.mark.skipif(bool(MISSING), reason=f"this host lacks a sandbox protection: {'; '.join(MISSING)}")
ROOT = os.geteuid() == 0
ISOLATION = "landlock+seccomp+rlimits" + ("+uid 65534" if ROOT else "")

LIMITS = dict(cpu_seconds=1, timeout=3, memory_mb=256, max_procs=8)
SLACK = 2.0  # seconds past the wall-clock limit: start-up and reaping, not a speed claim
ADD = "\ndef add(a, b):\n    return a + b\n"
TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]


@pytest.fixture
def outside():
    """A directory outside the sandbox with a canary, both writable by everyone: file permissions
    would let the sandbox uid change them, so only the sandbox itself can stop it."""
    d = Path(tempfile.mkdtemp(prefix="llmctl-canary-"))
    d.chmod(0o777)
    (d / "canary").write_text("keep")
    (d / "canary").chmod(0o666)
    yield d
    shutil.rmtree(d)


def _verdict(code: str, **limits):
    v = PythonVerifier(**{**LIMITS, **limits})
    t0 = time.monotonic()
    verdict = v.verify(code + ADD, TESTS)
    elapsed = time.monotonic() - t0
    assert elapsed < v.timeout + SLACK, f"{elapsed:.1f} s"
    assert _leftovers() == []
    return verdict


def _refused(verdict, why: str) -> None:
    assert verdict.reward == 0.0 and verdict.correct is False and not verdict.masked, verdict
    assert why in verdict.detail, verdict.detail


@needs_sandbox
def test_a_correct_solution_scores_1_with_the_standard_library_as_the_sandbox_uid():
    code = ("import collections, decimal, fractions, functools, hashlib, heapq, itertools, json, math, re, statistics\n"
            "import os, sys, threading, random\n"
            "def add(a, b):\n    return int(decimal.Decimal(a) + fractions.Fraction(b).numerator)\n"
            "digest = hashlib.sha256(json.dumps([1, 2]).encode('cp1252')).hexdigest()\n"  # an encodings submodule, loaded late
            "open('scratch.txt', 'w').write(digest); os.mkdir('d'); os.rename('scratch.txt', 'd/s.txt')\n")
    r = run_python(code, [*TESTS, "assert open('d/s.txt').read() == digest"], Limits(cpu_seconds=2, wall_seconds=10))
    assert r.finished and r.passed == [True, True, True], (r.crash, r.failures, r.error)
    assert r.isolation == ISOLATION
    assert PythonVerifier(**LIMITS).verify(code, TESTS).reward == 1.0


@needs_sandbox
@pytest.mark.skipif(not ROOT, reason="the uid drop happens when the parent runs as root")
def test_as_root_the_code_runs_as_65534_with_no_groups_or_capabilities():
    code = "import os\nids = os.getresuid(), os.getresgid(), os.getgroups()\n"
    assert PythonVerifier(**LIMITS).verify(code, ["assert ids == ((65534,) * 3, (65534,) * 3, [])"]).reward == 1.0
    _refused(_verdict("import os\nos.setuid(0)"), "PermissionError")
    _refused(_verdict("import os\nos.chown('.', 0, 0)"), "PermissionError")  # CAP_CHOWN is gone


READS = {
    "/etc/shadow": "open('/etc/shadow').read()",
    "/etc/passwd (world-readable)": "open('/etc/passwd').read()",
    "listing /root": "import os\nos.listdir('/root')",
    "listing /": "import os\nos.listdir('/')",
    "another process's /proc": "open('/proc/1/cmdline').read()",
    "this repository": f"open({str(Path(__file__).resolve())!r}).read()",
    "a symlink out of the sandbox": "import os\nos.symlink('/etc/passwd', 'p')\nopen('p').read()",
}


@needs_sandbox
@pytest.mark.parametrize("what", READS)
def test_reading_outside_is_refused(what):
    if what == "/etc/shadow" and not os.path.exists("/etc/shadow"):
        pytest.skip("no /etc/shadow on this host")
    _refused(_verdict(READS[what]), "PermissionError")


WRITES = {
    "create": "open('{d}/new', 'w').write('x')",
    "truncate": "open('{d}/canary', 'w')",
    "append": "open('{d}/canary', 'a').write('x')",
    "delete": "import os\nos.remove('{d}/canary')",
    "rename into the sandbox": "import os\nos.rename('{d}/canary', 'mine')",
    "mkdir": "import os\nos.mkdir('{d}/sub')",
    "symlink": "import os\nos.symlink('/etc/passwd', '{d}/link')",
    "chmod": "import os\nos.chmod('{d}/canary', 0o777)",
}


@needs_sandbox
@pytest.mark.parametrize("what", WRITES)
def test_writing_or_deleting_outside_is_refused_and_the_host_is_unchanged(what, outside):
    if what == "chmod" and not ROOT:  # metadata Landlock does not control: the uid drop refuses it
        pytest.skip("chmod is refused by the uid drop (the file is not the sandbox uid's), which happens as root")
    _refused(_verdict(WRITES[what].format(d=outside)), "PermissionError")
    assert sorted(p.name for p in outside.iterdir()) == ["canary"]
    assert (outside / "canary").read_text() == "keep" and (outside / "canary").stat().st_mode & 0o777 == 0o666


@needs_sandbox
def test_no_other_program_runs(outside):
    _refused(_verdict("import os\nos.execv('/bin/true', ['true'])"), "PermissionError")
    _refused(_verdict(f"import os\nos.execv('/usr/bin/touch', ['touch', '{outside}/touched'])"), "PermissionError")
    _refused(_verdict("import subprocess\nsubprocess.run(['/bin/true'])"), "BlockingIOError")  # no fork either
    assert sorted(p.name for p in outside.iterdir()) == ["canary"]


@needs_sandbox
def test_no_network_and_no_signals_to_other_processes():
    _refused(_verdict("import socket\nsocket.socket()"), "PermissionError")
    _refused(_verdict("import socket\nsocket.socket(socket.AF_UNIX)"), "PermissionError")
    _refused(_verdict("import os\nos.kill(os.getppid(), 0)"), "PermissionError")  # signal 0: harmless if it got through


@needs_sandbox
def test_fork_bomb_memory_bomb_and_infinite_loop_are_stopped_within_their_limits():
    _refused(_verdict("import os\nwhile True:\n    os.fork()"), "BlockingIOError")
    _refused(_verdict("hog = []\nwhile True:\n    hog.append(' ' * 2**20)"), "MemoryError")
    loop = _verdict("while True:\n    pass")
    assert loop.reward == 0.0 and not loop.masked and ("CPU limit" in loop.detail or "timeout" in loop.detail)
    sleep = _verdict("import time\nwhile True:\n    time.sleep(0.05)", timeout=1.0)  # no CPU used: the wall clock
    assert sleep.reward == 0.0 and "timeout" in sleep.detail


@needs_sandbox
def test_a_protection_that_fails_masks_the_sample_unless_unsafe(monkeypatch):
    """The harness's own Landlock step failing (as on a host without it) is infrastructure: masked,
    never 0; with unsafe the code runs and the result says what isolation it had."""
    broken = "def restrict(read=(), write=()):\n    raise OSError(38, 'Landlock is not available')\n"
    monkeypatch.setattr(sandbox, "_LANDLOCK_SOURCE", broken)
    v = PythonVerifier(**LIMITS).verify(ADD, TESTS)
    assert v.masked and v.reward == 0.0 and "no Landlock" in v.detail, v
    r = run_python(ADD, TESTS, Limits(cpu_seconds=1, wall_seconds=3), unsafe=True)
    assert r.finished and all(r.passed) and r.isolation == ISOLATION.replace("landlock+", "")


def _rl_without_landlock(cwd, *args):
    """`llmctl rl --verifier python` in a subprocess whose Landlock detection is patched to say
    the kernel has none."""
    patch = "import llmctl.rl.landlock as landlock; landlock.abi_version = lambda: 0\nfrom llmctl.cli import main; main()"
    return subprocess.run([sys.executable, "-c", patch, "rl", "no-checkpoint", "--prompts", "no-prompts.jsonl",
                           "-o", "run", "--verifier", "python", *args], capture_output=True, text=True, cwd=cwd)


def test_rl_refuses_a_host_without_landlock_unless_unsafe_sandbox(tmp_path):
    p = _rl_without_landlock(tmp_path)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "no Landlock" in p.stderr and "--unsafe-sandbox" in p.stderr
    assert not (tmp_path / "run").exists()  # refused before anything was written
    # with the flag the check passes (and says so); the run then stops on the missing checkpoint
    p = _rl_without_landlock(tmp_path, "--unsafe-sandbox")
    assert "checkpoint not found" in p.stderr and "no Landlock" not in p.stderr, p.stderr
    assert "python verifier: sandbox" in p.stderr and "(--unsafe-sandbox)" in p.stderr


def test_rl_help_documents_unsafe_sandbox():
    p = subprocess.run([sys.executable, "-m", "llmctl", "rl", "--help"], capture_output=True, text=True,
                       env={**os.environ, "COLUMNS": "200"})
    assert "--unsafe-sandbox" in p.stdout


@needs_sandbox
@pytest.mark.skipif(not ROOT, reason="the uid drop happens when the parent runs as root")
def test_a_standard_library_the_sandbox_uid_cannot_read_masks_the_sample(monkeypatch):
    """A Python installed where uid 65534 cannot look (under /root, mode 0700) still works: the
    harness opens its import path before the drop. Without that, the sample is masked — an import
    failing inside the code would otherwise score 0 for the host's fault."""
    probe = run_python("import sys\nmoved = [p for p in sys.path if p.startswith('/proc/self/fd/')]", ["assert moved"],
                       Limits(cpu_seconds=1, wall_seconds=3))
    if not probe.finished or not all(probe.passed):
        pytest.skip(f"{sys.executable}'s standard library is readable by uid 65534 as it is")
    unopened = sandbox._CHILD_SOURCE.replace("opened[entry] = os.open(entry, os.O_RDONLY | os.O_CLOEXEC)",
                                             "opened[entry] = os.stat(entry) and None")  # found, not opened
    assert unopened != sandbox._CHILD_SOURCE
    monkeypatch.setattr(sandbox, "_CHILD_SOURCE", unopened)
    v = PythonVerifier(**LIMITS).verify("import decimal" + ADD, TESTS)
    assert v.masked and v.reward == 0.0 and "cannot read" in v.detail, v
