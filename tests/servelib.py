"""`llmctl serve` started by a test: tests/test_serve.py and tests/test_annotate.py share it."""

from __future__ import annotations

import functools
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx


class Server:
    """`llmctl serve PATH --port 0` as a process: its URL from the line it prints, an OpenAI client on it."""

    def __init__(self, path: Path, *args: str):
        self.proc = subprocess.Popen([sys.executable, "-m", "llmctl", "serve", str(path), "--port", "0", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "OMP_NUM_THREADS": "1"})
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [self.lines.put(x) for x in self.proc.stderr], daemon=True).start()
        self.err: list[str] = []
        while True:
            try:
                line = self.lines.get(timeout=120)
            except queue.Empty:
                self.kill()
                raise AssertionError("the server printed no 'serving' line in 120 s") from None
            self.err.append(line)
            if line.startswith("serving "):
                break
            if self.proc.poll() is not None:
                raise AssertionError(f"the server ended ({self.proc.returncode}): {''.join(self.err)}")
        self.name, self.url = line.split()[1], line.split()[-1]

    @functools.cached_property
    def client(self):
        """OpenAI's own client on the server (imported here: a test that only needs the URL does not need openai)."""
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0, timeout=120)

    def stop(self, sig=signal.SIGTERM) -> tuple[int, str]:
        """Send `sig`; the exit code and the rest of stderr."""
        try:
            self.proc.send_signal(sig)
            code = self.proc.wait(timeout=60)
        finally:
            self.kill()
        rest = []
        while not self.lines.empty():
            rest.append(self.lines.get())
        return code, "".join(self.err + rest)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def health(self) -> dict:
        return httpx.get(self.url + "/health").json()
