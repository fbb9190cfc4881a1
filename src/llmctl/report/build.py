"""`write_report(PATH, DIR)`: walk PATH's lineage, build the sections, write DIR/report.md,
DIR/index.html, DIR/report.json and the figures under DIR/img/.

DIR is claimed first (artifacts/rerun.py: `.llmctl-run.json`, report's run identity), so a report
killed half-way is a report's folder, which the next report replaces; a report is a view of the
artifacts as they are now, so a re-run over a finished one writes it again (the evals found beside
the lineage may have changed)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from llmctl import __version__
from llmctl.artifacts.atomic import entries, is_temp, write_text
from llmctl.artifacts.lock import output_lock
from llmctl.artifacts.manifest import has_manifest, input_ref
from llmctl.artifacts.rerun import recorded_run, run_identity, start
from llmctl.errors import UsageError
from llmctl.report import html, markdown
from llmctl.report.collect import collect
from llmctl.report.page import Report
from llmctl.report.sections import build_sections
from llmctl.report.sections.common import Images

FILES = ("report.md", "index.html", "report.json")
OWN = (*FILES, "img")  # what a report writes in its folder: all that a new report there replaces


@dataclass
class Written:
    report: Report
    dir: Path
    markdown: Path
    html: Path
    json: Path
    figures: int


def write_report(path: str | Path, out: str | Path, evals: list[str] | None = None, discover: bool = True,
                 controls: list[str] | None = None) -> Written:
    """The report of `path` in folder `out` (created; a previous report there, finished or not, is
    replaced; any other non-empty folder or an artifact is refused). `evals`: eval results to
    include by name; `controls`: rl control runs to set beside the lineage's rl run; `discover`:
    also the evals beside the lineage's artifacts that measured one of its runs, and the control
    runs beside its rl runs (report/collect.py)."""
    if str(out) == "-":
        raise UsageError("a report is a folder (report.md, index.html, report.json, img/); -o - names none")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"output {out} exists and is not a directory; give the report its own folder")
    lineage = collect(path, evals, discover, controls)
    with output_lock(out):
        if has_manifest(out):
            raise UsageError(f"{out} is an artifact; give the report its own folder")
        recorded = recorded_run(out)
        if recorded is not None and recorded.get("stage") != "report":
            raise UsageError(f"{out} holds an unfinished llmctl {recorded.get('stage') or 'output'}; give the report its own folder")
        # a kill's hidden temporaries (the run file's own, first) are not someone's files
        if recorded is None and [e for e in entries(out) if not is_temp(e)] and not (out / "report.json").is_file():
            raise UsageError(f"{out} is not empty and holds no earlier report; give the report its own folder")
        ident = run_identity("report", {"evals": evals or [], "controls": controls or [], "discover": discover}, [input_ref(path)])
        start(out, ident, OWN, keep_others=True)  # an earlier report's files go, anything beside them stays
        sections = build_sections(lineage, Images(out))
        report = Report(str(lineage.root), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), __version__, sections)
        paths = [out / name for name in FILES]
        write_text(paths[2], json.dumps(report.to_dict(), indent=1, ensure_ascii=False, allow_nan=False) + "\n")
        write_text(paths[0], markdown.render(report))
        write_text(paths[1], html.render(report, out))
    return Written(report, out, paths[0], paths[1], paths[2], sum(len(s.figures) for s in sections))
