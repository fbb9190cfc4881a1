"""The `llmctl` command line: one thin command per stage. Commands parse flags and call a stage
function; everything they show goes to stderr, except the artifact itself (`-o -`), `inspect`
and `lineage` views, and `--json` summaries, which go to stdout.

Exit codes (DESIGN §3): 0 ok; 1 the run failed; 2 usage error (one line, no traceback).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.core import TyperGroup
from rich.tree import Tree

from llmctl import __version__
from llmctl.console import ConsoleProgress, err, flatten, print_json, table
from llmctl.errors import StageFailed, UsageError

app = typer.Typer(
    name="llmctl",
    help="From raw web crawl to a trained, evaluated, RL-tuned model: one command per stage.\n\n"
    "Stages read and write artifacts (directories with a manifest.json) or Arrow streams when a "
    "path is '-', so they chain in shell pipes and Makefiles.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@dataclasses.dataclass
class Globals:
    quiet: bool = False
    json: bool = False


G = Globals()


def _version(value: bool) -> None:
    if value:
        typer.echo(f"llmctl {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar, no summary, no log lines.")] = False,
    json_: Annotated[bool, typer.Option("--json", help="Print a machine-readable summary (JSON) on stdout.")] = False,
    version: Annotated[Optional[bool], typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit.")] = None,
) -> None:
    G.quiet, G.json = quiet, json_


# Options that every command also accepts after its name (`llmctl cat a -o b --quiet`).
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar, no summary, no log lines.")]
Json = Annotated[bool, typer.Option("--json", help="Print a machine-readable summary (JSON) on stdout.")]
Out = Annotated[str, typer.Option("--output", "-o", help="Output artifact directory, or '-' for an Arrow stream on stdout.")]
Overwrite = Annotated[bool, typer.Option("--overwrite", help="Replace OUT if it exists instead of resuming into it.")]
DocsIn = Annotated[list[str], typer.Argument(help="Docs inputs: artifacts, Parquet/JSONL files or dirs, globs, or '-'.")]


def _flags(quiet: bool, json_: bool) -> tuple[bool, bool]:
    return G.quiet or quiet, G.json or json_


def report(manifest, out: str, quiet: bool, as_json: bool, hide: tuple[str, ...] = (), rate_key: str = "out") -> None:
    """The end-of-command summary: a table for people (stderr) or JSON for programs.
    `hide` drops count keys another table shows (the filter's funnel)."""
    summary = {
        "stage": manifest.stage,
        "output": out,
        "counts": manifest.counts,
        "files": len(manifest.outputs),
        "wall_seconds": manifest.wall_seconds,
        "errors": manifest.errors[:20],
    }
    if as_json:
        print_json(summary, to_stderr=out == "-")
        return
    if quiet:
        return
    rows = flatten({k: v for k, v in manifest.counts.items() if k not in hide})
    if manifest.wall_seconds and manifest.counts.get(rate_key):
        rows.append(("docs/s", f"{manifest.counts[rate_key] / manifest.wall_seconds:,.1f}"))
    rows.append(("wall seconds", manifest.wall_seconds))
    rows.append(("output", out if out != "-" else "stdout (Arrow stream)"))
    err.print(table(f"llmctl {manifest.stage}", rows))


# ---------------------------------------------------------------------------------------------
# inspect / lineage


@app.command()
def inspect(
    path: Annotated[str, typer.Argument(help="An artifact directory, Parquet/JSONL docs, WARC file(s), or '-'.")],
    samples: Annotated[int, typer.Option("--samples", "-n", help="Sample rows to show.")] = 3,
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """Show what PATH is: kind, schema, counts, a few sample rows (any artifact, docs or WARC)."""
    from llmctl.inspection import inspect_path

    _, as_json = _flags(quiet, json_)
    info = inspect_path(path, samples=samples)
    if as_json:
        print_json(info)
        return
    from rich.console import Console

    out = Console(highlight=False)
    head = [(k, info[k]) for k in ("path", "kind", "stage", "created", "files", "rows", "bytes") if k in info]
    out.print(table("inspect", head))
    for key in ("counts", "records", "http_status", "content_types"):
        if info.get(key):
            out.print(table(key, flatten(info[key])))
    if info.get("schema"):
        out.print(table("schema", list(info["schema"].items()), headers=("column", "type")))
    for i, row in enumerate(info.get("samples", [])):
        out.print(table(f"sample {i}", [(k, v) for k, v in row.items()]))
    errors = info.get("errors") or []
    if errors:
        out.print(table("errors", [(e.get("file", e.get("shard", "")), e.get("offset", ""), e.get("error", e.get("message", ""))) for e in errors], headers=("where", "offset", "error")))


@app.command()
def lineage(
    path: Annotated[str, typer.Argument(help="An artifact directory with a manifest.json.")],
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """Show the chain of manifests from PATH back to the raw inputs (and whether any changed)."""
    from llmctl.artifacts.manifest import lineage as build

    _, as_json = _flags(quiet, json_)
    if not Path(path, "manifest.json").is_file():
        raise UsageError(f"{path} is not an artifact (no manifest.json)")
    node = build(path)
    if as_json:
        print_json(node)
        return

    def add(tree: Tree, n: dict) -> None:
        if "stage" in n:
            label = f"[bold]{n['kind']}[/bold] {n['path']}  ← llmctl {n['stage']} ({n.get('created', '')})"
            if n.get("changed"):
                label += "  [red]changed since[/red]"
            sub = tree.add(label)
            for c in n["inputs"]:
                add(sub, c)
        else:
            flag = " [red]changed[/red]" if n.get("changed") else " [red]missing[/red]" if n.get("missing") else ""
            sha = f" sha256:{n['sha256'][:12]}" if n.get("sha256") else ""
            tree.add(f"{n.get('kind', 'file')} {n.get('path')}{sha}{flag}")

    from rich.console import Console

    root_tree = Tree("lineage")
    add(root_tree, node)
    Console(highlight=False).print(root_tree)


# ---------------------------------------------------------------------------------------------
# cat / head


@app.command()
def cat(
    inputs: DocsIn,
    output: Out = ...,
    rows_per_part: Annotated[int, typer.Option(help="Rows per output Parquet part.")] = 1_000_000,
    overwrite: Overwrite = False,
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """Concatenate docs into one artifact or stream (columns are unioned, missing ones null)."""
    from llmctl.docs_ops import CatConfig, run_cat

    quiet, as_json = _flags(quiet, json_)
    m = run_cat(inputs, output, CatConfig(rows_per_part=rows_per_part, overwrite=overwrite), ConsoleProgress(quiet))
    report(m, output, quiet, as_json)


@app.command()
def head(
    input: Annotated[str, typer.Argument(help="Docs input (artifact, Parquet/JSONL, or '-').")],
    n: Annotated[int, typer.Option("-n", "--lines", help="Number of documents to keep.")] = 10,
    output: Out = ...,
    overwrite: Overwrite = False,
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """The first N documents of INPUT, as an artifact or stream (stops reading early)."""
    from llmctl.docs_ops import CatConfig, run_cat

    quiet, as_json = _flags(quiet, json_)
    m = run_cat([input], output, CatConfig(limit=n, overwrite=overwrite), ConsoleProgress(quiet))
    report(m, output, quiet, as_json)


# ---------------------------------------------------------------------------------------------
# stages

# The run-control flags every sharded stage takes (DESIGN §3).
Config = Annotated[Optional[str], typer.Option("--config", "-c", help="Stage config: a name under stages/<stage>/ or a .toml path. Flags override it.")]
Workers = Annotated[Optional[int], typer.Option("--workers", "-w", min=1, help="Worker processes (default: all cores).")]
ShardIndex = Annotated[int, typer.Option("--shard-index", min=0, help="Run only slice I of the work (Slurm arrays, indexed jobs).")]
NumShards = Annotated[int, typer.Option("--num-shards", min=1, help="Number of slices the work is cut into.")]
Strict = Annotated[bool, typer.Option("--strict", help="Fail (exit 1) on damaged input instead of skipping and counting it.")]


def _run_options(workers, shard_index, num_shards, overwrite, strict):
    from llmctl.runtime.stage import RunOptions

    if shard_index >= num_shards:
        raise UsageError(f"--shard-index {shard_index} must be below --num-shards {num_shards}")
    return RunOptions(workers=workers, shard_index=shard_index, num_shards=num_shards, overwrite=overwrite, strict=strict)


def _named_exists(stage: str, name: str) -> bool:
    from llmctl.config import stages_dirs

    return any((d / stage / f"{name}.toml").is_file() for d in stages_dirs())


def _default_config(stage: str, given: str | None) -> str | None:
    """An explicit --config, else the stage's shipped `default` config when it can be found."""
    if given:
        return given
    return "default" if _named_exists(stage, "default") else None


@app.command("crawl-extract")
def crawl_extract(
    inputs: Annotated[list[str], typer.Argument(help="WARC/ARC files (.warc, .warc.gz), globs, directories, or @paths.txt (one path a line, like warc.paths).")],
    output: Out = ...,
    config: Config = None,
    fast: Annotated[Optional[bool], typer.Option("--fast/--precise", help="trafilatura fast mode instead of the FineWeb settings (favour precision).")] = None,
    languages: Annotated[Optional[str], typer.Option("--languages", "-l", help="Keep only these languages, comma-separated (e.g. en,de). Default: keep all, score only.")] = None,
    lang_threshold: Annotated[Optional[float], typer.Option("--lang-threshold", help="Minimum lid.176 probability of the top language (FineWeb: 0.65).")] = None,
    langid_model: Annotated[Optional[str], typer.Option("--langid-model", help="fastText language-ID model (lid.176.bin or .ftz).")] = None,
    max_bytes: Annotated[Optional[int], typer.Option("--max-bytes", min=1, help="Skip HTTP payloads larger than this (too_large).")] = None,
    timeout: Annotated[Optional[float], typer.Option("--timeout", help="Seconds allowed per page; slower pages are skipped as timeout (0: no limit).")] = None,
    blocklist: Annotated[Optional[list[str]], typer.Option("--blocklist", help="Domain blocklist file (one domain a line); repeatable; replaces the config's.")] = None,
    banned_words: Annotated[Optional[list[str]], typer.Option("--banned-words", help="File of words banned in URLs; repeatable; replaces the config's.")] = None,
    keep_rejected: Annotated[Optional[bool], typer.Option("--keep-rejected", help="Write documents rejected by language to OUT/rejected/ with a reason column.")] = None,
    workers: Workers = None,
    shard_index: ShardIndex = 0,
    num_shards: NumShards = 1,
    overwrite: Overwrite = False,
    strict: Strict = False,
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """Turn Common Crawl WARC files into documents (trafilatura text, lid.176 language).

    Selects HTML 200 responses, filters URLs, extracts the main text with trafilatura and
    identifies the language with fastText lid.176. Every skipped record is counted by reason in
    the manifest and the summary."""
    from llmctl.config import build_config
    from llmctl.data.extract import STAGE, ExtractConfig, run_crawl_extract

    quiet, as_json = _flags(quiet, json_)
    cfg = build_config(
        ExtractConfig,
        STAGE,
        _default_config(STAGE, config),
        {
            "fast": fast,
            "languages": languages,
            "lang_threshold": lang_threshold,
            "langid_model": langid_model,
            "max_bytes": max_bytes,
            "timeout": timeout,
            "blocklist_files": blocklist,
            "banned_words_files": banned_words,
            "keep_rejected": keep_rejected,
        },
    )
    opts = _run_options(workers, shard_index, num_shards, overwrite, strict)
    m = run_crawl_extract(inputs, output, cfg, opts, ConsoleProgress(quiet))
    report(m, output, quiet, as_json)


# ---------------------------------------------------------------------------------------------
# filter: a group whose default command is the filter itself (`llmctl filter DOCS -o OUT`),
# beside `llmctl filter train-classifier` and `llmctl filter stats`.


class _DefaultCommandGroup(TyperGroup):
    """Runs the `run` subcommand when the first argument names no subcommand."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


filter_app = typer.Typer(
    cls=_DefaultCommandGroup,
    help="Keep the documents a pretraining corpus wants: an ordered chain of rule and classifier "
    "steps (default: the FineWeb chain), with a funnel of what each step removed.\n\n"
    "`llmctl filter DOCS -o OUT` runs it; see also `train-classifier` and `stats`.",
    no_args_is_help=True,
)
app.add_typer(filter_app, name="filter")


def report_funnel(m, quiet: bool) -> None:
    from llmctl.data.filter import funnel_rows

    if quiet:
        return
    c = m.counts
    rows = [("input", f"{c.get('in', 0):,}", "", f"{c.get('chars_in', 0):,}", "")]
    for r in funnel_rows(m):
        rows.append((r["step"], f"-{r['docs_removed']:,}", f"{r['docs_removed_pct']:.1f}%", f"-{r['chars_removed']:,}", f"{r['chars_removed_pct']:.1f}%"))
    rows.append(("kept", f"{c.get('kept', 0):,}", f"{100 * c.get('kept', 0) / max(1, c.get('in', 0)):.1f}%", f"{c.get('chars_kept', 0):,}", f"{100 * c.get('chars_kept', 0) / max(1, c.get('chars_in', 0)):.1f}%"))
    err.print(table("funnel (share of the input)", rows, headers=("step", "docs", "% docs", "chars", "% chars")))


@filter_app.command("run")
def filter_run(
    inputs: DocsIn,
    output: Out = ...,
    config: Config = None,
    annotate_only: Annotated[Optional[bool], typer.Option("--annotate-only", help="Drop nothing: write every step's statistics as stats.* columns and the would-be reason.")] = None,
    keep_rejected: Annotated[Optional[bool], typer.Option("--keep-rejected", help="Write dropped documents to OUT/rejected/ with a reason column.")] = None,
    workers: Workers = None,
    shard_index: ShardIndex = 0,
    num_shards: NumShards = 1,
    overwrite: Overwrite = False,
    strict: Strict = False,
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """Filter docs through the configured chain (stages/filter/fineweb.toml by default)."""
    from llmctl.config import build_config
    from llmctl.data.filter import STAGE, FilterConfig, run_filter

    quiet, as_json = _flags(quiet, json_)
    named = config or ("fineweb" if _named_exists(STAGE, "fineweb") else None)  # else the built-in FineWeb chain
    cfg = build_config(FilterConfig, STAGE, named, {"annotate_only": annotate_only, "keep_rejected": keep_rejected})
    m = run_filter(inputs, output, cfg, _run_options(workers, shard_index, num_shards, overwrite, strict), ConsoleProgress(quiet))
    report(m, output, quiet, as_json, hide=("funnel", "chars_in", "chars_kept"), rate_key="in")
    if not as_json:
        report_funnel(m, quiet)


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
    from llmctl.data.filters.classifier import TrainClassifierConfig, train_classifier

    quiet, as_json = _flags(quiet, json_)
    cfg = TrainClassifierConfig(dim=dim, bucket=bucket, epoch=epoch, lr=lr, word_ngrams=word_ngrams, label=label, holdout=holdout, seed=seed, max_docs=max_docs, overwrite=overwrite)
    m = train_classifier(positive, negative, output, cfg, ConsoleProgress(quiet))
    report(m, output, quiet, as_json, rate_key="none")


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

    quiet, as_json = _flags(quiet, json_)
    paths = write_histograms(inputs, output, bins=bins)
    if as_json:
        print_json({"output": output, "files": [str(p) for p in paths]})
    elif not quiet:
        err.print(f"wrote {len(paths)} histograms to {output}/")


# ---------------------------------------------------------------------------------------------
# dedup


@app.command()
def dedup(
    inputs: DocsIn,
    output: Out = ...,
    config: Config = None,
    url: Annotated[Optional[bool], typer.Option("--url", help="Exact URL dedup after normalization (host case, port, fragment, tracking parameters).")] = None,
    exact: Annotated[Optional[bool], typer.Option("--exact", help="Exact dedup on a hash of the normalized text.")] = None,
    lines: Annotated[Optional[bool], typer.Option("--lines", help="Drop lines seen more than --max-line-count times across the corpus (Llama 3).")] = None,
    minhash: Annotated[Optional[bool], typer.Option("--minhash", help="MinHash LSH near-duplicate dedup on word n-grams.")] = None,
    ngram: Annotated[Optional[int], typer.Option("--ngram", min=1, help="Words per shingle (default 5).")] = None,
    bands: Annotated[Optional[int], typer.Option("--bands", min=1, help="LSH bands (default 14; FineWeb 14 x 8).")] = None,
    rows: Annotated[Optional[int], typer.Option("--rows", min=1, help="Rows per band (default 8).")] = None,
    max_line_count: Annotated[Optional[int], typer.Option("--max-line-count", min=1, help="With --lines: keep a line seen at most this many times (default 6).")] = None,
    keep: Annotated[Optional[str], typer.Option("--keep", help="Survivor of a cluster: first | earliest (by date) | max:COLUMN (e.g. max:quality_score).")] = None,
    partitions: Annotated[Optional[int], typer.Option("--partitions", min=1, help="Split each key family into this many hash partitions (less memory per task).")] = None,
    keep_rejected: Annotated[Optional[bool], typer.Option("--keep-rejected", help="Write removed rows to OUT/rejected/ with reason and dup_of (the survivor's id).")] = None,
    plot: Annotated[Optional[str], typer.Option("--plot", help="Write the S-curve and cluster-size PNGs into this directory.")] = None,
    keep_work: Annotated[Optional[bool], typer.Option("--keep-work", help="Keep OUT/_work (signatures, pairs, clusters) after success.")] = None,
    workers: Workers = None,
    overwrite: Overwrite = False,
    strict: Strict = False,
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """Remove duplicates: URL, exact text, frequent lines, MinHash near-duplicates.

    Kept rows get dup_cluster_id (the survivor's id) and dup_cluster_size."""
    from llmctl.config import build_config
    from llmctl.data.dedup.stage import STAGE, DedupConfig, run_dedup

    quiet, as_json = _flags(quiet, json_)
    cfg = build_config(
        DedupConfig,
        STAGE,
        config,
        {"url": url, "exact": exact, "lines": lines, "minhash": minhash, "ngram": ngram, "bands": bands, "rows": rows, "max_line_count": max_line_count, "keep": keep, "partitions": partitions, "keep_rejected": keep_rejected, "keep_work": keep_work},
    )
    m = run_dedup(inputs, output, cfg, _run_options(workers, 0, 1, overwrite, strict), ConsoleProgress(quiet))
    report(m, output, quiet, as_json, hide=("s_curve", "clusters"), rate_key="in")
    if plot:
        from llmctl.data.dedup.plots import write_plots

        write_plots(m.counts, cfg.bands, cfg.rows, plot)
    if not as_json and not quiet and "s_curve" in m.counts:
        sc = m.counts["s_curve"]
        err.print(table(f"MinHash S-curve ({sc['bands']} bands x {sc['rows']} rows, threshold ~{sc['threshold']})", [(f"J = {j}", f"{p:.4f}") for j, p in sc["p_flag"].items()], headers=("similarity", "P(flagged)")))
    if not as_json and not quiet and m.counts.get("clusters"):
        err.print(table("clusters by size", list(m.counts["clusters"].items()), headers=("size", "clusters")))


# ---------------------------------------------------------------------------------------------
# tokenize: `llmctl tokenize DOCS -o TOKENS --tokenizer TOK` beside `train` and `report`

tokenize_app = typer.Typer(
    cls=_DefaultCommandGroup,
    help="Byte-level BPE: `train` a tokenizer on docs, encode docs into token shards "
    "(`llmctl tokenize DOCS -o TOKENS --tokenizer TOK/tokenizer.json`), `report` on a tokenizer.",
    no_args_is_help=True,
)
app.add_typer(tokenize_app, name="tokenize")


@tokenize_app.command("run")
def tokenize_run(
    inputs: Annotated[list[str], typer.Argument(help="Docs inputs: artifacts, Parquet/JSONL files or dirs, globs.")],
    output: Out = ...,
    tokenizer: Annotated[str, typer.Option("--tokenizer", "-t", help="tokenizer.json (ours or any Hugging Face one), or a `tokenize train` output dir.")] = "",
    split: Annotated[Optional[str], typer.Option("--split", help="Keep only the train or val side of a seeded by-document split.")] = None,
    val_fraction: Annotated[float, typer.Option("--val-fraction", help="Share of documents in the val side (with --split).")] = 0.0,
    seed: Annotated[int, typer.Option(help="Seed of the split.")] = 0,
    workers: Workers = None,
    shard_index: ShardIndex = 0,
    num_shards: NumShards = 1,
    overwrite: Overwrite = False,
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """Encode docs into token shards (uint16/uint32 .bin + .idx, EOS after every document)."""
    from llmctl.data.tokenize import TokenizeConfig, run_tokenize

    quiet, as_json = _flags(quiet, json_)
    cfg = TokenizeConfig(tokenizer=tokenizer, split=split, val_fraction=val_fraction, seed=seed)
    m = run_tokenize(inputs, output, cfg, _run_options(workers, shard_index, num_shards, overwrite, False), ConsoleProgress(quiet))
    report(m, output, quiet, as_json, rate_key="docs")


@tokenize_app.command("train")
def tokenize_train(
    inputs: Annotated[list[str], typer.Argument(help="Docs to train on.")],
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
    from llmctl.data.tokenize import train_tokenizer
    from llmctl.data.tokenizer import TrainTokenizerConfig

    quiet, as_json = _flags(quiet, json_)
    cfg = TrainTokenizerConfig(vocab_size=vocab_size, pattern=pattern, max_chars=max_chars, seed=seed, overwrite=overwrite)
    m = train_tokenizer(inputs, output, cfg, ConsoleProgress(quiet))
    report(m, output, quiet, as_json, rate_key="docs")


@tokenize_app.command("report")
def tokenize_report(
    tokenizer: Annotated[str, typer.Argument(help="tokenizer.json or a tokenizer directory.")],
    sample: Annotated[Optional[list[str]], typer.Option("--sample", help="Docs to measure on (bytes/chars per token, language premium).")] = None,
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """Bytes and characters per token, per-language premium, longest tokens, special tokens."""
    from rich.console import Console

    from llmctl.data.tokenize import report as tok_report

    _, as_json = _flags(quiet, json_)
    r = tok_report(tokenizer, sample)
    if as_json:
        print_json(r)
        return
    out = Console(highlight=False)
    out.print(table("tokenizer", [(k, r[k]) for k in ("tokenizer", "vocab_size", "eos_id", "encoder", "sample_docs", "bytes_per_token", "chars_per_token", "vocab_used", "vocab_utilization") if k in r]))
    out.print(table("special tokens", sorted(r["special_tokens"].items(), key=lambda kv: kv[1]), headers=("token", "id")))
    if r.get("languages"):
        out.print(table("languages", [(k, v["docs"], v["tokens_per_char"], v["premium_vs_en"]) for k, v in r["languages"].items()], headers=("lang", "docs", "tokens/char", "premium vs en")))
    out.print(table("longest tokens", [(t["id"], repr(t["text"]), t["bytes"]) for t in r["longest_tokens"]], headers=("id", "token", "bytes")))


# ---------------------------------------------------------------------------------------------
# entry point


# typer vendors its own click; its parser errors all derive from the base of BadParameter.
_ClickUsageError = typer.BadParameter.__mro__[1]


def _fail(code: int, message: str) -> None:
    err.print(f"llmctl: error: {message}", markup=False, highlight=False, soft_wrap=True)
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    command = typer.main.get_command(app)
    try:
        command.main(args=argv, prog_name="llmctl", standalone_mode=False)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except _ClickUsageError as e:  # bad flags or arguments, found by the parser
        if type(e).__name__ == "NoArgsIsHelpError":
            err.print(e.format_message(), markup=False, highlight=False)
            sys.exit(2)
        _fail(2, (e.format_message().splitlines() or ["bad usage"])[0])
    except UsageError as e:
        _fail(2, str(e))
    except StageFailed as e:
        _fail(1, str(e))
    except BrokenPipeError:
        # The reader went away (`| head`): like a Unix tool, stop quietly with SIGPIPE's status.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(141)
    except (KeyboardInterrupt, typer.Abort):
        _fail(130, "interrupted")


if __name__ == "__main__":
    main()
