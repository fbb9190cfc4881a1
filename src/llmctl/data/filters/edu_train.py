"""`llmctl filter train-classifier --regression`: FineWeb-Edu's classifier from scored documents.

Input: documents with a numeric label column (`score` by default: what `llmctl annotate` writes,
and the column of the published FineWeb-Edu annotations). Each labelled document is embedded by
the chosen embedder (data/embedders.py), a seeded share is held out, the linear head is fitted on
the rest (regression.py: ridge, closed form) and measured on the held-out part: MSE, Spearman,
precision/recall/F1 of int_score >= threshold and the confusion matrix, next to the MSE of always
predicting the training mean (a head that does not beat it learned nothing). Output: OUT/head.json
(edu.py) and the manifest (kind "classifier").

Rows left out are counted, never guessed: a null or empty text (`empty`), a null label
(`unlabelled`: annotate's unparseable answers), a label that is NaN or infinite (`non_finite`).
A label column that is not numbers is a one-line error.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from llmctl.artifacts.docs import STDIO, open_docs_inputs
from llmctl.artifacts.lock import output_lock
from llmctl.artifacts.manifest import Manifest, error_place, input_ref, output_entry, read_manifest, write_manifest
from llmctl.artifacts.rerun import claim_out, run_identity, running
from llmctl.bounds import usable_cores
from llmctl.data.embedders import Embedder, open_embedder, torch_threads
from llmctl.data.filters.edu import HEAD_FILE, RegressionHead
from llmctl.data.filters.regression import choose_ridge, fit_head, report
from llmctl.errors import UsageError
from llmctl.runtime.progress import Progress


@dataclass
class TrainRegressionConfig:
    labels: str = "score"  # the label column (annotate's, and FineWeb-Edu's)
    embedder: str = "minilm"  # minilm | sentence-transformers:MODEL | llmctl:CKPT
    threshold: int = 3  # FineWeb-Edu: keep int_score >= 3; the F1 in the report is at it
    holdout: float = 0.1  # FineWeb-Edu held out 45k of its 450k annotations
    seed: int = 0
    max_docs: int | None = None  # a seeded uniform sample of the labelled documents when there are more
    batch_size: int = 32
    ridge: float | None = None  # None: chosen by 5-fold cross-validation on the training part (regression.py)
    overwrite: bool = False

    def validate(self) -> None:
        if not self.labels or self.labels == "text":
            raise UsageError(f"--labels must name a numeric column other than text, got {self.labels!r}")
        if not 0.0 < self.holdout < 1.0:
            raise UsageError(f"--holdout must be in (0, 1), got {self.holdout}")
        if self.max_docs is not None and self.max_docs < 2:
            raise UsageError(f"--max-docs must be at least 2, got {self.max_docs}")
        if self.seed < 0 or self.batch_size < 1 or (self.ridge is not None and not self.ridge >= 0):
            raise UsageError("--seed must be >= 0, the batch size >= 1 and the ridge >= 0")


def label_values(column: pa.Array, name: str, where: str) -> list:
    """A label column as Python numbers (None where null); anything but numbers is refused."""
    t = column.type
    if pa.types.is_dictionary(t):
        t = t.value_type
    if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t) or pa.types.is_null(t)):
        raise UsageError(f"{where}: the label column {name!r} holds {t}, not numbers")
    return column.to_pylist()


def labelled(paths: list[str], col: str, counts: dict, progress: Progress) -> Iterator[tuple[str, float]]:
    """(text, label) for every usable row, in input order; the rest counted in `counts`."""
    docs = open_docs_inputs(paths)
    if docs.schema.get_field_index(col) < 0:
        raise UsageError(f"the inputs have no column {col!r} (columns: {', '.join(docs.schema.names)}); "
                         "name the label column with --labels")
    for batch in docs.batches:
        texts = batch.column("text").to_pylist()
        for text, y in zip(texts, label_values(batch.column(col), col, ", ".join(paths))):
            counts["in"] += 1
            if not text:
                counts["empty"] += 1
            elif y is None:
                counts["unlabelled"] += 1
            elif not np.isfinite(float(y)):
                counts["non_finite"] += 1
            else:
                yield text, float(y)
        progress.advance(batch.num_rows)
    counts["errors"] = docs.log.errors
    for e in docs.log.errors:
        progress.log(f"filter train-classifier: skipped damage in {error_place(e)}: {e['error']}")


def sample(rows: Iterator[tuple[str, float]], k: int | None, rng: random.Random) -> Iterator[tuple[str, float]] | list:
    """All rows (streamed), or a uniform sample of k kept in memory (Algorithm R)."""
    if k is None:
        return rows
    kept: list[tuple[str, float]] = []
    for seen, row in enumerate(rows, 1):
        if len(kept) < k:
            kept.append(row)
        elif (j := rng.randrange(seen)) < k:
            kept[j] = row
    return kept


def embed_rows(rows, embedder: Embedder, batch_size: int, threads: int, progress: Progress) -> tuple[np.ndarray, np.ndarray, int]:
    """(vectors, labels, documents truncated by the embedder), torch on `threads` threads."""
    parts, ys, cut, batch = [], [], 0, []

    def flush():
        nonlocal cut
        vectors, truncated = embedder.embed([t for t, _ in batch])
        parts.append(vectors.astype(np.float32))
        ys.extend(y for _, y in batch)
        cut += sum(truncated)
        batch.clear()

    with torch_threads(threads):
        for row in rows:
            batch.append(row)
            if len(batch) == batch_size:
                flush()
        if batch:
            flush()
    x = np.concatenate(parts) if parts else np.zeros((0, embedder.dim), np.float32)
    return x, np.asarray(ys, np.float64), cut


def train_regression(inputs: list[str], out: str, cfg: TrainRegressionConfig, progress: Progress | None = None,
                     embedder: Embedder | None = None, threads: int | None = None) -> Manifest:
    """Train a FineWeb-Edu-style head on the labelled documents of `inputs` into OUT. `embedder`:
    the one cfg.embedder names, when the caller made it (llmctl.model.embed for a checkpoint).
    `threads`: torch's while embedding, every core by default; a caller that forks workers
    afterwards passes 1 (data/embedders.py: a fork after a multi-threaded OpenMP region hangs)."""
    progress = progress or Progress()
    cfg.validate()
    if not inputs:
        raise UsageError("train-classifier --regression needs labelled DOCS (a `score` column, or name one with --labels)")
    if out == STDIO:
        raise UsageError("train-classifier writes a directory; -o - is not possible")
    embedder = embedder or open_embedder(cfg.embedder)
    if embedder.name != cfg.embedder:
        raise UsageError(f"the embedder given ({embedder.name}) is not the config's ({cfg.embedder})")
    refs = [{**input_ref(p), "role": "labelled"} for p in inputs]
    config = {**{k: v for k, v in asdict(cfg).items() if k != "overwrite"}, "embedder_weights_sha256": embedder.weights_sha256}
    ident = run_identity("filter train-classifier", config, refs)
    with output_lock(out):
        if claim_out(out, ident, cfg.overwrite, own=(HEAD_FILE,)):
            progress.log(f"filter train-classifier: {out} already holds this head; nothing to do")
            return read_manifest(out)
        with running(out):
            return _fit(inputs, out, cfg, embedder, refs, progress, threads or usable_cores())


def _fit(inputs: list[str], out: str, cfg: TrainRegressionConfig, embedder: Embedder, refs: list[dict], progress: Progress,
         threads: int) -> Manifest:
    t0 = time.perf_counter()
    embedder = embedder.prepare()
    counts: dict = {"in": 0, "empty": 0, "unlabelled": 0, "non_finite": 0}
    progress.start(None, "docs", f"embed with {embedder.name}")
    rows = sample(labelled(inputs, cfg.labels, counts, progress), cfg.max_docs, random.Random(f"{cfg.seed}/sample"))
    x, y, truncated = embed_rows(rows, embedder, cfg.batch_size, threads, progress)
    progress.finish()
    if len(y) < 2:
        raise UsageError(f"{len(y)} labelled document(s) with text in {', '.join(inputs)}; at least 2 are needed (one to train, one to test)")

    order = np.random.default_rng(cfg.seed).permutation(len(y))
    n_hold = min(len(y) - 1, max(1, round(cfg.holdout * len(y))))
    hold, train = order[:n_hold], order[n_hold:]
    ridge, cv = (cfg.ridge, {}) if cfg.ridge is not None else choose_ridge(x[train], y[train], seed=cfg.seed)
    w, b = fit_head(x[train], y[train], ridge)
    head = RegressionHead(w, b, embedder.identity(), cfg.threshold, cfg.labels)
    heldout = report(head.predict(x[hold]), y[hold], cfg.threshold)
    heldout["baseline_mse"] = round(float(((y[hold] - y[train].mean()) ** 2).mean()), 4)  # always the training mean
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    head.save(out_dir / HEAD_FILE)

    errors = counts.pop("errors", [])
    labels, n = np.unique(y, return_counts=True)
    counts.update({"used": len(y), "train": len(train), "holdout": len(hold), "truncated": truncated, "errors": len(errors),
                   "labels": {f"{v:g}": int(c) for v, c in zip(labels, n)}, "ridge": ridge, "ridge_cv_mse": cv,
                   "train_fit": report(head.predict(x[train]), y[train], cfg.threshold), "heldout": heldout})
    manifest = Manifest(
        kind="classifier",
        stage="filter train-classifier",
        config={**asdict(cfg), "regression": True, **embedder.identity()},
        inputs=refs,
        outputs=[output_entry(out_dir / HEAD_FILE, None, out_dir)],
        counts=counts,
        errors=errors,
        wall_seconds=round(time.perf_counter() - t0, 3),
    )
    write_manifest(out_dir, manifest)
    progress.log(f"held out {len(hold)} documents: MSE {heldout['mse']} (always the mean: {heldout['baseline_mse']}), "
                 f"Spearman {heldout['spearman']}, F1 {heldout['f1']} at int_score >= {cfg.threshold}")
    return manifest


__all__ = ["TrainRegressionConfig", "train_regression"]
