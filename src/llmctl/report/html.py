"""index.html: the report as one self-contained page — the figures inlined as base64 data: URIs,
the style in the page, no script and nothing fetched from the network."""

from __future__ import annotations

import base64
from html import escape
from pathlib import Path

from llmctl.report.page import Report, Section, Table, fmt

STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1180px; padding: 1.5em; color: #1b1f24; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #d0d7de; padding-bottom: .2em; margin-top: 2em; }
code, .src { font-family: ui-monospace, monospace; font-size: .92em; }
.src { color: #57606a; }
nav a { margin-right: 1em; }
table { border-collapse: collapse; margin: .6em 0 1.2em; }
th, td { border: 1px solid #d0d7de; padding: .25em .6em; vertical-align: top; }
th { background: #f6f8fa; text-align: left; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
td pre { margin: 0; white-space: pre-wrap; max-width: 40em; font-size: .9em; }
caption { caption-side: top; text-align: left; font-style: italic; color: #57606a; padding-bottom: .2em; }
figure { display: inline-block; margin: .4em 1em .8em 0; vertical-align: top; }
figure img { max-width: 560px; border: 1px solid #d0d7de; }
figcaption { color: #57606a; font-size: .9em; }
.row { display: flex; flex-wrap: wrap; gap: 0 1.2em; align-items: flex-start; }
.note { color: #57606a; border-left: 3px solid #d0d7de; padding-left: .6em; }
"""


def _cell(v) -> str:
    if isinstance(v, str) and "\n" in v:
        return f"<td><pre>{escape(v)}</pre></td>"
    numeric = isinstance(v, (int, float)) and not isinstance(v, bool)
    return f'<td class="n">{escape(fmt(v))}</td>' if numeric else f"<td>{escape(fmt(v))}</td>"


def table(t: Table, header: bool = True) -> str:
    head = "<tr>" + "".join(f"<th>{escape(c)}</th>" for c in t.columns) + "</tr>" if header else ""
    body = "".join("<tr>" + "".join(_cell(v) for v in row) + "</tr>" for row in t.rows)
    caption = f"<caption>{escape(t.caption)}</caption>" if t.caption else ""
    return f"<table>{caption}{head}{body}</table>"


def _image(root: Path, file: str) -> str:
    return "data:image/png;base64," + base64.b64encode((root / file).read_bytes()).decode("ascii")


def section(s: Section, root: Path) -> str:
    parts = [f'<section id="{escape(s.key)}"><h2>{escape(s.title)}</h2>',
             '<p class="src">from ' + ", ".join(escape(p) for p in s.sources) + "</p>"]
    row = [table(Table(["", ""], [[k, v] for k, v in s.facts.items()]), header=False)] if s.facts else []
    row += [f'<figure><img src="{_image(root, f.file)}" alt="{escape(f.caption)}"><figcaption>{escape(f.caption)}</figcaption></figure>'
            for f in s.figures]
    parts.append('<div class="row">' + "".join(row) + "</div>")
    parts += [table(t) for t in s.tables]
    parts += [f'<p class="note">{escape(n)}</p>' for n in s.notes]
    return "\n".join(parts) + "</section>"


def render(r: Report, root: Path) -> str:
    nav = "".join(f'<a href="#{escape(s.key)}">{escape(s.title)}</a> ' for s in r.sections)
    body = "\n".join(section(s, root) for s in r.sections)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>llmctl report: {escape(r.root)}</title>'
            f"<style>{STYLE}</style></head><body>\n<h1>llmctl report: <code>{escape(r.root)}</code></h1>\n"
            f"<p>Written {escape(r.created)} by llmctl {escape(r.llmctl_version)}. Every number comes from the artifacts' own "
            f"manifests and files; report.json has them all.</p>\n<nav>{nav}</nav>\n{body}\n</body></html>\n")
