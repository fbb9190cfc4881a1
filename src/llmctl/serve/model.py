"""The model a server serves: an llmctl checkpoint (a step dir, or a run dir: its latest) or a
Hugging Face folder that `llmctl export` wrote, loaded with everything a request needs — the
weights, the tokenizer files (tokenizer/vocab.py), the chat template of a chat checkpoint, the
context length.

A Hugging Face folder is made a checkpoint the one way llmctl has (model/hf_import.py, what
`llmctl import` runs), into a temporary folder this module owns: once the model and tokenizer are
in memory the folder is removed, so a server killed later leaves nothing behind.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from llmctl.errors import UsageError
from llmctl.model.transformer import Transformer
from llmctl.tokenizer.vocab import Vocab, read_json_object


@dataclass
class ServedModel:
    name: str  # what requests name it by ("model") and /v1/models lists
    model: Transformer
    vocab: Vocab
    chat: object | None  # the chat template (tokenizer/ ChatTemplate or JinjaChat); None: not a chat model
    context: int  # the model's context length: prompt + generated tokens fit in it
    source: str  # "checkpoint" or "export"
    weights: str  # raw or ema: which weights file was loaded


def is_hf_folder(path: Path) -> bool:
    """A Hugging Face model folder (config.json names a model_type), not an llmctl checkpoint,
    whose config.json holds only llmctl's ModelConfig keys."""
    config = path / "config.json"
    return path.is_dir() and config.is_file() and "model_type" in read_json_object(config)


def load_served(path: str | Path, name: str, weights: str = "auto", device: str = "auto") -> ServedModel:
    """The model at `path`, loaded for serving; a Hugging Face folder is imported first (the
    temporary checkpoint is removed before this returns)."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"checkpoint not found: {p}")
    if not is_hf_folder(p):
        return _load(p, name, weights, device, "checkpoint")
    from llmctl.model.hf_import import import_hf

    tmp = Path(tempfile.mkdtemp(prefix="llmctl-serve-"))
    try:
        import_hf(p, tmp / "checkpoint")
        return _load(tmp / "checkpoint", name, weights, device, "export")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _load(path: Path, name: str, weights: str, device: str, source: str) -> ServedModel:
    from llmctl.model.load import load_model
    from llmctl.torchrt.device import pick_device

    model, ck = load_model(path, pick_device(device), weights)
    if ck.tokenizer_file is None:
        raise UsageError(f"{ck.path} has no tokenizer.json: a server cannot turn requests into tokens")
    vocab = Vocab(ck.path)
    # chat as generate and eval decide it: a checkpoint that was trained (SFT, rl) or imported as one
    chat = vocab.require_chat() if ck.trainer_state.get("chat") else None
    return ServedModel(name, model, vocab, chat, model.cfg.max_seq_len, source, ck.weights)
