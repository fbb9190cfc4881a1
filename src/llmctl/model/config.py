"""The architecture of the one model llmctl trains: a Llama-style decoder, described by numbers.

`ModelConfig` is what `stages/train/*.toml` `[model]` tables, checkpoints' `config.json` and
`llmctl plan` read. The counting methods are the closed forms of spec 001-compute-appendix §B1-B3
and B15, so a plan can be made without building the module (and a test checks that the module
has exactly `n_params()` parameters).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmctl.errors import UsageError

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
    qk_norm: bool = False  # RMSNorm per head on q and k (OLMo 2; §A3)
    init_std: float = 0.02  # N(0, 0.02^2); residual output projections get 0.02/sqrt(2L) (§A7)

    def __post_init__(self) -> None:
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.head_dim is None:
            if self.n_heads <= 0 or self.d_model % self.n_heads:
                raise UsageError(
                    f"model: n_heads ({self.n_heads}) must divide d_model ({self.d_model})"
                )
            self.head_dim = self.d_model // self.n_heads
        if self.d_ff is None:
            self.d_ff = 64 * math.ceil(8 * self.d_model / 3 / 64)
        for name in ("vocab_size", "n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim",
                     "d_ff", "max_seq_len"):
            if getattr(self, name) <= 0:
                raise UsageError(f"model: {name} must be positive, got {getattr(self, name)}")
        if self.n_heads % self.n_kv_heads:
            raise UsageError(
                f"model: n_kv_heads ({self.n_kv_heads}) must divide n_heads ({self.n_heads})"
            )
        if self.head_dim % 2:
            raise UsageError(f"model: head_dim ({self.head_dim}) must be even for RoPE")

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
        """Training FLOPs per token: 6·(N − V·d) plus attention 12·L·h·d_h·ctx (§B3).

        ctx = (s+1)/2 for causal attention (FlashAttention-2 convention, the spec's default),
        s for the full count (PaLM/nanoGPT). For a tied head, N − V·d still counts the head's
        matmul, so N − V·d becomes N there (§B1: "keep N whole for a tied head")."""
        s = seq_len or self.max_seq_len
        ctx = (s + 1) / 2 if causal else s
        return 6 * self.n_params_matmul() + 12 * self.n_layers * self.n_heads * self.head_dim * ctx

    def kv_cache_bytes_per_token(self, bytes_per_element: int = 2) -> int:
        """2·L·h_kv·d_h·e (§B15)."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * bytes_per_element

    # -- files ---------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "model") -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise UsageError(f"{where}: unknown model key(s) {', '.join(unknown)}")
        return cls(**d)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> ModelConfig:
        try:
            return cls.from_dict(json.loads(Path(path).read_text()), where=str(path))
        except (OSError, json.JSONDecodeError) as e:
            raise UsageError(f"cannot read model config {path}: {e}") from e

    def to_hf_config(self) -> dict[str, Any]:
        """The `LlamaForCausalLM` config.json of this architecture (export, benchmarks)."""
        if self.qk_norm:
            raise UsageError("a model with qk_norm has no LlamaForCausalLM equivalent")
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.padded_vocab,
            "hidden_size": self.d_model,
            "intermediate_size": self.d_ff,
            "num_hidden_layers": self.n_layers,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_seq_len,
            "rope_theta": self.rope_base,
            "rms_norm_eps": self.norm_eps,
            "tie_word_embeddings": self.tied,
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
            "initializer_range": self.init_std,
            "torch_dtype": "float32",
        }

    @classmethod
    def from_hf_config(cls, hf: dict[str, Any]) -> ModelConfig:
        """A dense Llama-family `config.json` (Llama, Mistral, Qwen2-style keys)."""
        try:
            d = hf["hidden_size"]
            h = hf["num_attention_heads"]
            return cls(
                vocab_size=hf["vocab_size"],
                n_layers=hf["num_hidden_layers"],
                d_model=d,
                n_heads=h,
                n_kv_heads=hf.get("num_key_value_heads") or h,
                head_dim=hf.get("head_dim") or (d // h if d % h == 0 else None),
                d_ff=hf["intermediate_size"],
                max_seq_len=hf.get("max_position_embeddings", 2048),
                rope_base=float(hf.get("rope_theta", 10000.0)),
                norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
                tied=bool(hf.get("tie_word_embeddings", False)),
            )
        except KeyError as e:
            raise UsageError(f"HF config lacks {e.args[0]!r}") from e
