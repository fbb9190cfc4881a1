"""`llmctl import HF_DIR -o CKPT`: a released model (Llama 2/3.x, SmolLM2, Mistral, Qwen2/2.5,
Qwen3) as an llmctl checkpoint that train --init, rl, eval and generate read. The inverse of export.

The checkpoint keeps the model's own tokenizer files (tokenizer.json, tokenizer_config.json with
its chat template, special_tokens_map.json, chat_template.jinja) and a generation_config.json
with its EOS ids (the release's, else config.json's), so prompts get the BOS the model was trained
with and generation stops where it ends a text or a turn (tokenizer/vocab.py).

Weights are read tensor by tensor from each shard (safetensors' lazy reader) and kept in their
stored dtype: a bf16 release becomes a bf16 checkpoint, with no fp32 copy of the whole model in
memory. Whether the model is a chat model (eval, generate and rl then prompt it through its
template) is read from its files: its generation stops at the template's turn end (`--chat` /
`--no-chat` override).
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path, PurePosixPath

import torch

from llmctl.artifacts.atomic import directory_only
from llmctl.artifacts.checkpoint import LATEST, TOKENIZER_FILES, save_checkpoint, step_dir_name
from llmctl.artifacts.lock import output_lock
from llmctl.artifacts.manifest import Manifest, input_ref, write_manifest
from llmctl.artifacts.rerun import claim_out, run_identity, running
from llmctl.errors import UsageError
from llmctl.model.config import VOCAB_MULTIPLE, ModelConfig, shown
from llmctl.model.hf_layout import hf_state_dict, import_config, our_state_dict
from llmctl.tokenizer.vocab import Vocab, model_rows, read_json_object, token_ids


INDEX = "model.safetensors.index.json"


def _shard_files(src: Path) -> list[str]:
    """The weight files of a model folder: model.safetensors, or the shards its index names — each
    a relative name inside the folder (an index is downloaded data: `../x` or `/x` would read
    files elsewhere)."""
    index = src / INDEX
    if not index.is_file():
        if (src / "model.safetensors").is_file():
            return ["model.safetensors"]
        raise UsageError(f"{src}: no model.safetensors or {INDEX} (only safetensors weights are read)")
    weight_map = read_json_object(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise UsageError(f"{index}: weight_map must be an object of tensor name -> shard file, got {shown(weight_map)}")
    for tensor, name in weight_map.items():
        if not isinstance(name, str) or not name.strip():
            raise UsageError(f"{index}: weight_map[{shown(tensor)}] must be a shard file name, got {shown(name)}")
        parts = PurePosixPath(name).parts
        if PurePosixPath(name).is_absolute() or "\\" in name or ".." in parts:
            raise UsageError(f"{index}: weight_map[{shown(tensor)}] names {shown(name)}, outside the model folder")
    return sorted(set(weight_map.values()))


class LazyTensors:
    """`take(name)`: one tensor from whichever shard holds it, read when asked, its shape checked
    first against what the config implies (`expected`: name -> shape) so nothing is read, padded
    or concatenated on a size the config and the file disagree on."""

    def __init__(self, src: Path, stack: ExitStack, expected: dict[str, tuple[int, ...]] | None = None):
        from safetensors import SafetensorError, safe_open

        self.where, self.shards, self.files, self.expected = src, {}, [], expected or {}
        for name in _shard_files(src):
            path = src / name
            if not path.exists():
                raise UsageError(f"{path}: missing (named in {INDEX})")
            if not path.is_file():  # a FIFO would block the reader forever, a device never end
                raise UsageError(f"{path}: not a regular file")
            try:
                f = stack.enter_context(safe_open(str(path), framework="pt"))
            except (SafetensorError, OSError, ValueError) as e:
                raise UsageError(f"{path}: missing, corrupt or unreadable ({e})") from e
            self.files.append(path)
            self.shards.update({k: f for k in f.keys()})

    def __call__(self, name: str) -> torch.Tensor:
        if name not in self.shards:
            raise UsageError(f"{self.where}: tensor {name} is missing")
        shape = tuple(self.shards[name].get_slice(name).get_shape())
        want = self.expected.get(name)
        if want is not None and not _fits(shape, want, name):
            raise UsageError(f"{self.where}: tensor {name} has shape {shape}, config.json implies {want}"
                             + (" (its vocab_size)" if name in VOCAB_TENSORS else ""))
        return self.shards[name].get_tensor(name)

    def dtype(self) -> torch.dtype:
        """The stored dtype when every floating tensor shares it, else float32."""
        kinds = {str(f.get_slice(k).get_dtype()) for k, f in self.shards.items()}
        return {"BF16": torch.bfloat16, "F16": torch.float16}.get(kinds.pop(), torch.float32) if len(kinds) == 1 else torch.float32


VOCAB_TENSORS = ("model.embed_tokens.weight", "lm_head.weight")


def _fits(shape: tuple[int, ...], want: tuple[int, ...], name: str) -> bool:
    """The vocabulary tables may hold fewer rows than the padded size (less than one multiple short:
    the release's own vocab_size), never more; every other shape is exact."""
    if name in VOCAB_TENSORS and len(shape) == 2:
        return shape[1] == want[1] and want[0] - VOCAB_MULTIPLE < shape[0] <= want[0]
    return shape == want


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """transformers' tensor names and shapes for `cfg`, computed on the meta device (no memory)."""
    from llmctl.model.transformer import Transformer

    with torch.device("meta"):
        ours = Transformer(cfg).state_dict()
        return {k: tuple(v.shape) for k, v in hf_state_dict(cfg, ours).items()}


def generation_config(src: Path, hf: dict, size: int) -> dict:
    """generation_config.json of the release, with bos/eos/pad ids from config.json where it has
    none (those of them that are ids below `size`: old configs write -1 for none)."""
    gen = read_json_object(src / "generation_config.json")
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        ids = token_ids(hf.get(key))
        if gen.get(key) is None and ids and all(0 <= i < size for i in ids):
            gen[key] = hf[key]
    return gen


def import_hf(src: str | Path, out: str | Path, chat: bool | None = None, overwrite: bool = False) -> Path:
    """Write `out/step-000000/` (and `out/latest`, `out/manifest.json`) from a Hugging Face model
    directory: config.json, model.safetensors (single or sharded), tokenizer.json (+ its siblings).
    Run again into its own `out` (artifacts/rerun.py), an interrupted import starts over and a
    finished one is a no-op."""
    directory_only(out, "a checkpoint")
    with output_lock(out):
        return _import_hf(Path(src), Path(out), chat, overwrite)


def _import_hf(src: Path, out: Path, chat: bool | None, overwrite: bool) -> Path:
    from llmctl.model.transformer import Transformer

    src, out = Path(src), Path(out)
    if not (src / "config.json").is_file():
        raise UsageError(f"{src}: no config.json (expected a Hugging Face model directory)")
    hf = read_json_object(src / "config.json")
    tok = src / "tokenizer.json"
    if not tok.is_file():
        raise UsageError(f"{src}: no tokenizer.json (import needs the fast-tokenizer file)")
    where = f"{src / 'config.json'}"
    cfg = import_config(hf, where)
    vocab = Vocab(src)
    gen = generation_config(src, hf, model_rows(src, vocab.size))
    eos = tuple(token_ids(gen.get("eos_token_id"))) or vocab.eos_ids
    if not eos:
        raise UsageError(f"{src}: no EOS id in generation_config.json, config.json or tokenizer_config.json")
    if chat is None:
        chat = vocab.speaks_chat(eos)
    elif chat:
        vocab.require_chat()
    # A table padded for the matmuls (ours on export, some releases) keeps the tokenizer's size as
    # vocab_size when the padded size is the same, so ids past the tokenizer are never sampled.
    if vocab.size < cfg.vocab_size and ModelConfig.from_dict({**cfg.to_dict(), "vocab_size": vocab.size}).padded_vocab == cfg.padded_vocab:
        cfg = ModelConfig.from_dict({**cfg.to_dict(), "vocab_size": vocab.size})
    with ExitStack() as stack:
        take = LazyTensors(src, stack)  # the index and the shards' headers: no tensor read yet
        dtype = take.dtype()
        cfg.check_memory(where, bytes_per_param=dtype.itemsize, rope=False)  # the tensors are held until saved
        take.expected = expected_shapes(cfg)
        refs = [input_ref(src / "config.json")] + [input_ref(src / n) for n in TOKENIZER_FILES if (src / n).is_file()] \
            + [input_ref(p) for p in take.files]
        ident = run_identity("import", {"model": cfg.to_dict(), "chat": chat}, refs)
        if claim_out(out, ident, overwrite, own=("step-*", LATEST)):  # what save_checkpoint writes before the manifest
            return out / step_dir_name(0)
        stack.enter_context(running(out))
        tensors = our_state_dict(cfg, take, str(src))
        with torch.device("meta"):  # shapes checked against the config without allocating a model
            expected = {k: tuple(v.shape) for k, v in Transformer(cfg).state_dict().items()}
        for k, v in tensors.items():
            if tuple(v.shape) != expected[k]:
                raise UsageError(f"{src}: tensor {k} has shape {tuple(v.shape)}, config.json implies {expected[k]}")
        state = {"step": 0, "tokens": 0, "imported_from": str(src.resolve()), "hf_architecture": (hf.get("architectures") or [None])[0],
                 "chat": chat, "chat_template": vocab.chat.name if chat else None}
        path = save_checkpoint(out, 0, cfg, tensors, state, tokenizer_file=tok, dtype=dtype,
                               extra_json={TOKENIZER_FILES[3]: {**gen, "eos_token_id": list(eos) if len(eos) > 1 else eos[0]}})
        write_manifest(out, Manifest(kind="checkpoint", stage="import", config={"model": cfg.to_dict(), "chat": chat},
                                     inputs=refs, outputs=[], counts={"tensors": len(tensors), "parameters": cfg.n_params()}))
    return path
