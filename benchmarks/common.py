"""What every benchmark script here shares: where results go, and how the machine is named."""

from __future__ import annotations

import platform
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
HEAD = "# Benchmark results\n\nLatest figures of the scripts in this folder; see README.md for what they measure.\n"


def write_results(name: str, section: str) -> None:
    """Replace (or append) the `## name` section of RESULTS.md, keeping the others as they are.
    The file is read right before it is written: each script rewrites only its own section."""
    parts = (RESULTS.read_text() if RESULTS.exists() else HEAD).split("\n## ")
    new = section.removeprefix("## ").rstrip("\n") + "\n"
    i = next((i for i, p in enumerate(parts[1:], 1) if p.split("\n", 1)[0].strip() == name), None)
    parts = parts[:i] + [new] + parts[i + 1 :] if i else parts + [new]
    RESULTS.write_text("\n## ".join(p.rstrip("\n") + "\n" for p in parts))


def cpu_name() -> str:
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def pct(n: int, d: int, digits: int = 1) -> str:
    return f"{100 * n / d:.{digits}f}% ({n}/{d})" if d else "n/a"
