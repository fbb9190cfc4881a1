"""filter: the funnel (documents and characters left after each step) and the top rejection reasons,
all from the filter manifest's counts (data/filter.py's `funnel_rows`, the table the stage prints)."""

from __future__ import annotations

from llmctl.data.filter import funnel_rows
from llmctl.report import charts
from llmctl.report.collect import Artifact, Lineage
from llmctl.report.page import Figure, Section, Table
from llmctl.report.sections.common import Images, per_artifact, per_second

TOP_REASONS = 10


def sections(lineage: Lineage, images: Images) -> list[Section]:
    return per_artifact(lineage.stage("filter"), "filter", images, _fill)


def _fill(a: Artifact, s: Section, images: Images) -> None:
    m, c = a.manifest, a.manifest.counts
    docs_in, chars_in = c.get("in", 0), c.get("chars_in", 0)
    s.facts = {
        "documents in": docs_in,
        "documents kept": c.get("kept", c.get("out")),
        "characters in": chars_in,
        "characters kept": c.get("chars_kept"),
        "steps": len(m.config.get("step_labels", [])),
        "errors": c.get("errors"),
        "wall seconds": m.wall_seconds,
        "documents / s": per_second(docs_in, m.wall_seconds),
    }
    rows = funnel_rows(m)
    table = [["input", docs_in, 100.0, chars_in, 100.0]]
    for r in rows:
        table.append([r["step"], r["docs_left"], round(100 * r["docs_left"] / docs_in, 2) if docs_in else None,
                      r["chars_left"], round(100 * r["chars_left"] / chars_in, 2) if chars_in else None])
    s.tables.append(Table(["after step", "documents", "% documents", "characters", "% characters"], table,
                          "the funnel: what is left after each step (characters include lines a step rewrote away)"))
    if rows and docs_in and chars_in:
        path = charts.funnel(images.folder(s.key) / "funnel.png", [t[0] for t in table], [t[2] for t in table], [t[4] for t in table])
        s.figures.append(Figure(images.rel(path), "documents and characters left after each filter step"))
    reasons = sorted((c.get("rejected") or {}).items(), key=lambda kv: -kv[1])
    if reasons:
        total = sum(v for _, v in reasons)
        s.tables.append(Table(["reason", "documents", "share of rejected"], [[k, v, round(v / total, 4)] for k, v in reasons[:TOP_REASONS]],
                              f"top rejection reasons (step.statistic; {len(reasons)} in all)"))
        top = reasons[:TOP_REASONS]
        path = charts.bars(images.folder(s.key) / "reasons.png", [k for k, _ in top], [v for _, v in top], "rejections by reason", "documents")
        s.figures.append(Figure(images.rel(path), "top rejection reasons"))
