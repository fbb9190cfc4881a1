"""`llmctl serve`: a model behind an OpenAI-compatible HTTP API (serve/)."""

from __future__ import annotations

import signal
from typing import Annotated, Optional

import typer

from llmctl.bounds import check_flags
from llmctl.errors import UsageError
from llmctl.cli import render
from llmctl.cli.options import Quiet, flags

app = typer.Typer()


@app.command()
def serve(
    checkpoint: Annotated[str, typer.Argument(help="A checkpoint (a step dir, or a run dir: its latest) or a Hugging Face folder written by `llmctl export`.")],
    host: Annotated[str, typer.Option("--host", help="Address to listen on (0.0.0.0: every interface).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port; 0 = a free one (the 'serving' line names it).")] = 8000,
    served_model_name: Annotated[Optional[str], typer.Option("--served-model-name", help="The model's name in the API (default: CHECKPOINT as typed).")] = None,
    weights: Annotated[str, typer.Option("--weights", help="auto (the EMA weights of a checkpoint trained with --ema-decay, else the raw ones), ema or raw.")] = "auto",
    device: Annotated[str, typer.Option("--device", help="auto, cpu or cuda.")] = "auto",
    max_rows: Annotated[int, typer.Option("--max-rows", help="Sequences decoding at once at most (vLLM's --max-num-seqs); more wait for a free row.")] = 256,
    kv_tokens: Annotated[int, typer.Option("--kv-tokens", help="Tokens the paged KV pool may hold (0: as many as a quarter of the memory holds, at most 262,144); past it the newest sequence waits and is recomputed.")] = 0,
    dtype: Annotated[str, typer.Option("--dtype", help="The weights while generating: auto (the model's own on CPU, bfloat16 on a GPU), float32 or bfloat16.")] = "auto",
    quiet: Quiet = False,
) -> None:
    """Serve a model with OpenAI's API (/v1/completions, /v1/chat/completions, /v1/models) until
    Ctrl-C or SIGTERM; concurrent requests share the engine's batch."""
    check_flags("serve", port=port, max_rows=max_rows, kv_tokens=kv_tokens)
    from llmctl.model.generate import GEN_DTYPES

    if dtype not in GEN_DTYPES:
        raise UsageError(f"--dtype must be one of {', '.join(GEN_DTYPES)}, got {dtype!r}")
    from llmctl.serve.server import ServeConfig, serve as run

    quiet, _ = flags(quiet, False)
    cfg = ServeConfig(host=host, port=port, name=served_model_name, weights=weights, device=device, max_rows=max_rows,
                      kv_tokens=kv_tokens, dtype=dtype)
    # soft_wrap: the line is never folded at the terminal's width (a URL cut in two is no URL)
    stopped = run(checkpoint, cfg, on_ready=lambda name, url: render.plain(f"serving {name} on {url}", soft_wrap=True),
                  log=(lambda message: None) if quiet else render.plain)
    if stopped is not None and not quiet:
        render.plain(f"stopped ({signal.Signals(stopped).name})")
