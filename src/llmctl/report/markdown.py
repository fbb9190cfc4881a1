"""report.md: the report as GitHub-flavoured Markdown (pipe tables, images linked relative to the
report folder)."""

from __future__ import annotations

from llmctl.report.page import Report, Section, Table, fmt


def cell(v) -> str:
    """A table cell: formatted, with what would break a pipe table or turn into HTML escaped."""
    text = fmt(v).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
    return text.replace("\r", "").replace("\n", "<br>")


def table(t: Table) -> list[str]:
    out = [f"*{cell(t.caption)}*", ""] if t.caption else []
    out.append("| " + " | ".join(cell(c) for c in t.columns) + " |")
    out.append("|" + "|".join(" ---: " if _numeric(t, i) else " --- " for i in range(len(t.columns))) + "|")
    out += ["| " + " | ".join(cell(v) for v in row) + " |" for row in t.rows]
    return out + [""]


def _numeric(t: Table, i: int) -> bool:
    values = [row[i] for row in t.rows if i < len(row) and row[i] is not None]
    return bool(values) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def section(s: Section) -> list[str]:
    out = [f'<a id="{s.key}"></a>', f"## {s.title}", "", "From " + ", ".join(f"`{p}`" for p in s.sources), ""]
    if s.facts:
        out += table(Table(["", ""], [[k, v] for k, v in s.facts.items()]))
    for f in s.figures:
        out += [f"![{cell(f.caption)}]({f.file})", ""]
    for t in s.tables:
        out += table(t)
    out += [f"> {cell(n)}" + "\n" for n in s.notes]
    return out


def render(r: Report) -> str:
    out = [f"# llmctl report: `{r.root}`", "", f"Written {r.created} by llmctl {r.llmctl_version}. "
           "Every number comes from the artifacts' own manifests and files; report.json has them all.", ""]
    out += [f"- [{s.title}](#{s.key})" for s in r.sections] + [""]
    for s in r.sections:
        out += section(s)
    return "\n".join(out).rstrip() + "\n"
