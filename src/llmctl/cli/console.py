"""The terminal primitives the CLI draws with: the stderr console, the progress bar, tables,
JSON on stdout. What each command shows is built from these in `cli/render.py`.

Library code reports through `runtime.progress.Progress`; `ConsoleProgress` is the
implementation the CLI passes in. The bar is off when stderr is not a terminal or with --quiet;
log lines are shown unless --quiet.
"""

from __future__ import annotations

import json
import sys

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, MofNCompleteColumn, Progress as RichBar, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from llmctl.runtime.progress import Progress

err = Console(stderr=True, highlight=False)


class ConsoleProgress(Progress):
    def __init__(self, quiet: bool = False):
        self.quiet = quiet
        self.bar: RichBar | None = None
        self.task = None

    def start(self, total, unit="", description=""):
        if self.quiet or not err.is_terminal:
            return
        self.bar = RichBar(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            DownloadColumn() if unit == "bytes" else MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=err,
            transient=True,
        )
        self.bar.start()
        self.task = self.bar.add_task(description, total=total)

    def advance(self, n=1):
        if self.bar is not None:
            self.bar.advance(self.task, n)

    def log(self, message):
        if not self.quiet:
            err.print(f"[yellow]{message}[/yellow]", markup=True, highlight=False, soft_wrap=True)

    def finish(self):
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


def table(title: str, rows: list[tuple], headers: tuple = ("", ""), numeric: tuple[int, ...] = ()) -> Table:
    """A table titled on the left. A text cell too wide for the terminal folds onto more lines
    rather than ending in "…"; the `numeric` columns are right-aligned and never broken, so a
    table whose numbers would not fit 80 columns has to be laid out narrower by its caller
    (shorter headers, a legend, a second table)."""
    t = Table(title=title, title_justify="left", show_header=any(headers))
    for i, h in enumerate(headers):
        if i in numeric:
            t.add_column(str(h), justify="right", no_wrap=True)
        else:
            t.add_column(str(h), overflow="fold")
    for r in rows:
        t.add_row(*[str(x) for x in r])
    return t


def flatten(d: dict, prefix: str = "") -> list[tuple[str, object]]:
    """{'skipped': {'status': 3}} -> [('skipped.status', 3)] for one-level tables."""
    rows = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            rows.extend(flatten(v, key + "."))
        else:
            rows.append((key, v))
    return rows


def print_json(obj, to_stderr: bool = False) -> None:
    stream = sys.stderr if to_stderr else sys.stdout
    stream.write(json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n")
    stream.flush()

