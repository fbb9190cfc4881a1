"""Export a checkpoint as a Hugging Face `LlamaForCausalLM` directory.

Our blocks fuse Q/K/V and gate/up into single projections; Llama keeps them apart, so export is a
renaming plus two splits. Everything else (RoPE in rotate-half form, RMSNorm in fp32, no biases,
a tied or untied head) already matches transformers' Llama, which is what lets its logits equal ours.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from llmctl.artifacts.checkpoint import load_checkpoint
from llmctl.model.config import ModelConfig


def hf_state_dict(cfg: ModelConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our tensor names and layout → `LlamaForCausalLM`'s."""
    q_dim, kv_dim = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    out = {"model.embed_tokens.weight": tensors["embed.weight"], "model.norm.weight": tensors["norm.weight"]}
    if not cfg.tied:
        out["lm_head.weight"] = tensors["head.weight"]
    for i in range(cfg.n_layers):
        ours, hf = f"layers.{i}.", f"model.layers.{i}."
        q, k, v = tensors[ours + "attn.qkv.weight"].split((q_dim, kv_dim, kv_dim), dim=0)
        gate, up = tensors[ours + "mlp.gate_up.weight"].split(cfg.d_ff, dim=0)
        out.update({
            hf + "self_attn.q_proj.weight": q,
            hf + "self_attn.k_proj.weight": k,
            hf + "self_attn.v_proj.weight": v,
            hf + "self_attn.o_proj.weight": tensors[ours + "attn.o.weight"],
            hf + "mlp.gate_proj.weight": gate,
            hf + "mlp.up_proj.weight": up,
            hf + "mlp.down_proj.weight": tensors[ours + "mlp.down.weight"],
            hf + "input_layernorm.weight": tensors[ours + "attn_norm.weight"],
            hf + "post_attention_layernorm.weight": tensors[ours + "mlp_norm.weight"],
        })
    return {k: v.contiguous() for k, v in out.items()}


def tokenizer_files(tokenizer_json: Path, out: Path, max_len: int) -> None:
    """tokenizer.json plus the small config files `AutoTokenizer` reads."""
    shutil.copyfile(tokenizer_json, out / "tokenizer.json")
    added = {t["content"] for t in json.loads(tokenizer_json.read_text()).get("added_tokens", [])}
    eos = "<|endoftext|>" if "<|endoftext|>" in added else None
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_len, "clean_up_tokenization_spaces": False}
    if eos:
        cfg.update(eos_token=eos, bos_token=eos, pad_token=eos)
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def export_hf(checkpoint: str | Path, out: Path) -> Path:
    """Write config.json, model.safetensors and tokenizer files of `checkpoint` into `out`."""
    ckpt = load_checkpoint(checkpoint)
    cfg = ckpt.config
    out.mkdir(parents=True, exist_ok=True)
    hf_cfg = cfg.to_hf_config()
    tok = ckpt.tokenizer_file
    if tok is not None:
        ids = {t["content"]: t["id"] for t in json.loads(tok.read_text()).get("added_tokens", [])}
        if "<|endoftext|>" in ids:
            hf_cfg.update(eos_token_id=ids["<|endoftext|>"], bos_token_id=ids["<|endoftext|>"])
        tokenizer_files(tok, out, cfg.max_seq_len)
    (out / "config.json").write_text(json.dumps(hf_cfg, indent=2) + "\n")
    save_file(hf_state_dict(cfg, ckpt.tensors), str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


# ---------------------------------------------------------------------------------------------
# import: a Hugging Face LlamaForCausalLM directory → our checkpoint (the inverse of export)


def _hf_model_config(hf: dict, where: Path) -> ModelConfig:
    """ModelConfig of a Llama config.json, refusing what our decoder does not compute the same way."""
    from llmctl.errors import UsageError

    archs = hf.get("architectures") or []
    if hf.get("model_type") != "llama" or (archs and "LlamaForCausalLM" not in archs):
        raise UsageError(f"{where}: not a LlamaForCausalLM model (model_type {hf.get('model_type')!r}, "
                         f"architectures {archs}); import reads Llama-architecture checkpoints only")
    for key, ok in (("hidden_act", "silu"), ("attention_bias", False), ("mlp_bias", False)):
        if hf.get(key, ok) != ok:
            raise UsageError(f"{where}: {key} = {hf[key]!r} is not supported (our decoder has {key} = {ok!r})")
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in (None, "default"):
        raise UsageError(f"{where}: RoPE scaling {kind!r} is not supported (plain RoPE only)")
    hf = dict(hf)
    if "rope_theta" not in hf and "rope_theta" in rope:  # transformers ≥ 5 nests it
        hf["rope_theta"] = rope["rope_theta"]
    return ModelConfig.from_hf_config(hf)


def _read_hf_tensors(src: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from llmctl.errors import UsageError

    index = src / "model.safetensors.index.json"
    if index.is_file():
        try:
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError) as e:
            raise UsageError(f"{index}: not a safetensors index ({e})") from e
    elif (src / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise UsageError(f"{src}: no model.safetensors or model.safetensors.index.json (only safetensors weights are read)")
    tensors: dict[str, torch.Tensor] = {}
    for name in files:
        try:
            tensors.update(load_file(str(src / name)))
        except (SafetensorError, OSError, ValueError) as e:
            raise UsageError(f"{src / name}: missing, corrupt or unreadable ({e})") from e
    return tensors


def our_state_dict(cfg: ModelConfig, hf: dict[str, torch.Tensor], where: Path) -> dict[str, torch.Tensor]:
    """`LlamaForCausalLM` tensors → ours: q/k/v and gate/up fused, the vocabulary rows padded with
    zeros to padded_vocab (ids past vocab_size are never produced or sampled). Inverse of hf_state_dict."""
    from llmctl.errors import UsageError

    def take(name: str) -> torch.Tensor:
        if name not in hf:
            raise UsageError(f"{where}: tensor {name} is missing")
        return hf[name].to(torch.float32)

    def pad_rows(t: torch.Tensor) -> torch.Tensor:
        if t.shape[0] > cfg.padded_vocab:
            raise UsageError(f"{where}: {t.shape[0]} vocabulary rows exceed the config's {cfg.padded_vocab}")
        return torch.cat([t, t.new_zeros(cfg.padded_vocab - t.shape[0], t.shape[1])]) if t.shape[0] < cfg.padded_vocab else t

    out = {"embed.weight": pad_rows(take("model.embed_tokens.weight")), "norm.weight": take("model.norm.weight")}
    if not cfg.tied:
        out["head.weight"] = pad_rows(take("lm_head.weight"))
    for i in range(cfg.n_layers):
        ours, h = f"layers.{i}.", f"model.layers.{i}."
        out.update({
            ours + "attn.qkv.weight": torch.cat([take(h + f"self_attn.{p}_proj.weight") for p in "qkv"]),
            ours + "attn.o.weight": take(h + "self_attn.o_proj.weight"),
            ours + "mlp.gate_up.weight": torch.cat([take(h + "mlp.gate_proj.weight"), take(h + "mlp.up_proj.weight")]),
            ours + "mlp.down.weight": take(h + "mlp.down_proj.weight"),
            ours + "attn_norm.weight": take(h + "input_layernorm.weight"),
            ours + "mlp_norm.weight": take(h + "post_attention_layernorm.weight"),
        })
    return out


def import_hf(src: str | Path, out: str | Path) -> Path:
    """Write `out/step-000000/` (and `out/latest`, `out/manifest.json`) from a LlamaForCausalLM
    directory: config.json + model.safetensors (single or sharded) + tokenizer.json."""
    from llmctl.artifacts.checkpoint import save_checkpoint
    from llmctl.artifacts.manifest import Manifest, input_ref, write_manifest
    from llmctl.errors import UsageError
    from llmctl.model.transformer import Transformer

    src, out = Path(src), Path(out)
    if not (src / "config.json").is_file():
        raise UsageError(f"{src}: no config.json (expected a Hugging Face model directory)")
    try:
        hf_cfg = json.loads((src / "config.json").read_text())
    except json.JSONDecodeError as e:
        raise UsageError(f"{src / 'config.json'}: invalid JSON ({e})") from e
    tok = src / "tokenizer.json"
    if not tok.is_file():
        raise UsageError(f"{src}: no tokenizer.json (import needs the fast-tokenizer file)")
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"{out} is not empty")
    cfg = _hf_model_config(hf_cfg, src / "config.json")
    from tokenizers import Tokenizer

    try:
        n_tok = Tokenizer.from_file(str(tok)).get_vocab_size(with_added_tokens=True)
    except Exception as e:  # tokenizers raises a bare Exception on a bad file
        raise UsageError(f"{tok}: not a Hugging Face tokenizer.json ({str(e).splitlines()[0]})") from e
    # A table padded for the matmuls (ours on export, some released models) keeps the tokenizer's
    # size as vocab_size when the padded size is the same, so ids past it are never sampled.
    if n_tok < cfg.vocab_size and ModelConfig.from_dict({**cfg.to_dict(), "vocab_size": n_tok}).padded_vocab == cfg.padded_vocab:
        cfg = ModelConfig.from_dict({**cfg.to_dict(), "vocab_size": n_tok})
    tensors = our_state_dict(cfg, _read_hf_tensors(src), src)
    with torch.device("meta"):  # shapes checked against the config without allocating a model
        expected = {k: tuple(v.shape) for k, v in Transformer(cfg).state_dict().items()}
    for k, v in tensors.items():
        if tuple(v.shape) != expected[k]:
            raise UsageError(f"{src}: tensor {k} has shape {tuple(v.shape)}, config.json implies {expected[k]}")
    path = save_checkpoint(out, 0, cfg, tensors, {"step": 0, "tokens": 0, "imported_from": str(src.resolve())},
                           tokenizer_file=tok)
    write_manifest(out, Manifest(kind="checkpoint", stage="import", config={"model": cfg.to_dict()},
                                 inputs=[input_ref(src / "config.json"), input_ref(tok)] + [
                                     input_ref(p) for p in sorted(src.glob("*.safetensors"))],
                                 outputs=[], counts={"tensors": len(tensors), "parameters": cfg.n_params()}))
    return path
