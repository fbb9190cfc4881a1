"""`llmctl decontam`: training documents that share a word n-gram with an eval item, removed or
flagged, and a per-task report of how much of each eval set is in the data."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from llmctl.cli import render
from llmctl.cli.options import Config, DocsIn, Json, Quiet, RunFlags, flags, run_control
from llmctl.cli.console import ConsoleProgress
from llmctl.errors import UsageError

app = typer.Typer()


@app.command()
@run_control()
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
    *,
    run: RunFlags,
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """Find training documents that share a word n-gram with an eval item (GPT-3 13-gram overlap); remove them (or --flag them) and report, per task, how many eval items appear in the data.

    Words are lowercased with punctuation and accents stripped; digits are kept. The report (a table on stderr, decontam.json beside the output) gives per task: items, contaminated items and their share, training docs hit, n-grams matched, and the contaminated items themselves."""
    from llmctl.config import build_config
    from llmctl.data.decontam.run import REPORT_FILE, STAGE, DecontamConfig, run_decontam

    quiet, as_json = flags(quiet, json_)
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
    m = run_decontam(inputs, output, cfg, against, run.options(), ConsoleProgress(quiet), report_path=report_file)
    render.report(m, output if output is not None else "none (--report-only)", quiet, as_json, hide=("tasks",), rate_key="in")
    if not as_json and not quiet:
        beside = None if output in (None, "-") else str(Path(output) / REPORT_FILE)
        render.decontam_tasks(m, cfg, [p for p in (report_file, beside) if p])
