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
    base_identity(path, weights)     what a LoRA checkpoint records of its base (path, sha256)
    check_shapes(cfg, tensors)       the weights against config.json, before a model is allocated
    apply_weights(model, tensors)    the strict name/shape check every load goes through

A LoRA checkpoint (`train --lora-rank`, model/lora.py) stores only its adapters in model.safetensors
and, in lora.json, the LoRA settings and its base checkpoint's path, weights and sha256. Reading
one reads the base too, refusing it (one line) when its weights file no longer has that hash; by
default the adapters are folded into the base's tensors, so every reader of full weights (export,
`train --init`) takes a LoRA checkpoint as the model it computes; `load_model` gives the base with
the adapters attached (generation runs through them), or merged with merge=True.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

import torch

from llmctl.artifacts.checkpoint import Checkpoint, open_checkpoint, own_file, weights_file
from llmctl.errors import UsageError
from llmctl.model.config import ModelConfig
from llmctl.model.lora import LORA_FILE, LoraConfig, attach, load_adapters, merge as merge_adapters, merged_tensors
from llmctl.model.transformer import Transformer


@dataclass
class LoadedCheckpoint(Checkpoint):
    """A checkpoint with its architecture parsed and one weights file read: `weights` says which
    (raw: model.safetensors, ema: ema.safetensors)."""

    config: ModelConfig | None = None
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    weights: str = "raw"
    # a LoRA checkpoint: its settings, its base's identity (lora.json) and the base's tensors;
    # `tensors` are then the merged weights, or the adapters alone (load_checkpoint(merged=False))
    lora: LoraConfig | None = None
    lora_base: dict | None = None
    base_tensors: dict[str, torch.Tensor] | None = None


def model_config(ck: Checkpoint) -> ModelConfig:
    """The architecture in a checkpoint's config.json (no weights read)."""
    return ModelConfig.from_dict(ck.config_json, where=str(ck.path / "config.json"))


def load_checkpoint(path: str | os.PathLike | Checkpoint, weights: str = "raw", merged: bool = True) -> LoadedCheckpoint:
    """A checkpoint with the tensors of `weights`: raw (what training resumes from, the default),
    ema, or auto (the EMA where there is one: what inference loads). A LoRA checkpoint's tensors
    are its base's with the adapters folded in, or with merged=False the adapters alone (the
    base's in `base_tensors`)."""
    ck = path if isinstance(path, Checkpoint) else open_checkpoint(path)
    cfg = model_config(ck)
    tensors, which = ck.read_tensors(weights)
    out = LoadedCheckpoint(ck.path, ck.config_json, ck.trainer_state, config=cfg, tensors=tensors, weights=which)
    if (ck.path / LORA_FILE).is_file():
        out.lora, out.lora_base = read_lora(ck.path)
        base = load_base(out.lora_base, f"{ck.path}/{LORA_FILE}")
        if dataclasses.replace(base.config, max_seq_len=cfg.max_seq_len) != cfg:  # train may lengthen the context
            raise UsageError(f"{ck.path}: config.json is not the architecture of its base {base.path}")
        out.base_tensors = base.tensors
        if merged:
            out.tensors = merged_tensors(cfg, out.lora, base.tensors, tensors)
    return out


def read_lora(ckpt) -> tuple[LoraConfig, dict]:
    """(LoRA settings, base identity) of a LoRA checkpoint's lora.json."""
    import json

    f = own_file(ckpt, LORA_FILE)
    try:
        doc = json.loads(f.read_text())
        base = doc["base"]
        if not all(isinstance(base.get(k), str) for k in ("path", "weights", "sha256")):
            raise KeyError("base.path, base.weights, base.sha256")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise UsageError(f"{f}: not a LoRA checkpoint's lora.json ({type(e).__name__}: {e})") from e
    return LoraConfig.from_dict(doc.get("lora"), str(f)), base


def base_identity(path: str | os.PathLike, weights: str = "raw") -> dict:
    """What a LoRA run records of the checkpoint it adapts: its directory, which weights file
    (raw or ema) and that file's sha256 (a base changed in place is then refused, not used)."""
    from llmctl.artifacts.manifest import file_sha256

    ck = open_checkpoint(path)
    f, which = weights_file(ck.path, weights)
    return {"path": str(ck.path), "weights": which, "sha256": file_sha256(f)}


def load_base(identity: dict, where: str) -> LoadedCheckpoint:
    """The base checkpoint a LoRA checkpoint names, refused when its weights are not the ones hashed."""
    now = base_identity(identity["path"], identity["weights"])
    if now["sha256"] != identity["sha256"]:
        raise UsageError(f"{where}: the base {identity['path']} is not the checkpoint these adapters were trained on "
                         f"(its {now['weights']} weights hash to {now['sha256'][:12]}…, lora.json says {identity['sha256'][:12]}…)")
    return load_checkpoint(identity["path"], identity["weights"])


def load_model(path: str | os.PathLike | Checkpoint, device: str | torch.device = "cpu",
               weights: str = "auto", merge: bool = False) -> tuple[Transformer, LoadedCheckpoint]:
    """The Transformer of a checkpoint, weights loaded, in eval mode: by default the EMA weights
    where the checkpoint has them (`weights`: auto, ema or raw; the checkpoint's `weights` says which).
    A LoRA checkpoint gives its base with the adapters attached (frozen base, float32), or with
    merge=True the plain model with the adapters folded in."""
    ck = load_checkpoint(path, weights, merged=False)
    full = ck.base_tensors if ck.lora is not None else ck.tensors
    check_shapes(ck.config, full, ck.path)  # before the model is allocated on the config's sizes
    ck.config.check_memory(str(ck.path / "config.json"))
    model = Transformer(ck.config)
    apply_weights(model, full, ck.path)
    if ck.lora is not None:
        attach(model, dataclasses.replace(ck.lora, base_dtype="float32"))
        load_adapters(model, ck.tensors, ck.path)
        if merge:
            merge_adapters(model)
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
