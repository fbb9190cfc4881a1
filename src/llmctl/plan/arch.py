"""What `plan` needs to know about a model, from a train preset or a Hugging Face config.json.

`Arch` holds the exact parameter counts (total and activated) and the few shapes the FLOP,
memory and KV-cache formulas use. Dense Llama-style models are counted by
`llmctl.model.config.ModelConfig` (spec 001-compute-appendix §B1); this module adds what that
class does not model: MoE layers (§B1b), multi-head latent attention (DeepSeek), biases and
full-width QK-norm (Qwen2, OLMo 2), GPT-2 blocks, and unpadded vocabularies of HF checkpoints.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmctl.errors import UsageError
from llmctl.model.config import ModelConfig
from llmctl.model.hf_layout import config_from_hf


@dataclass
class Block:
    """`count` blocks of one kind, each with `params` parameters of which `active` do work per token."""

    kind: str
    count: int
    params: int
    active: int


@dataclass
class Arch:
    name: str
    source: str
    family: str  # "llama" (dense, ModelConfig), "moe", "gpt2"
    vocab: int  # rows of the token table as stored (a preset's vocabulary is padded to 64)
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_qk: int  # query/key width per head (d_h; MLA: nope + rope)
    d_v: int  # value width per head
    d_ff: float  # MLP width a token goes through (MoE: activated experts, averaged over layers)
    tied: bool
    max_seq_len: int
    n_params: int
    n_active: int
    n_matmul: int  # activated params that do matmul work: input tables out, head in (§B1, §B3)
    embedding: int  # token table V·d
    head: int  # untied output head (0 when tied)
    position_embedding: int
    final_norm: int
    blocks: list[Block]
    kv_elements_per_layer: int  # cached K+V elements per token per layer (2·h_kv·d_h; MLA d_c + d_h^R)
    attention: str = "gqa"  # "mha", "gqa", "mqa", "mla"
    moe: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    model_config: ModelConfig | None = None

    @property
    def attn_dim(self) -> float:
        """h·d_h of the attention FLOP terms; h·(d_qk + d_v)/2 when they differ (§C6)."""
        return self.n_heads * (self.d_qk + self.d_v) / 2

    @property
    def kv_attn_width(self) -> float:
        """h_kv·d_h: per-token width of K (and of V) as the attention kernel sees them."""
        return self.n_kv_heads * (self.d_qk + self.d_v) / 2

    @property
    def non_embedding(self) -> int:
        return self.n_params - self.embedding - self.head - self.position_embedding

    def summary(self) -> dict[str, Any]:
        out = {
            "name": self.name, "source": self.source, "family": self.family, "attention": self.attention,
            "vocab": self.vocab, "d_model": self.d_model, "n_layers": self.n_layers, "n_heads": self.n_heads,
            "n_kv_heads": self.n_kv_heads, "head_dim": self.d_qk if self.d_qk == self.d_v else {"qk": self.d_qk, "v": self.d_v},
            "d_ff": self.d_ff if self.family != "moe" else None, "tied": self.tied, "max_seq_len": self.max_seq_len,
        }
        if self.moe:
            out["moe"] = self.moe
        return out


# -- dense Llama-style, counted by ModelConfig ------------------------------------------------


def from_model_config(cfg: ModelConfig, name: str, source: str, vocab_rows: int | None = None,
                      extra_per_layer: int = 0, notes: list[str] | None = None) -> Arch:
    """A dense decoder counted by `ModelConfig` (§B1). `vocab_rows`: the table size of a checkpoint
    whose vocabulary is not padded to 64 (ModelConfig pads); `extra_per_layer`: biases or
    full-width QK-norm gains that ModelConfig's block lacks."""
    d, L = cfg.d_model, cfg.n_layers
    pad = cfg.padded_vocab - (vocab_rows if vocab_rows is not None else cfg.padded_vocab)
    untied = 0 if cfg.tied else 1
    emb = cfg.embedding_params() - pad * d
    block = cfg.block_params() + extra_per_layer
    n = cfg.n_params() - pad * d * (1 + untied) + L * extra_per_layer
    n_mm = cfg.n_params_matmul() - pad * d + L * extra_per_layer
    hkv = cfg.n_kv_heads
    return Arch(
        name=name, source=source, family="llama", vocab=cfg.padded_vocab - pad, d_model=d, n_layers=L,
        n_heads=cfg.n_heads, n_kv_heads=hkv, d_qk=cfg.head_dim, d_v=cfg.head_dim, d_ff=cfg.d_ff,
        tied=cfg.tied, max_seq_len=cfg.max_seq_len, n_params=n, n_active=n, n_matmul=n_mm,
        embedding=emb, head=emb * untied, position_embedding=0, final_norm=d,
        blocks=[Block("dense", L, block, block)],
        kv_elements_per_layer=cfg.kv_cache_bytes_per_token(bytes_per_element=1) // L,
        attention="mha" if hkv == cfg.n_heads else "mqa" if hkv == 1 else "gqa",
        notes=list(notes or []), model_config=cfg,
    )


def load_preset(name_or_path: str) -> tuple[Arch, dict[str, Any]]:
    """A train preset (`stages/train/NAME.toml` or a path): its [model] as an Arch, its [train] table."""
    from llmctl.config import find_config, read_toml

    from llmctl.bounds import check_value
    from llmctl.config import build_config

    path = find_config("train", name_or_path)
    data = read_toml(path)
    if not isinstance(data.get("model"), dict):
        raise UsageError(f"{path}: no [model] table")
    cfg = build_config(ModelConfig, "train", str(path), table="model")  # as train builds it: types and ranges checked
    train = data.get("train") or {}
    # the [train] keys plan reads (TrainConfig itself would import torch, seconds for a plan)
    for k in ("seq_len", "micro_batch", "batch_tokens", "max_tokens"):
        v = train.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise UsageError(f"{path}: [train] {k}: expected int, got {v!r}")
        check_value("TrainConfig", k, v, f"{path}: [train] {k}")
    try:
        shown = path.resolve().relative_to(Path.cwd())
    except ValueError:
        shown = path
    return from_model_config(cfg, name=path.stem, source=str(shown)), train


# -- Hugging Face config.json -----------------------------------------------------------------

_MISSING = object()


def _int(hf: dict, key: str, default: Any = _MISSING, *alts: str) -> int:
    for k in (key, *alts):
        v = hf.get(k)
        if v is not None:
            break
    else:
        if default is _MISSING:
            raise UsageError(f"HF config lacks {key!r}")
        return default
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise UsageError(f"HF config: {key} must be a non-negative integer, got {v!r}")
    return v


def _positive(**values: int) -> None:
    for k, v in values.items():
        if v <= 0:
            raise UsageError(f"HF config: {k} must be positive, got {v}")


def _heads(hf: dict) -> tuple[int, int, int, int]:
    """(d, h, h_kv, d_h) with the checks a real attention layer needs."""
    d = _int(hf, "hidden_size")
    h = _int(hf, "num_attention_heads")
    hkv = _int(hf, "num_key_value_heads", 0) or h
    _positive(hidden_size=d, num_attention_heads=h, num_key_value_heads=hkv)
    hd = _int(hf, "head_dim", 0)
    if not hd:
        if d % h:
            raise UsageError(f"HF config: num_attention_heads ({h}) must divide hidden_size ({d})")
        hd = d // h
    if h % hkv:
        raise UsageError(f"HF config: num_key_value_heads ({hkv}) must divide num_attention_heads ({h})")
    return d, h, hkv, hd


MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
DENSE_TYPES = ("llama", "mistral", "qwen2", "qwen3", "olmo2", "gemma", "granite", "smollm3")


def arch_from_hf(hf: dict[str, Any], name: str = "hf", source: str = "config.json") -> Arch:
    """An Arch from a `config.json` of the Llama family (llama, mistral, qwen2, qwen3, olmo2), a MoE
    (mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek_v2, deepseek_v3) or gpt2."""
    if not isinstance(hf, dict):
        raise UsageError("HF config must be a JSON object")
    mt = str(hf.get("model_type", "")).lower()
    if mt == "gpt2":
        return _gpt2(hf, name, source)
    if mt in ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v2", "deepseek_v3"):
        return _moe(hf, mt, name, source)
    if any(hf.get(k) for k in MOE_KEYS):
        raise UsageError(f"HF config: MoE model_type {mt or '(none)'!r} is not supported "
                         "(mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek_v2, deepseek_v3 are)")
    if mt.startswith("gemma"):
        raise UsageError("HF config: Gemma blocks (4 norms, GeGLU, scaled embeddings) are not modelled")
    return _dense(hf, mt, name, source)


def _dense(hf: dict, mt: str, name: str, source: str) -> Arch:
    d, h, hkv, hd = _heads(hf)
    _int(hf, "intermediate_size")
    cfg = config_from_hf({**hf, "head_dim": hd})
    if cfg.d_ff <= 0:
        raise UsageError("HF config: intermediate_size must be positive")
    vocab = _int(hf, "vocab_size")
    extra, notes = 0, []
    if mt == "qwen3":
        cfg = dataclasses.replace(cfg, qk_norm=True)  # per-head q_norm, k_norm (2·d_h)
    if mt == "olmo2":
        extra += (h + hkv) * hd  # q_norm over h·d_h, k_norm over h_kv·d_h (§B1 "+2d per layer")
        notes.append("OLMo 2: QK-norm over the full q and k widths counted (+(h+h_kv)·d_h per layer)")
    if mt == "qwen2":
        extra += (h + 2 * hkv) * hd  # q, k, v biases
        notes.append("Qwen2: q/k/v biases counted")
    elif hf.get("attention_bias"):
        extra += (h + 2 * hkv) * hd + d
        notes.append("attention biases counted (q, k, v, o)")
    if hf.get("mlp_bias"):
        extra += 2 * cfg.d_ff + d
        notes.append("MLP biases counted")
    if mt and mt not in DENSE_TYPES:
        notes.append(f"model_type {mt!r} counted as a Llama-style block (GQA, SwiGLU, 2 RMSNorms)")
    if vocab % 64:
        notes.append(f"vocabulary {vocab:,} counted as stored (not padded to a multiple of 64)")
    return from_model_config(cfg, name, source, vocab_rows=vocab, extra_per_layer=extra, notes=notes)


def _gpt2(hf: dict, name: str, source: str) -> Arch:
    V, d, L, h = (_int(hf, k) for k in ("vocab_size", "n_embd", "n_layer", "n_head"))
    P = _int(hf, "n_positions", 1024)
    _positive(vocab_size=V, n_embd=d, n_layer=L, n_head=h)
    if d % h:
        raise UsageError(f"HF config: n_head ({h}) must divide n_embd ({d})")
    ff = _int(hf, "n_inner", 0) or 4 * d
    tied = bool(hf.get("tie_word_embeddings", True))
    # LayerNorms with bias (2·2d), qkv (3d² + 3d), proj (d² + d), fc (d·ff + ff), proj (ff·d + d)
    block = 4 * d + 4 * d * d + 4 * d + 2 * d * ff + ff + d
    emb, pos = V * d, P * d
    head = 0 if tied else emb
    n = emb + head + pos + L * block + 2 * d
    return Arch(
        name=name, source=source, family="gpt2", vocab=V, d_model=d, n_layers=L, n_heads=h, n_kv_heads=h,
        d_qk=d // h, d_v=d // h, d_ff=ff, tied=tied, max_seq_len=P, n_params=n, n_active=n,
        n_matmul=n - pos - (emb if not tied else 0), embedding=emb, head=head, position_embedding=pos,
        final_norm=2 * d, blocks=[Block("gpt2", L, block, block)], kv_elements_per_layer=2 * d, attention="mha",
        notes=["GPT-2: biases, LayerNorm and learned positions counted; activations by Korthikanti's GPT form (§B11)"],
    )


def _moe(hf: dict, mt: str, name: str, source: str) -> Arch:
    """MoE decoders (§B1b): N_active = L·(A + 2d) + 2·V·d + N_dense + N_moe,
    N_moe = L_moe·[(k + E_s)·3·d·d_e + d·E]; totals count all E experts."""
    V = _int(hf, "vocab_size")
    L = _int(hf, "num_hidden_layers")
    _positive(vocab_size=V, num_hidden_layers=L)
    tied = bool(hf.get("tie_word_embeddings", False))
    notes = ["MoE: memory follows total parameters, FLOPs follow activated ones (§B1b)"]
    d_ff_dense = _int(hf, "intermediate_size", 0)
    shared_w = 0  # width of the always-on shared expert MLP
    shared_gate = 0
    router_bias = 0
    qk_norm = 0
    attn_bias = 0
    mla = None
    if mt == "mixtral":
        d, h, hkv, hd = _heads(hf)
        E, k, d_e = _int(hf, "num_local_experts"), _int(hf, "num_experts_per_tok"), _int(hf, "intermediate_size")
        moe_layers = list(range(L))
    elif mt in ("qwen2_moe", "qwen3_moe", "olmoe"):
        d, h, hkv, hd = _heads(hf)
        E, k = _int(hf, "num_experts", _MISSING, "num_local_experts"), _int(hf, "num_experts_per_tok")
        if mt == "olmoe":
            d_e = _int(hf, "intermediate_size")
            moe_layers = list(range(L))
            qk_norm = (h + hkv) * hd
        else:
            d_e = _int(hf, "moe_intermediate_size")
            step = _int(hf, "decoder_sparse_step", 1) or 1
            only = set(hf.get("mlp_only_layers") or [])
            moe_layers = [i for i in range(L) if i not in only and E > 0 and (i + 1) % step == 0]
            if mt == "qwen2_moe":
                shared_w = _int(hf, "shared_expert_intermediate_size", 0)
                shared_gate = d if shared_w else 0
                attn_bias = (h + 2 * hkv) * hd
                notes.append("Qwen2-MoE: q/k/v biases and the shared expert's gate counted")
            else:
                qk_norm = 2 * hd
    else:  # deepseek_v2 / deepseek_v3: multi-head latent attention
        d = _int(hf, "hidden_size")
        h = _int(hf, "num_attention_heads")
        _positive(hidden_size=d, num_attention_heads=h)
        q_r = _int(hf, "q_lora_rank", 0)
        kv_r = _int(hf, "kv_lora_rank")
        nope, rope, dv = _int(hf, "qk_nope_head_dim"), _int(hf, "qk_rope_head_dim"), _int(hf, "v_head_dim")
        _positive(kv_lora_rank=kv_r, qk_nope_head_dim=nope, v_head_dim=dv)
        mla = {"q_lora_rank": q_r or None, "kv_lora_rank": kv_r, "qk_nope_head_dim": nope,
               "qk_rope_head_dim": rope, "v_head_dim": dv}
        hkv, hd = h, None
        E, k = _int(hf, "n_routed_experts"), _int(hf, "num_experts_per_tok")
        d_e = _int(hf, "moe_intermediate_size")
        shared_w = _int(hf, "n_shared_experts", 0) * d_e
        first = _int(hf, "first_k_dense_replace", 0)
        freq = _int(hf, "moe_layer_freq", 1) or 1
        moe_layers = [i for i in range(L) if E > 0 and i >= first and i % freq == 0]
        if mt == "deepseek_v3" or hf.get("topk_method") == "noaux_tc":
            router_bias = E  # V3's per-expert score-correction bias (aux-loss-free balancing)
        if hf.get("num_nextn_predict_layers"):
            notes.append("DeepSeek: the multi-token-prediction module is not counted (not in the HF model)")
    _positive(num_experts=E, num_experts_per_tok=k, expert_width=d_e)
    if k > E:
        raise UsageError(f"HF config: num_experts_per_tok ({k}) exceeds the number of experts ({E})")
    n_moe = len(moe_layers)
    n_dense = L - n_moe
    if n_dense and d_ff_dense <= 0:
        raise UsageError("HF config: dense layers need a positive intermediate_size")

    if mla is None:
        d_qk = d_v = hd
        A = 2 * d * h * hd + 2 * d * hkv * hd + attn_bias + qk_norm
        kv_elems = 2 * hkv * hd
        attention = "mha" if hkv == h else "mqa" if hkv == 1 else "gqa"
    else:
        q_r, kv_r, nope, rope, dv = (mla[k_] or 0 for k_ in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
        d_qk, d_v = nope + rope, dv
        q = d * q_r + q_r + q_r * h * d_qk if q_r else d * h * d_qk  # q_a, its norm, q_b (or one q_proj)
        kv = d * (kv_r + rope) + kv_r + kv_r * h * (nope + dv)  # kv_a (latent + rope key), norm, kv_b
        A = q + kv + h * dv * d
        kv_elems = kv_r + rope  # the cache holds the latent and the shared RoPE key (§B15)
        attention = "mla"
        notes.append("MLA: activations estimated with K, V materialized for all heads")
    norms = 2 * d
    router = d * E + router_bias
    expert = 3 * d * d_e
    shared = 3 * d * shared_w + shared_gate
    dense_block = A + norms + 3 * d * d_ff_dense
    moe_total = A + norms + E * expert + shared + router
    moe_active = A + norms + k * expert + shared + router
    emb = V * d
    head = 0 if tied else emb
    n = emb + head + d + n_dense * dense_block + n_moe * moe_total
    n_act = emb + head + d + n_dense * dense_block + n_moe * moe_active
    blocks = []
    if n_dense:
        blocks.append(Block("dense", n_dense, dense_block, dense_block))
    blocks.append(Block("moe", n_moe, moe_total, moe_active))
    d_ff_act = (n_dense * d_ff_dense + n_moe * (k * d_e + shared_w)) / L
    moe = {"experts": E, "active": k, "shared_width": shared_w, "expert_width": d_e,
           "moe_layers": n_moe, "dense_layers": n_dense}
    if mla:
        moe["mla"] = mla
    return Arch(
        name=name, source=source, family="moe", vocab=V, d_model=d, n_layers=L, n_heads=h, n_kv_heads=hkv,
        d_qk=d_qk, d_v=d_v, d_ff=d_ff_act, tied=tied, max_seq_len=_int(hf, "max_position_embeddings", 4096),
        n_params=n, n_active=n_act, n_matmul=n_act - (emb if not tied else 0), embedding=emb, head=head,
        position_embedding=0, final_norm=d, blocks=blocks, kv_elements_per_layer=kv_elems,
        attention=attention, moe=moe, notes=notes,
    )


def load_hf_config(path: str | Path) -> Arch:
    p = Path(path)
    try:
        hf = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read HF config {p}: {e}") from e
    name = p.parent.name if p.name == "config.json" and p.parent.name else p.stem
    return arch_from_hf(hf, name=name, source=str(p))
