"""`llmctl filter`: the quality filter chain (its default command), `train-classifier` for a
fastText quality model, and `stats` for choosing thresholds."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from llmctl.bounds import check_flags
from llmctl.cli import render
from llmctl.cli.options import Config, DefaultCommandGroup, DocsIn, Json, Out, Overwrite, Quiet, RunFlags, flags, run_control
from llmctl.cli.console import ConsoleProgress, err, print_json
from llmctl.errors import UsageError

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


FASTTEXT_ONLY = ("dim", "bucket", "epoch", "lr", "word_ngrams", "label")


@filter_app.command("train-classifier")
def filter_train_classifier(
    inputs: Annotated[Optional[list[str]], typer.Argument(help="--regression: labelled docs (a numeric --labels column).", show_default=False)] = None,
    output: Annotated[str, typer.Option("--output", "-o", help="Output directory: model.bin (or head.json with --regression) + manifest.json.")] = ...,
    positive: Annotated[Optional[list[str]], typer.Option("--positive", help="fastText: high-quality reference docs (repeatable).")] = None,
    negative: Annotated[Optional[list[str]], typer.Option("--negative", help="fastText: random crawl docs (repeatable).")] = None,
    regression: Annotated[bool, typer.Option("--regression", help="FineWeb-Edu's classifier instead: a linear head on embeddings of DOCS, "
                                             "fitted to their scores (MSE), applied as int_score >= threshold.")] = False,
    labels: Annotated[Optional[str], typer.Option("--labels", help="--regression: the score column (default: score, what `llmctl annotate` writes).")] = None,
    embedder: Annotated[Optional[str], typer.Option("--embedder", help="--regression: minilm (default; its weights come with the embed extra), "
                                                    "sentence-transformers:MODEL or llmctl:CKPT.")] = None,
    threshold: Annotated[Optional[int], typer.Option(help="--regression: keep int_score >= this (default 3, FineWeb-Edu's).")] = None,
    dim: Annotated[Optional[int], typer.Option(help="fastText: embedding size (default 256, DCLM's). The model is about (words + bucket) x dim x 4 bytes.")] = None,
    bucket: Annotated[Optional[int], typer.Option(help="fastText: hash buckets for word n-grams (default 2M, fastText's; smaller = smaller model).")] = None,
    epoch: Annotated[Optional[int], typer.Option(help="fastText: training epochs (default 3, DCLM's).")] = None,
    lr: Annotated[Optional[float], typer.Option(help="fastText: learning rate (default 0.1, DCLM's).")] = None,
    word_ngrams: Annotated[Optional[int], typer.Option("--word-ngrams", help="fastText: word n-gram length (default 2, DCLM's).")] = None,
    label: Annotated[Optional[str], typer.Option(help="fastText: the positive label's name (default hq).")] = None,
    holdout: Annotated[Optional[float], typer.Option(help="Share held out to measure the classifier (default 0.1; fastText: of each class).")] = None,
    seed: Annotated[Optional[int], typer.Option(help="Seed of the held-out split (and of fastText).")] = None,
    max_docs: Annotated[Optional[int], typer.Option(help="At most this many docs (fastText: per class), a seeded sample.")] = None,
    overwrite: Overwrite = False,
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """Train a quality classifier, with a held-out report in the manifest.

    fastText, the DCLM way: --positive (a high-quality reference set) against --negative (random crawl).

    With --regression, FineWeb-Edu's: DOCS scored 0-5 (by `llmctl annotate`, or any Parquet/JSONL with a score column) are embedded and a linear head is fitted to the scores; held out: MSE, Spearman, F1 at the threshold, confusion matrix.

    Either is applied by the filter's `classifier` step (`model = OUT`; stages/filter/edu.toml for a head)."""
    from llmctl.config import build_config

    quiet, as_json = flags(quiet, json_)
    check_flags("TrainRegressionConfig", threshold=threshold)  # its range first, whichever the mode
    given = dict(dim=dim, bucket=bucket, epoch=epoch, lr=lr, word_ngrams=word_ngrams, label=label)
    shared = dict(holdout=holdout, seed=seed, max_docs=max_docs, overwrite=overwrite)
    if regression:
        from llmctl.data.filters.edu_train import TrainRegressionConfig, train_regression
        from llmctl.model.embed import make_embedder

        wrong = [f"--{k.replace('_', '-')}" for k, v in given.items() if v is not None]
        wrong += ["--positive"] * bool(positive) + ["--negative"] * bool(negative)
        if wrong:
            raise UsageError(f"{wrong[0]} is for a fastText classifier, not --regression (which reads DOCS and their --labels)")
        cfg = build_config(TrainRegressionConfig, "filter train-classifier", None,
                           dict(labels=labels, embedder=embedder, threshold=threshold, **shared))
        m = train_regression(inputs or [], output, cfg, ConsoleProgress(quiet), embedder=make_embedder(cfg.embedder))
    else:
        from llmctl.data.filters.fasttext_train import TrainClassifierConfig, train_classifier

        wrong = [f for f, v in (("--labels", labels), ("--embedder", embedder), ("--threshold", threshold)) if v is not None]
        if inputs or wrong:
            what = wrong[0] if wrong else f"DOCS ({inputs[0]})"
            raise UsageError(f"{what} goes with --regression; a fastText classifier reads --positive and --negative")
        if not positive or not negative:
            raise UsageError("train-classifier needs --positive DOCS and --negative DOCS (or --regression DOCS)")
        cfg = build_config(TrainClassifierConfig, "filter train-classifier", None, {**given, **shared})
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
