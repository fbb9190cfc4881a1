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
