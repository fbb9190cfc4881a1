"""`llmctl inspect` and `llmctl lineage`: what an artifact is, and where it came from."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from llmctl.bounds import check_flags
from llmctl.cli import render
from llmctl.cli.options import Json, Quiet, flags
from llmctl.cli.console import print_json
from llmctl.errors import UsageError

app = typer.Typer()


@app.command()
def inspect(
    path: Annotated[str, typer.Argument(help="An artifact directory, Parquet/JSONL docs, WARC file(s), or '-'.")],
    samples: Annotated[int, typer.Option("--samples", "-n", help="Sample rows to show.")] = 3,
    doc_id: Annotated[Optional[str], typer.Option("--id", help="Show this document whole, with the spans dedup cut from it (removed_spans) and their text where it is at hand.")] = None,
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """Show what PATH is: kind, schema, counts, a few sample rows (any artifact, docs or WARC)."""
    from llmctl.data.inspect import document, inspect_path

    _, as_json = flags(quiet, json_)
    check_flags("inspect", samples=samples)
    if doc_id is not None:
        doc = document(path, doc_id)
        print_json(doc) if as_json else render.document_view(doc)
        return
    info = inspect_path(path, samples=samples)
    if as_json:
        print_json(info)
    else:
        render.inspect_view(info)


@app.command()
def lineage(
    path: Annotated[str, typer.Argument(help="An artifact directory with a manifest.json.")],
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """Show the chain of manifests from PATH back to the raw inputs (and whether any changed)."""
    from llmctl.artifacts.manifest import lineage as build

    _, as_json = flags(quiet, json_)
    if not Path(path, "manifest.json").is_file():
        raise UsageError(f"{path} is not an artifact (no manifest.json)")
    node = build(path)
    if as_json:
        print_json(node)
    else:
        render.lineage_tree(node)
