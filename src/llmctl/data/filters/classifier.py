"""Model-based quality filtering: the `classifier` step scores each document with a fastText
classifier (spec 001-data-eval §A4) or a FineWeb-Edu-style regression head (edu.py).

With a fastText model the step writes q = P(positive label | text) as the `quality_score` column
and keeps a document in one of three ways:

- `threshold`: q >= threshold;
- `top_fraction`: the best `top_fraction` of the run's documents (DCLM kept its top 10%, which
  beat 15% and 20%); the cutoff is a quantile of all scores, found in a pass before filtering;
- `gpt3_soft`: GPT-3's soft threshold, keep if a Pareto(9) draw exceeds 1 - q, which keeps with
  probability (2 - q)^-9. The draw is seeded by the document id, so the decision is a property of
  the document, the same whatever the sharding or the number of workers.

With a regression head it writes `score` and `int_score` and keeps int_score >= threshold (or
the top fraction). fasttext_train.py and edu_train.py train the two kinds
(`llmctl filter train-classifier`, without and with --regression).
"""

from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import pyarrow as pa

from llmctl.artifacts.manifest import file_sha256
from llmctl.data.filters.base import Check, Step
from llmctl.data.filters.doc import Doc
from llmctl.data.filters.edu import RegressionHead, find_head, rounded
from llmctl.data.filters.regression import SCORES
from llmctl.errors import UsageError
from llmctl.hashing import h64

MODEL_FILE = "model.bin"  # what train_classifier writes into OUT; `model = OUT` finds it
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
    """Score each document with a quality model and keep the good ones.

    `model` is a fastText .bin (or a `train-classifier` output holding one): the step writes
    `quality_score` = P(label) and keeps by `mode` (module docstring; spec §A4). Or it is a
    regression head (`train-classifier --regression`, edu.py): the step writes `score` (the
    head's float prediction) and `int_score` (rounded and clipped to 0-5) and keeps int_score >=
    `threshold` (the head's own unless set; FineWeb-Edu: 3), or the `top_fraction` best scores.
    In `top_fraction` mode the stage calls `prepare(texts)` with every document first and
    `threshold` becomes the cutoff. Documents are scored a batch at a time (`prepare_batch`).
    """

    name = "classifier"
    output_columns: ClassVar[dict] = {"quality_score": pa.float32()}  # a regression head's: score, int_score

    model: str = ""
    mode: str = "threshold"
    threshold: float | None = None  # fastText: 0.5; a regression head: its own (FineWeb-Edu: 3)
    top_fraction: float = 0.1  # DCLM's choice: top 10% beat 15% and 20% (spec §A4)
    label: str = "hq"
    seed: int = 0

    def __post_init__(self):
        if self.mode not in MODES:
            raise UsageError(f"classifier step: mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.threshold is not None and (isinstance(self.threshold, bool) or not isinstance(self.threshold, (int, float))):
            raise UsageError(f"classifier step: threshold should be a number, got {self.threshold!r}")
        if not 0.0 < self.top_fraction <= 1.0:
            raise UsageError(f"classifier step: top_fraction must be in (0, 1], got {self.top_fraction}")
        if not self.label or any(c.isspace() for c in self.label):
            raise UsageError(f"classifier step: label must be one word, got {self.label!r}")
        if self.seed < 0:
            raise UsageError(f"classifier step: seed must be >= 0, got {self.seed}")
        # fail at config time, not in a worker halfway through
        self._head_file = find_head(self.model) if self.model else None
        self._head = RegressionHead.load(self._head_file) if self._head_file else None
        if self._head is None:
            self._path = resolve_model(self.model)
            self.threshold, top = float(0.5 if self.threshold is None else self.threshold), 1.0
        else:
            self._head.encoder()  # the embedder it was trained on is here, with those weights
            if self.mode == "gpt3_soft":
                raise UsageError("classifier step: gpt3_soft needs a probability; a regression head gives a 0-5 score "
                                 "(use threshold or top_fraction)")
            self.output_columns = {"score": pa.float32(), "int_score": pa.int64()}
            self.threshold, top = float(self._head.threshold if self.threshold is None else self.threshold), SCORES - 1
        if not 0.0 <= self.threshold <= top:
            raise UsageError(f"classifier step: threshold must be in [0, {top:g}], got {self.threshold:g}")
        self._prepared = False
        self._cores = 1  # torch threads for a head's embedder (use_cores)
        self._known: dict[int, float] = {}  # a head's scores from the top_fraction pass, by h64(text)
        self._batch: dict[int, float] = {}  # this batch's scores, by id(doc)

    @property
    def needs_prepare(self) -> bool:
        return self.mode == "top_fraction"

    def identity(self) -> dict:
        """The model this step runs, by content: in the run's config, so a resumed run whose model
        file changed under the same path is refused."""
        if self._head is None:
            return {"model": str(Path(self._path).resolve()), "sha256": file_sha256(self._path)}
        return {"model": str(Path(self._head_file).resolve()), "sha256": file_sha256(self._head_file),
                "embedder_weights_sha256": self._head.embedder["weights_sha256"]}

    def use_cores(self, n: int) -> None:
        self._cores = n

    def scores(self, texts: list[str], threads: int | None = None) -> list[float]:
        """The model's score for each text (a head's: its prediction, NaN for an empty text)."""
        if self._head is None:
            return score_texts(load_model(self._path, self.label), texts, self.label)
        known = [self._known.get(h64(t)) if self._known else None for t in texts]
        todo = [i for i, k in enumerate(known) if k is None]
        fresh = self._head.scores([texts[i] for i in todo], threads or self._cores) if todo else []
        for i, s in zip(todo, fresh):
            known[i] = float(s)
        return known

    def prepare(self, texts: Iterable[str]) -> None:
        """top_fraction: score every document of the run and set `threshold` to the cutoff. A
        head's scores are kept (by text hash) for the filter pass, which then embeds nothing; the
        pass runs in the stage's own process, whose workers are forked afterwards, so torch runs on
        one thread here (data/embedders.py: a fork after a multi-threaded OpenMP region hangs)."""
        if self.mode != "top_fraction":
            return
        scores: list[float] = []
        batch: list[str] = []

        def flush():
            got = self.scores(batch, threads=1)
            if self._head is not None:
                self._known.update((h64(t), s) for t, s in zip(batch, got))
            scores.extend(got)
            batch.clear()

        for t in texts:
            batch.append(t or "")
            if len(batch) == 1024:  # predict() on a list amortizes the call overhead
                flush()
        flush()
        self.threshold = top_fraction_cutoff((s for s in scores if s == s), self.top_fraction)  # NaN: an empty text
        self._prepared = True

    def prepare_batch(self, docs: list[Doc]) -> None:
        """Score the documents about to be checked together: one predict() or a few forwards."""
        self._batch = dict(zip(map(id, docs), self.scores([d.text for d in docs]))) if docs else {}

    def checks(self, doc: Doc) -> Iterator[Check]:
        q = self._batch.pop(id(doc), None)
        if q is None:
            q = self.scores([doc.text])[0]
        if self.mode == "top_fraction" and not self._prepared:
            raise RuntimeError("classifier step in top_fraction mode: prepare() was not called before checks()")
        if self._head is not None:
            i = int(rounded(np.array([q]))[0])
            doc.row["score"], doc.row["int_score"] = q, i
            yield "score", q, self.mode != "top_fraction" or q >= self.threshold
            yield "int_score", i, self.mode == "top_fraction" or i >= self.threshold
            return
        doc.row["quality_score"] = q
        if self.mode == "gpt3_soft":
            passes = gpt3_keeps(q, doc.row.get("id") or doc.text, self.seed)
        else:
            passes = q >= self.threshold
        yield "quality_score", q, passes
