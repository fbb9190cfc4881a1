"""How our decoder maps onto transformers' causal-LM classes: config.json keys and tensor names,
both ways. `llmctl export` and `llmctl import` are file handling around these functions.

Our blocks fuse Q/K/V and gate/up into single projections; transformers keeps them apart, so a
checkpoint crosses over by renaming plus two splits (or two concatenations). Which class a model
becomes follows from the options it uses:

    no biases, no q/k norm          LlamaForCausalLM    (also what Mistral and SmolLM2 are)
    q/k/v biases                    Qwen2ForCausalLM    (Qwen2 / Qwen2.5)
    q/k/v and output biases         LlamaForCausalLM with attention_bias
    per-head q/k RMSNorm            Qwen3ForCausalLM    (attention_bias covers q, k, v and o there)

What computes differently is refused with one line naming it: OLMo 2 (norms after each sublayer,
q/k norm over the full width), GPT-2 (learned positions, LayerNorm, GELU), MLP biases, YaRN and
LongRoPE scaling, a sliding window that binds inside the context.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from llmctl.errors import UsageError
from llmctl.model.config import ROPE_SCALINGS, ModelConfig, build, check_fields, check_rope_scaling, shown

if TYPE_CHECKING:  # torch is imported where tensors are handled: `llmctl plan` reads configs only
    import torch

ACCEPTED = {  # model_type -> the architecture class it is written as
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
REFUSED = {
    "olmo2": "OLMo 2 normalizes after each sublayer and over the full q/k width, not the block llmctl computes",
    "olmo": "OLMo's non-parametric LayerNorm is not the block llmctl computes",
    "gpt2": "GPT-2 has learned positions, LayerNorm and GELU, not the Llama-style block llmctl computes",
    "gemma": "Gemma's four norms, GeGLU and scaled embeddings are not the block llmctl computes",
}


HF_KEYS = {  # our field -> the config.json key it is read from (its messages name that key)
    "vocab_size": "vocab_size", "n_layers": "num_hidden_layers", "d_model": "hidden_size", "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads", "head_dim": "head_dim", "d_ff": "intermediate_size",
    "max_seq_len": "max_position_embeddings", "rope_base": "rope_theta", "norm_eps": "rms_norm_eps", "tied": "tie_word_embeddings",
}
HF_DEFAULTS = {"max_seq_len": 2048, "rope_base": 10000.0, "norm_eps": 1e-5, "tied": False}  # transformers' where a file has none


def config_from_hf(hf: dict[str, Any], where: str = "HF config") -> ModelConfig:
    """The dimensions of a dense Llama-family config.json (no checks of what else it holds:
    `llmctl plan` counts many families with it; import checks with `import_config`). Each value is
    checked (type, finite, range) before anything is sized by it, the error naming its key."""
    if not isinstance(hf, dict):
        raise UsageError(f"{where}: must hold a JSON object, got {type(hf).__name__}")
    for key in ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size"):
        if hf.get(key) is None:
            raise UsageError(f"{where}: lacks {key!r}")
    values = {ours: hf.get(key) for ours, key in HF_KEYS.items()}
    names = dict(HF_KEYS)
    rope = hf.get("rope_parameters")
    if values["rope_base"] is None and isinstance(rope, dict) and rope.get("rope_theta") is not None:
        # transformers ≥ 5 nests rope_theta in rope_parameters; released files keep it at the top
        values["rope_base"], names["rope_base"] = rope["rope_theta"], "rope_parameters.rope_theta"
    values.update({k: v for k, v in HF_DEFAULTS.items() if values[k] is None})
    check_fields(values, where, names)
    d, h = values["d_model"], values["n_heads"]
    if values["n_kv_heads"] is None:
        values["n_kv_heads"] = h
    if values["head_dim"] is None and d % h == 0:
        values["head_dim"] = d // h
    values["rope_base"], values["norm_eps"] = float(values["rope_base"]), float(values["norm_eps"])
    return build(ModelConfig, values, where)


def _rope_scaling(hf: dict, where: str) -> dict | None:
    key = "rope_parameters" if hf.get("rope_parameters") else "rope_scaling"
    rs = hf.get(key)
    if rs is None:
        return None
    if not isinstance(rs, dict):
        raise UsageError(f"{where}: {key} must be an object, got {shown(rs)}")
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind in (None, "default"):
        return None
    if kind not in ROPE_SCALINGS:
        raise UsageError(f"{where}: RoPE scaling {kind!r} is not supported ({', '.join(['default', *ROPE_SCALINGS])} are)")
    out = {"rope_type": kind}
    for name in ROPE_SCALINGS[kind]:
        value = rs.get(name)
        if value is None and name == "original_max_position_embeddings":
            value = hf.get("max_position_embeddings")  # transformers' fallback for dynamic
        out[name] = value
    check_rope_scaling(out, where, key)
    return out


def _sliding_window_binds(hf: dict, context: int) -> int | None:
    """The window size when some layer's sliding window is shorter than the context, else None."""
    window = hf.get("sliding_window")
    if not isinstance(window, int) or isinstance(window, bool) or window >= context:
        return None
    layer_types = hf.get("layer_types")
    if isinstance(layer_types, list):  # transformers ≥ 4.53 names each layer's attention
        return window if "sliding_attention" in layer_types else None
    if hf.get("model_type") in ("qwen2", "qwen3"):  # windowed only when switched on, from max_window_layers up
        first = hf.get("max_window_layers", 0)
        on = hf.get("use_sliding_window", False) and (not isinstance(first, int) or first < hf["num_hidden_layers"])
        return window if on else None
    return window  # mistral: every layer


def import_config(hf: dict[str, Any], where: str) -> ModelConfig:
    """ModelConfig of a released model's config.json, refusing what our decoder computes otherwise."""
    if not isinstance(hf, dict):
        raise UsageError(f"{where}: must hold a JSON object, got {type(hf).__name__}")
    archs = hf.get("architectures") or []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise UsageError(f"{where}: architectures must be a list of class names, got {shown(archs)}")
    mt = str(hf.get("model_type", ""))
    family = mt.split("_")[0] if mt.startswith("gemma") else mt
    if family in REFUSED:
        raise UsageError(f"{where}: {REFUSED[family]} (import reads {', '.join(ACCEPTED.values())})")
    if mt not in ACCEPTED or (archs and ACCEPTED[mt] not in archs):
        raise UsageError(f"{where}: model_type {shown(mt)} ({', '.join(archs) or 'no architectures'}) is not supported; "
                         f"import reads {', '.join(ACCEPTED.values())}")
    for key in ("attention_bias", "mlp_bias", "use_sliding_window"):
        if hf.get(key) is not None and not isinstance(hf[key], bool):
            raise UsageError(f"{where}: {key} must be true or false, got {shown(hf[key])}")
    if hf.get("hidden_act", "silu") != "silu":
        raise UsageError(f"{where}: hidden_act {shown(hf['hidden_act'])} is not supported (SwiGLU with silu only)")
    if hf.get("mlp_bias"):
        raise UsageError(f"{where}: mlp_bias is not supported")
    if hf.get("partial_rotary_factor", 1.0) != 1.0:
        raise UsageError(f"{where}: partial_rotary_factor {shown(hf['partial_rotary_factor'])} is not supported")
    cfg = config_from_hf(hf, where)
    context = cfg.max_seq_len if hf.get("max_position_embeddings") is not None else 0
    if (window := _sliding_window_binds(hf, context)) is not None:
        raise UsageError(f"{where}: a sliding window of {window} tokens inside a {cfg.max_seq_len}-token "
                         "context is not supported (full causal attention only)")
    biased = bool(hf.get("attention_bias"))
    cfg.qkv_bias = mt == "qwen2" or biased
    cfg.o_bias = mt != "qwen2" and biased
    cfg.qk_norm = mt == "qwen3"
    cfg.rope_scaling = _rope_scaling(hf, where)
    if cfg.rope_scaling and cfg.rope_scaling["rope_type"] == "dynamic" and cfg.head_dim <= 2:
        raise UsageError(f"{where}: dynamic RoPE scaling needs a head_dim above 2, got {cfg.head_dim}")
    return cfg


def architecture(cfg: ModelConfig) -> tuple[str, str]:
    """(architectures entry, model_type) that computes what `cfg` computes."""
    if cfg.qk_norm:
        if cfg.qkv_bias != cfg.o_bias:
            raise UsageError("a q/k-norm model with q/k/v biases but no output bias has no transformers class")
        return "Qwen3ForCausalLM", "qwen3"
    if cfg.qkv_bias and not cfg.o_bias:
        return "Qwen2ForCausalLM", "qwen2"
    if cfg.o_bias and not cfg.qkv_bias:
        raise UsageError("an output bias without q/k/v biases has no transformers class")
    return "LlamaForCausalLM", "llama"


def hf_config(cfg: ModelConfig, vocab_rows: int | None = None, dtype: str = "float32") -> dict[str, Any]:
    """The config.json of `cfg` for its transformers class, with `vocab_rows` embedding rows."""
    arch, model_type = architecture(cfg)
    out = {
        "architectures": [arch],
        "model_type": model_type,
        "vocab_size": vocab_rows or cfg.padded_vocab,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "max_position_embeddings": cfg.max_seq_len,
        "rope_theta": cfg.rope_base,
        "rms_norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tied,
        "hidden_act": "silu",
        "initializer_range": cfg.init_std,
        "torch_dtype": dtype,
    }
    if model_type == "llama":
        out.update(attention_bias=cfg.o_bias, mlp_bias=False)
    elif model_type == "qwen3":
        out.update(attention_bias=cfg.o_bias, use_sliding_window=False, sliding_window=None)
    else:
        out.update(use_sliding_window=False, sliding_window=None)
    if cfg.rope_scaling:  # the key released files and vLLM read; transformers ≥ 5 converts it
        out["rope_scaling"] = dict(cfg.rope_scaling)
    return out


# ---------------------------------------------------------------------------------------------
# tensors


def _block_names(i: int) -> tuple[str, str]:
    return f"layers.{i}.", f"model.layers.{i}."


def hf_state_dict(cfg: ModelConfig, tensors: dict[str, torch.Tensor], vocab_rows: int | None = None) -> dict[str, torch.Tensor]:
    """Our tensor names and layout → transformers'; the vocabulary cut to `vocab_rows` rows."""
    q_dim, kv_dim = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    rows = vocab_rows or cfg.padded_vocab
    out = {"model.embed_tokens.weight": tensors["embed.weight"][:rows], "model.norm.weight": tensors["norm.weight"]}
    if not cfg.tied:
        out["lm_head.weight"] = tensors["head.weight"][:rows]
    for i in range(cfg.n_layers):
        ours, hf = _block_names(i)
        attn = hf + "self_attn."
        for kind in ("weight", "bias") if cfg.qkv_bias else ("weight",):
            q, k, v = tensors[f"{ours}attn.qkv.{kind}"].split((q_dim, kv_dim, kv_dim), dim=0)
            out.update({f"{attn}q_proj.{kind}": q, f"{attn}k_proj.{kind}": k, f"{attn}v_proj.{kind}": v})
        if cfg.o_bias:
            out[attn + "o_proj.bias"] = tensors[ours + "attn.o.bias"]
        if cfg.qk_norm:
            out[attn + "q_norm.weight"] = tensors[ours + "attn.q_norm.weight"]
            out[attn + "k_norm.weight"] = tensors[ours + "attn.k_norm.weight"]
        gate, up = tensors[ours + "mlp.gate_up.weight"].split(cfg.d_ff, dim=0)
        out.update({
            attn + "o_proj.weight": tensors[ours + "attn.o.weight"],
            hf + "mlp.gate_proj.weight": gate,
            hf + "mlp.up_proj.weight": up,
            hf + "mlp.down_proj.weight": tensors[ours + "mlp.down.weight"],
            hf + "input_layernorm.weight": tensors[ours + "attn_norm.weight"],
            hf + "post_attention_layernorm.weight": tensors[ours + "mlp_norm.weight"],
        })
    return {k: v.contiguous() for k, v in out.items()}


def our_state_dict(cfg: ModelConfig, take, where: str) -> dict[str, torch.Tensor]:
    """transformers' tensors → ours: q/k/v and gate/up fused, the vocabulary padded with zero rows
    to padded_vocab (ids past vocab_size are never produced or sampled). `take(name)` returns one
    tensor (read lazily from its shard, in its stored dtype); the inverse of hf_state_dict."""
    import torch

    def pad_rows(t: torch.Tensor) -> torch.Tensor:
        if t.shape[0] > cfg.padded_vocab:
            raise UsageError(f"{where}: {t.shape[0]} vocabulary rows exceed the config's {cfg.padded_vocab}")
        return torch.cat([t, t.new_zeros(cfg.padded_vocab - t.shape[0], t.shape[1])]) if t.shape[0] < cfg.padded_vocab else t

    out = {"embed.weight": pad_rows(take("model.embed_tokens.weight")), "norm.weight": take("model.norm.weight")}
    if not cfg.tied:
        out["head.weight"] = pad_rows(take("lm_head.weight"))
    for i in range(cfg.n_layers):
        ours, hf = _block_names(i)
        attn = hf + "self_attn."
        for kind in ("weight", "bias") if cfg.qkv_bias else ("weight",):
            out[f"{ours}attn.qkv.{kind}"] = torch.cat([take(f"{attn}{p}_proj.{kind}") for p in "qkv"])
        if cfg.o_bias:
            out[ours + "attn.o.bias"] = take(attn + "o_proj.bias")
        if cfg.qk_norm:
            out[ours + "attn.q_norm.weight"] = take(attn + "q_norm.weight")
            out[ours + "attn.k_norm.weight"] = take(attn + "k_norm.weight")
        out.update({
            ours + "attn.o.weight": take(attn + "o_proj.weight"),
            ours + "mlp.gate_up.weight": torch.cat([take(hf + "mlp.gate_proj.weight"), take(hf + "mlp.up_proj.weight")]),
            ours + "mlp.down.weight": take(hf + "mlp.down_proj.weight"),
            ours + "attn_norm.weight": take(hf + "input_layernorm.weight"),
            ours + "mlp_norm.weight": take(hf + "post_attention_layernorm.weight"),
        })
    return out
