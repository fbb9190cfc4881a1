"""Clusters from candidate pairs: union-find, survivors, and which method removed what.

Edges from every enabled method (URL, exact text, MinHash bands) join documents into clusters
(spec 001-data-eval §A5: "flagged pairs form a graph; keep ONE doc per connected component").
Roots are always the smallest document index, so the result does not depend on edge order.
"""

from __future__ import annotations

import numpy as np


def components(n: int, edges: np.ndarray) -> np.ndarray:
    """Label of each of n nodes = the smallest node index in its connected component."""
    parent = np.arange(n, dtype=np.int64)
    if len(edges):
        # iterate min-label propagation with pointer jumping: vectorized, a few passes in practice
        a, b = edges[:, 0].astype(np.int64), edges[:, 1].astype(np.int64)
        while True:
            pa, pb = parent[a], parent[b]
            low = np.minimum(pa, pb)
            changed = False
            for side in (pa, pb):
                need = low < parent[side]
                if need.any():
                    np.minimum.at(parent, side[need], low[need])
                    changed = True
            # pointer jumping: point every node at its root
            while True:
                grand = parent[parent]
                if np.array_equal(grand, parent):
                    break
                parent = grand
            if not changed:
                break
    return parent


def survivors(labels: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """For each node, the index of its cluster's survivor: the lowest (rank, index)."""
    n = len(labels)
    order = np.lexsort((np.arange(n), rank, labels))  # by cluster, then rank, then index
    first = np.ones(n, dtype=bool)
    first[1:] = labels[order][1:] != labels[order][:-1]
    best_of_label = np.empty(n, dtype=np.int64)
    best_of_label[labels[order][first]] = order[first]
    return best_of_label[labels]


def sizes(labels: np.ndarray) -> np.ndarray:
    counts = np.bincount(labels, minlength=len(labels))
    return counts[labels]


def size_histogram(cluster_sizes: np.ndarray, labels: np.ndarray) -> dict[str, int]:
    """Clusters by size bucket: {"1": n, "2": n, "3-5": n, "6-10": n, "11-100": n, ">100": n}."""
    roots = labels == np.arange(len(labels))
    s = cluster_sizes[roots]
    edges = [(1, 1, "1"), (2, 2, "2"), (3, 5, "3-5"), (6, 10, "6-10"), (11, 100, "11-100"), (101, np.inf, ">100")]
    return {name: int(((s >= lo) & (s <= hi)).sum()) for lo, hi, name in edges}
