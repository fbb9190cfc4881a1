"""dedup --semantic: SemDeDup on hand-made embeddings with known clusters, the k-means pieces,
the survivor rules, worker-count identity and bad embedding columns."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import llmctl
from llmctl.data.dedup import semantic
from llmctl.data.dedup.run import DedupConfig, run_dedup
from llmctl.errors import StageFailed
from llmctl.runtime.options import RunOptions


def groups_of_copies(seed=0, n_groups=12, copies=6, noise=60, dim=48):
    """n_groups groups of near-copies (cosine > 0.99 inside a group) and `noise` unrelated
    vectors; returns rows and each row's group (-1: unrelated)."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(n_groups, dim))
    rows, group = [], []
    for g in range(n_groups):
        for c in range(copies):
            rows.append(centers[g] + rng.normal(scale=0.02, size=dim))
            group.append(g)
    for _ in range(noise):
        rows.append(rng.normal(size=dim))
        group.append(-1)
    order = rng.permutation(len(rows))
    return [rows[i] for i in order], [group[i] for i in order]


def write(tmp_path, vectors, parts=2, name="in"):
    d = tmp_path / name
    d.mkdir()
    rows = [{"id": f"d{i}", "text": f"document {i}", "embedding": None if v is None else np.asarray(v, np.float32).tolist()} for i, v in enumerate(vectors)]
    step = -(-len(rows) // parts)
    for p in range(parts):
        pq.write_table(pa.Table.from_pylist(rows[p * step : (p + 1) * step], schema=pa.schema([("id", pa.string()), ("text", pa.string()), ("embedding", pa.list_(pa.float32()))])), d / f"p{p}.parquet")
    return str(d)


def read(out):
    return [r for p in sorted(out.glob("part-*.parquet")) for r in pq.read_table(p).to_pylist()]


def test_kmeans_finds_well_separated_clusters():
    rng = np.random.default_rng(3)
    centers = semantic.normalized(rng.normal(size=(5, 16)))
    x = semantic.normalized(np.repeat(centers, 40, axis=0) + rng.normal(scale=0.05, size=(200, 16)))
    labels = semantic.assign(x, semantic.kmeans(x, 5, seed=0))
    truth = np.repeat(np.arange(5), 40)
    # the same partition, whatever the cluster numbers
    assert len({(a, b) for a, b in zip(truth, labels)}) == 5 and len(set(labels)) == 5


def test_cluster_edges_are_the_pairs_above_the_threshold():
    x = semantic.normalized(np.array([[1, 0], [0.999, 0.045], [0, 1], [0.02, 1], [-1, 0]], dtype=np.float32))
    docs = np.array([10, 11, 12, 13, 14])
    edges = semantic.cluster_edges(x, docs, eps=0.01)
    assert sorted(map(tuple, edges.tolist())) == [(10, 11), (12, 13)]
    assert len(semantic.cluster_edges(x, docs, eps=1e-9)) == 0
    # brute force on random vectors, across the block boundary
    rng = np.random.default_rng(0)
    y = semantic.normalized(rng.normal(size=(300, 4)))
    semantic_block, semantic.BLOCK = semantic.BLOCK, 64
    try:
        got = {tuple(e) for e in semantic.cluster_edges(y, np.arange(300), 0.05).tolist()}
    finally:
        semantic.BLOCK = semantic_block
    sim = y @ y.T
    want = {(i, j) for i in range(300) for j in range(i + 1, 300) if sim[i, j] > 0.95}
    assert got == want and want


def test_normalized_handles_zero_and_non_finite_rows():
    x = semantic.normalized(np.array([[3, 4], [0, 0], [np.nan, 1], [np.inf, 1]], dtype=np.float32))
    assert np.allclose(x[0], [0.6, 0.8]) and not x[1].any() and np.isfinite(x).all()


@pytest.mark.parametrize("clusters", [0, 4, 12])
def test_each_group_of_near_copies_keeps_one(tmp_path, clusters):
    vectors, group = groups_of_copies()
    src = write(tmp_path, vectors)
    m = run_dedup([src], str(tmp_path / "o"), DedupConfig(semantic=True, eps=0.01, clusters=clusters, keep_rejected=True), RunOptions(workers=1))
    kept = {int(r["id"][1:]) for r in read(tmp_path / "o")}
    for g in range(12):
        members = [i for i, x in enumerate(group) if x == g]
        # k-means may split a group only if it put near-copies in different clusters: with these
        # gaps it does not, so exactly one survives, the first (the default survivor rule)
        assert [i for i in members if i in kept] == [min(members)], (g, clusters)
    assert all(i in kept for i, x in enumerate(group) if x == -1)
    assert m.counts["removed"]["semantic"]["docs"] == 12 * 5
    assert sum(m.counts["semantic"]["kmeans_clusters"].values()) == (clusters or 1)


def test_keep_centroid_and_worker_counts(tmp_path):
    vectors, group = groups_of_copies(seed=1)
    src = write(tmp_path, vectors, parts=3)
    cfg = DedupConfig(semantic=True, eps=0.01, clusters=12, keep="centroid", keep_work=True)
    run_dedup([src], str(tmp_path / "a"), cfg, RunOptions(workers=1))
    run_dedup([src], str(tmp_path / "b"), cfg, RunOptions(workers=2))
    a, b = read(tmp_path / "a"), read(tmp_path / "b")
    assert a == b
    kept = {int(r["id"][1:]) for r in a}
    with np.load(tmp_path / "a" / "_work" / "semantic" / "kmeans.npz") as z:
        near = z["near"]  # each document's cosine to its k-means centroid, documents in input order
    not_first = 0
    for g in range(12):
        members = [i for i, v in enumerate(group) if v == g]
        survivors = [i for i in members if i in kept]
        assert survivors == [max(members, key=lambda i: float(near[i]))]
        not_first += survivors != [min(members)]
    assert not_first >= 6  # the rule decides: most survivors are not the first copy


def test_null_embeddings_are_never_duplicates(tmp_path):
    v = [1.0] * 8
    src = write(tmp_path, [v, v, None, None], parts=1)
    m = run_dedup([src], str(tmp_path / "o"), DedupConfig(semantic=True, clusters=1), RunOptions(workers=1))
    assert [r["id"] for r in read(tmp_path / "o")] == ["d0", "d2", "d3"] and m.counts["removed"]["semantic"]["docs"] == 1


def test_bad_inputs_are_one_line_errors(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    pq.write_table(pa.table({"id": ["a"], "text": ["no embedding here"]}), plain / "p.parquet")
    p = llmctl("dedup", plain, "-o", tmp_path / "o", "--semantic")
    assert p.returncode == 2 and b"lacks" in p.stderr and len(p.stderr.decode().strip().splitlines()) == 1, p.stderr
    for flags, message in ((["--eps", "0"], b"--eps"), (["--eps", "1.5"], b"--eps"), (["--keep", "centroid", "--exact"], b"centroid")):
        p = llmctl("dedup", plain, "-o", tmp_path / "x", *flags, *(["--semantic"] if "--exact" not in flags else []))
        assert p.returncode == 2 and message in p.stderr and len(p.stderr.decode().strip().splitlines()) == 1, p.stderr
    with pytest.raises(StageFailed, match="different lengths"):
        run_dedup([write(tmp_path, [[1.0, 0.0], [1.0, 0.0, 0.0]], parts=1, name="ragged")], str(tmp_path / "r"), DedupConfig(semantic=True), RunOptions(workers=1))
