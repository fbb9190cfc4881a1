"""`llmctl annotate`: an LLM scores each document with a rubric prompt (eval/annotate.py). It
parses its flags, builds its config (docs/design.md §3), calls the stage and renders the summary."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from llmctl.cli import render
from llmctl.cli.console import ConsoleProgress
from llmctl.cli.options import Config, DocsIn, Json, Out, Quiet, RunFlags, flags, run_control

app = typer.Typer()


@app.command()
@run_control()
def annotate(
    inputs: DocsIn,
    output: Out = ...,
    config: Config = None,
    prompt: Annotated[Optional[str], typer.Option("--prompt", help="The rubric: edu (built in: educational value, additive 0-5, FineWeb-Edu style) or a template FILE with {text} where the document goes; the model must end its answer with a line '<label> score: N'.")] = None,
    endpoint: Annotated[Optional[str], typer.Option("--endpoint", help="An OpenAI-compatible server's URL (http://HOST:PORT/v1), asked through chat completions at temperature 0; an API key, if it wants one, from $LLMCTL_API_KEY.")] = None,
    model: Annotated[Optional[str], typer.Option("--model", help="With --endpoint: the model to ask (default: the one the server lists).")] = None,
    checkpoint: Annotated[Optional[str], typer.Option("--checkpoint", help="Or a local checkpoint (run dir, step dir, `llmctl import` output), run greedy through llmctl's engine.")] = None,
    max_chars: Annotated[Optional[int], typer.Option("--max-chars", help="Cut a document to this many characters in the prompt (default 4000; 0: never).")] = None,
    max_tokens: Annotated[Optional[int], typer.Option("--max-tokens", help="Tokens of an answer at most (default 256).")] = None,
    min_score: Annotated[Optional[int], typer.Option("--min-score", help="With a prompt FILE: the lowest score its line may give (default 0).")] = None,
    max_score: Annotated[Optional[int], typer.Option("--max-score", help="With a prompt FILE: the highest score (default 5).")] = None,
    annotation: Annotated[Optional[bool], typer.Option("--annotation/--no-annotation", help="Keep the model's raw answer in an `annotation` column (default: keep).")] = None,
    concurrency: Annotated[Optional[int], typer.Option("--concurrency", help="With --endpoint: requests in flight at most, per worker (default 8).")] = None,
    retries: Annotated[Optional[int], typer.Option("--retries", help="With --endpoint: tries after the first on a connection error, timeout or 5xx (default 5).")] = None,
    backoff: Annotated[Optional[float], typer.Option("--backoff", help="With --endpoint: seconds before the first retry, doubling each time (default 1).")] = None,
    timeout: Annotated[Optional[float], typer.Option("--timeout", help="With --endpoint: seconds a request may take (default 300).")] = None,
    batch_size: Annotated[Optional[int], typer.Option("--batch-size", help="With --checkpoint: prompts to a call of the engine (default 64).")] = None,
    weights: Annotated[Optional[str], typer.Option("--weights", help="With --checkpoint: auto (the EMA weights where there are some), ema or raw.")] = None,
    device: Annotated[Optional[str], typer.Option("--device", help="With --checkpoint: auto, cpu or cuda.")] = None,
    *,
    run: RunFlags,
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """Score each document with an LLM and a rubric prompt: columns `score` (null when the answer
    has no valid score line, or the request failed) and `annotation` (the answer).

    The answer is read strictly: its last line holding 'score:' must end in a whole number in
    range and nothing else. One worker by default: the endpoint's --concurrency (or the engine's
    batch) is where the parallelism is. A row the endpoint never answered (down, after --retries)
    leaves its shard unfinished, exit 1: run the same command again and only the rows without an
    answer are asked."""
    from llmctl.config import build_config
    from llmctl.eval.annotate import STAGE, AnnotateConfig, run_annotate

    quiet, as_json = flags(quiet, json_)
    cfg = build_config(
        AnnotateConfig,
        STAGE,
        config,
        {"prompt": prompt, "endpoint": endpoint, "model": model, "checkpoint": checkpoint, "max_chars": max_chars,
         "max_tokens": max_tokens, "min_score": min_score, "max_score": max_score, "keep_annotation": annotation,
         "concurrency": concurrency, "retries": retries, "backoff": backoff, "timeout": timeout, "batch_size": batch_size,
         "weights": weights, "device": device},
    )
    m = run_annotate(inputs, output, cfg, run.options(), ConsoleProgress(quiet))
    render.report(m, output, quiet, as_json)
