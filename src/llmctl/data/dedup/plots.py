"""`llmctl dedup --plot DIR`: the S-curve of the banding and the cluster-size histogram as PNGs."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from llmctl.data.dedup.minhash import s_curve, threshold


def write_plots(manifest_counts: dict, bands: int, rows: int, out_dir: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    j = np.linspace(0, 1, 201)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(j, s_curve(j, bands, rows), label=f"{bands} bands x {rows} rows")
    ax.axvline(threshold(bands, rows), ls="--", c="grey", label=f"threshold ~ {threshold(bands, rows):.3f}")
    ax.set_xlabel("Jaccard similarity of word n-gram sets")
    ax.set_ylabel("P(flagged as duplicates)")
    ax.set_title("MinHash LSH S-curve: 1 - (1 - J^r)^b")
    ax.legend(loc="upper left")
    fig.tight_layout()
    paths = [out / "s_curve.png"]
    fig.savefig(paths[0], dpi=100)
    plt.close(fig)
    hist = manifest_counts.get("clusters") or {}
    if hist:
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.bar(list(hist), list(hist.values()))
        ax.set_yscale("log")
        ax.set_xlabel("cluster size (documents)")
        ax.set_ylabel("clusters")
        ax.set_title("duplicate clusters by size")
        fig.tight_layout()
        paths.append(out / "cluster_sizes.png")
        fig.savefig(paths[1], dpi=100)
        plt.close(fig)
    return paths
