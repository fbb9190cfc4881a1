"""`llmctl tokenize`: encode docs into token shards (its default command), `train` a byte-level
BPE tokenizer, `report` on one."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from llmctl.cli import render
from llmctl.cli.options import DefaultCommandGroup, DocsIn, Json, Out, Overwrite, Quiet, RunFlags, flags, run_control
from llmctl.cli.console import ConsoleProgress, print_json

tokenize_app = typer.Typer(
    cls=DefaultCommandGroup,
    help="Byte-level BPE: `train` a tokenizer on docs, encode docs into token shards "
    "(`llmctl tokenize DOCS -o TOKENS --tokenizer TOK/tokenizer.json`), `report` on a tokenizer.",
    no_args_is_help=True,
)


@tokenize_app.command("run")
@run_control()
def tokenize_run(
    inputs: DocsIn,
    output: Out = ...,
    tokenizer: Annotated[str, typer.Option("--tokenizer", "-t", help="tokenizer.json (ours or any Hugging Face one), or a `tokenize train` output dir.")] = "",
    split: Annotated[Optional[str], typer.Option("--split", help="Keep only the train or val side of a seeded by-document split.")] = None,
    val_fraction: Annotated[float, typer.Option("--val-fraction", help="Share of documents in the val side (with --split).")] = 0.0,
    seed: Annotated[int, typer.Option(help="Seed of the split.")] = 0,
    keep_column: Annotated[Optional[list[str]], typer.Option("--keep-column", help="Record this docs column per document beside the tokens (repeatable; e.g. dup_cluster_size, which a train mixture can upsample by).")] = None,
    *,
    run: RunFlags,
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """Encode docs into token shards (uint16/uint32 .bin + .idx, EOS after every document)."""
    from llmctl.config import build_config
    from llmctl.data.tokenize import STAGE, TokenizeConfig, run_tokenize

    quiet, as_json = flags(quiet, json_)
    cfg = build_config(TokenizeConfig, STAGE, None, {"tokenizer": tokenizer, "split": split, "val_fraction": val_fraction, "seed": seed,
                                                       "keep_columns": keep_column or []})
    m = run_tokenize(inputs, output, cfg, run.options(), ConsoleProgress(quiet))
    render.report(m, output, quiet, as_json, rate_key="docs")


@tokenize_app.command("train")
def tokenize_train(
    inputs: Annotated[list[str], typer.Argument(help="Docs to train on: artifacts, Parquet/JSONL files or dirs, globs, or '-'.")],
    output: Annotated[str, typer.Option("--output", "-o", help="Output directory (tokenizer.json + manifest.json).")],
    vocab_size: Annotated[int, typer.Option("--vocab-size", "-v", help="Vocabulary size, special tokens included.")] = 8192,
    pattern: Annotated[str, typer.Option(help="Pre-tokenizer regex: cl100k (digit runs of 1-3) or gpt2.")] = "cl100k",
    max_chars: Annotated[int, typer.Option("--max-chars", help="Train on a seeded sample of at most this many characters.")] = 50_000_000,
    seed: Annotated[int, typer.Option(help="Seed of the training sample.")] = 0,
    overwrite: Overwrite = False,
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """Train a byte-level BPE tokenizer (Hugging Face tokenizers) with the special tokens reserved."""
    from llmctl.config import build_config
    from llmctl.data.tokenize import train_tokenizer
    from llmctl.tokenizer.bpe import TrainTokenizerConfig

    quiet, as_json = flags(quiet, json_)
    cfg = build_config(TrainTokenizerConfig, "tokenize train", None,
                       {"vocab_size": vocab_size, "pattern": pattern, "max_chars": max_chars, "seed": seed, "overwrite": overwrite})
    m = train_tokenizer(inputs, output, cfg, ConsoleProgress(quiet))
    render.report(m, output, quiet, as_json, rate_key="docs")


@tokenize_app.command("report")
def tokenize_report(
    tokenizer: Annotated[str, typer.Argument(help="tokenizer.json or a tokenizer directory.")],
    sample: Annotated[Optional[list[str]], typer.Option("--sample", help="Docs to measure on (bytes/chars per token, language premium).")] = None,
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """Bytes and characters per token, per-language premium, longest tokens, special tokens."""
    from llmctl.data.tokenize import report

    _, as_json = flags(quiet, json_)
    r = report(tokenizer, sample)
    if as_json:
        print_json(r)
    else:
        render.tokenizer_report(r)
