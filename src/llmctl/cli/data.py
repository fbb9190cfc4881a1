"""The docs commands: `cat`, `head`, `sample`, `crawl-extract` and `dedup`. Each parses its flags, builds
its config (docs/design.md §3), calls one stage function and renders the summary."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from llmctl.cli import render
from llmctl.cli.options import Config, DocsIn, Json, Out, Overwrite, Quiet, RunFlags, Strict, flags, run_control
from llmctl.cli.console import ConsoleProgress

app = typer.Typer()


@app.command()
def cat(
    inputs: DocsIn,
    output: Out = ...,
    rows_per_part: Annotated[int, typer.Option(help="Rows per output Parquet part.")] = 1_000_000,
    overwrite: Overwrite = False,
    strict: Strict = False,
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """Concatenate docs into one artifact or stream (columns are unioned, missing ones null).

    Run again into the same OUT, an interrupted cat starts over and a finished one does nothing (exit 0)."""
    from llmctl.config import build_config
    from llmctl.data.cat import CatConfig, run_cat

    quiet, as_json = flags(quiet, json_)
    cfg = build_config(CatConfig, "cat", None, {"rows_per_part": rows_per_part, "overwrite": overwrite, "strict": strict})
    m = run_cat(inputs, output, cfg, ConsoleProgress(quiet))
    render.report(m, output, quiet, as_json)


@app.command()
def head(
    input: Annotated[str, typer.Argument(help="Docs input (artifact, Parquet/JSONL, or '-').")],
    n: Annotated[int, typer.Option("-n", "--lines", help="Number of documents to keep.")] = 10,
    output: Out = ...,
    overwrite: Overwrite = False,
    strict: Strict = False,
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """The first N documents of INPUT, as an artifact or stream (stops reading early).

    Run again into the same OUT, an interrupted head starts over and a finished one does nothing (exit 0)."""
    from llmctl.config import build_config
    from llmctl.data.cat import CatConfig, run_cat

    quiet, as_json = flags(quiet, json_)
    cfg = build_config(CatConfig, "head", None, {"limit": n, "overwrite": overwrite, "strict": strict})
    m = run_cat([input], output, cfg, ConsoleProgress(quiet))
    render.report(m, output, quiet, as_json)


@app.command()
def sample(
    inputs: Annotated[list[str], typer.Argument(help="Docs inputs: artifacts, Parquet/JSONL files or dirs, globs, or '-'. With --warc: WARC files (.warc.gz, .warc), dirs, globs or @paths.txt.")],
    n: Annotated[int, typer.Option("-n", help="Documents in the sample (with --warc: response records).")] = 10,
    output: Annotated[str, typer.Option("--output", "-o", help="Output artifact directory, or '-' for the sample on stdout (an Arrow stream; with --warc, WARC bytes).")] = ...,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Which sample: the same seed and input give the same rows (default 0). Not with --warc.")] = None,
    warc: Annotated[bool, typer.Option("--warc", help="Cut WARC files instead: the first N response records, each with the records before it and its own after it (request, metadata), copied byte for byte as the original gzip members; OUT holds part-*.warc.gz, a valid WARC that crawl-extract reads.")] = False,
    overwrite: Overwrite = False,
    strict: Strict = False,
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """A seeded uniform sample of N documents (one pass, memory for N rows, rows in input order), or with --warc a WARC cut down to its first N responses: small inputs for CI runs.

    The sample keeps the N rows whose hash of (seed, id) is smallest: the same rows whatever the batching, and a document in the sample of a corpus is in the sample of any part of it that holds it. Damaged input is skipped and counted (--warc: the cut of a file stops before its damage).

    Run again into the same OUT, an interrupted sample starts over and a finished one does nothing (exit 0)."""
    from llmctl.config import build_config
    from llmctl.errors import UsageError

    quiet, as_json = flags(quiet, json_)
    if warc:
        from llmctl.data.crawl.warccut import WarcCutConfig, run_warc_cut

        if seed is not None:
            raise UsageError("--seed has no meaning with --warc: the cut is the first N responses")
        cfg = build_config(WarcCutConfig, "sample", None, {"n": n, "overwrite": overwrite, "strict": strict})
        m = run_warc_cut(inputs, output, cfg, ConsoleProgress(quiet))
    else:
        from llmctl.data.sample import SampleConfig, run_sample

        cfg = build_config(SampleConfig, "sample", None, {"n": n, "seed": seed, "overwrite": overwrite, "strict": strict})
        m = run_sample(inputs, output, cfg, ConsoleProgress(quiet))
    render.report(m, output, quiet, as_json, **({"rate_key": "responses", "stream": "WARC"} if warc else {}))


@app.command("crawl-extract")
@run_control()
def crawl_extract(
    inputs: Annotated[list[str], typer.Argument(help="WARC/ARC files (.warc, .warc.gz), globs, directories, @paths.txt (one path a line, like warc.paths), or '-' for a WARC on stdin.")],
    output: Out = ...,
    config: Config = None,
    extractor: Annotated[Optional[str], typer.Option("--extractor", help="Main-text extractor: trafilatura (FineWeb's, the default) or resiliparse (DCLM's: ~8x less CPU a page, keeps more boilerplate; --config dclm has DCLM's settings).")] = None,
    fast: Annotated[Optional[bool], typer.Option("--fast/--precise", help="trafilatura fast mode instead of the FineWeb settings (favour precision).")] = None,
    languages: Annotated[Optional[str], typer.Option("--languages", "-l", help="Keep only these languages, comma-separated (e.g. en,de). Default: keep all, score only.")] = None,
    lang_threshold: Annotated[Optional[float], typer.Option("--lang-threshold", help="Minimum lid.176 probability of the top language (FineWeb: 0.65).")] = None,
    langid_model: Annotated[Optional[str], typer.Option("--langid-model", help="fastText language-ID model (lid.176.bin or .ftz).")] = None,
    max_bytes: Annotated[Optional[int], typer.Option("--max-bytes", min=1, help="Skip HTTP payloads larger than this (too_large).")] = None,
    timeout: Annotated[Optional[float], typer.Option("--timeout", help="Seconds allowed per page; slower pages are skipped as timeout (0: no limit).")] = None,
    blocklist: Annotated[Optional[list[str]], typer.Option("--blocklist", help="Domain blocklist file (one domain a line); repeatable; replaces the config's.")] = None,
    banned_words: Annotated[Optional[list[str]], typer.Option("--banned-words", help="File of words banned in URLs; repeatable; replaces the config's.")] = None,
    keep_rejected: Annotated[Optional[bool], typer.Option("--keep-rejected", help="Write documents rejected by language to OUT/rejected/ with a reason column.")] = None,
    *,
    run: RunFlags,
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """Turn Common Crawl WARC files into documents (trafilatura or resiliparse text, lid.176 language).

    Selects HTML 200 responses, filters URLs, extracts the main text with trafilatura (or
    resiliparse) and identifies the language with fastText lid.176. Every skipped record is counted by reason in
    the manifest and the summary."""
    from llmctl.config import build_config, preset
    from llmctl.data.crawl.extract import STAGE, ExtractConfig, run_crawl_extract

    quiet, as_json = flags(quiet, json_)
    cfg = build_config(
        ExtractConfig,
        STAGE,
        preset(STAGE, config),
        {
            "extractor": extractor,
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
    m = run_crawl_extract(inputs, output, cfg, run.options(), ConsoleProgress(quiet))
    render.report(m, output, quiet, as_json)


@app.command()
@run_control(omit=("shard_index", "num_shards"))  # dedup needs the whole corpus at once
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
    keep: Annotated[Optional[str], typer.Option("--keep", help="Survivor of a cluster: first | earliest (by date) | centroid (--semantic: nearest its k-means centroid) | max:COLUMN (e.g. max:quality_score).")] = None,
    partitions: Annotated[Optional[int], typer.Option("--partitions", min=1, help="Split each key family into this many hash partitions (less memory per task).")] = None,
    semantic: Annotated[Optional[bool], typer.Option("--semantic", help="SemDeDup on the embedding column (llmctl embed): k-means, then pairs above cosine 1 - --eps inside each cluster.")] = None,
    eps: Annotated[Optional[float], typer.Option("--eps", help="With --semantic: pairs with cosine similarity above 1 - eps are duplicates (default 0.05).")] = None,
    clusters: Annotated[Optional[int], typer.Option("--clusters", min=0, help="With --semantic: k-means clusters (default 0: about one per 1,000 documents).")] = None,
    substring: Annotated[Optional[bool], typer.Option("--substring", help="Cut every span of >= --min-len units seen earlier in the corpus (Lee et al. 2022, suffix arrays); the first copy stays.")] = None,
    min_len: Annotated[Optional[int], typer.Option("--min-len", min=1, help="With --substring: shortest repeat cut, in --unit (default 50).")] = None,
    unit: Annotated[Optional[str], typer.Option("--unit", help="With --substring: tokens (GPT-2 pre-tokenizer pieces, the default) or bytes (UTF-8; cuts shrink to whole characters).")] = None,
    memory: Annotated[Optional[str], typer.Option("--memory", help="With --substring: memory per task, e.g. 8G (default 4G); the corpus is cut into shards that fit it.")] = None,
    reference: Annotated[Optional[list[str]], typer.Option("--reference", help="Docs seen before the input, never cut or written: spans repeating them are cut from the input (repeatable).")] = None,
    sentences: Annotated[Optional[bool], typer.Option("--sentences", help="datatrove's sentence-span dedup: cut every window of --n-sentences sentences seen in an earlier document.")] = None,
    n_sentences: Annotated[Optional[int], typer.Option("--n-sentences", min=1, help="With --sentences: sentences per window (default 3).")] = None,
    min_doc_words: Annotated[Optional[int], typer.Option("--min-doc-words", min=0, help="With --substring/--sentences: drop a document cut below this many words (default 50; 0 keeps all).")] = None,
    annotate_only: Annotated[Optional[bool], typer.Option("--annotate-only", help="With --substring/--sentences: fill removed_spans but cut nothing.")] = None,
    keep_rejected: Annotated[Optional[bool], typer.Option("--keep-rejected", help="Write removed rows to OUT/rejected/ with reason and dup_of (the survivor's id); with span methods also each cut text (reason dedup.spans.cut).")] = None,
    plot: Annotated[Optional[str], typer.Option("--plot", help="Write the S-curve and cluster-size PNGs into this directory.")] = None,
    keep_work: Annotated[Optional[bool], typer.Option("--keep-work", help="Keep OUT/_work (signatures, pairs, clusters, the span phases' files) after success.")] = None,
    *,
    run: RunFlags,
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """Remove duplicates: URL, exact text, frequent lines, MinHash near-duplicates, semantic
    duplicates (SemDeDup on an embedding column), then repeated
    spans inside the survivors (--substring, --sentences), in that order.

    Kept rows get dup_cluster_id (the survivor's id) and dup_cluster_size; with a span method also
    removed_spans, the UTF-8 byte ranges cut from the text as read."""
    from llmctl.config import build_config
    from llmctl.data.dedup.run import STAGE, DedupConfig, run_dedup

    quiet, as_json = flags(quiet, json_)
    cfg = build_config(
        DedupConfig,
        STAGE,
        config,
        {"url": url, "exact": exact, "lines": lines, "minhash": minhash, "ngram": ngram, "bands": bands, "rows": rows, "max_line_count": max_line_count, "keep": keep, "partitions": partitions, "keep_rejected": keep_rejected, "keep_work": keep_work,
         "semantic": semantic, "eps": eps, "clusters": clusters, "substring": substring, "min_len": min_len, "unit": unit, "memory": memory, "reference": reference, "sentences": sentences,
         "n_sentences": n_sentences, "min_doc_words": min_doc_words, "annotate_only": annotate_only},
    )
    m = run_dedup(inputs, output, cfg, run.options(), ConsoleProgress(quiet))
    render.report(m, output, quiet, as_json, hide=("s_curve", "clusters", "spans", "semantic"), rate_key="in")
    if plot:
        from llmctl.data.dedup.plots import write_plots

        write_plots(m.counts, cfg.bands, cfg.rows, plot)
    if not as_json and not quiet:
        render.dedup_tables(m.counts)
