"""Model-based quality filtering: a fastText classifier scores each document, and the way to train
one (spec 001-data-eval §A4).

The `classifier` step writes q = P(positive label | text) as the `quality_score` column and keeps
a document in one of three ways:

- `threshold`: q >= threshold;
- `top_fraction`: the best `top_fraction` of the run's documents (DCLM kept its top 10%, which
  beat 15% and 20%); the cutoff is a quantile of all scores, found in a pass before filtering;
- `gpt3_soft`: GPT-3's soft threshold, keep if a Pareto(9) draw exceeds 1 - q, which keeps with
  probability (2 - q)^-9. The draw is seeded by the document id, so the decision is a property of
  the document, the same whatever the sharding or the number of workers.

`train_classifier` trains one the DCLM way: positives are a high-quality reference set, negatives
a random sample of the crawl; held-out precision and recall go into the manifest, and the
manifest's inputs (with their roles) link the model to its training data.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import pyarrow as pa

from llmctl.artifacts.docs import STDIO, open_docs_inputs
from llmctl.artifacts.atomic import temp_name
from llmctl.artifacts.lock import output_lock
from llmctl.artifacts.manifest import Manifest, error_place, input_ref, output_entry, read_manifest, write_manifest
from llmctl.artifacts.rerun import claim_out, run_identity, running
from llmctl.data.filters.base import Check, Step
from llmctl.data.filters.doc import Doc
from llmctl.hashing import h64
from llmctl.errors import StageFailed, UsageError
from llmctl.runtime.progress import Progress

MODEL_FILE = "model.bin"  # what train_classifier writes into OUT; `model = OUT` finds it
NEGATIVE_LABEL = "lq"
PARETO_SHAPE = 9.0  # GPT-3 (Brown et al. 2020, App. A): keep if np.random.pareto(9) > 1 - q
MODES = ("threshold", "top_fraction", "gpt3_soft")

# ---------------------------------------------------------------------------------------------
# The GPT-3 soft threshold


def gpt3_keep_probability(q: float) -> float:
    """P(keep | q) under GPT-3's rule: numpy's pareto(a) is Lomax, P(X > x) = (1 + x)^-a, so
    P(X > 1 - q) = (2 - q)^-9 (spec §A4). q = 0.9 gives 0.4241."""
    return (2.0 - q) ** -PARETO_SHAPE


def gpt3_keeps(q: float, key: str, seed: int = 0) -> bool:
    """One document's GPT-3 soft-threshold decision, from a generator seeded by (seed, its key)."""
    draw = np.random.default_rng([seed, h64(key)]).pareto(PARETO_SHAPE)
    return bool(draw > 1.0 - q)


def top_fraction_cutoff(scores: Iterable[float], fraction: float) -> float:
    """The score s such that keeping `score >= s` keeps the top `fraction` of `scores` (more
    only when several documents tie at s). No scores: 0.0, since there is nothing to cut."""
    s = np.sort(np.fromiter(scores, dtype=np.float64))[::-1]
    if not len(s):
        return 0.0
    # The tolerance keeps float noise (0.7 * 10 = 7.000000000000001) from keeping one too many.
    k = min(len(s), max(1, math.ceil(fraction * len(s) - 1e-9)))
    return float(s[k - 1])


# ---------------------------------------------------------------------------------------------
# Loading and scoring

_models: dict[str, object] = {}


def one_line(text: str) -> str:
    """fastText reads one example per line and its predict() refuses a newline; it splits words on
    whitespace, so a space in place of each newline keeps every word (DCLM scores the same way)."""
    return text.replace("\n", " ")


def resolve_model(model: str) -> str:
    """The .bin file a `model` parameter names: a file, or a train-classifier output directory."""
    if not model:
        raise UsageError("classifier step: set `model` to a fastText .bin or a train-classifier output directory")
    p = Path(model)
    if p.is_dir():
        p = p / MODEL_FILE
    if not p.is_file():
        raise UsageError(f"classifier model not found: {p}")
    return str(p)


def load_model(path: str, label: str):
    """Load once per process (cached by path: workers forked after a load share the pages), and
    check the model knows the positive label, so a wrong `label` fails here, not as all-zero scores."""
    if path not in _models:
        import fasttext

        with contextlib.redirect_stderr(io.StringIO()):  # fastText prints a deprecation notice
            try:
                _models[path] = fasttext.load_model(path)
            except ValueError as e:
                raise UsageError(f"{path}: not a fastText model ({e})") from e
    model = _models[path]
    if f"__label__{label}" not in model.labels:
        known = ", ".join(lab.removeprefix("__label__") for lab in model.labels)
        raise UsageError(f"{path}: the model has no label {label!r} (its labels: {known})")
    return model


def score_texts(model, texts: list[str], label: str) -> list[float]:
    """P(label) for each text. k=-1 asks for every label, so the positive one is always there.

    Scores are rounded to float32, the type of the `quality_score` column, so a threshold chosen
    from the written column reproduces the filter's decisions exactly.
    """
    if not texts:
        return []
    key = f"__label__{label}"
    labels, probs = model.predict([one_line(t) for t in texts], k=-1)
    out = []
    for labs, ps in zip(labels, probs):
        q = next((float(p) for lab, p in zip(labs, ps) if lab == key), 0.0)
        # fastText smooths probabilities by 1e-5 before the log, so a sure score reads 1.00001.
        out.append(float(np.float32(min(1.0, max(0.0, q)))))
    return out


# ---------------------------------------------------------------------------------------------
# The filter step


@dataclass
class QualityClassifier(Step):
    """Score each document with a fastText quality classifier and keep the good ones (spec §A4).

    Writes `quality_score` (float32) for every document it sees. In `top_fraction` mode the stage
    calls `prepare(texts)` with every document first and `threshold` becomes the cutoff.
    """

    name = "classifier"
    output_columns: ClassVar[dict] = {"quality_score": pa.float32()}

    model: str = ""
    mode: str = "threshold"
    threshold: float = 0.5
    top_fraction: float = 0.1  # DCLM's choice: top 10% beat 15% and 20% (spec §A4)
    label: str = "hq"
    seed: int = 0

    def __post_init__(self):
        if self.mode not in MODES:
            raise UsageError(f"classifier step: mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if not 0.0 <= self.threshold <= 1.0:
            raise UsageError(f"classifier step: threshold must be in [0, 1], got {self.threshold}")
        if not 0.0 < self.top_fraction <= 1.0:
            raise UsageError(f"classifier step: top_fraction must be in (0, 1], got {self.top_fraction}")
        if not self.label or any(c.isspace() for c in self.label):
            raise UsageError(f"classifier step: label must be one word, got {self.label!r}")
        if self.seed < 0:
            raise UsageError(f"classifier step: seed must be >= 0, got {self.seed}")
        self._path = resolve_model(self.model)  # fail at config time, not in a worker halfway through
        self._prepared = False

    @property
    def needs_prepare(self) -> bool:
        return self.mode == "top_fraction"

    def _model(self):
        return load_model(self._path, self.label)

    def score(self, text: str) -> float:
        return score_texts(self._model(), [text], self.label)[0]

    def prepare(self, texts: Iterable[str]) -> None:
        """top_fraction: score every document of the run and set `threshold` to the cutoff."""
        if self.mode != "top_fraction":
            return
        model = self._model()
        scores: list[float] = []
        batch: list[str] = []
        for t in texts:
            batch.append(t or "")
            if len(batch) == 1024:  # predict() on a list amortizes the call overhead
                scores += score_texts(model, batch, self.label)
                batch = []
        scores += score_texts(model, batch, self.label)
        self.threshold = top_fraction_cutoff(scores, self.top_fraction)
        self._prepared = True

    def checks(self, doc: Doc) -> Iterator[Check]:
        q = self.score(doc.text)
        doc.row["quality_score"] = q
        if self.mode == "gpt3_soft":
            passes = gpt3_keeps(q, doc.row.get("id") or doc.text, self.seed)
        else:
            if self.mode == "top_fraction" and not self._prepared:
                raise RuntimeError("classifier step in top_fraction mode: prepare() was not called before checks()")
            passes = q >= self.threshold
        yield "quality_score", q, passes


# ---------------------------------------------------------------------------------------------
# Training (`llmctl filter train-classifier`)


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
