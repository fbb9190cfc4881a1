"""The training loop's LoRA side (`train --lora-rank R`, model/lora.py): which base the adapters sit
on, what a LoRA checkpoint stores, and the check that a resumed run adapts the same base.

A LoRA run starts from --init: the base's weights are loaded, frozen, and the adapters attached
(A drawn from the run's seeded generator, B = 0). Its checkpoints hold the adapter tensors alone in
model.safetensors, AdamW's state of the adapters alone in optimizer.pt, and lora.json: the LoRA
settings and the base's identity (directory, raw or EMA weights file, and its sha256). A resumed run
reloads the base named by --init and refuses it, in one line, when its hash is not the recorded one:
adapters trained on one base mean nothing on another.
"""

from __future__ import annotations

from typing import Callable

from llmctl.errors import UsageError
from llmctl.model.load import LoadedCheckpoint, apply_weights, base_identity
from llmctl.model.lora import LORA_FILE, LoraConfig, attach, is_adapter, load_adapters


def start(model, init: LoadedCheckpoint, lora: LoraConfig, on_log: Callable[[str], None]) -> dict:
    """A fresh LoRA run: `model` holds the --init weights; attach the adapters. Returns the base identity."""
    identity = base_identity(init.path, init.weights)
    attach(model, lora)
    _log(model, lora, identity, on_log)
    return identity


def resume(model, ck: LoadedCheckpoint, init_path, lora: LoraConfig | None,
           on_log: Callable[[str], None]) -> tuple[dict, LoraConfig]:
    """A resumed LoRA run: `ck` is its last checkpoint read with merged=False (adapters in
    `tensors`, the recorded base's in `base_tensors`). The base given again with --init must be the
    recorded one; the --lora-* flags, when given, must be the recorded ones. Returns (base identity,
    the run's LoRA settings)."""
    if ck.lora is None:
        raise UsageError(f"--resume: {ck.path} holds full weights, not LoRA adapters; drop the --lora-* flags")
    if lora is not None and lora.check().to_dict() != ck.lora.to_dict():
        changed = ", ".join(f"{k} {v} (given {getattr(lora, k)})" for k, v in ck.lora.to_dict().items() if getattr(lora, k) != v)
        raise UsageError(f"--resume: the run's LoRA settings are not the flags': {changed} ({ck.path / LORA_FILE})")
    if init_path is not None:
        given = base_identity(init_path, ck.lora_base["weights"])
        if given["sha256"] != ck.lora_base["sha256"]:
            raise UsageError(f"--resume: --init {given['path']} is not the base this LoRA run adapts "
                             f"({ck.lora_base['path']}, sha256 {ck.lora_base['sha256'][:12]}…; this one {given['sha256'][:12]}…)")
    apply_weights(model, ck.base_tensors, ck.lora_base["path"])
    attach(model, ck.lora)
    load_adapters(model, ck.tensors, ck.path)
    _log(model, ck.lora, ck.lora_base, on_log)
    return ck.lora_base, ck.lora


def checkpoint_parts(lora: LoraConfig | None, base: dict | None, model_state: dict) -> tuple[dict, dict | None]:
    """(the tensors a checkpoint stores, lora.json's object): under LoRA the adapters alone and the
    settings with the base's identity; otherwise the state as it is and no lora.json."""
    if lora is None:
        return model_state, None
    return {k: v for k, v in model_state.items() if is_adapter(k)}, {"lora": lora.to_dict(), "base": base}


def _log(model, lora: LoraConfig, base: dict, on_log) -> None:
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    on_log(f"LoRA r {lora.rank}, alpha {lora.alpha:g} on {','.join(lora.targets)}: {trainable:,} trainable parameters "
           f"({100 * trainable / total:.2f}% of {total:,}); base {base['path']} ({base['weights']} weights, "
           f"sha256 {base['sha256'][:12]}…, {lora.base_dtype}, frozen)")
