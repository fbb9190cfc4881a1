"""Progress reporting as a callback, so library code never prints (the CLI renders it with rich).

A stage calls `start` once with the total amount of work (in any unit: bytes, docs, shards),
`advance` as work completes, `log` for a line a person should see (a skipped damaged record, with
file and offset), and `finish` at the end. The default does nothing, which is what tests and
library callers get unless they pass their own.
"""

from __future__ import annotations


class Progress:
    def start(self, total: int | None, unit: str = "", description: str = "") -> None:
        """Begin a unit of work of `total` units (None when unknown)."""

    def advance(self, n: int = 1) -> None:
        """`n` more units are done."""

    def log(self, message: str) -> None:
        """A line for the person running the command (warnings, skipped damage)."""

    def finish(self) -> None:
        """The work announced by `start` is over."""
