"""`write_report(PATH, DIR)`: walk PATH's lineage, build the sections, write DIR/report.md,
DIR/index.html, DIR/report.json and the figures under DIR/img/."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from llmctl import __version__
from llmctl.artifacts.atomic import write_text
from llmctl.artifacts.lock import output_lock
from llmctl.artifacts.manifest import has_manifest
from llmctl.errors import UsageError
from llmctl.report import html, markdown
from llmctl.report.collect import collect
from llmctl.report.page import Report
from llmctl.report.sections import build_sections
from llmctl.report.sections.common import Images

FILES = ("report.md", "index.html", "report.json")


@dataclass
class Written:
    report: Report
    dir: Path
    markdown: Path
    html: Path
    json: Path
    figures: int


def write_report(path: str | Path, out: str | Path, evals: list[str] | None = None, discover: bool = True) -> Written:
    """The report of `path` in folder `out` (created; a previous report there is replaced, any other
    non-empty folder or an artifact is refused). `evals`: eval results to include by name; `discover`:
    also the evals beside the lineage's artifacts that measured one of its runs (report/collect.py)."""
    if str(out) == "-":
        raise UsageError("a report is a folder (report.md, index.html, report.json, img/); -o - names none")
    out = Path(out)
    lineage = collect(path, evals, discover)
    if has_manifest(out):
        raise UsageError(f"{out} is an artifact; give the report its own folder")
    if out.is_dir() and any(out.iterdir()) and not (out / "report.json").is_file():
        raise UsageError(f"{out} is not empty and holds no earlier report; give the report its own folder")
    out.mkdir(parents=True, exist_ok=True)
    with output_lock(out):
        shutil.rmtree(out / "img", ignore_errors=True)  # figures of an earlier report
        sections = build_sections(lineage, Images(out))
        report = Report(str(lineage.root), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), __version__, sections)
        paths = [out / name for name in FILES]
        write_text(paths[2], json.dumps(report.to_dict(), indent=1, ensure_ascii=False, allow_nan=False) + "\n")
        write_text(paths[0], markdown.render(report))
        write_text(paths[1], html.render(report, out))
    return Written(report, out, paths[0], paths[1], paths[2], sum(len(s.figures) for s in sections))
