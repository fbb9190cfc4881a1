"""The FineWeb-Edu classifier: a regression head on document embeddings, its file, and how it
scores text (`RegressionHead`). Penedo et al. 2024 ("The FineWeb datasets") trained a linear head
with MSE on Snowflake-arctic-embed-m embeddings of 450k pages that Llama-3-70B scored 0-5, rounded
its prediction to `int_score` and kept pages with int_score >= 3. The math is regression.py; the
training command is edu_train.py; the `classifier` step (classifier.py) applies a head.

A head is one small JSON file, OUT/head.json: the weights and bias of the linear layer, the
threshold it was trained for, the label column it learned, and the identity of its embedder (its
--embedder name and the sha256 of its weights). A head is only meaningful on the vectors of the
embedder it was trained on, so applying it re-opens that embedder by name and refuses one whose
weights differ.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from llmctl.artifacts.atomic import write_text
from llmctl.data.embedders import Embedder, open_embedder, torch_threads
from llmctl.data.filters.regression import int_score
from llmctl.errors import UsageError

HEAD_FILE = "head.json"
FORMAT = "llmctl-regression-head/1"
BATCH = 32  # documents per forward (sentence-transformers' default batch)


def find_head(model: str) -> Path | None:
    """The head file a classifier `model` names (a .json file, or a directory holding head.json);
    None when it names something else (a fastText model)."""
    p = Path(model)
    if p.is_dir() and (p / HEAD_FILE).is_file():
        return p / HEAD_FILE
    if p.is_file() and p.suffix == ".json":
        return p
    return None


@dataclass
class RegressionHead:
    """A trained head and the embedder it reads. `embedder` is the identity recorded at training
    (Embedder.identity()); the model behind it is opened and loaded only when text is scored."""

    weight: np.ndarray
    bias: float
    embedder: dict
    threshold: int = 3  # FineWeb-Edu keeps int_score >= 3
    labels: str = "score"
    _encoder: Embedder | None = field(default=None, repr=False)

    def to_json(self) -> dict:
        return {"format": FORMAT, "embedder": self.embedder, "labels": self.labels, "threshold": self.threshold,
                "dim": len(self.weight), "bias": self.bias, "weight": [float(w) for w in self.weight]}

    def save(self, path: Path) -> Path:
        return write_text(path, json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> RegressionHead:
        try:
            d = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise UsageError(f"{path}: not a readable regression head ({type(e).__name__}: {e})") from e
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise UsageError(f"{path}: not a regression head written by `llmctl filter train-classifier --regression`")
        try:
            weight = np.asarray(d["weight"], dtype=np.float64)
            bias, threshold, emb = float(d["bias"]), d["threshold"], d["embedder"]
            ok = (weight.ndim == 1 and len(weight) == d["dim"] == emb["dim"] and isinstance(emb["embedder"], str)
                  and isinstance(threshold, int) and np.isfinite(weight).all() and math.isfinite(bias))
        except (KeyError, TypeError, ValueError) as e:
            raise UsageError(f"{path}: a damaged regression head ({type(e).__name__}: {e})") from e
        if not ok:
            raise UsageError(f"{path}: a damaged regression head (weights, dimension, threshold or embedder do not agree)")
        return cls(weight, bias, emb, threshold, str(d.get("labels", "score")))

    # -- scoring ---------------------------------------------------------------------------------

    def encoder(self) -> Embedder:
        """The embedder the head was trained on, opened by name and checked against its weights."""
        if self._encoder is None:
            enc = open_embedder(self.embedder["embedder"])
            if enc.weights_sha256 != self.embedder["weights_sha256"]:
                raise UsageError(
                    f"the head was trained on --embedder {enc.name} with weights sha256 {self.embedder['weights_sha256'][:12]}…, "
                    f"but {enc.path} holds {enc.weights_sha256[:12]}…: retrain the head, or restore those weights")
            self._encoder = enc
        return self._encoder

    def predict(self, vectors: np.ndarray) -> np.ndarray:
        return np.asarray(vectors, np.float64) @ self.weight + self.bias

    def scores(self, texts: list[str], threads: int | None = None, batch: int = BATCH) -> np.ndarray:
        """The head's score for each text, as float32 (the `score` column's type, so a threshold
        chosen from the column reproduces the decisions). An empty text scores NaN: there is
        nothing to embed, and NaN fails every threshold."""
        out = np.full(len(texts), np.nan, dtype=np.float32)
        todo = [i for i, t in enumerate(texts) if t]
        if not todo:
            return out
        enc = self.encoder()
        if not enc.dim:  # first use in this process: load the model and read its dimension
            enc = self._encoder = enc.prepare()
            if enc.dim != len(self.weight):
                raise UsageError(f"--embedder {enc.name} gives {enc.dim}-dimensional vectors; the head has {len(self.weight)} weights")
        with torch_threads(threads or 1):
            for k in range(0, len(todo), batch):
                idx = todo[k : k + batch]
                vectors, _ = enc.embed([texts[i] for i in idx])
                out[idx] = self.predict(vectors).astype(np.float32)
        return out


def rounded(scores: np.ndarray) -> np.ndarray:
    """int_score of float scores; NaN (an empty text) becomes -1, below every threshold."""
    s = np.asarray(scores, np.float64)
    return np.where(np.isnan(s), -1, int_score(np.nan_to_num(s)))


__all__ = ["RegressionHead", "find_head", "rounded", "HEAD_FILE"]
