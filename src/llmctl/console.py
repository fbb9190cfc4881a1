"""How the CLI shows work to a person: a rich progress bar and summary tables, on stderr.

Library code reports through `runtime.progress.Progress`; this is the implementation the CLI
passes in. The bar is off when stderr is not a terminal or with --quiet; log lines are shown
unless --quiet.
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


def table(title: str, rows: list[tuple], headers: tuple = ("", "")) -> Table:
    t = Table(title=title, title_justify="left", show_header=any(headers))
    for h in headers:
        t.add_column(str(h))
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


class TrainStatus:
    """The live status line of `llmctl train`: a bar over steps with loss, lr, tokens/s and MFU.
    Without a terminal (logs, CI) it prints a line at every validation pass and every 10% instead."""

    def __init__(self, quiet: bool = False):
        self.quiet = quiet
        self.bar: RichBar | None = None
        self.task = None
        self.last_printed = 0

    def log(self, message: str) -> None:
        if not self.quiet:
            err.print(message, markup=False, highlight=False, soft_wrap=True)

    def _line(self, s) -> str:
        mfu = f"  mfu {100 * s.mfu:.1f}%" if s.mfu is not None else ""
        return f"loss {s.loss:.4f}  lr {s.lr:.2e}  {s.tokens_per_s:,.0f} tok/s{mfu}"

    def step(self, s) -> None:
        if self.quiet:
            return
        if err.is_terminal:
            if self.bar is None:
                self.bar = RichBar(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[line]}"),
                                   TimeElapsedColumn(), TimeRemainingColumn(), console=err, transient=True)
                self.bar.start()
                self.task = self.bar.add_task("train", total=s.total_steps, completed=s.step - 1, line="")
            self.bar.update(self.task, completed=s.step, line=self._line(s))
        elif s.val is None and s.step - self.last_printed < max(1, s.total_steps // 10):
            return
        else:
            self.last_printed = s.step
            err.print(f"step {s.step}/{s.total_steps}  {self._line(s)}", markup=False, highlight=False)
        if s.val is not None:
            bpb = f"  bits/byte {s.val['bits_per_byte']:.4f}" if "bits_per_byte" in s.val else ""
            message = f"step {s.step}: val loss {s.val['loss']:.4f}{bpb}"
            (self.bar.console.print if self.bar else err.print)(message, markup=False, highlight=False)

    def finish(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
