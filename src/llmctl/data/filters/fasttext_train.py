"""`llmctl filter train-classifier`, the fastText way (DCLM; spec 001-data-eval §A4): positives
are a high-quality reference set, negatives a random sample of the crawl; held-out precision and
recall go into the manifest, and the manifest's inputs (with their roles) link the model to its
training data. The `classifier` step (classifier.py) applies the model.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from llmctl.artifacts.docs import STDIO, open_docs_inputs
from llmctl.artifacts.atomic import temp_name
from llmctl.artifacts.lock import output_lock
from llmctl.artifacts.manifest import Manifest, error_place, input_ref, output_entry, read_manifest, write_manifest
from llmctl.artifacts.rerun import claim_out, run_identity, running
from llmctl.data.filters.classifier import MODEL_FILE, one_line, score_texts
from llmctl.errors import StageFailed, UsageError
from llmctl.runtime.progress import Progress

NEGATIVE_LABEL = "lq"

@dataclass
class TrainClassifierConfig:
    """fastText settings of DCLM's quality classifiers (bigrams, dim 256, lr 0.1, 3 epochs,
    minCount 3; fastText's default 2M hash buckets). Such a model is about 2 GB on disk
    ((words + bucket) x dim x 4 bytes); a smaller `bucket` or `dim` makes a smaller one."""

    dim: int = 256
    lr: float = 0.1
    epoch: int = 3
    word_ngrams: int = 2
    min_count: int = 3
    bucket: int = 2_000_000
    # fastText trains Hogwild: with more than one thread the result depends on scheduling.
    thread: int = 1
    holdout: float = 0.1  # share of each side held out for precision/recall
    seed: int = 0
    max_docs: int | None = None  # per side; a seeded uniform sample when a side has more
    label: str = "hq"
    overwrite: bool = False

    def validate(self) -> None:
        from llmctl.bounds import check_fits

        # fastText's input table: a row of `dim` floats for each hashed n-gram bucket (and word)
        check_fits(f"--bucket {self.bucket} x --dim {self.dim} (fastText's n-gram table)", 4 * self.bucket * self.dim)
        if not 0.0 < self.holdout < 1.0:
            raise UsageError(f"--holdout must be in (0, 1), got {self.holdout}")
        if self.max_docs is not None and self.max_docs < 2:
            raise UsageError(f"--max-docs must be at least 2, got {self.max_docs}")
        for name in ("dim", "epoch", "word_ngrams", "min_count", "thread"):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0 or self.seed < 0:
            raise UsageError(f"--lr must be > 0 and --seed >= 0, got {self.lr} and {self.seed}")
        if self.bucket < 1 and self.word_ngrams > 1:  # fastText hashes n-grams modulo bucket
            raise UsageError(f"--bucket must be >= 1 with --word-ngrams {self.word_ngrams}, got {self.bucket}")
        if not self.label or any(c.isspace() for c in self.label) or self.label == NEGATIVE_LABEL:
            raise UsageError(f"--label must be one word other than {NEGATIVE_LABEL!r}, got {self.label!r}")

    def fasttext_params(self) -> dict:
        return {
            "dim": self.dim,
            "lr": self.lr,
            "epoch": self.epoch,
            "wordNgrams": self.word_ngrams,
            "minCount": self.min_count,
            "bucket": self.bucket,
            "thread": self.thread,
            "seed": self.seed,
            "loss": "softmax",
            "verbose": 0,
        }


def read_side(paths: list[str], max_docs: int | None, rng: random.Random, progress: Progress) -> tuple[list[str], dict]:
    """One side's texts, one line each, in input order (or a uniform sample of `max_docs`,
    reservoir-sampled so memory stays at `max_docs` texts). Empty texts teach nothing: skipped."""
    docs = open_docs_inputs(paths)
    texts: list[str] = []
    seen = empty = 0
    for batch in docs.batches:
        for t in batch.column("text").to_pylist():
            line = one_line(t).strip() if t else ""
            if not line:
                empty += 1
                continue
            seen += 1
            if max_docs is None or len(texts) < max_docs:
                texts.append(line)
            else:  # Algorithm R: the seen-th text replaces a random slot with prob max_docs/seen
                j = rng.randrange(seen)
                if j < max_docs:
                    texts[j] = line
        progress.advance(batch.num_rows)
    for e in docs.log.errors:
        progress.log(f"filter train-classifier: skipped damage in {error_place(e)}: {e['error']}")
    return texts, {"in": seen + empty, "empty": empty, "used": len(texts), "errors": docs.log.errors}


def split_holdout(texts: list[str], share: float, rng: random.Random) -> tuple[list[str], list[str]]:
    """(train, holdout): a seeded shuffle, then round(share x n) held out (at least one each)."""
    order = list(range(len(texts)))
    rng.shuffle(order)
    n_hold = min(len(texts) - 1, max(1, round(share * len(texts))))
    return [texts[i] for i in order[n_hold:]], [texts[i] for i in order[:n_hold]]


# Training runs in a fresh interpreter whose allocations all come from fresh, zeroed pages.
# fastText's initializer (DenseMatrix::uniform) writes only thread/10 of the input matrix, and this
# build allocates the matrix with posix_memalign and never zeroes it, so the rest of it starts as
# whatever the memory held. Measured: MALLOC_PERTURB_ changes the trained model; a second identical
# train_supervised call in one process gave a different model or "Encountered NaN" about half the
# time, and a fresh process still failed on a small model whose matrix reused freed heap. With
# MALLOC_MMAP_THRESHOLD_=0 glibc serves every allocation from new mmap'd pages, which the kernel
# zeroes: byte-identical models run after run, at the same speed, for at most ~250 MB more resident
# memory (one page per small allocation, up to the kernel's map count).
_TRAIN_SCRIPT = """
import json, sys
from llmctl.runtime.lifeline import die_with_parent
a = json.loads(sys.argv[1])
die_with_parent(a["parent"])  # a killed llmctl leaves no training running on
import fasttext
fasttext.train_supervised(input=a["input"], **a["params"]).save_model(a["output"])
"""


def run_fasttext_training(train_file: Path, model_file: Path, params: dict) -> None:
    """Train in a child process (see above); raise StageFailed with fastText's own message."""
    arg = json.dumps({"input": str(train_file), "output": str(model_file), "params": params, "parent": os.getpid()})
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_PERTURB_"}  # it would fill those pages
    env["MALLOC_MMAP_THRESHOLD_"] = "0"
    proc = subprocess.run(
        [sys.executable, "-c", _TRAIN_SCRIPT, arg], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True
    )
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        last = lines[-1] if lines else f"exit status {proc.returncode}"
        hint = " (the training diverged: try a lower --lr)" if "NaN" in last else ""
        raise StageFailed(f"fastText training failed: {last}{hint}")


def holdout_metrics(pos_scores: list[float], neg_scores: list[float], threshold: float = 0.5) -> dict:
    """Precision, recall and F1 of the positive label at `threshold`, with the confusion counts.
    A ratio with a zero denominator is None (JSON null), not a made-up 0 or 1."""
    tp = sum(q >= threshold for q in pos_scores)
    fn = len(pos_scores) - tp
    fp = sum(q >= threshold for q in neg_scores)
    tn = len(neg_scores) - fp

    def div(a, b):
        return round(a / b, 6) if b else None

    precision, recall = div(tp, tp + fp), div(tp, tp + fn)
    f1 = div(2 * precision * recall, precision + recall) if precision and recall else None
    return {
        "threshold": threshold,
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "accuracy": div(tp + tn, tp + tn + fp + fn),
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "tn": tn,
    }


def train_classifier(
    positive: list[str],
    negative: list[str],
    out: str,
    cfg: TrainClassifierConfig,
    progress: Progress | None = None,
) -> Manifest:
    """Train a fastText quality classifier: `positive` docs (a high-quality reference set) against
    `negative` docs (a random crawl sample), the DCLM recipe. Writes OUT/model.bin and
    OUT/manifest.json (kind "classifier"); counts hold per-side sizes and held-out metrics."""
    if out == STDIO:
        raise UsageError("train-classifier writes a directory; -o - is not possible")
    with output_lock(out):
        return _train_classifier(positive, negative, out, cfg, progress)


def _train_classifier(positive: list[str], negative: list[str], out: str, cfg: TrainClassifierConfig,
                      progress: Progress | None) -> Manifest:
    progress = progress or Progress()
    t0 = time.perf_counter()
    cfg.validate()
    if not positive or not negative:
        raise UsageError("train-classifier needs --positive DOCS and --negative DOCS")
    if STDIO in positive and STDIO in negative:
        raise UsageError("only one of --positive/--negative can read stdin ('-')")
    if out == STDIO:
        raise UsageError("train-classifier writes a directory; -o - is not possible")
    refs = [{**input_ref(p), "role": "positive"} for p in positive]
    refs += [{**input_ref(p), "role": "negative"} for p in negative]
    config = {k: v for k, v in asdict(cfg).items() if k != "overwrite"}
    ident = run_identity("filter train-classifier", config, refs)  # each input with its side
    if claim_out(out, ident, cfg.overwrite, own=(MODEL_FILE, ".train-*")):  # written before the manifest; a killed run's scratch
        progress.log(f"filter train-classifier: {out} already holds this classifier; nothing to do")
        return read_manifest(out)
    with running(out):
        return _fit(positive, negative, out, cfg, refs, progress, t0)


def _fit(positive: list[str], negative: list[str], out: str, cfg: TrainClassifierConfig, refs: list[dict],
         progress: Progress, t0: float) -> Manifest:
    # One generator per purpose, each from the seed: the positives' sample never depends on how
    # many negatives there were, and a change in sampling never shifts the split.
    sides = {}
    for i, (role, paths) in enumerate((("positive", positive), ("negative", negative))):
        progress.start(None, "docs", f"read {role}s")
        texts, stats = read_side(paths, cfg.max_docs, random.Random(f"{cfg.seed}/sample/{i}"), progress)
        progress.finish()
        if len(texts) < 2:
            raise UsageError(f"--{role} has {len(texts)} non-empty document(s); at least 2 are needed (one to train, one to test)")
        train, hold = split_holdout(texts, cfg.holdout, random.Random(f"{cfg.seed}/split/{i}"))
        sides[role] = {"train": train, "holdout": hold, "stats": stats}

    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    labelled = [f"__label__{cfg.label} {t}" for t in sides["positive"]["train"]]
    labelled += [f"__label__{NEGATIVE_LABEL} {t}" for t in sides["negative"]["train"]]
    # SGD sees examples in file order; interleave the classes so neither comes all at the end.
    random.Random(f"{cfg.seed}/order").shuffle(labelled)
    model_file = out_dir / MODEL_FILE
    tmp_model = temp_name(model_file)  # renamed into place once the held-out metrics are computed
    with tempfile.TemporaryDirectory(prefix=".train-", dir=out_dir) as tmp:
        train_file = Path(tmp) / "train.txt"
        with open(train_file, "w", encoding="utf-8", errors="replace", newline="\n") as f:
            for line in labelled:
                f.write(line + "\n")
        progress.start(None, "", f"train fastText on {len(labelled)} documents")
        try:
            run_fasttext_training(train_file, tmp_model, cfg.fasttext_params())
        except BaseException:
            tmp_model.unlink(missing_ok=True)
            raise
        progress.finish()

    # Evaluate with a fresh load, not the step's cache: the model file is about to be renamed.
    import fasttext

    with contextlib.redirect_stderr(io.StringIO()):
        model = fasttext.load_model(str(tmp_model))
    pos_q = score_texts(model, sides["positive"]["holdout"], cfg.label)
    neg_q = score_texts(model, sides["negative"]["holdout"], cfg.label)
    del model
    metrics = holdout_metrics(pos_q, neg_q)
    os.replace(tmp_model, model_file)

    counts = {role: {**s["stats"], "errors": len(s["stats"]["errors"]), "train": len(s["train"]), "holdout": len(s["holdout"])}
              for role, s in sides.items()}
    counts["holdout"] = metrics
    manifest = Manifest(
        kind="classifier",
        stage="filter train-classifier",
        config={**asdict(cfg), "negative_label": NEGATIVE_LABEL, "fasttext": cfg.fasttext_params()},
        inputs=refs,
        outputs=[output_entry(model_file, None, out_dir)],
        counts=counts,
        errors=[e for s in sides.values() for e in s["stats"]["errors"]],
        wall_seconds=round(time.perf_counter() - t0, 3),
    )
    write_manifest(out_dir, manifest)
    progress.log(
        f"held out {metrics['tp'] + metrics['fn']} positive / {metrics['fp'] + metrics['tn']} negative documents: "
        f"precision {metrics['precision']}, recall {metrics['recall']} at P({cfg.label}) >= 0.5"
    )
    return manifest
