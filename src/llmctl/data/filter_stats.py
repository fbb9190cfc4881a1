"""`llmctl filter stats`: histograms of an annotated docs artifact, for choosing thresholds.

`llmctl filter --annotate-only` keeps every document and writes each step's statistics as float
columns `stats.<step>.<statistic>`, plus `reason`: null for a document the filter would keep, else
the first statistic that failed. This draws, for every statistic, the values of the would-be-kept
documents against the would-be-rejected ones on shared bins, so a threshold can be read off where
the two separate; `summary.json` has the same figures as numbers (counts and quantiles).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa

from llmctl.artifacts.atomic import directory_only
from llmctl.artifacts.lock import output_lock
from llmctl.artifacts.docs import open_docs_inputs
from llmctl.artifacts.manifest import error_place
from llmctl.errors import UsageError
from llmctl.runtime.progress import Progress

STATS_PREFIX = "stats."
QUANTILES = {"min": 0.0, "p01": 0.01, "p05": 0.05, "p25": 0.25, "p50": 0.5, "p75": 0.75, "p95": 0.95, "p99": 0.99, "max": 1.0}
LOG_Y_RATIO = 100  # tallest bin over the lowest non-empty one: past this, small bins vanish on a linear axis
LOG_X_DECADES = 3  # positive values spanning more decades than this (word counts) get log-spaced bins
KEPT_COLOR, REJECTED_COLOR = "#1f77b4", "#d62728"


def read_stats(inputs: list[str], progress: Progress) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """({statistic: values}, rejected mask, reason array) over every document of the inputs.

    Only the stats columns and `reason` are kept in memory, batch by batch. Nulls become NaN.
    """
    docs = open_docs_inputs(inputs)
    names = [
        f.name
        for f in docs.schema
        if f.name.startswith(STATS_PREFIX) and (pa.types.is_floating(f.type) or pa.types.is_integer(f.type))
    ]
    if not names:
        raise UsageError(
            f"{', '.join(inputs)}: no {STATS_PREFIX}* columns to plot; run `llmctl filter --annotate-only` first"
        )
    has_reason = "reason" in docs.schema.names
    if not has_reason:
        progress.log("no `reason` column: every document counts as kept")
    chunks: dict[str, list[np.ndarray]] = {n: [] for n in names}
    reasons: list[np.ndarray] = []
    progress.start(None, "docs", "filter stats")
    for batch in docs.batches:
        for n in names:
            col = batch.column(n).cast(pa.float64())
            chunks[n].append(col.to_numpy(zero_copy_only=False))  # nulls come out as NaN
        if has_reason:
            reasons.append(np.asarray(batch.column("reason").to_pylist(), dtype=object))
        else:
            reasons.append(np.full(batch.num_rows, None, dtype=object))
        progress.advance(batch.num_rows)
    progress.finish()
    for e in docs.log.errors:  # plotted without them; named, so nobody takes the plot for the whole input
        progress.log(f"filter stats: skipped damage in {error_place(e)}: {e['error']}")
    values = {n.removeprefix(STATS_PREFIX): np.concatenate(c) if c else np.zeros(0) for n, c in chunks.items()}
    reason = np.concatenate(reasons) if reasons else np.zeros(0, dtype=object)
    rejected = np.array([r is not None for r in reason], dtype=bool)
    return values, rejected, reason


def quantiles(x: np.ndarray) -> dict[str, float | None]:
    """The QUANTILES of the finite values (all None when there are none)."""
    if not len(x):
        return {k: None for k in QUANTILES}
    qs = np.quantile(x, list(QUANTILES.values()))
    return {k: float(v) for k, v in zip(QUANTILES, qs)}


def side_summary(x: np.ndarray) -> dict:
    finite = np.isfinite(x)
    return {"n": int(len(x)), "n_nan": int((~finite).sum()), "quantiles": quantiles(x[finite])}


def bin_edges(finite: np.ndarray, bins: int) -> tuple[np.ndarray, bool]:
    """(shared bin edges, log x?). Integer statistics with few distinct values get one bin per
    integer; positive values over many decades get log-spaced bins."""
    if not len(finite):
        return np.linspace(0.0, 1.0, bins + 1), False
    lo, hi = float(finite.min()), float(finite.max())
    if np.all(finite == np.round(finite)) and hi - lo < bins:
        return np.arange(lo - 0.5, hi + 1.5), False
    if lo > 0 and math.log10(hi / lo) > LOG_X_DECADES:
        return np.geomspace(lo, hi, bins + 1), True
    return np.histogram_bin_edges(finite, bins=bins), False


def plot_statistic(path: Path, stat: str, x: np.ndarray, rejected: np.ndarray, bins: int) -> None:
    """One PNG: stepped histograms of kept and rejected values on shared bins, NaN counted in
    the legend. Uses matplotlib's object API with the Agg canvas: no pyplot, no global backend."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    finite = np.isfinite(x)
    edges, log_x = bin_edges(x[finite], bins)
    fig = Figure(figsize=(7, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    counts = []
    for name, mask, color in (("kept", ~rejected, KEPT_COLOR), ("rejected", rejected, REJECTED_COLOR)):
        vals = x[mask & finite]
        n_nan = int((mask & ~finite).sum())
        label = f"{name} (n={int(mask.sum()):,}" + (f", {n_nan:,} NaN not shown)" if n_nan else ")")
        if len(vals):
            c, _, _ = ax.hist(vals, bins=edges, histtype="step", linewidth=1.5, color=color, label=label)
            counts.append(c)
        else:
            ax.plot([], [], color=color, label=label)  # still named in the legend, with its n
    nonzero = np.concatenate(counts)[np.concatenate(counts) > 0] if counts else np.zeros(0)
    if len(nonzero) and nonzero.max() / nonzero.min() > LOG_Y_RATIO:
        ax.set_yscale("log")
    if log_x:
        ax.set_xscale("log")
    if not finite.any():
        ax.text(0.5, 0.5, "no finite values", ha="center", va="center", transform=ax.transAxes)
    ax.set_title(stat)
    ax.set_xlabel(stat)
    ax.set_ylabel("documents")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, format="png")


def file_name(stat: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", stat) + ".png"


def write_histograms(inputs: list[str], out_dir: str, bins: int = 50, progress: Progress | None = None) -> list[Path]:
    """Write OUT_DIR/<step>.<statistic>.png for every stats column of an annotated docs input, and
    OUT_DIR/summary.json; return the PNG paths in column order."""
    directory_only(out_dir, "a histograms folder")
    with output_lock(out_dir):
        return _write_histograms(inputs, out_dir, bins, progress)


def _write_histograms(inputs: list[str], out_dir: str, bins: int, progress: Progress | None) -> list[Path]:
    progress = progress or Progress()
    if bins < 1:
        raise UsageError(f"--bins must be >= 1, got {bins}")
    values, rejected, reason = read_stats(inputs, progress)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UsageError(f"output {out} exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    summary = {"documents": int(len(rejected)), "rejected": int(rejected.sum()), "statistics": {}}
    by_reason = Counter(r for r in reason if r is not None)
    for stat, x in values.items():
        path = out / file_name(stat)
        plot_statistic(path, stat, x, rejected, bins)
        paths.append(path)
        finite = np.isfinite(x)
        summary["statistics"][stat] = {
            "file": path.name,
            "n": int(len(x)),
            "n_nan": int((~finite).sum()),
            # the documents this very statistic rejected (the first failing one names the reason)
            "rejected_here": by_reason.get(stat, 0),
            "kept": side_summary(x[~rejected]),
            "rejected": side_summary(x[rejected]),
        }
    tmp = out / ".summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(out / "summary.json")
    return paths
