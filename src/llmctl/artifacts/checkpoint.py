"""The checkpoint artifact (docs/design.md §2): `step-000123/` under a run's `checkpoints/`.

    model.safetensors    weights (a tied head stored once, as embed.weight)
    ema.safetensors      with `train --ema-decay`: the exponential moving average of the weights,
                         fp32, the same tensor names (train/ema.py)
    config.json          the architecture (ModelConfig)
    tokenizer.json       the tokenizer the tokens were made with, when known, and beside it the
                         other tokenizer files of an imported model (TOKENIZER_FILES)
    optimizer.pt         optimizer state, read back with torch.load(weights_only=True)
    trainer_state.json   step, tokens seen, RNG states, schedule — everything resume needs

A checkpoint is written under a temporary name and renamed, and `latest` (a one-line file) is
replaced atomically after it, so a crash never leaves a half checkpoint behind a valid `latest`
(spec 001-systems-ops §A2). Weights are read only from safetensors and other state only with
`weights_only=True`: loading a stranger's checkpoint cannot run code.

Which weights a reader takes (`weights_file`, the one place the choice is made): `raw`
(model.safetensors: what training resumes from), `ema` (ema.safetensors; an error where there is
none) or `auto`, the EMA where the checkpoint has one and the raw weights otherwise — what eval,
generate, export, rl and `train --sft --init` use unless `--weights` says otherwise.

This module is the floor: the file layout, names, `latest`, the atomic save and reading tensors.
It knows nothing of the model — `open_checkpoint` reads a checkpoint's metadata (config.json as
JSON, trainer_state.json, which files it has) without touching its weights, and `model/load.py`
turns a checkpoint into a model, reading each weight file once.
"""

from __future__ import annotations

from collections.abc import Iterable
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from llmctl.artifacts.atomic import atomic_path, check_write, write_text
from llmctl.artifacts.manifest import artifact_file, outside_name
from llmctl.errors import UsageError

LATEST = "latest"
MODEL_FILE, EMA_FILE = "model.safetensors", "ema.safetensors"
WEIGHTS = ("auto", "ema", "raw")  # --weights: which weights of a checkpoint inference loads
# What transformers reads to tokenize, prompt and stop: tokenizer.json first (the one llmctl needs);
# the others come with an imported model and travel with every checkpoint made from it.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "generation_config.json", "chat_template.jinja")


class Architecture(Protocol):
    """What a checkpoint stores of a model's architecture (model/config.py ModelConfig): its
    config.json object, and whether the head is tied to the embedding (then stored once)."""

    tied: bool

    def to_dict(self) -> dict[str, Any]: ...


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


def model_tensors(cfg: Architecture, state: dict[str, torch.Tensor], dtype: torch.dtype | None = torch.float32) -> dict[str, torch.Tensor]:
    """The tensors to store: contiguous CPU copies in `dtype` (None: as they are; an import keeps a
    bf16 release in bf16), a tied head dropped (it is the embedding)."""
    out = {k: v.detach().to("cpu", dtype or v.dtype).contiguous() for k, v in state.items()}
    if cfg.tied:
        out.pop("head.weight", None)
    return out


def save_checkpoint(
    ckpt_root: Path,
    step: int,
    config: Architecture,
    model_state: dict[str, torch.Tensor],
    trainer_state: dict[str, Any],
    optimizer_state: dict | None = None,
    tokenizer_file: Path | None = None,
    keep_last: int = 0,
    dtype: torch.dtype | None = torch.float32,
    extra_json: dict[str, Any] | None = None,
    ema_state: dict[str, torch.Tensor] | None = None,
    keep_steps: Iterable[int] = (),
) -> Path:
    """Write `ckpt_root/step-NNNNNN/` atomically, point `latest` at it, prune to `keep_last`
    (the checkpoints of `keep_steps` aside: a scaling ladder's decay branches start there).
    `tokenizer_file`'s sibling TOKENIZER_FILES are copied with it; `extra_json` {name: object}
    adds (or replaces) JSON files in the same atomic step; `ema_state` (the EMA weights, named as
    the model's) goes to ema.safetensors in fp32."""
    ckpt_root.mkdir(parents=True, exist_ok=True)
    final = ckpt_root / step_dir_name(step)
    with atomic_path(final) as tmp:  # re-saving a step (a signal right after a periodic save) replaces it
        tmp.mkdir()
        save_file(model_tensors(config, model_state, dtype), str(tmp / MODEL_FILE), metadata={"format": "pt"})
        if ema_state is not None:
            save_file(model_tensors(config, ema_state, torch.float32), str(tmp / EMA_FILE), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config.to_dict(), indent=2) + "\n")
        if optimizer_state is not None:
            try:
                torch.save(optimizer_state, tmp / "optimizer.pt")
            except RuntimeError as e:  # torch says "unexpected pos" on a full disk: ask the disk
                check_write(tmp / "optimizer.pt", e)
        (tmp / "trainer_state.json").write_text(json.dumps(trainer_state, indent=2) + "\n")
        if tokenizer_file is not None and Path(tokenizer_file).is_file():
            copy_tokenizer_files(Path(tokenizer_file), tmp)
        for name, obj in (extra_json or {}).items():
            (tmp / name).write_text(json.dumps(obj, indent=2) + "\n")
    write_text(ckpt_root / LATEST, final.name + "\n")
    if keep_last > 0:
        kept = {step_dir_name(s) for s in keep_steps}
        for old in [c for c in list_checkpoints(ckpt_root) if c.name not in kept][:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def copy_tokenizer_files(tokenizer_file: Path, dest: Path) -> None:
    """tokenizer.json (whatever its name) and the TOKENIZER_FILES beside it, into `dest`."""
    shutil.copyfile(tokenizer_file, dest / TOKENIZER_FILES[0])
    for name in TOKENIZER_FILES[1:]:
        if (tokenizer_file.parent / name).is_file() and tokenizer_file.name == TOKENIZER_FILES[0]:
            shutil.copyfile(tokenizer_file.parent / name, dest / name)


def list_checkpoints(ckpt_root: Path) -> list[Path]:
    """Complete checkpoints, oldest first (temporary directories are never listed)."""
    if not ckpt_root.is_dir():
        return []
    return sorted(p for p in ckpt_root.iterdir() if p.is_dir() and p.name.startswith("step-"))


def owner_artifact(path: str | os.PathLike) -> Path:
    """The artifact a checkpoint belongs to, for lineage: the step dir, its run, or the import
    (the first of step dir, checkpoints/, run dir that has a manifest.json); else the path itself."""
    p = Path(path)
    return next((q for q in (p, p.parent, p.parent.parent) if (q / "manifest.json").is_file()), p)


def latest_target(ckpt_root: Path) -> Path:
    """The step directory `ckpt_root/latest` names: one name inside `ckpt_root`, as
    save_checkpoint writes it. A pointer naming any other place (`../../other`, an absolute
    path, a link out) is a usage error, never followed."""
    latest = ckpt_root / LATEST
    try:
        name = latest.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{latest}: unreadable ({type(e).__name__}: {e})") from e
    if len(Path(name).parts) > 1 or outside_name(name):
        raise UsageError(f"{latest}: names {name!r}, not a step directory beside it; `latest` holds one name "
                         "(step-NNNNNN) inside its checkpoints/ folder")
    return artifact_file(ckpt_root, name, str(latest))


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A checkpoint directory from a step dir, a `checkpoints/` dir or a run dir (→ its latest)."""
    p = Path(path)
    if (p / "model.safetensors").is_file():
        return p
    for root in (p, p / "checkpoints"):
        latest = root / LATEST
        if latest.is_file():
            target = latest_target(root)
            if not (target / "model.safetensors").is_file():
                raise UsageError(f"{latest} names {target.name}, which is missing or incomplete")
            return target
    if not p.exists():
        raise UsageError(f"checkpoint not found: {p}")
    raise UsageError(f"{p} is not a checkpoint (no model.safetensors, no checkpoints/latest)")


@dataclass
class Checkpoint:
    """A checkpoint's metadata, read without its weights: `config_json` is config.json's object
    (model/load.py parses it into a ModelConfig), `trainer_state` trainer_state.json's. The weights
    are read on demand, each file once by whoever asks (`read_tensors`)."""

    path: Path
    config_json: Any
    trainer_state: dict[str, Any]

    @property
    def has_ema(self) -> bool:
        return (self.path / EMA_FILE).is_file()

    @property
    def tokenizer_file(self) -> Path | None:
        t = self.path / "tokenizer.json"
        return own_file(self.path, t.name) if t.is_file() else None

    @property
    def step(self) -> int:
        return int(self.trainer_state.get("step", 0))

    def read_tensors(self, weights: str = "raw") -> tuple[dict[str, torch.Tensor], str]:
        """(the tensors of the file `weights` picks, raw or ema: which one was read)."""
        f, which = weights_file(self.path, weights)
        return read_tensors(f), which

    def ema_tensors(self) -> dict[str, torch.Tensor] | None:
        """ema.safetensors' tensors (None where the run kept no EMA)."""
        return read_tensors(own_file(self.path, EMA_FILE)) if self.has_ema else None

    def optimizer_state(self) -> dict | None:
        f = self.path / "optimizer.pt"
        if not f.is_file():
            return None
        f = own_file(self.path, f.name)
        try:
            return torch.load(f, map_location="cpu", weights_only=True)
        except Exception as e:  # a truncated or foreign file: say which, never a traceback
            raise UsageError(f"{f}: cannot read optimizer state ({type(e).__name__}: {e})") from e


def read_tensors(f: Path) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors; a corrupt or unreadable one is a UsageError naming it."""
    try:
        return load_file(str(f))
    except (SafetensorError, OSError, ValueError) as e:
        raise UsageError(f"{f}: corrupt or unreadable ({e})") from e


def weights_file(ckpt: Path, weights: str = "raw") -> tuple[Path, str]:
    """(the weights file, raw or ema) that `weights` (WEIGHTS) picks in checkpoint dir `ckpt`."""
    if weights not in WEIGHTS:
        raise UsageError(f"--weights must be one of {', '.join(WEIGHTS)}, got {weights!r}")
    if weights == "ema" and not (ckpt / EMA_FILE).is_file():
        raise UsageError(f"--weights ema: {ckpt} has no {EMA_FILE} (the run was trained without --ema-decay)")
    if weights != "raw" and (ckpt / EMA_FILE).is_file():
        return own_file(ckpt, EMA_FILE), "ema"
    return own_file(ckpt, MODEL_FILE), "raw"


def own_file(ckpt: Path, name: str) -> Path:
    """`ckpt/name`, refused (one line) when it is a link that leads out of the checkpoint: a
    checkpoint is closed over itself like every artifact (save_checkpoint writes no link)."""
    return artifact_file(ckpt, name, f"{ckpt}: {name}")


def open_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """The checkpoint a step dir, `checkpoints/` dir or run dir names, its weights unread."""
    ckpt = resolve_checkpoint(path)
    config_file, state_file = own_file(ckpt, "config.json"), own_file(ckpt, "trainer_state.json")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UsageError(f"cannot read model config {config_file}: {e}") from e
    try:
        state = json.loads(state_file.read_text()) if state_file.is_file() else {}
    except json.JSONDecodeError as e:
        raise UsageError(f"{state_file}: invalid JSON ({e})") from e
    return Checkpoint(ckpt, config, state)
