"""The architecture of the one model llmctl trains: a Llama-style decoder, described by numbers.

`ModelConfig` is what `stages/train/*.toml` `[model]` tables, checkpoints' `config.json` and
`llmctl plan` read. The counting methods are the closed forms of spec 001-compute-appendix §B1-B3
and B15, so a plan can be made without building the module (and a test checks that the module
has exactly `n_params()` parameters).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmctl.bounds import check_fits, check_value
from llmctl.errors import UsageError
from llmctl.model.flops import training_flops_per_token

# Spec 001-compute-appendix §B1 (L269): a vocabulary divisible by 64 keeps the embedding and head
# matmuls on aligned tile sizes; the extra rows are never produced by the tokenizer.
VOCAB_MULTIPLE = 64


@dataclass
class ModelConfig:
    vocab_size: int = 4096  # the tokenizer's vocabulary; the tables are padded (padded_vocab)
    n_layers: int = 4
    d_model: int = 256
    n_heads: int = 4
    n_kv_heads: int | None = None  # None: multi-head attention (= n_heads)
    head_dim: int | None = None  # None: d_model / n_heads
    d_ff: int | None = None  # None: 8d/3 rounded up to a multiple of 64 (SwiGLU parity, §A2)
    max_seq_len: int = 256
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    tied: bool = True  # small models tie the head to the embedding (§A2, L1787)
    qk_norm: bool = False  # RMSNorm per head on q and k (Qwen3; OLMo 2 norms the full width; §A3)
    qkv_bias: bool = False  # biases on the q, k and v projections (Qwen2; imported models only)
    o_bias: bool = False  # a bias on the attention output projection (Llama's attention_bias)
    # None: plain RoPE. Else transformers' rope_scaling of an imported model: {"rope_type": "linear" |
    # "dynamic" | "llama3", "factor": ..., and llama3's low/high_freq_factor and
    # original_max_position_embeddings} (model/transformer.py rope_inv_freq computes them)
    rope_scaling: dict | None = None
    init_std: float = 0.02  # N(0, 0.02^2); residual output projections get 0.02/sqrt(2L) (§A7)

    def __post_init__(self) -> None:
        # Every way a config is made passes here (a TOML, a checkpoint's or a release's config.json,
        # code), so no size reaches torch before it is an integer in its range (bounds.py).
        check_fields(self.__dict__, "model")
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.head_dim is None:
            if self.d_model % self.n_heads:
                raise UsageError(
                    f"model: n_heads ({self.n_heads}) must divide d_model ({self.d_model})"
                )
            self.head_dim = self.d_model // self.n_heads
        if self.d_ff is None:
            self.d_ff = 64 * math.ceil(8 * self.d_model / 3 / 64)
        check_fields(self.__dict__, "model")
        if self.n_heads % self.n_kv_heads:
            raise UsageError(
                f"model: n_kv_heads ({self.n_kv_heads}) must divide n_heads ({self.n_heads})"
            )
        if self.head_dim % 2:
            raise UsageError(f"model: head_dim ({self.head_dim}) must be even for RoPE")
        if self.rope_scaling is not None:
            check_rope_scaling(self.rope_scaling)
            if self.rope_scaling["rope_type"] == "dynamic" and self.head_dim <= 2:
                raise UsageError(f"model: dynamic RoPE scaling needs a head_dim above 2, got {self.head_dim}")

    # -- sizes ---------------------------------------------------------------------------------

    @property
    def padded_vocab(self) -> int:
        return VOCAB_MULTIPLE * math.ceil(self.vocab_size / VOCAB_MULTIPLE)

    def block_params(self) -> int:
        """One block: Q and O, grouped K and V, gate/up/down, two RMSNorm gains (§B1)."""
        d, hd = self.d_model, self.head_dim
        p = 2 * d * self.n_heads * hd + 2 * d * self.n_kv_heads * hd + 3 * d * self.d_ff + 2 * d
        if self.qk_norm:
            p += 2 * hd  # one gain per head dimension for q, one for k (shared across heads)
        if self.qkv_bias:
            p += (self.n_heads + 2 * self.n_kv_heads) * hd
        if self.o_bias:
            p += d
        return p

    def embedding_params(self) -> int:
        return self.padded_vocab * self.d_model

    def n_params(self) -> int:
        """N = V·d·(1 + untied) + L·P_layer + d  (spec 001-compute-appendix §B1)."""
        head = 0 if self.tied else self.embedding_params()
        return self.embedding_params() + head + self.n_layers * self.block_params() + self.d_model

    def n_params_matmul(self) -> int:
        """Parameters that do matmul work: the input table does none, the head does (§B1)."""
        return self.n_params() - self.embedding_params() + (
            self.embedding_params() if self.tied else 0
        )

    def flops_per_token(self, seq_len: int | None = None, causal: bool = True) -> float:
        """Training FLOPs per token: 6·(N − V·d) plus attention 12·L·h·d_h·ctx (§B3; model/flops.py).

        ctx = (s+1)/2 for causal attention (FlashAttention-2 convention, the spec's default),
        s for the full count (PaLM/nanoGPT). For a tied head, N − V·d still counts the head's
        matmul, so N − V·d becomes N there (§B1: "keep N whole for a tied head")."""
        return training_flops_per_token(self.n_params_matmul(), self.n_layers, self.n_heads * self.head_dim,
                                        seq_len or self.max_seq_len, "causal" if causal else "full")

    def kv_cache_bytes_per_token(self, bytes_per_element: int = 2) -> int:
        """2·L·h_kv·d_h·e (§B15)."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * bytes_per_element

    def memory_bytes(self, bytes_per_param: int = 4, rope: bool = True) -> int:
        """What building the model takes: its parameters, and the RoPE tables for max_seq_len
        (cos and sin, with the angles they are computed from)."""
        return self.n_params() * bytes_per_param + (4 * self.max_seq_len * self.head_dim * 4 if rope else 0)

    def check_memory(self, where: str = "model", bytes_per_param: int = 4, rope: bool = True) -> None:
        """A one-line UsageError when the model cannot fit in this machine's memory: sizes each in
        range can still multiply past it, and torch would be killed (or fail deep inside) trying."""
        context = f" and a {self.max_seq_len:,}-token context" if rope else ""
        check_fits(f"{where}: a model of {self.n_params():,} parameters{context}", self.memory_bytes(bytes_per_param, rope))

    # -- files ---------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "model") -> ModelConfig:
        """The config a file holds (a checkpoint's config.json, a run's `model`); every error names `where`."""
        if not isinstance(d, dict):
            raise UsageError(f"{where}: must hold a JSON object of model settings, got {type(d).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise UsageError(f"{where}: unknown model key(s) {', '.join(unknown)}")
        check_fields(d, where)
        if d.get("rope_scaling") is not None:
            check_rope_scaling(d["rope_scaling"], where)
        return build(cls, d, where)


def build(cls, values: dict[str, Any], where: str) -> ModelConfig:
    """cls(**values), its consistency errors (heads that do not divide, ...) said of `where`."""
    try:
        return cls(**values)
    except UsageError as e:
        raise UsageError(f"{where}: {str(e).removeprefix('model: ')}") from e


INT_FIELDS = ("vocab_size", "n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "d_ff", "max_seq_len")
FLOAT_FIELDS = ("rope_base", "norm_eps", "init_std")
BOOL_FIELDS = ("tied", "qk_norm", "qkv_bias", "o_bias")
DERIVED = ("n_kv_heads", "head_dim", "d_ff")  # None: derived from the others


def shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_fields(values: Mapping[str, Any], where: str, names: Mapping[str, str] | None = None) -> None:
    """Each model setting in `values` of its type (an integer, a number, true or false), finite and
    in its range (bounds.BOUNDS["ModelConfig"]); `names` maps a field to the key the file calls it."""
    names = names or {}
    for field in INT_FIELDS + FLOAT_FIELDS + BOOL_FIELDS:
        if field not in values or (values[field] is None and field in DERIVED):
            continue
        value, key = values[field], f"{where}: {names.get(field, field)}"
        if field in BOOL_FIELDS:
            if not isinstance(value, bool):
                raise UsageError(f"{key} must be true or false, got {shown(value)}")
            continue
        kind = int if field in INT_FIELDS else (int, float)
        if isinstance(value, bool) or not isinstance(value, kind):
            raise UsageError(f"{key} must be {'an integer' if kind is int else 'a number'}, got {shown(value)}")
        check_value("ModelConfig", field, value, key)  # finite, int64, in range: bounds.py, as for every setting


ROPE_SCALINGS = {  # rope_type -> the keys transformers reads for it
    "linear": ("factor",),
    "dynamic": ("factor", "original_max_position_embeddings"),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}


def check_rope_scaling(rs: Any, where: str = "model", key: str = "rope_scaling") -> None:
    """A rope_scaling object of a supported type, each of its numbers finite and positive."""
    kind = rs.get("rope_type") if isinstance(rs, dict) else None
    if not isinstance(rs, dict):
        raise UsageError(f"{where}: {key} must be an object, got {shown(rs)}")
    if kind not in ROPE_SCALINGS:
        raise UsageError(f"{where}: {key} type {shown(kind)} is not supported ({', '.join(ROPE_SCALINGS)} are)")
    for name in ROPE_SCALINGS[kind]:
        value = rs.get(name)
        whole = name == "original_max_position_embeddings"
        if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)):
            raise UsageError(f"{where}: {key} {kind} needs {name} as {'an integer' if whole else 'a number'}, got {shown(value)}")
        if not math.isfinite(value) or value <= 0 or (whole and value > 1 << 24):
            raise UsageError(f"{where}: {key} {name} must be {'between 1 and 16777216' if whole else 'finite and > 0'}, "
                             f"got {value}")
    if kind == "llama3" and rs["high_freq_factor"] <= rs["low_freq_factor"]:
        raise UsageError(f"{where}: {key} high_freq_factor ({rs['high_freq_factor']}) must be above low_freq_factor "
                         f"({rs['low_freq_factor']})")
