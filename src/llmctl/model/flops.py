"""Training FLOPs per token: the one formula `train` (MFU, through ModelConfig.flops_per_token),
`plan` and `report` use (spec 001-compute-appendix §B3). Inference and crossover arithmetic stay
with the planner (plan/arithmetic.py)."""

from __future__ import annotations

from llmctl.errors import UsageError

ATTENTION_MODES = ("causal", "full", "none")


def attention_context(seq_len: int, attention: str) -> float:
    """ctx_bar of compute §B3: (s+1)/2 for causal attention (FlashAttention-2 convention, the
    default), s for the full count (PaLM/nanoGPT), 0 to drop attention (plain 6N)."""
    if attention == "causal":
        return (seq_len + 1) / 2
    if attention == "full":
        return float(seq_len)
    if attention == "none":
        return 0.0
    raise UsageError(f"attention counting must be one of {', '.join(ATTENTION_MODES)}, got {attention!r}")


def training_flops_per_token(n_matmul: float, n_layers: int, attn_dim: float, seq_len: int,
                             attention: str = "causal") -> float:
    """C_token = 6·N_matmul + 12·L·h·d_h·ctx_bar  (compute §B3, planning rule L376).

    `attn_dim` is h·d_h, or h·(d_qk + d_v)/2 when keys and values differ in width (MLA, compute
    §C6: 3·2·ctx·h·(192+128)·L). N_matmul is the activated count for MoE."""
    return 6 * n_matmul + 12 * n_layers * attn_dim * attention_context(seq_len, attention)
