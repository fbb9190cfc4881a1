"""`llmctl plot RUN -o DIR`: the curves a run's metrics.jsonl holds, one PNG each — a train run's
loss, bits per byte, lr, gradient norm and throughput, or an rl run's reward, accuracy (with the
held-out accuracy and its interval), entropy and response length. The bits-per-byte curve carries the
unigram floor of the validation tokens when the run's manifest records it (a finished pretraining run).
`llmctl report` draws its train and rl curves through `plot_run` too."""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path

from llmctl.artifacts.atomic import directory_only
from llmctl.artifacts.lock import output_lock
from llmctl.errors import UsageError

# (file name, title, the metrics records' key, y-axis label, log scale)
CURVES = [
    ("loss.png", "training and validation loss", "loss", "nats / token", False),
    ("bits_per_byte.png", "validation bits per byte", "bits_per_byte", "bits / byte", False),
    ("lr.png", "learning rate", "lr", "lr", False),
    ("grad_norm.png", "gradient norm before clipping", "grad_norm", "global L2 norm", True),
    ("tokens_per_s.png", "throughput", "tokens_per_s", "tokens / s", False),
]

# rl runs: x is the step; "eval" records carry the held-out accuracy with its interval
RL_CURVES = [
    ("reward.png", "reward (mean over samples)", "reward_mean", "reward", False),
    ("accuracy.png", "accuracy: rollouts and held-out (greedy)", "accuracy", "accuracy", False),
    ("entropy.png", "policy entropy on sampled tokens", "entropy", "nats / token", False),
    ("length.png", "response length", "response_length", "tokens", False),
    ("zero_variance.png", "share of groups with equal rewards", "zero_variance_share", "share", False),
]


def read_metrics(run: Path) -> tuple[list[dict], list[dict]]:
    """(step records, validation records) of a run directory or a metrics.jsonl file."""
    from llmctl.tasks.files import read_records  # the JSONL reader that names a bad line

    path = run / "metrics.jsonl" if run.is_dir() else run
    if not path.is_file():
        raise UsageError(f"no metrics.jsonl in {run}")
    steps, vals = [], []
    for rec in read_records(path):
        (vals if "val" in rec else steps).append(rec)
    return steps, vals


def save_figure(fig, ax, path: Path, title: str, xlabel: str, ylabel: str, log: bool, legend: bool) -> Path:
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    if log:
        ax.set_yscale("log")
    if legend:
        ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def unigram_floor(run: Path) -> float | None:
    """The unigram bits per byte a finished pretraining run recorded in its manifest, else None."""
    try:
        counts = json.loads((run / "manifest.json").read_text(encoding="utf-8")).get("counts", {})
    except (OSError, ValueError, AttributeError):
        return None
    floor = counts.get("val_unigram_bits_per_byte") if isinstance(counts, dict) else None
    return float(floor) if isinstance(floor, (int, float)) else None


def plot_run(run: Path, out: Path, only: Collection[str] | None = None) -> list[Path]:
    """The run's curves as PNGs in `out`; `only`: just these file names (e.g. {"loss.png"})."""
    directory_only(out, "a plots folder")
    with output_lock(out):
        return _plot_run(run, out, only)


def _plot_run(run: Path, out: Path, only: Collection[str] | None) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, vals = read_metrics(run)
    out.mkdir(parents=True, exist_ok=True)
    if any("reward_mean" in r for r in steps):
        return _plot_rl(steps, out, plt, only)
    floor = unigram_floor(run) if run.is_dir() else None
    written = []
    for name, title, key, ylabel, log in CURVES:
        if only is not None and name not in only:
            continue
        fig, ax = plt.subplots(figsize=(6, 3.5))
        train = [(r["tokens"], r[key]) for r in steps if r.get(key) is not None]
        val = [(r["tokens"], r["val"][key]) for r in vals if r["val"].get(key) is not None]
        ema = [(r["tokens"], r["val_ema"][key]) for r in vals if r.get("val_ema", {}).get(key) is not None]
        if train:
            ax.plot(*zip(*train), label="train", lw=1)
        if val:
            ax.plot(*zip(*val), "o-", label="validation", ms=3)
        if ema:  # --ema-decay: the moving average of the weights, validated on the same windows
            ax.plot(*zip(*ema), "s--", label="validation, EMA weights", ms=3)
        with_floor = key == "bits_per_byte" and floor is not None and bool(val)
        if with_floor:  # the bits per byte a model that ignores context gets: what training has to beat
            ax.axhline(floor, ls="--", c="grey", label=f"unigram floor {floor:.3f}")
        if train or val:
            written.append(save_figure(fig, ax, out / name, title, "tokens", ylabel, log,
                                       legend=bool(train and val) or bool(ema) or with_floor))
        plt.close(fig)
    return written


def _plot_rl(records: list[dict], out: Path, plt, only: Collection[str] | None = None) -> list[Path]:
    written = []
    held_out = [(r["step"], r["eval"]) for r in records if r.get("eval")]
    for name, title, key, ylabel, log in RL_CURVES:
        if only is not None and name not in only:
            continue
        fig, ax = plt.subplots(figsize=(6, 3.5))
        series = [(r["step"], r[key]) for r in records if r.get(key) is not None]
        if series:
            ax.plot(*zip(*series), label="rollouts", lw=1)
        with_held_out = key == "accuracy" and bool(held_out)
        if with_held_out:
            x = [s for s, _ in held_out]
            ax.errorbar(x, [e["mean"] for _, e in held_out], fmt="o-", ms=3, capsize=3, label="held-out, 95% interval",
                        yerr=[[e["mean"] - e["ci_low"] for _, e in held_out], [e["ci_high"] - e["mean"] for _, e in held_out]])
        if series or with_held_out:
            written.append(save_figure(fig, ax, out / name, title, "step", ylabel, log, legend=with_held_out))
        plt.close(fig)
    return written
