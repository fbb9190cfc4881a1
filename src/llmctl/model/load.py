"""Checkpoint → model: the one place a checkpoint's config.json becomes a ModelConfig and its
weights a Transformer's, for train (resume, --init), SFT, rl, eval, generate and export.

artifacts/checkpoint.py owns the files (names, `latest`, the atomic save, which weights file
`--weights` picks) and reads a checkpoint's metadata without its weights (`open_checkpoint`);
this module parses the architecture and reads the tensors — each weights file once per load, so
`train --init` on a 0.5B model reads its 2 GB once, not once for the metadata and again for the
weights.

    model_config(ck)                 the architecture, no tensor read
    load_checkpoint(path, weights)   metadata + architecture + one weights file's tensors
    load_model(path, device, ...)    the Transformer, weights in, eval mode (what inference loads)
    check_shapes(cfg, tensors)       the weights against config.json, before a model is allocated
    apply_weights(model, tensors)    the strict name/shape check every load goes through
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from llmctl.artifacts.checkpoint import Checkpoint, open_checkpoint
from llmctl.errors import UsageError
from llmctl.model.config import ModelConfig
from llmctl.model.transformer import Transformer


@dataclass
class LoadedCheckpoint(Checkpoint):
    """A checkpoint with its architecture parsed and one weights file read: `weights` says which
    (raw: model.safetensors, ema: ema.safetensors)."""

    config: ModelConfig | None = None
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    weights: str = "raw"


def model_config(ck: Checkpoint) -> ModelConfig:
    """The architecture in a checkpoint's config.json (no weights read)."""
    return ModelConfig.from_dict(ck.config_json, where=str(ck.path / "config.json"))


def load_checkpoint(path: str | os.PathLike | Checkpoint, weights: str = "raw") -> LoadedCheckpoint:
    """A checkpoint with the tensors of `weights`: raw (what training resumes from, the default),
    ema, or auto (the EMA where there is one: what inference loads)."""
    ck = path if isinstance(path, Checkpoint) else open_checkpoint(path)
    cfg = model_config(ck)
    tensors, which = ck.read_tensors(weights)
    return LoadedCheckpoint(ck.path, ck.config_json, ck.trainer_state, config=cfg, tensors=tensors, weights=which)


def load_model(path: str | os.PathLike | Checkpoint, device: str | torch.device = "cpu",
               weights: str = "auto") -> tuple[Transformer, LoadedCheckpoint]:
    """The Transformer of a checkpoint, weights loaded, in eval mode: by default the EMA weights
    where the checkpoint has them (`weights`: auto, ema or raw; the checkpoint's `weights` says which)."""
    ck = load_checkpoint(path, weights)
    check_shapes(ck.config, ck.tensors, ck.path)  # before the model is allocated on the config's sizes
    ck.config.check_memory(str(ck.path / "config.json"))
    model = Transformer(ck.config)
    apply_weights(model, ck.tensors, ck.path)
    return model.to(device).eval(), ck


def check_shapes(cfg: ModelConfig, tensors: dict[str, torch.Tensor], where) -> None:
    """Every tensor of the weights file of the shape config.json implies, checked on a model built
    on the meta device (no memory), so a tampered config.json is one line, not an allocation."""
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in Transformer(cfg).state_dict().items()}
    for name, t in tensors.items():
        if name in expected and tuple(t.shape) != expected[name]:
            raise UsageError(f"{where}: weights do not match config.json ({name} has shape {tuple(t.shape)}, "
                             f"config.json implies {expected[name]})")


def apply_weights(model: torch.nn.Module, tensors: dict[str, torch.Tensor], where) -> None:
    """Load `tensors` into `model`, every name and shape checked (a tied head's absence allowed)."""
    try:
        missing, unexpected = model.load_state_dict(tensors, strict=False)
    except RuntimeError as e:  # shape mismatches
        raise UsageError(f"{where}: weights do not match config.json ({str(e).splitlines()[-1].strip()})") from e
    if model.cfg.tied:
        missing = [k for k in missing if k != "head.weight"]
    if missing or unexpected:
        raise UsageError(
            f"{where}: weights do not match the architecture in config.json "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
