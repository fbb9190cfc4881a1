"""`llmctl filter`: the quality filter chain (its default command), `train-classifier` for a
fastText quality model, and `stats` for choosing thresholds."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from llmctl.bounds import check_flags
from llmctl.cli import render
from llmctl.cli.options import Config, DefaultCommandGroup, DocsIn, Json, Out, Overwrite, Quiet, RunFlags, flags, run_control
from llmctl.cli.console import ConsoleProgress, err, print_json

filter_app = typer.Typer(
    cls=DefaultCommandGroup,
    help="Keep the documents a pretraining corpus wants: an ordered chain of rule and classifier "
    "steps (default: the FineWeb chain), with a funnel of what each step removed.\n\n"
    "`llmctl filter DOCS -o OUT` runs it; see also `train-classifier` and `stats`.",
    no_args_is_help=True,
)


@filter_app.command("run")
@run_control()
def filter_run(
    inputs: DocsIn,
    output: Out = ...,
    config: Config = None,
    annotate_only: Annotated[Optional[bool], typer.Option("--annotate-only", help="Drop nothing: write every step's statistics as stats.* columns and the would-be reason.")] = None,
    keep_rejected: Annotated[Optional[bool], typer.Option("--keep-rejected", help="Write dropped documents to OUT/rejected/ with a reason column.")] = None,
    *,
    run: RunFlags,
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """Filter docs through the configured chain (stages/filter/fineweb.toml by default)."""
    from llmctl.config import build_config, preset
    from llmctl.data.filter import STAGE, FilterConfig, funnel_rows, run_filter

    quiet, as_json = flags(quiet, json_)
    named = preset(STAGE, config, fallback="fineweb")  # None: the built-in FineWeb chain
    cfg = build_config(FilterConfig, STAGE, named, {"annotate_only": annotate_only, "keep_rejected": keep_rejected})
    m = run_filter(inputs, output, cfg, run.options(), ConsoleProgress(quiet))
    render.report(m, output, quiet, as_json, hide=("funnel", "chars_in", "chars_kept"), rate_key="in")
    if not as_json and not quiet:
        render.funnel(m, funnel_rows(m))


@filter_app.command("train-classifier")
def filter_train_classifier(
    positive: Annotated[list[str], typer.Option("--positive", help="High-quality reference docs (repeatable).")],
    negative: Annotated[list[str], typer.Option("--negative", help="Random crawl docs (repeatable).")],
    output: Annotated[str, typer.Option("--output", "-o", help="Output directory: model.bin + manifest.json.")],
    dim: Annotated[int, typer.Option(min=1, help="Embedding size (DCLM: 256). The model is about (words + bucket) x dim x 4 bytes.")] = 256,
    bucket: Annotated[int, typer.Option(min=1, help="Hash buckets for word n-grams (fastText default 2M; smaller = smaller model).")] = 2_000_000,
    epoch: Annotated[int, typer.Option(min=1, help="Training epochs (DCLM: 3).")] = 3,
    lr: Annotated[float, typer.Option(help="Learning rate (DCLM: 0.1).")] = 0.1,
    word_ngrams: Annotated[int, typer.Option("--word-ngrams", min=1, help="Word n-gram length (DCLM: 2).")] = 2,
    label: Annotated[str, typer.Option(help="The positive label's name.")] = "hq",
    holdout: Annotated[float, typer.Option(help="Share of each class held out to measure precision/recall.")] = 0.1,
    seed: Annotated[int, typer.Option(help="Seed of the held-out split and of fastText.")] = 0,
    max_docs: Annotated[Optional[int], typer.Option(help="At most this many docs per class.")] = None,
    overwrite: Overwrite = False,
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """Train a fastText quality classifier the DCLM way, with held-out precision and recall.

    Positives: a high-quality reference set; negatives: random crawl."""
    from llmctl.config import build_config
    from llmctl.data.filters.classifier import TrainClassifierConfig, train_classifier

    quiet, as_json = flags(quiet, json_)
    cfg = build_config(TrainClassifierConfig, "filter train-classifier", None, dict(
        dim=dim, bucket=bucket, epoch=epoch, lr=lr, word_ngrams=word_ngrams, label=label, holdout=holdout, seed=seed,
        max_docs=max_docs, overwrite=overwrite))
    m = train_classifier(positive, negative, output, cfg, ConsoleProgress(quiet))
    render.report(m, output, quiet, as_json, rate_key="none")


@filter_app.command("stats")
def filter_stats(
    inputs: Annotated[list[str], typer.Argument(help="An artifact written by `llmctl filter --annotate-only`.")],
    output: Annotated[str, typer.Option("--output", "-o", help="Directory for the PNG histograms and summary.json.")],
    bins: Annotated[int, typer.Option(min=2, help="Histogram bins.")] = 50,
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """Histograms of every stats.* column, kept vs rejected, to choose thresholds."""
    from llmctl.data.filter_stats import write_histograms

    check_flags("filter stats", bins=bins)
    quiet, as_json = flags(quiet, json_)
    paths = write_histograms(inputs, output, bins=bins)
    if as_json:
        print_json({"output": output, "files": [str(p) for p in paths]})
    elif not quiet:
        err.print(f"wrote {len(paths)} histograms to {output}/")
