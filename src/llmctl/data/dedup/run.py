"""dedup: URL, exact, line and MinHash deduplication in phases that scale past memory.

Spec 001-data-eval §A5 gives the order (URL first, then exact, lines, MinHash on word 5-grams
near J = 0.7-0.8) and FineWeb's banding (112 hashes = 14 bands x 8 rows). The work runs as
phases, each persisted under OUT/_work/ and resumable:

1. sign      one task per input file: keys per document (normalized URL hash, normalized text
             hash, MinHash band keys, line hashes) -> _work/sign/NNNNN.npz
2. pairs     one task per (key family, hash partition): sort the keys, every run of equal keys
             becomes edges to its first document -> _work/pairs/FAMILY-P.npy. Memory is one
             partition: more `partitions` = less memory.
3. clusters  union-find over all edges, one survivor per cluster by the survivor rule, which
             method removed each document -> _work/clusters/NNNNN.npz per input file; frequent
             lines and the size histogram -> _work/clusters.npz
   spans     --substring / --sentences: what to cut from the survivors (spans.py)
4. filter    (apply.py) one task per input file, through the usual sharded driver: kept rows get
             dup_cluster_id (the survivor's id) and dup_cluster_size, and the span methods' cuts
             (removed_spans); removed rows go to rejected/ with dup_of.

Document numbers are global (input order), so results are identical whatever --workers.
"""

from __future__ import annotations

import shutil
import time
import dataclasses
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from llmctl.artifacts.docs import DocsSource, STDIO, read_source, resolve_docs_inputs, row_count, source_schema
from llmctl.artifacts.lock import output_lock
from llmctl.artifacts.manifest import Manifest, input_ref, read_manifest
from llmctl.data.dedup.clusters import components, size_histogram, sizes, survivors
from llmctl.data.dedup.minhash import MinHasher, Shingler, Words, s_curve, threshold
from llmctl.data.dedup.normalize import normalize_url, normalized_codes
from llmctl.data.dedup.apply import Filter
from llmctl.data.dedup.config import METHODS, STAGE, DedupConfig, rank
from llmctl.data.dedup import semantic
from llmctl.data.dedup.workfiles import save_npy, save_npz
from llmctl.data.dedup.spans import sentences_phase, substring_phase, trim_top, unit_sources
from llmctl.hashing import h64
from llmctl.errors import StageFailed, UsageError
from llmctl.runtime.executor import Task, run_tasks
from llmctl.runtime.progress import Progress
from llmctl.runtime.options import RunOptions
from llmctl.artifacts.rerun import run_identity
from llmctl.runtime.sharded import prepare_out, run_sharded
from llmctl.runtime.stage import stage_run

S_CURVE_J = (0.3, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)


# ---------------------------------------------------------------------------------------------
# Phase 1: keys per document


CHUNK_CHARS = 1 << 17  # texts hashed together: enough to amortize numpy's calls, few enough for cache (measured)


def text_chunks(texts: list[str]) -> list[tuple[int, int]]:
    """[lo, hi) ranges of texts with about CHUNK_CHARS characters each (at least one text)."""
    ends = np.cumsum([len(t) for t in texts])
    bounds, lo = [], 0
    while lo < len(texts):
        hi = max(int(np.searchsorted(ends, (ends[lo - 1] if lo else 0) + CHUNK_CHARS, side="right")), lo + 1)
        bounds.append((lo, hi))
        lo = hi
    return bounds


def _text_keys(texts: list[str], cfg: DedupConfig, shingler: Shingler, hasher: MinHasher) -> dict[str, np.ndarray]:
    """The keys of one batch that come from its normalized words, chunk by chunk in numpy, as cfg
    asks: "exact" (the whole text), "bands" (MinHash band keys), "empty" (no words at all)."""
    parts: dict[str, list] = {"exact": [], "sigs": [], "empty": []}
    for lo, hi in text_chunks(texts):
        words = Words.of(*normalized_codes(texts[lo:hi]))
        if cfg.exact:
            parts["exact"].append(words.text_keys())
        if cfg.minhash:
            parts["sigs"].append(hasher.signatures(*shingler.shingles(words)))
            parts["empty"].append(words.counts() == 0)
    out = {k: np.concatenate(v) for k, v in parts.items() if v}
    if "sigs" in out:
        out["bands"] = hasher.band_keys(out.pop("sigs"))
    return out


@dataclass
class _Sign:
    cfg: DedupConfig
    work: Path

    def __call__(self, task: Task, report) -> dict:
        path = self.work / "sign" / f"{task.index:05d}.npz"
        if path.exists():
            report(task.weight)
            return {}
        cfg, source, first = self.cfg, DocsSource(**task.payload["source"]), task.payload["first"]
        shingler, hasher = Shingler(cfg.ngram), MinHasher(cfg.bands, cfg.rows, cfg.seed)
        ids, ranks, chars, url_keys, line_keys = [], [], [], [], []
        hashed = {"exact": [np.zeros(0, np.uint64)], "bands": [np.zeros((0, cfg.bands), np.uint64)], "empty": [np.zeros(0, bool)]}
        # the columns the keys and the survivor rule read, besides id and text
        columns = ["url"] * cfg.url + ["date"] * (cfg.keep == "earliest") + [cfg.keep[4:]] * cfg.keep.startswith("max:") + ["embedding"] * cfg.semantic
        embeddings = []
        # the reader's skips here are the filter phase's too (same file, same rules): counted there
        for batch in read_source(source, columns=columns, skip_empty=True):
            texts = [t or "" for t in batch.column("text").to_pylist()]
            ids += batch.column("id").to_pylist()
            chars += map(len, texts)
            if cfg.semantic:
                embeddings.append(_embeddings(batch))
            if cfg.keep in ("first", "centroid"):  # every rank equal (centroid's come later): no need to look at the rows
                ranks += [0.0] * len(texts)
            else:
                ranks += [rank(row, cfg.keep) for row in batch.to_pylist()]
            if cfg.url:
                urls = batch.column("url").to_pylist() if "url" in batch.schema.names else [None] * len(texts)
                # a document without a URL never matches another by URL
                url_keys += [h64(normalize_url(u)) if u else h64(f"\0no-url\0{first + len(url_keys) + i}") for i, u in enumerate(urls)]
            if cfg.exact or cfg.minhash:
                for key, values in _text_keys(texts, cfg, shingler, hasher).items():
                    hashed[key].append(values)
            if cfg.lines:
                line_keys += [h64(ln.strip()) for text in texts for ln in text.split("\n") if ln.strip()]
            report(batch.num_rows)
        n = len(ids)
        arrays = {"ids": np.array(ids, dtype=object).astype(str) if n else np.array([], dtype=str), "rank": np.array(ranks, dtype=np.float64), "chars": np.array(chars, dtype=np.int64)}
        if cfg.url:
            arrays["url"] = np.array(url_keys, dtype=np.uint64)
        if cfg.exact:
            arrays["exact"] = np.concatenate(hashed["exact"])
        if cfg.minhash:
            arrays["bands"] = np.concatenate(hashed["bands"])
            # documents with no words at all must not all collide on the empty signature
            for i in np.flatnonzero(np.concatenate(hashed["empty"])):
                arrays["bands"][i] = [h64(f"\0empty\0{first + i}\0{b}") for b in range(cfg.bands)]
        if cfg.lines:
            arrays["lines"] = np.array(line_keys, dtype=np.uint64)
        if cfg.semantic:  # before the sign file, which marks the task done
            emb = np.concatenate(embeddings) if embeddings else np.zeros((0, 1), np.float32)
            save_npy(self.work / "semantic" / f"{task.index:05d}.npy", semantic.normalized(emb))
        save_npz(path, **arrays)
        return {}


def _embeddings(batch) -> np.ndarray:
    """The batch's embedding column as a float32 matrix; a null embedding is a zero row."""
    col = batch.column("embedding").to_pylist()
    dim = next((len(v) for v in col if v is not None), 0)
    if any(v is not None and len(v) != dim for v in col):
        raise UsageError("--semantic: the embedding column holds vectors of different lengths")
    return np.array([v if v is not None else [0.0] * dim for v in col], dtype=np.float32).reshape(len(col), dim)


# ---------------------------------------------------------------------------------------------
# Phase 2: candidate pairs per (family, partition)


def families(cfg: DedupConfig) -> list[tuple[str, int | None]]:
    fam: list[tuple[str, int | None]] = []
    if cfg.url:
        fam.append(("url", None))
    if cfg.exact:
        fam.append(("exact", None))
    if cfg.minhash:
        fam += [("minhash", b) for b in range(cfg.bands)]
    return fam


def edges_of_equal_keys(keys: np.ndarray, docs: np.ndarray) -> np.ndarray:
    """Every run of equal keys -> edges (first doc of the run, each other doc of the run)."""
    if len(keys) < 2:
        return np.zeros((0, 2), np.int64)
    order = np.lexsort((docs, keys))
    k, d = keys[order], docs[order]
    new_run = np.ones(len(k), dtype=bool)
    new_run[1:] = k[1:] != k[:-1]
    head = np.maximum.accumulate(np.where(new_run, np.arange(len(k)), 0))
    dup = ~new_run
    return np.stack([d[head[dup]], d[dup]], axis=1).astype(np.int64)


@dataclass
class _Pairs:
    cfg: DedupConfig
    work: Path
    n_shards: int
    firsts: list[int]

    def __call__(self, task: Task, report) -> dict:
        family, band, part = task.payload["family"], task.payload["band"], task.payload["part"]
        path = self.work / "pairs" / f"{task.name}.npy"
        if not path.exists():
            keys, docs = [], []
            for i in range(self.n_shards):
                with np.load(self.work / "sign" / f"{i:05d}.npz") as z:
                    col = z["bands"][:, band] if family == "minhash" else z[family]
                mine = (col % np.uint64(self.cfg.partitions)) == part if self.cfg.partitions > 1 else slice(None)
                keys.append(col[mine])
                docs.append((np.arange(len(col), dtype=np.int64) + self.firsts[i])[mine])
            keys_all = np.concatenate(keys) if keys else np.zeros(0, np.uint64)
            docs_all = np.concatenate(docs) if docs else np.zeros(0, np.int64)
            save_npy(path, edges_of_equal_keys(keys_all, docs_all))
        report(1)
        return {}


# ---------------------------------------------------------------------------------------------
# Phase 3: clusters


def build_clusters(cfg: DedupConfig, work: Path, counts: list[int], pair_tasks: list[Task]) -> None:
    """Union-find over every edge; then one slice per input file (what its filter task needs)
    under _work/clusters/, and _work/clusters.npz (frequent lines, size histogram) last, which
    marks the phase done."""
    path = work / "clusters.npz"
    if path.exists():
        return
    n_shards = len(counts)
    ids, ranks, chars = [], [], []
    for i in range(n_shards):
        with np.load(work / "sign" / f"{i:05d}.npz") as z:
            ids.append(z["ids"])
            ranks.append(z["rank"])
            chars.append(z["chars"])
    ids_all = np.concatenate(ids) if ids else np.array([], dtype=str)
    n = len(ids_all)
    rank = np.concatenate(ranks) if ranks else np.zeros(0)
    if cfg.keep == "centroid":  # SemDeDup's survivor: the one nearest its k-means centroid
        with np.load(work / "semantic" / "kmeans.npz") as z:
            rank = -z["near"].astype(np.float64)
    by_method = {m: [] for m in METHODS}
    for t in pair_tasks:
        by_method[t.payload["family"]].append(np.load(work / "pairs" / f"{t.name}.npy"))
    method_edges = {m: (np.concatenate(v) if v else np.zeros((0, 2), np.int64)) for m, v in by_method.items()}
    labels = components(n, np.concatenate(list(method_edges.values())))
    survivor = survivors(labels, rank) if n else np.zeros(0, np.int64)
    size = sizes(labels) if n else np.zeros(0, np.int64)
    # A removal's reason: the cheapest methods that already connect it to its survivor (edges of
    # METHODS[:k+1]); a chain that needs MinHash counts as MinHash.
    removed_by = np.zeros(n, dtype=np.int8)  # 0 kept, else 1 + index in METHODS
    pending = survivor != np.arange(n)
    for k in range(len(METHODS)):
        cheap = [method_edges[m] for m in METHODS[: k + 1]]
        comp = components(n, np.concatenate(cheap))
        done = pending & (comp == comp[survivor])
        removed_by[done] = k + 1
        pending &= ~done
    frequent = np.zeros(0, np.uint64)
    if cfg.lines:
        frequent = frequent_lines(work, n_shards, cfg)
    (work / "clusters").mkdir(exist_ok=True)
    survivor_ids = ids_all[survivor] if n else ids_all
    start = 0
    for i, c in enumerate(counts):
        sl = slice(start, start + c)
        save_npz(work / "clusters" / f"{i:05d}.npz", size=size[sl], removed_by=removed_by[sl], survivor_ids=survivor_ids[sl])
        start += c
    hist = size_histogram(size, survivor) if n else {}
    save_npz(path, frequent=frequent, hist_names=np.array(list(hist), dtype=str), hist_counts=np.array(list(hist.values()), dtype=np.int64))


def frequent_lines(work: Path, n_shards: int, cfg: DedupConfig) -> np.ndarray:
    """Line hashes seen more than max_line_count times, counted one hash partition at a time."""
    out = []
    for part in range(cfg.partitions):
        chunks = []
        for i in range(n_shards):
            with np.load(work / "sign" / f"{i:05d}.npz") as z:
                h = z["lines"]
            chunks.append(h[(h % np.uint64(cfg.partitions)) == part] if cfg.partitions > 1 else h)
        allh = np.concatenate(chunks) if chunks else np.zeros(0, np.uint64)
        if len(allh):
            uniq, counts = np.unique(allh, return_counts=True)
            out.append(uniq[counts > cfg.max_line_count])
    return np.sort(np.concatenate(out)) if out else np.zeros(0, np.uint64)


# ---------------------------------------------------------------------------------------------
# Phase 4: filter (apply.py)


# ---------------------------------------------------------------------------------------------
# The stage


def run_dedup(inputs: list[str], out: str, cfg: DedupConfig, opts: RunOptions | None = None, progress: Progress | None = None) -> Manifest:
    """Its four phases under one lock on OUT (run_sharded's, for the last phase, is the same lock)."""
    with output_lock(out):
        return _run_dedup(inputs, out, cfg, opts, progress)


def _run_dedup(inputs: list[str], out: str, cfg: DedupConfig, opts: RunOptions | None, progress: Progress | None) -> Manifest:
    cfg.check()
    t0 = time.perf_counter()
    opts = opts or RunOptions()
    progress = progress or Progress()
    config = asdict(cfg)
    streaming = out == STDIO
    # one executor scope for all four phases: one Ray connection, and a library caller's
    # --executor reaches the sign and pairs phases too
    with stage_run(opts, "llmctl-dedup-") as run:
        sources, refs = run.read_inputs(inputs)
        # --reference files: checked before OUT is claimed, and named (by content) in the run's
        # identity and the manifest's inputs, so a changed reference is a changed run
        references = _references(cfg)
        if cfg.semantic:
            missing = [s.path for s, schema in zip(sources, map(source_schema, sources)) if schema is not None and "embedding" not in schema.names]
            if missing:
                raise UsageError(f"--semantic reads the embedding column, which {missing[0]} lacks (make it with llmctl embed)")
        refs = refs + [{**input_ref(r), "role": "reference"} for r in cfg.reference]
        # rows before reading (the sign phase's weights, and disjoint document numbers for its
        # keys); the rows each file gives once damaged and text-less ones are left out are known
        # after it, and number the documents from then on
        estimates = [row_count(s) for s in sources]
        firsts = _firsts(estimates)
        work = run.tmp / "_work" if streaming else Path(out) / "_work"
        if not streaming:
            prepare_out(Path(out), STAGE, run_identity(STAGE, config, refs), opts.overwrite)
            if (Path(out) / "manifest.json").exists():  # finished before, same config: nothing to do
                _drop_work(work, cfg)  # but what a kill right after the manifest left behind
                return read_manifest(out)
        for sub in ("sign", "pairs") + ("semantic",) * cfg.semantic:
            (work / sub).mkdir(parents=True, exist_ok=True)

        sign_tasks = run.tasks(name=lambda i: f"sign-{i:05d}", payload=lambda i, s: {"source": asdict(s), "first": firsts[i]}, weights=estimates)
        progress.start(sum(estimates), "docs", "dedup: sign")
        _phase(run_tasks(_Sign(cfg, work), sign_tasks, workers=opts.workers, progress=progress), "sign")
        progress.finish()
        counts = []
        for i in range(len(sources)):
            with np.load(work / "sign" / f"{i:05d}.npz") as z:
                counts.append(len(z["rank"]))
        firsts = _firsts(counts)

        fams = families(cfg)
        pair_tasks = [
            Task(k, f"{fam}{'' if band is None else f'-b{band:02d}'}-p{part:03d}", {"family": fam, "band": band, "part": part})
            for k, ((fam, band), part) in enumerate((f, p) for f in fams for p in range(cfg.partitions))
        ]
        progress.start(len(pair_tasks), "", "dedup: pairs")
        _phase(run_tasks(_Pairs(cfg, work, len(sources), firsts), pair_tasks, workers=opts.workers, progress=progress), "pairs")
        progress.finish()

        if cfg.semantic:
            pair_tasks += _semantic_phase(cfg, work, counts, opts, progress)
        build_clusters(cfg, work, counts, pair_tasks)
        if cfg.substring:
            substring_phase(cfg, work, unit_sources(sources, references), opts.workers, progress, _phase)
        if cfg.sentences:
            sentences_phase(cfg, work, unit_sources(sources, references), opts.workers, progress, _phase)

        filter_tasks = run.tasks(payload=lambda i, s: {"source": asdict(s), "first": firsts[i], "work": str(work), "n_refs": len(references)}, weights=counts)

        def finish(manifest: Manifest) -> None:  # in the manifest's one write, so a kill cannot split them
            manifest.counts.update(_report(cfg, work, counts))
            trim_top(manifest.counts)
            manifest.wall_seconds = round(time.perf_counter() - t0, 3)  # all four phases

        manifest = run_sharded(
            stage=STAGE,
            kind="docs",
            out=out,
            tasks=filter_tasks,
            fn=Filter(cfg),
            config=config,
            inputs=refs,
            opts=dataclasses.replace(opts, overwrite=False, shard_index=0, num_shards=1),  # OUT was prepared above
            progress=progress,
            unit="docs",
            finish=finish,
        )
        if not streaming and (Path(out) / "manifest.json").exists():
            _drop_work(work, cfg)
        return manifest


def _semantic_phase(cfg: DedupConfig, work: Path, counts: list[int], opts: RunOptions, progress: Progress) -> list[Task]:
    """k-means over every embedding (here), then one pair task per group of clusters."""
    embeddings = [np.load(work / "semantic" / f"{i:05d}.npy") for i in range(len(counts))]
    dims = {e.shape[1] for e in embeddings if len(e)}
    if len(dims) > 1:
        raise UsageError(f"--semantic: the input files' embeddings have different lengths ({sorted(dims)})")
    semantic.fit(work, [e for e in embeddings if len(e)] if dims else [], cfg.clusters or None, cfg.seed)
    del embeddings
    tasks = [Task(g, f"semantic-g{g:04d}", {"family": "semantic", "clusters": cl})
             for g, cl in enumerate(semantic.groups(work, 4 * max(1, opts.workers or 1)))]
    progress.start(len(tasks), "", "dedup: semantic pairs")
    _phase(run_tasks(semantic.Pairs(work, cfg.eps, len(counts)), tasks, workers=opts.workers, progress=progress), "semantic pairs")
    progress.finish()
    return tasks


def _references(cfg: DedupConfig) -> list[DocsSource]:
    refs = resolve_docs_inputs(cfg.reference) if cfg.reference else []
    bad = [r for r in refs if r.problem is not None]
    if bad:
        raise UsageError(f"--reference {bad[0].path}: {bad[0].problem}")
    return refs


def _drop_work(work: Path, cfg: DedupConfig) -> None:
    """The phases' files go once the manifest is written (a re-run after a kill half-way through
    removing them removes the rest), unless --keep-work asks to inspect them."""
    if not cfg.keep_work:
        shutil.rmtree(work, ignore_errors=True)


def _firsts(counts: list[int]) -> list[int]:
    """The global number of each file's first document."""
    return [int(x) for x in np.concatenate(([0], np.cumsum(counts)[:-1]))] if counts else []


def _phase(results, name: str) -> None:
    failed = [r for r in results if not r.ok]
    if failed:
        raise StageFailed(f"dedup {name} phase: {failed[0].name} failed: {failed[0].error}; finished work is kept, re-run to resume")


def _report(cfg: DedupConfig, work: Path, counts: list[int]) -> dict:
    """S-curve of the banding, cluster-size histogram (for the manifest and the summary)."""
    rep: dict = {}
    if cfg.minhash:
        rep["s_curve"] = {"bands": cfg.bands, "rows": cfg.rows, "threshold": round(threshold(cfg.bands, cfg.rows), 4), "p_flag": {str(j): round(float(s_curve(j, cfg.bands, cfg.rows)), 4) for j in S_CURVE_J}}
    with np.load(work / "clusters.npz") as z:
        rep["clusters"] = {str(k): int(v) for k, v in zip(z["hist_names"], z["hist_counts"])}
    if cfg.semantic:
        rep["semantic"] = {"eps": cfg.eps, "kmeans_clusters": semantic.cluster_sizes(work)}
    return rep
