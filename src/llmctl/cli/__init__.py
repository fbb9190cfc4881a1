"""The `llmctl` command line: one thin command per stage. Commands parse flags and call a stage
function; everything they show goes to stderr, except the artifact itself (`-o -`), `inspect`
and `lineage` views, and `--json` summaries, which go to stdout.

Exit codes (DESIGN §3): 0 ok; 1 the run failed; 2 usage error (one line, no traceback).
"""

from __future__ import annotations

import dataclasses
import gc
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.core import TyperGroup
from rich.tree import Tree

from llmctl import __version__
from llmctl.console import ConsoleProgress, err, flatten, print_json, table
from llmctl.errors import Interrupted, StageFailed, UsageError

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
    from llmctl.data.inspect import inspect_path

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
    from llmctl.data.cat import CatConfig, run_cat

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
    from llmctl.data.cat import CatConfig, run_cat

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
Executor = Annotated[str, typer.Option("--executor", help="Where the shard tasks run: local (process pool) or ray (Ray tasks; needs the ray extra of llmctl).")]
RayAddress = Annotated[Optional[str], typer.Option("--ray-address", help="With --executor ray: the cluster (HOST:PORT, ray://HOST:10001, auto). Default: $RAY_ADDRESS, else a Ray started for this run.")]
CpusPerTask = Annotated[Optional[float], typer.Option("--cpus-per-task", help="With --executor ray: CPUs reserved for each shard task (default 1).")]
MemoryPerTask = Annotated[Optional[str], typer.Option("--memory-per-task", help="With --executor ray: memory reserved for each shard task, in bytes or with K/M/G/T (e.g. 4G).")]


def _bytes(value: str) -> int:
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    v = value.strip().upper().removesuffix("B").removesuffix("I")
    try:
        return int(float(v[:-1] if v[-1:] in units else v) * units[v[-1:] if v[-1:] in units else ""])
    except (ValueError, IndexError):
        raise UsageError(f"--memory-per-task takes bytes or a size like 512M or 4G, not {value!r}") from None


def _run_options(workers, shard_index, num_shards, overwrite, strict, executor="local", ray_address=None, cpus_per_task=None, memory_per_task=None):
    from llmctl.runtime.options import EXECUTORS, RunOptions

    if shard_index >= num_shards:
        raise UsageError(f"--shard-index {shard_index} must be below --num-shards {num_shards}")
    if executor not in EXECUTORS:
        raise UsageError(f"--executor must be one of {', '.join(EXECUTORS)}, not {executor!r}")
    ray_flags = [f for f, v in (("--ray-address", ray_address), ("--cpus-per-task", cpus_per_task), ("--memory-per-task", memory_per_task)) if v is not None]
    if ray_flags and executor != "ray":
        raise UsageError(f"{ray_flags[0]} needs --executor ray")
    if cpus_per_task is not None and cpus_per_task <= 0:
        raise UsageError("--cpus-per-task must be above 0")
    memory = _bytes(memory_per_task) if memory_per_task is not None else None
    if memory is not None and memory <= 0:
        raise UsageError("--memory-per-task must be above 0")
    return RunOptions(
        workers=workers, shard_index=shard_index, num_shards=num_shards, overwrite=overwrite, strict=strict,
        executor=executor, ray_address=ray_address, cpus_per_task=cpus_per_task or 1.0, memory_per_task=memory,
    )


def _executor(opts):
    """One executor scope around a whole stage (one Ray connection for all of dedup's phases)."""
    from llmctl.runtime.options import executor_scope

    return executor_scope(opts)


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
    executor: Executor = "local",
    ray_address: RayAddress = None,
    cpus_per_task: CpusPerTask = None,
    memory_per_task: MemoryPerTask = None,
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
    opts = _run_options(workers, shard_index, num_shards, overwrite, strict, executor, ray_address, cpus_per_task, memory_per_task)
    with _executor(opts):
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
    executor: Executor = "local",
    ray_address: RayAddress = None,
    cpus_per_task: CpusPerTask = None,
    memory_per_task: MemoryPerTask = None,
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """Filter docs through the configured chain (stages/filter/fineweb.toml by default)."""
    from llmctl.config import build_config
    from llmctl.data.filter import STAGE, FilterConfig, run_filter

    quiet, as_json = _flags(quiet, json_)
    named = config or ("fineweb" if _named_exists(STAGE, "fineweb") else None)  # else the built-in FineWeb chain
    cfg = build_config(FilterConfig, STAGE, named, {"annotate_only": annotate_only, "keep_rejected": keep_rejected})
    opts = _run_options(workers, shard_index, num_shards, overwrite, strict, executor, ray_address, cpus_per_task, memory_per_task)
    with _executor(opts):
        m = run_filter(inputs, output, cfg, opts, ConsoleProgress(quiet))
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
    executor: Executor = "local",
    ray_address: RayAddress = None,
    cpus_per_task: CpusPerTask = None,
    memory_per_task: MemoryPerTask = None,
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """Remove duplicates: URL, exact text, frequent lines, MinHash near-duplicates.

    Kept rows get dup_cluster_id (the survivor's id) and dup_cluster_size."""
    from llmctl.config import build_config
    from llmctl.data.dedup.run import STAGE, DedupConfig, run_dedup

    quiet, as_json = _flags(quiet, json_)
    cfg = build_config(
        DedupConfig,
        STAGE,
        config,
        {"url": url, "exact": exact, "lines": lines, "minhash": minhash, "ngram": ngram, "bands": bands, "rows": rows, "max_line_count": max_line_count, "keep": keep, "partitions": partitions, "keep_rejected": keep_rejected, "keep_work": keep_work},
    )
    opts = _run_options(workers, 0, 1, overwrite, strict, executor, ray_address, cpus_per_task, memory_per_task)
    with _executor(opts):  # every phase's tasks (sign, pairs, filter) go to the executor
        m = run_dedup(inputs, output, cfg, opts, ConsoleProgress(quiet))
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
    executor: Executor = "local",
    ray_address: RayAddress = None,
    cpus_per_task: CpusPerTask = None,
    memory_per_task: MemoryPerTask = None,
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """Encode docs into token shards (uint16/uint32 .bin + .idx, EOS after every document)."""
    from llmctl.data.tokenize import TokenizeConfig, run_tokenize

    quiet, as_json = _flags(quiet, json_)
    cfg = TokenizeConfig(tokenizer=tokenizer, split=split, val_fraction=val_fraction, seed=seed)
    opts = _run_options(workers, shard_index, num_shards, overwrite, False, executor, ray_address, cpus_per_task, memory_per_task)
    with _executor(opts):
        m = run_tokenize(inputs, output, cfg, opts, ConsoleProgress(quiet))
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
# train / export / plot


@app.command()
def train(
    tokens: Annotated[Optional[str], typer.Argument(help="Tokens artifact to train on (`llmctl tokenize` output); omitted with --sft.")] = None,
    output: Annotated[str, typer.Option("--output", "-o", help="Run directory: config.json, metrics.jsonl, checkpoints/.")] = "",
    config: Annotated[Optional[str], typer.Option("--config", "-c", help="Preset under stages/train/ (tiny, small, gpt2-124m, fineweb-0.5b) or a .toml with model and train tables.")] = "tiny",
    sft: Annotated[Optional[str], typer.Option("--sft", help="Supervised fine-tuning on conversations (JSONL/Parquet: messages, GSM8K question/answer, or prompt/answer): loss on assistant tokens only, packed rows.")] = None,
    init: Annotated[Optional[str], typer.Option("--init", help="With --sft: start from this checkpoint (its architecture and tokenizer).")] = None,
    tokenizer: Annotated[Optional[str], typer.Option("--tokenizer", help="With --sft and no --init: tokenizer.json of the fresh model (needs the chat tokens).")] = None,
    val_fraction: Annotated[float, typer.Option("--val-fraction", help="With --sft: share of conversations held out for validation loss (seeded).")] = 0.0,
    val: Annotated[Optional[str], typer.Option("--val", help="Held-out tokens artifact for validation loss and bits per byte.")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the run's latest checkpoint (same batches, same losses).")] = False,
    max_tokens: Annotated[Optional[int], typer.Option("--max-tokens", help="Length of the run in tokens; the schedule spans it.")] = None,
    max_steps: Annotated[Optional[int], typer.Option("--max-steps", help="Stop after this many steps (schedule unchanged).")] = None,
    lr: Annotated[Optional[float], typer.Option("--lr", help="Peak learning rate.")] = None,
    batch_tokens: Annotated[Optional[int], typer.Option("--batch-tokens", help="Global batch in tokens (all ranks).")] = None,
    micro_batch: Annotated[Optional[int], typer.Option("--micro-batch", help="Sequences per forward pass; gradient accumulation makes up the rest.")] = None,
    seq_len: Annotated[Optional[int], typer.Option("--seq-len", help="Tokens per training sequence.")] = None,
    schedule: Annotated[Optional[str], typer.Option("--schedule", help="wsd (warmup-stable-decay), cosine (to 10%), or linear (to zero).")] = None,
    dtype: Annotated[Optional[str], typer.Option("--dtype", help="float32, or bfloat16 autocast with fp32 master weights.")] = None,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Initial weights and data order.")] = None,
    eval_every: Annotated[Optional[int], typer.Option("--eval-every", help="Steps between validation passes.")] = None,
    checkpoint_every: Annotated[Optional[int], typer.Option("--checkpoint-every", help="Steps between checkpoints (one is always written at the end and on SIGTERM/SIGINT).")] = None,
    compile_: Annotated[Optional[bool], typer.Option("--compile/--no-compile", help="torch.compile the model.")] = None,
    fsdp: Annotated[Optional[bool], typer.Option("--fsdp/--no-fsdp", help="Shard parameters with FSDP2 (under torchrun).")] = None,
    peak_flops: Annotated[Optional[float], typer.Option("--peak-flops", help="Dense peak FLOP/s of one device for MFU (default: GPU table, or a matmul benchmark on CPU).")] = None,
    device: Annotated[Optional[str], typer.Option("--device", help="auto, cpu or cuda.")] = None,
    threads: Annotated[Optional[int], typer.Option("--threads", help="Torch CPU threads.")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override any preset key: model.n_layers=8, train.z_loss=1e-4 (repeatable).")] = None,
    overwrite: Overwrite = False,
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """Pretrain the Llama-style decoder on token shards, or fine-tune it on conversations with --sft;
    under torchrun the same command runs DDP."""
    from llmctl.console import TrainStatus
    from llmctl.train.trainer import load_run_config, run_train

    if not output:
        raise UsageError("train: missing option --output/-o")
    if (tokens is None) == (sft is None):
        raise UsageError("train: give a tokens artifact, or --sft CHATS (not both)")
    if sft is None and (init or tokenizer or val_fraction):
        raise UsageError("train: --init, --tokenizer and --val-fraction go with --sft")
    if init and any(x.strip().startswith("model.") for x in set_ or []):
        raise UsageError("train: --init fixes the architecture; --set model.* cannot change it")

    quiet, as_json = _flags(quiet, json_)
    flags = dict(max_tokens=max_tokens, max_steps=max_steps, lr=lr, batch_tokens=batch_tokens, micro_batch=micro_batch,
                 seq_len=seq_len, schedule=schedule, dtype=dtype, seed=seed, eval_every=eval_every,
                 checkpoint_every=checkpoint_every, compile=compile_, fsdp=fsdp, peak_flops=peak_flops,
                 device=device, threads=threads)
    model_cfg, cfg = load_run_config(config, flags, set_ or [])
    status = TrainStatus(quiet or int(os.environ.get("RANK", "0")) != 0)
    try:
        kw = dict(val=Path(val) if val else None, resume=resume, overwrite=overwrite, on_step=status.step, on_log=status.log)
        if sft is not None:
            from llmctl.train.sft import run_sft

            m = run_sft(Path(sft), Path(output), model_cfg, cfg, init=Path(init) if init else None,
                        tokenizer=Path(tokenizer) if tokenizer else None, val_fraction=val_fraction, **kw)
        else:
            m = run_train(Path(tokens), Path(output), model_cfg, cfg, **kw)
    finally:
        status.finish()
    if int(os.environ.get("RANK", "0")) == 0:
        report(m, output, quiet, as_json, rate_key="tokens")


@app.command()
def export(
    checkpoint: Annotated[str, typer.Argument(help="A checkpoint: step dir, checkpoints/ dir or run dir (its latest).")],
    output: Annotated[str, typer.Option("--output", "-o", help="Directory for the Hugging Face model.")],
    quiet: Quiet = False,
) -> None:
    """Write a Hugging Face LlamaForCausalLM directory (config.json, model.safetensors, tokenizer)."""
    from llmctl.model.export import export_hf

    out = export_hf(checkpoint, Path(output))
    if not _flags(quiet, False)[0]:
        err.print(f"exported to {out} (load with transformers.AutoModelForCausalLM.from_pretrained)", markup=False)


@app.command("import")
def import_cmd(
    hf_dir: Annotated[str, typer.Argument(help="A Hugging Face LlamaForCausalLM directory: config.json, model.safetensors (or sharded with its index), tokenizer.json.")],
    output: Annotated[str, typer.Option("--output", "-o", help="Checkpoint directory (step-000000/ and latest); eval, generate, rl and train --init read it.")],
    quiet: Quiet = False,
) -> None:
    """Bring in a released Llama-architecture model as an llmctl checkpoint (the inverse of export)."""
    from llmctl.model.export import import_hf

    path = import_hf(hf_dir, Path(output))
    if not _flags(quiet, False)[0]:
        err.print(f"imported to {path}", markup=False)


@app.command()
def plot(
    run: Annotated[str, typer.Argument(help="A run directory (or its metrics.jsonl).")],
    output: Annotated[str, typer.Option("--output", "-o", help="Directory for the PNG files.")],
    quiet: Quiet = False,
) -> None:
    """PNG curves of a run: train/val loss, bits per byte, lr, gradient norm, tokens/s; for an rl run, reward, accuracy (held-out with intervals), entropy, length."""
    from llmctl.train.plots import plot_run

    written = plot_run(Path(run), Path(output))
    if not _flags(quiet, False)[0]:
        err.print("wrote " + ", ".join(str(p) for p in written), markup=False, soft_wrap=True)


# ---------------------------------------------------------------------------------------------
# plan


@app.command()
def plan(
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Train preset: a name under stages/train/ (tiny, small, gpt2-124m, fineweb-0.5b) or a .toml with model and train tables; the train table gives the seq_len, micro_batch, batch_tokens and max_tokens (D) defaults.")] = None,
    hf_config: Annotated[Optional[str], typer.Option("--hf-config", help="A Hugging Face config.json instead: llama, mistral, qwen2/3, olmo2, gpt2, or MoE (mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek_v2/v3).")] = None,
    tokens: Annotated[Optional[float], typer.Option("--tokens", "-D", help="Training tokens D (e.g. 10e9). Default: the preset's max_tokens, else compute-optimal for the model.")] = None,
    flops: Annotated[Optional[float], typer.Option("--flops", "-C", help="Compute budget C in FLOPs instead of --tokens (D = C / FLOPs per token).")] = None,
    days: Annotated[Optional[float], typer.Option("--days", help="Budget as a reservation instead: C = GPUs x peak x MFU x days x ETTR.")] = None,
    gpus: Annotated[int, typer.Option("--gpus", "-p", help="Number of GPUs (all data parallel).")] = 1,
    gpu: Annotated[str, typer.Option("--gpu", help="Accelerator key from the hardware table (h100, h200, a100, b200, mi300x, l4, t4, ...; see --list-gpus).")] = "h100",
    mfu: Annotated[float, typer.Option("--mfu", help="Model FLOPs utilization against the dense BF16 peak (planning band 0.35-0.45).")] = 0.4,
    seq_len: Annotated[Optional[int], typer.Option("--seq-len", "-s", help="Sequence length (default: the preset's seq_len, else the model's context).")] = None,
    micro_batch: Annotated[Optional[int], typer.Option("--micro-batch", help="Sequences per GPU per forward pass, for activation memory (default: preset, else 1).")] = None,
    batch_tokens: Annotated[Optional[int], typer.Option("--batch-tokens", help="Global batch in tokens, for steps and step time (default: preset).")] = None,
    recipe: Annotated[str, typer.Option("--recipe", help="Model-state recipe: bf16-adamw (16 B/param), bf16-adamw-fp32grad (20), fp32-adamw (16), adamw-8bit (10), sgd-momentum (12), adafactor (8), deepseek-v3 (12).")] = "bf16-adamw",
    zero: Annotated[int, typer.Option("--zero", min=0, max=3, help="ZeRO stage 0-3: shard optimizer states (1), + gradients (2), + weights (3) over the GPUs.")] = 0,
    recompute: Annotated[str, typer.Option("--recompute", help="Activation recomputation: none, norms, swiglu (fused), selective (both) or full.")] = "none",
    fused_loss: Annotated[bool, typer.Option("--fused-loss", help="Fused cross-entropy: no materialized logits in the memory estimate.")] = False,
    price: Annotated[float, typer.Option("--price", help="Price per GPU-hour in dollars (default 2, illustrative).")] = 2.0,
    mttf: Annotated[Optional[float], typer.Option("--mttf", help="Job mean time to failure in hours (default: from --failure-rate and the node count).")] = None,
    failure_rate: Annotated[float, typer.Option("--failure-rate", help="Failures per 1,000 node-days when --mttf is not given (Llama 3: 3.79).")] = 3.79,
    gpus_per_node: Annotated[int, typer.Option("--gpus-per-node", help="GPUs per node, for the node count behind the MTTF.")] = 8,
    ckpt_write_s: Annotated[float, typer.Option("--ckpt-write-s", help="Seconds training stalls per checkpoint (delta in Young's interval; default 30, illustrative).")] = 30.0,
    restart_s: Annotated[float, typer.Option("--restart-s", help="Seconds lost per failure to restart (default 600, illustrative).")] = 600.0,
    ettr: Annotated[Optional[float], typer.Option("--ettr", help="Effective training time ratio for --days and wall time (default: estimated from MTTF and checkpoint cadence).")] = None,
    chinchilla_constants: Annotated[str, typer.Option("--chinchilla-constants", help="Scaling-law constants: besiroglu (refit, default), original (Chinchilla as printed) or unrounded.")] = "besiroglu",
    attention: Annotated[str, typer.Option("--attention", help="Attention FLOPs counting: causal ((s+1)/2, default), full (s, PaLM/nanoGPT) or none (6N).")] = "causal",
    count_input_embedding: Annotated[bool, typer.Option("--count-embedding", help="Count the input embedding table (and learned positions) in 6N; it does no matmul, so off by default.")] = False,
    gpu_hours: Annotated[Optional[float], typer.Option("--gpu-hours", help="GPU-hours a run reported: also print the utilization they imply.")] = None,
    hardware_file: Annotated[Optional[str], typer.Option("--hardware-file", help="TOML file of extra accelerators, same keys as the built-in table (llmctl/plan/hardware.toml).")] = None,
    list_gpus: Annotated[bool, typer.Option("--list-gpus", help="Print the hardware table and exit.")] = False,
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """The arithmetic of a run before you book the cluster: parameters, FLOPs, time, cost, memory
    per GPU, KV cache, Chinchilla sizing and checkpoint interval."""
    from rich.console import Console

    from llmctl.plan import load_hf_config, load_preset, load_table
    from llmctl.plan import plan as make_plan
    from llmctl.plan import render
    from llmctl.plan.planner import HARDWARE_HEADERS, hardware_rows

    _, as_json = _flags(quiet, json_)
    out = Console(highlight=False)
    if list_gpus:
        hw_table = load_table(hardware_file)
        if as_json:
            print_json({k: h.summary() for k, h in hw_table.items()})
        else:
            out.print(table("accelerators (dense peaks)", hardware_rows(hw_table), headers=HARDWARE_HEADERS))
        return
    if (model is None) == (hf_config is None):
        raise UsageError("give one of --model PRESET|TOML or --hf-config config.json")
    if model is not None:
        arch, train_cfg = load_preset(model)
    else:
        arch, train_cfg = load_hf_config(hf_config), {}
    r = make_plan(
        arch, train=train_cfg, tokens=tokens, flops=flops, days=days, gpus=gpus, gpu=gpu, hardware_file=hardware_file,
        mfu=mfu, seq_len=seq_len, micro_batch=micro_batch, batch_tokens=batch_tokens, recipe=recipe, zero=zero,
        price=price, mttf_hours=mttf, failure_rate=failure_rate, gpus_per_node=gpus_per_node, ckpt_write_s=ckpt_write_s,
        restart_s=restart_s, ettr=ettr, constants=chinchilla_constants, attention=attention,
        count_input_embedding=count_input_embedding, recompute=recompute, fused_loss=fused_loss, reported_gpu_hours=gpu_hours,
    )
    if as_json:
        print_json(r)
        return
    for t in render(r):
        out.print(t)


# ---------------------------------------------------------------------------------------------
# decontam


@app.command()
def decontam(
    inputs: DocsIn,
    against: Annotated[Optional[list[str]], typer.Option("--against", "-a", help="Eval task file to check against: JSONL(.gz) or Parquet (generic {context, choices}, {prompt, answer}, or native GSM8K, HellaSwag, ARC, PIQA, Winogrande, MMLU), a directory of them, a quoted glob, a comma-separated list, or NAME=PATH to name the task (default: the file name; gsm8k/test.jsonl -> gsm8k-test). Repeat for more.")] = None,
    output: Annotated[Optional[str], typer.Option("--output", "-o", help="Output docs artifact directory, or '-' for an Arrow stream on stdout. With --report-only: a directory for manifest.json + decontam.json, '-' to print the report JSON on stdout, or omitted.")] = None,
    config: Config = None,
    ngram: Annotated[Optional[int], typer.Option("--ngram", min=1, help="Words per n-gram (default 13, GPT-3; Llama 3 used 8). An eval item shorter than this is matched as one gram of all its words.")] = None,
    min_overlap: Annotated[Optional[int], typer.Option("--min-overlap", min=1, help="Distinct n-grams a document must share with one eval item to count as contaminated (default 1: any; capped at the item's own n-gram count).")] = None,
    flag: Annotated[Optional[bool], typer.Option("--flag", help="Keep every document and add columns contaminated (bool) and contaminated_tasks (list) instead of removing the contaminated ones.")] = None,
    report_only: Annotated[Optional[bool], typer.Option("--report-only", help="Write no documents: only the per-task report (printed; and OUT/decontam.json + manifest when -o DIR is given).")] = None,
    report_file: Annotated[Optional[str], typer.Option("--report", help="Also write the full JSON report here: per task figures plus every contaminated item (index, line, docs, coverage), for a clean-subset eval.")] = None,
    threshold: Annotated[Optional[float], typer.Option("--threshold", min=0.0, max=1.0, help="Mark a task over_threshold when more than this share of its items is contaminated (default 0.02, Tülu 3's rule for dropping a training set).")] = None,
    keep_rejected: Annotated[Optional[bool], typer.Option("--keep-rejected", help="Write removed documents to OUT/rejected/ with reason decontam.<task> and contaminated_tasks.")] = None,
    workers: Workers = None,
    shard_index: ShardIndex = 0,
    num_shards: NumShards = 1,
    overwrite: Overwrite = False,
    strict: Strict = False,
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """Find training documents that share a word n-gram with an eval item (GPT-3 13-gram overlap); remove them (or --flag them) and report, per task, how many eval items appear in the data.

    Words are lowercased with punctuation and accents stripped; digits are kept. The report (a table on stderr, decontam.json beside the output) gives per task: items, contaminated items and their share, training docs hit, n-grams matched, and the contaminated items themselves."""
    from llmctl.config import build_config
    from llmctl.data.decontam.run import REPORT_FILE, STAGE, DecontamConfig, run_decontam

    quiet, as_json = _flags(quiet, json_)
    if not against:
        raise UsageError("give the eval task files to check against with --against FILE (repeatable)")
    cfg = build_config(
        DecontamConfig,
        STAGE,
        config,
        {"ngram": ngram, "min_overlap": min_overlap, "mode": "flag" if flag else None, "report_only": report_only, "threshold": threshold, "keep_rejected": keep_rejected},
    )
    if output is None and not cfg.report_only:
        raise UsageError("give the output with -o OUT (or use --report-only)")
    m = run_decontam(inputs, output, cfg, against, _run_options(workers, shard_index, num_shards, overwrite, strict), ConsoleProgress(quiet), report_path=report_file)
    shown = output if output is not None else "none (--report-only)"
    report(m, shown, quiet, as_json, hide=("tasks",), rate_key="in")
    if as_json or quiet:
        return
    rows = [
        (name, f"{t['items']:,}", f"{t['items_contaminated']:,}", f"{100 * t['share']:.2f}%" + (" (over)" if t["over_threshold"] else ""), f"{t['docs_hit']:,}", f"{t['ngrams_matched']:,}/{t['ngrams']:,}", f"{t['short_items']:,}")
        for name, t in m.counts.get("tasks", {}).items()
    ]
    title = f"contamination per task ({cfg.ngram}-gram overlap, min overlap {cfg.min_overlap}; over: share > {cfg.threshold:g})"
    err.print(table(title, rows, headers=("task", "items", "in data", "share", "docs hit", "n-grams matched", "short items")))
    where = [p for p in (report_file, None if output in (None, "-") else str(Path(output) / REPORT_FILE)) if p]
    if where:
        err.print(f"contaminated items listed in {' and '.join(where)}")


# ---------------------------------------------------------------------------------------------
# eval / generate

eval_app = typer.Typer(
    cls=_DefaultCommandGroup,
    help="Measure a checkpoint: `llmctl eval CKPT --task KIND:PATH … -o RESULTS` (loss / bits per byte, "
    "multiple choice, generative), each score with n, standard error and a 95% interval; "
    "`compare A B` for the paired difference between two results.",
    no_args_is_help=True,
)
app.add_typer(eval_app, name="eval")


def _score_cell(v: dict) -> str:
    if "value" in v:
        return f"{v['value']:.4f}"
    return f"{v['mean']:.4f} ± {v['se']:.4f}  [{v['ci_low']:.4f}, {v['ci_high']:.4f}] ({v['interval']})"


@eval_app.command("run")
def eval_run(
    checkpoint: Annotated[str, typer.Argument(help="Checkpoint: a step dir, or a run dir (its latest).")],
    output: Annotated[str, typer.Option("--output", "-o", help="Results directory: results.json, samples.parquet, manifest.json.")],
    task: Annotated[list[str], typer.Option("--task", "-t", help="KIND:PATH; KIND is loss (tokens artifact), mc ({context, choices, label}), hellaswag, arc, piqa, winogrande, mmlu (native files), gsm8k, or gen ({prompt, answer}). Repeatable.")],
    shots: Annotated[int, typer.Option("--shots", help="Solved examples before each item, drawn with --seed from the same file (never the item).")] = 0,
    seed: Annotated[int, typer.Option("--seed", help="Few-shot draw and sampling seed.")] = 0,
    limit: Annotated[Optional[int], typer.Option("--limit", help="Only the first N items of each task.")] = None,
    norm: Annotated[str, typer.Option("--norm", help="Headline normalization for multiple choice: none, per_token, per_char (acc_norm), pmi. none, per_token and per_char are always reported.")] = "per_char",
    pmi: Annotated[bool, typer.Option("--pmi", help="Also report pmi (one more scoring pass: each choice after 'Answer:').")] = False,
    samples: Annotated[int, typer.Option("--samples", "-n", help="Generations per generative item (with --temperature > 0).")] = 1,
    temperature: Annotated[float, typer.Option("--temperature", help="0 = greedy.")] = 0.0,
    top_k: Annotated[int, typer.Option("--top-k", help="Keep the k most likely tokens (0 = off).")] = 0,
    top_p: Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass (1 = off).")] = 1.0,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Generation budget per answer; answers that hit it are counted as truncated.")] = 256,
    extract: Annotated[str, typer.Option("--extract", help="Answer extraction: after_hash (GSM8K '####'), last_number, boxed.")] = "after_hash",
    pass_k: Annotated[Optional[list[int]], typer.Option("--pass-k", help="Report unbiased pass@k (k ≤ --samples). Repeatable.")] = None,
    batch_tokens: Annotated[int, typer.Option("--batch-tokens", help="Tokens per scoring forward pass.")] = 4096,
    device: Annotated[str, typer.Option("--device", help="auto, cpu or cuda.")] = "auto",
    overwrite: Overwrite = False,
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """Score a checkpoint on tasks; every score comes with n, its standard error and a 95% interval."""
    from llmctl.eval.runner import EvalConfig, run_eval
    from llmctl.eval.tasks import parse_task

    quiet, as_json = _flags(quiet, json_)
    cfg = EvalConfig(shots=shots, seed=seed, limit=limit, norm=norm, pmi=pmi, samples=samples, temperature=temperature, top_k=top_k,
                     top_p=top_p, max_new_tokens=max_new_tokens, extract=extract, pass_k=pass_k or [1],
                     batch_tokens=batch_tokens, device=device)
    m = run_eval(checkpoint, [parse_task(t) for t in task], Path(output), cfg, ConsoleProgress(quiet), overwrite)
    results = __import__("json").loads((Path(output) / "results.json").read_text())
    if as_json:
        print_json(results)
        return
    if not quiet:
        rows = [(name, metric, r["n"], _score_cell(v)) for name, r in results["tasks"].items() for metric, v in r["metrics"].items()]
        err.print(table(f"llmctl eval  ({m.wall_seconds:.1f} s)", rows, headers=("task", "metric", "n", "mean ± SE  [95% interval]")))


@eval_app.command("compare")
def eval_compare(
    a: Annotated[str, typer.Argument(help="Results directory A.")],
    b: Annotated[str, typer.Argument(help="Results directory B.")],
    json_: Json = False,
) -> None:
    """Paired difference A − B per task: its SE, z, 95% interval, and the questions needed to detect it."""
    from llmctl.eval.compare import compare_results

    r = compare_results(a, b)
    if _flags(False, json_)[1]:
        print_json(r)
        return
    fmt = lambda x, f=".4f": "n/a" if x is None else format(x, f)
    rows = [(t["task"], t["n"], fmt(t["mean_a"]), fmt(t["mean_b"]), fmt(t["diff"], "+.4f"), fmt(t["se"]), fmt(t["z"], ".2f"),
             f"[{fmt(t['ci_low'])}, {fmt(t['ci_high'])}]", fmt(t["questions_needed"], ",")) for t in r["tasks"]]
    err.print(table(f"A = {a}  B = {b}", rows, headers=("task", "paired n", "A", "B", "A − B", "SE", "z", "95% interval", "questions to detect")))


@app.command()
def generate(
    checkpoint: Annotated[str, typer.Argument(help="Checkpoint: a step dir, or a run dir (its latest).")],
    prompt: Annotated[list[str], typer.Option("--prompt", "-p", help="Prompt text (repeatable).")],
    n: Annotated[int, typer.Option("-n", help="Samples per prompt.")] = 1,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Tokens to generate at most.")] = 64,
    temperature: Annotated[float, typer.Option("--temperature", help="0 = greedy (deterministic).")] = 0.0,
    top_k: Annotated[int, typer.Option("--top-k", help="0 = off.")] = 0,
    top_p: Annotated[float, typer.Option("--top-p", help="1 = off.")] = 1.0,
    seed: Annotated[int, typer.Option("--seed", help="Sampling seed.")] = 0,
    stop: Annotated[Optional[list[str]], typer.Option("--stop", help="Stop string (repeatable).")] = None,
    json_: Json = False,
) -> None:
    """Sample continuations of prompts with the KV-cache engine (the one eval and rl use)."""
    from llmctl.eval.runner import EvalConfig, Evaluator
    from llmctl.model.generate import Engine, SamplingParams

    ev = Evaluator(checkpoint, EvalConfig())
    if ev.chat is not None:  # SFT/RL checkpoints: each prompt is a user turn
        engine = Engine(ev.model, ev.encode, ev.decode, ev.chat.end_id, pad_id=ev.eos_id)
        inputs = [ev.chat.prompt_ids([{"role": "user", "content": p}]) for p in prompt for _ in range(n)]
    else:
        engine = Engine(ev.model, ev.encode, ev.decode, ev.eos_id, pad_id=ev.eos_id)
        inputs = [p for p in prompt for _ in range(n)]
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, stop=stop or ())
    gens = engine.generate(inputs, params)
    if _flags(False, json_)[1]:
        print_json([{"prompt": p, "completion": g.text, "finish": g.finish, "tokens": len(g.ids)} for p, g in zip([p for p in prompt for _ in range(n)], gens)])
        return
    for i, g in enumerate(gens):
        typer.echo(f"--- {prompt[i // n]!r} [{g.finish}, {len(g.ids)} tokens]")
        typer.echo(g.text if ev.chat is not None else prompt[i // n] + g.text)


# ---------------------------------------------------------------------------------------------
# rl


@app.command()
def rl(
    checkpoint: Annotated[str, typer.Argument(help="Starting checkpoint (an SFT model, a run dir, or an imported HF model).")],
    prompts: Annotated[str, typer.Option("--prompts", help="Prompts with checkable answers: {prompt, answer} JSONL/Parquet or GSM8K native.")],
    output: Annotated[str, typer.Option("--output", "-o", help="Run directory: config.json, metrics.jsonl, rollouts/, checkpoints/.")],
    config: Config = "arith",
    eval_prompts: Annotated[Optional[str], typer.Option("--eval", help="Held-out prompts: greedy accuracy with its interval every --eval-every steps.")] = None,
    steps: Annotated[Optional[int], typer.Option("--steps", help="Optimizer steps.")] = None,
    group_size: Annotated[Optional[int], typer.Option("--group-size", "-G", help="Samples per prompt.")] = None,
    prompts_per_step: Annotated[Optional[int], typer.Option("--prompts-per-step", help="Groups per step.")] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option("--max-new-tokens", help="Completion budget; longer samples are truncated.")] = None,
    temperature: Annotated[Optional[float], typer.Option("--temperature", help="Sampling temperature (the loss uses the same).")] = None,
    top_p: Annotated[Optional[float], typer.Option("--top-p", help="Nucleus sampling mass for rollouts.")] = None,
    format_reward: Annotated[Optional[float], typer.Option("--format-reward", help="Added when the answer has the expected form ('#### n', \\boxed{}).")] = None,
    lr: Annotated[Optional[float], typer.Option("--lr", help="Learning rate (the peak of --schedule).")] = None,
    warmup_steps: Annotated[Optional[int], typer.Option("--warmup-steps", help="Steps of linear warmup from 0 to --lr.")] = None,
    schedule: Annotated[Optional[str], typer.Option("--schedule", help="Rate after warmup: constant, linear (to 0) or cosine (to 10%).")] = None,
    adv_std: Annotated[Optional[str], typer.Option("--adv-std", help="Advantage scale: group (GRPO), group-bessel (verl), batch, none (Dr. GRPO).")] = None,
    clip_low: Annotated[Optional[float], typer.Option("--clip-low", help="ε_low of the ratio clip.")] = None,
    clip_high: Annotated[Optional[float], typer.Option("--clip-high", help="ε_high (DAPO clip-higher: 0.28).")] = None,
    loss_agg: Annotated[Optional[str], typer.Option("--loss-agg", help="seq-mean-token-mean (GRPO), token-mean (DAPO), seq-sum-const (Dr. GRPO).")] = None,
    kl: Annotated[Optional[str], typer.Option("--kl", help="KL to the frozen start model: none, k2, k3.")] = None,
    kl_coef: Annotated[Optional[float], typer.Option("--kl-coef", help="Weight of the KL term.")] = None,
    epochs: Annotated[Optional[int], typer.Option("--epochs", help="μ: optimizer passes over each batch (old log-probs kept).")] = None,
    dynamic_sampling: Annotated[Optional[bool], typer.Option("--dynamic-sampling/--no-dynamic-sampling", help="Drop groups whose rewards are all equal and draw more prompts.")] = None,
    truncated: Annotated[Optional[str], typer.Option("--truncated", help="Samples cut at --max-new-tokens: mask (out of the loss) or zero (reward 0).")] = None,
    verifier: Annotated[Optional[str], typer.Option("--verifier", help="math, exact, regex or python.")] = None,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Prompt order and sampling seed.")] = None,
    device: Annotated[Optional[str], typer.Option("--device", help="auto, cpu or cuda.")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the run's latest checkpoint.")] = False,
    overwrite: Overwrite = False,
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """GRPO (and Dr. GRPO / DAPO variants) on verifiable rewards, with the shared generation engine;
    under torchrun each rank samples its slice of every step's prompts and gradients are summed."""
    from llmctl.config import build_config
    from llmctl.rl.trainer import RLConfig, run_rl

    quiet, as_json = _flags(quiet, json_)
    flags = dict(steps=steps, group_size=group_size, prompts_per_step=prompts_per_step, max_new_tokens=max_new_tokens, lr=lr,
                 warmup_steps=warmup_steps, schedule=schedule, temperature=temperature, top_p=top_p, format_reward=format_reward,
                 adv_std=adv_std, clip_low=clip_low, clip_high=clip_high, loss_agg=loss_agg, kl=kl, kl_coef=kl_coef,
                 epochs=epochs, dynamic_sampling=dynamic_sampling, truncated=truncated, verifier=verifier, seed=seed, device=device)
    cfg = build_config(RLConfig, "rl", config, flags)

    def show(rec: dict) -> None:
        if quiet:
            return
        ev = rec.get("eval")
        line = (f"step {rec['step']}/{cfg.steps}  reward {rec['reward_mean']:.3f}  acc {rec['accuracy']:.3f}  "
                f"len {rec['response_length']:.0f}  zero-var {rec['zero_variance_share']:.2f}  "
                f"gen {rec['generate_s']:.1f}s train {rec['train_s']:.1f}s")
        if ev:
            line += f"  held-out {ev['mean']:.3f} [{ev['ci_low']:.3f}, {ev['ci_high']:.3f}]"
        err.print(line, markup=False, highlight=False)

    m = run_rl(checkpoint, prompts, Path(output), cfg, eval_file=eval_prompts, resume=resume, overwrite=overwrite,
               on_step=show, on_log=lambda msg: None if quiet else err.print(msg, markup=False, highlight=False))
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun: one summary, rank 0's
        report(m, output, quiet, as_json, rate_key="steps")


# ---------------------------------------------------------------------------------------------
# entry point


# typer vendors its own click; its parser errors all derive from the base of BadParameter.
_ClickUsageError = typer.BadParameter.__mro__[1]


def _fail(code: int, message: str) -> None:
    err.print(f"llmctl: error: {message}", markup=False, highlight=False, soft_wrap=True)
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    # What is imported by now lives until exit: frozen, it is not walked again by the full
    # collections that typer's and the stages' imports would trigger (15-35 ms a command).
    gc.freeze()
    command = typer.main.get_command(app)
    try:
        rc = command.main(args=argv, prog_name="llmctl", standalone_mode=False)
        if rc == 130:  # typer turns Ctrl-C into a returned exit code instead of raising it
            _fail(130, "interrupted")
        if isinstance(rc, int) and rc:
            sys.exit(rc)
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
    except Interrupted as e:
        _fail(128 + e.signum, str(e))
    except (KeyboardInterrupt, typer.Abort):
        _fail(130, "interrupted")


if __name__ == "__main__":
    main()
