"""The report's charts that no stage draws itself: bar charts (languages, rejection reasons) and the
filter funnel. A run's curves come from train/plots.py and dedup's S-curve and cluster sizes from
data/dedup/plots.py; these share plots.py's axes style (`save_figure`)."""

from __future__ import annotations

from pathlib import Path

from llmctl.train.plots import save_figure


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def bars(path: Path, labels: list[str], values: list[float], title: str, xlabel: str) -> Path:
    """Horizontal bars, the first label on top (lists arrive sorted, largest first)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 0.8 + 0.28 * max(3, len(labels))))
    ax.barh(range(len(labels)), values, color="#4c72b0")
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    save_figure(fig, ax, path, title, xlabel, "", False, legend=False)
    plt.close(fig)
    return path


def funnel(path: Path, steps: list[str], docs_pct: list[float], chars_pct: list[float]) -> Path:
    """Documents and characters left after each filter step, as shares of the input."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    x = range(len(steps))
    ax.plot(x, docs_pct, "o-", label="documents left")
    ax.plot(x, chars_pct, "s--", label="characters left")
    ax.set_xticks(list(x), steps, rotation=30, ha="right")
    ax.set_ylim(0, 105)
    save_figure(fig, ax, path, "filter funnel", "", "% of the input", False, legend=True)
    plt.close(fig)
    return path


def curves(path: Path, series: dict[str, tuple[list, list, list, list]], title: str, xlabel: str, ylabel: str) -> Path:
    """One line per series (x, y, low, high) with its interval shaded; x on a log-2 axis (pass@k's k)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for label, (x, y, lo, hi) in series.items():
        ax.plot(x, y, "o-", markersize=3, label=label)
        ax.fill_between(x, lo, hi, alpha=0.2)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(plt.matplotlib.ticker.ScalarFormatter())  # 1, 2, 4 … rather than 2^0, 2^1 …
    save_figure(fig, ax, path, title, xlabel, ylabel, False, legend=True)
    plt.close(fig)
    return path
