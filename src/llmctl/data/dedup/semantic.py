"""dedup --semantic: SemDeDup (Abbas et al. 2023, "SemDeDup: Data-efficient learning at web-scale
through semantic deduplication") on the documents' `embedding` column (llmctl embed).

1. k-means    the unit-normalized embeddings are clustered (spherical k-means: Lloyd's iterations
              on cosine similarity, k-means++ seeding, a seeded sample of at most SAMPLE documents
              to fit the centroids, then every document assigned) -> _work/semantic/kmeans.npz
2. pairs      one task per group of clusters: inside a cluster, every pair whose cosine similarity
              is above 1 - eps is an edge -> _work/pairs/semantic-gNNNN.npy
Then the clusters phase joins these edges with the other methods' (attribution order url, exact,
minhash, semantic: a document MinHash already explains counts as MinHash), and one document of
each duplicate cluster survives by --keep; `--keep centroid` keeps the one nearest its k-means
centroid, SemDeDup's choice.

Why by hand: k-means here is forty lines of numpy; scikit-learn would bring scipy into the core
install for one function, and NeMo Curator's and the paper's versions need faiss or a GPU.
A document without an embedding (null) gets the zero vector: similarity 0 to all, never a pair.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llmctl.data.dedup.workfiles import save_npy, save_npz
from llmctl.runtime.executor import Task

SAMPLE = 100_000  # documents the centroids are fitted on (all of them when fewer)
ITERATIONS = 20
DOCS_PER_CLUSTER = 1_000  # the default K: about this many documents a cluster
BLOCK = 2_048  # rows of a cluster's similarity matrix computed at a time


def normalized(emb: np.ndarray) -> np.ndarray:
    emb = np.nan_to_num(np.asarray(emb, dtype=np.float32), nan=0.0, posinf=0.0, neginf=0.0)
    norm = np.linalg.norm(emb, axis=1, keepdims=True)
    return np.divide(emb, norm, out=np.zeros_like(emb), where=norm > 0)


def default_k(n: int) -> int:
    return max(1, round(n / DOCS_PER_CLUSTER))


def kmeans(x: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Spherical k-means centroids (k x d, unit rows) of the unit rows of x."""
    rng = np.random.default_rng(seed)
    fit = x[np.sort(rng.choice(len(x), SAMPLE, replace=False))] if len(x) > SAMPLE else x
    k = min(k, len(fit))
    # k-means++ on cosine distance: each next seed drawn in proportion to its distance to the nearest
    centroids = [fit[rng.integers(len(fit))]]
    nearest = 1.0 - fit @ centroids[0]
    for _ in range(1, k):
        weights = np.clip(nearest, 0, None)
        total = weights.sum()
        j = rng.choice(len(fit), p=weights / total) if total > 0 else rng.integers(len(fit))
        centroids.append(fit[j])
        nearest = np.minimum(nearest, 1.0 - fit @ fit[j])
    c = np.stack(centroids)
    labels = np.full(len(fit), -1)
    for _ in range(ITERATIONS):
        new = assign(fit, c)
        if np.array_equal(new, labels):
            break
        labels = new
        for j in range(len(c)):
            members = fit[labels == j]
            if len(members):
                m = members.sum(axis=0)
                norm = np.linalg.norm(m)
                c[j] = m / norm if norm > 0 else c[j]
    return c


def assign(x: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """The nearest centroid (highest cosine) of each row, in blocks."""
    return np.concatenate([np.argmax(x[i : i + 65_536] @ centroids.T, axis=1) for i in range(0, len(x), 65_536)] or [np.zeros(0, np.int64)])


def cluster_edges(x: np.ndarray, docs: np.ndarray, eps: float) -> np.ndarray:
    """(first, other) edges between the documents of one cluster whose cosine similarity is above
    1 - eps; x: their unit embeddings, docs: their global numbers (ascending)."""
    out = []
    for i in range(0, len(x), BLOCK):
        sim = x[i : i + BLOCK] @ x.T
        a, b = np.nonzero(sim > 1.0 - eps)
        a += i
        keep = a < b  # each pair once, never a document with itself
        out.append(np.stack([docs[a[keep]], docs[b[keep]]], axis=1))
    return np.concatenate(out).astype(np.int64) if out else np.zeros((0, 2), np.int64)


def fit(work: Path, embeddings: list[np.ndarray], k: int | None, seed: int) -> None:
    """Phase 1, in the driver: centroids, each document's cluster and its similarity to it."""
    path = work / "semantic" / "kmeans.npz"
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    x = np.concatenate(embeddings) if embeddings else np.zeros((0, 1), np.float32)
    if len(x) == 0:
        centroids, labels, near = np.zeros((0, x.shape[1]), np.float32), np.zeros(0, np.int64), np.zeros(0, np.float32)
    else:
        centroids = kmeans(x, k or default_k(len(x)), seed)
        labels = assign(x, centroids)
        near = np.einsum("ij,ij->i", x, centroids[labels])
    save_npz(path, centroids=centroids, labels=labels, near=near)


def groups(work: Path, tasks: int) -> list[list[int]]:
    """The clusters, largest first, dealt into at most `tasks` groups of about equal pair counts."""
    with np.load(work / "semantic" / "kmeans.npz") as z:
        labels, k = z["labels"], len(z["centroids"])
    size = np.bincount(labels, minlength=k)
    out: list[list[int]] = [[] for _ in range(max(1, min(tasks, k)))]
    load = np.zeros(len(out))
    for j in np.argsort(-size.astype(np.int64) ** 2, kind="stable"):
        g = int(np.argmin(load))
        out[g].append(int(j))
        load[g] += float(size[j]) ** 2
    return [sorted(g) for g in out]


@dataclass
class Pairs:
    """Phase 2: one group of clusters' edges."""

    work: Path
    eps: float
    n_files: int

    def __call__(self, task: Task, report) -> dict:
        path = self.work / "pairs" / f"{task.name}.npy"
        if not path.exists():
            with np.load(self.work / "semantic" / "kmeans.npz") as z:
                labels = z["labels"]
            x = np.concatenate([np.load(self.work / "semantic" / f"{i:05d}.npy") for i in range(self.n_files)] or [np.zeros((0, 1), np.float32)])
            edges = [cluster_edges(x[m], m, self.eps) for j in task.payload["clusters"] if len(m := np.flatnonzero(labels == j)) > 1]
            save_npy(path, np.concatenate(edges) if edges else np.zeros((0, 2), np.int64))
        report(1)
        return {}


def cluster_sizes(work: Path) -> dict[str, int]:
    """k-means clusters by size (the manifest's semantic table)."""
    with np.load(work / "semantic" / "kmeans.npz") as z:
        size = np.bincount(z["labels"], minlength=len(z["centroids"]))
    buckets = {"1": (1, 1), "2-10": (2, 10), "11-100": (11, 100), "101-1000": (101, 1000), ">1000": (1001, np.inf)}
    return {name: int(((size >= lo) & (size <= hi)).sum()) for name, (lo, hi) in buckets.items()} | {"empty": int((size == 0).sum())}
