"""Shared test helpers: the shared data folder, and running the real CLI as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmctl.runtime.progress import Progress

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("LLMCTL_SHARED", ROOT.parent / "shared"))
DATA = SHARED / "data"
CRAWL = ROOT / "examples" / "crawl"


def shared_file(rel: str) -> Path:
    """A file under ../shared/data, or skip the test cleanly when the folder is absent."""
    p = DATA / rel
    if not p.exists():
        pytest.skip(f"shared data not available: {p}")
    return p


def llmctl(*args: str, input: bytes | None = None, check: bool = False, cwd=None) -> subprocess.CompletedProcess:
    """Run `python -m llmctl ARGS` in a subprocess (real exit codes, real stdin/stdout bytes)."""
    proc = subprocess.run(
        [sys.executable, "-m", "llmctl", *map(str, args)],
        input=input,
        capture_output=True,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "200"},
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"llmctl {' '.join(map(str, args))} exited {proc.returncode}:\n{proc.stderr.decode()}")
    return proc


class RecordingProgress(Progress):
    """A runtime.progress.Progress that keeps what it was told, for tests to read back."""

    def __init__(self) -> None:
        self.total: int | None = None
        self.done = 0
        self.messages: list[str] = []
        self.finished = False

    def start(self, total, unit="", description=""):
        self.total = total

    def advance(self, n=1):
        self.done += n

    def log(self, message):
        self.messages.append(message)

    def finish(self):
        self.finished = True


def pytest_addoption(parser):
    parser.addoption("--trials", type=int, default=None,
                     help="tests/test_faults.py: kill -9 a run this many times before it may finish (default 5 for "
                          "the sharded stages and train, 20 for cat, head, eval and report)")
