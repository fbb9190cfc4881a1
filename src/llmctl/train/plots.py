"""`llmctl plot RUN -o DIR`: the curves a run's metrics.jsonl holds, one PNG each."""

from __future__ import annotations

import json
from pathlib import Path

from llmctl.errors import UsageError

# (file name, title, the metrics records' key, y-axis label, log scale)
CURVES = [
    ("loss.png", "training and validation loss", "loss", "nats / token", False),
    ("bits_per_byte.png", "validation bits per byte", "bits_per_byte", "bits / byte", False),
    ("lr.png", "learning rate", "lr", "lr", False),
    ("grad_norm.png", "gradient norm before clipping", "grad_norm", "global L2 norm", True),
    ("tokens_per_s.png", "throughput", "tokens_per_s", "tokens / s", False),
]


def read_metrics(run: Path) -> tuple[list[dict], list[dict]]:
    """(step records, validation records) of a run directory or a metrics.jsonl file."""
    path = run / "metrics.jsonl" if run.is_dir() else run
    if not path.is_file():
        raise UsageError(f"no metrics.jsonl in {run}")
    steps, vals = [], []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise UsageError(f"{path}:{n}: not JSON ({e.msg})") from e
        (vals if "val" in rec else steps).append(rec)
    return steps, vals


def plot_run(run: Path, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, vals = read_metrics(run)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, title, key, ylabel, log in CURVES:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        train = [(r["tokens"], r[key]) for r in steps if r.get(key) is not None]
        val = [(r["tokens"], r["val"][key]) for r in vals if r["val"].get(key) is not None]
        if train:
            ax.plot(*zip(*train), label="train", lw=1)
        if val:
            ax.plot(*zip(*val), "o-", label="validation", ms=3)
        if not (train or val):
            plt.close(fig)
            continue
        ax.set(title=title, xlabel="tokens", ylabel=ylabel)
        if log:
            ax.set_yscale("log")
        if train and val:
            ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        written.append(out / name)
    return written
