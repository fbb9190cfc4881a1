"""`llmctl report PATH -o DIR`: one page (Markdown, self-contained HTML, JSON) telling the whole
story of an artifact from its lineage's manifests."""

from __future__ import annotations

from typing import Annotated

import typer

from llmctl.cli import render
from llmctl.cli.options import Json, Quiet, flags
from llmctl.cli.console import print_json

app = typer.Typer()


@app.command()
def report(
    path: Annotated[str, typer.Argument(help="An artifact directory (an rl or train run, tokens, docs…).")],
    output: Annotated[str, typer.Option("--output", "-o", help="Report folder: report.md, index.html, report.json, img/.")],
    eval_: Annotated[list[str], typer.Option("--eval", help="Eval results to include (repeatable), beside those found next to the lineage's artifacts.")] = [],  # noqa: B006
    control: Annotated[list[str], typer.Option("--control", help="An rl control run (`llmctl rl --control …`) from the same start, set beside the lineage's rl run (repeatable), beside those found in its folder.")] = [],  # noqa: B006
    discover: Annotated[bool, typer.Option("--discover/--no-discover", help="Include the eval results found in the folders of the lineage's artifacts that measured one of its runs, and the rl control runs beside its rl run.")] = True,
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """One page for a model's whole story: every stage of PATH's lineage (crawl, filter, dedup, tokenize,
    train, rl) and the evals of its runs — for an rl run, what its gain is made of (format or content,
pass@k) beside its control runs — from the artifacts' own manifests; writes report.md, a
    self-contained index.html and report.json with every number shown. A report folder, finished or
    interrupted, is written again; any other non-empty folder is refused."""
    from llmctl.report.build import write_report

    _, as_json = flags(quiet, json_)
    written = write_report(path, output, eval_, discover, control)
    if as_json:
        print_json({"report": str(written.dir), "markdown": str(written.markdown), "html": str(written.html),
                    "json": str(written.json), "figures": written.figures,
                    "sections": [s.key for s in written.report.sections]})
    else:  # on stdout, like the lineage view: `xdg-open "$(llmctl report RUN -o R | head -1)"`
        render.stdout().print(f"{written.html}\n{written.markdown}", markup=False, soft_wrap=True)
