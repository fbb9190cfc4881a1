"""The Llama-style decoder that train, eval, rl and export share.

Pre-norm blocks (spec 001-arch-optim-scaling §A2): x + Attn(RMSNorm(x)), then x + SwiGLU(RMSNorm(x)).
Attention is grouped-query through `scaled_dot_product_attention`, with RoPE in the Hugging Face
rotate-half convention so a checkpoint exports to `LlamaForCausalLM` by renaming tensors. No biases
and plain RoPE for the models llmctl trains; an imported Qwen2 brings q/k/v biases, Qwen3 a per-head
q/k norm, a Llama 3.x its rope_scaling (model/hf_layout.py maps each onto these options).

Two fusions keep a training step to fewer, larger matmuls than the reference implementation:
Q, K and V are one `qkv` projection, and SwiGLU's gate and up are one `gate_up` projection. Export
splits them back (model/hf_layout.py). With targets, the head and the loss run chunk by chunk without
the full logits (model/linear_ce.py); on CPU, causal attention over short windows is two batched
matmuls rather than the flash kernel (`explicit_causal_attention`). Both change speed and memory,
not results: tests check them against the plain computation.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from llmctl.model.config import ModelConfig
from llmctl.model.linear_ce import linear_cross_entropy
from llmctl.model.recompute import check_mode, run_block, selective_policy


class RMSNorm(nn.Module):
    """a / sqrt(mean(a²) + eps) · g, computed in float32 (§A8: norms in high precision)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_inv_freq(cfg: ModelConfig, seq_len: int | None = None, device=None) -> torch.Tensor:
    """ω_j = base^(−2j/d_h) (§A2), rescaled as transformers does for an imported model's
    rope_scaling: linear divides every ω by the factor (position interpolation); llama3 divides the
    low frequencies by it and blends the middle band (Llama 3.1's smoothing); dynamic (NTK) raises
    the base once the sequence outgrows the original context, so inside it ω is the plain one."""
    d = cfg.head_dim
    exponents = torch.arange(0, d, 2, dtype=torch.int64, device=device).float() / d
    rs = cfg.rope_scaling or {}
    kind, base = rs.get("rope_type"), cfg.rope_base
    if kind == "dynamic" and seq_len is not None and seq_len > rs["original_max_position_embeddings"]:
        f, orig = rs["factor"], rs["original_max_position_embeddings"]
        base = base * ((f * seq_len / orig) - (f - 1)) ** (d / (d - 2))
    inv_freq = 1.0 / (base ** exponents)
    if kind == "linear":
        inv_freq = inv_freq / rs["factor"]
    elif kind == "llama3":
        f, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        orig = rs["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > orig / lo, inv_freq / f, inv_freq)
        smooth = (orig / wavelen - lo) / (hi - lo)
        blended = (1 - smooth) * scaled / f + smooth * scaled
        medium = (wavelen >= orig / hi) & (wavelen <= orig / lo)
        inv_freq = torch.where(medium, blended, scaled)
    return inv_freq


def rope_tables(cfg: ModelConfig, length: int, device=None, start: int = 0,
                seq_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of m·ω_j for m in start..length-1, each frequency repeated for both halves (§A2)."""
    inv_freq = rope_inv_freq(cfg, seq_len, device)
    angles = torch.outer(torch.arange(start, length, dtype=torch.float32, device=device), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def dynamic_rope_past(cfg: ModelConfig, end: int) -> bool:
    """Dynamic NTK RoPE past its original context: the frequencies depend on the sequence length
    (transformers takes it as the largest position + 1 of each forward), so no table is cached."""
    rs = cfg.rope_scaling
    return bool(rs) and rs["rope_type"] == "dynamic" and end > rs["original_max_position_embeddings"]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x·cos + rotate_half(x)·sin; rotate_half(x) = (−x₂, x₁) over the two halves of head_dim."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


# The explicit path keeps the B·H·T² attention probabilities of every layer for the backward pass;
# above this many bytes per layer (8 × 8 heads × T 2,048 in bf16) it hands over to the flash kernel.
EXPLICIT_ATTENTION_MAX_BYTES = 512 << 20


def use_explicit_attention(q: torch.Tensor) -> bool:
    """On CPU, causal attention as two batched matmuls beats PyTorch's flash kernel: measured on 2
    EPYC cores, forward + backward in bf16, GQA 8/4 heads of 64: B 8 × T 512 0.028 s against 0.076 s,
    T 1,024 0.055 against 0.090, T 2,048 0.113 against 0.148 (benchmarks/RESULTS.md, train). On GPUs
    the fused kernels win and never materialize the T×T scores."""
    B, H, T, _ = q.shape
    return q.device.type == "cpu" and B * H * T * T * q.element_size() <= EXPLICIT_ATTENTION_MAX_BYTES


def causal_bias(T: int, dtype: torch.dtype, device) -> torch.Tensor:
    """(T, T): 0 on and below the diagonal, −inf above."""
    return torch.full((T, T), float("-inf"), dtype=dtype, device=device).triu_(1)


def explicit_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q·kᵀ/√d_h + causal bias)·v for q (B, H, T, d_h) and k, v (B, H_kv, T, d_h).

    The G = H/H_kv query heads that share a KV head are stacked along the rows, so each group is
    one (G·T × d_h)·(d_h × T) matmul against its K without copying K G times; the bias and the
    1/√d_h scale ride in the same baddbmm, and the softmax runs in the input dtype (its CPU kernel
    accumulates in fp32), so the T×T scores are written once and read once each way."""
    B, H, T, hd = q.shape
    kv = k.shape[1]
    G = H // kv
    qs = q.reshape(B * kv, G * T, hd)
    bias = causal_bias(T, q.dtype, q.device).repeat(G, 1).expand(B * kv, G * T, T)
    scores = torch.baddbmm(bias, qs, k.reshape(B * kv, T, hd).transpose(1, 2), alpha=hd ** -0.5)
    y = torch.bmm(torch.softmax(scores, dim=-1), v.reshape(B * kv, T, hd))
    return y.view(B, H, T, hd)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        q_dim, kv_dim = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        self.qkv = nn.Linear(cfg.d_model, q_dim + 2 * kv_dim, bias=cfg.qkv_bias)
        self.qkv.row_blocks = (q_dim, kv_dim, kv_dim)  # three matrices in one: Muon orthogonalizes each (torchrt/muon.py)
        self.o = nn.Linear(q_dim, cfg.d_model, bias=cfg.o_bias)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps) if cfg.qk_norm else None

    def forward(self, x, cos, sin, cache=None, mask=None):
        B, T, _ = x.shape
        q_dim, kv_dim = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        q, k, v = self.qkv(x).split((q_dim, kv_dim, kv_dim), dim=-1)
        q = q.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin).to(v.dtype), apply_rope(k, cos, sin).to(v.dtype)
        if cache is not None:
            k, v = cache.update(k, v)
        if mask is None and cache is None and use_explicit_attention(q):
            y = explicit_causal_attention(q, k, v)
        elif mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.n_kv_heads != self.n_heads)
        elif T == 1 and mask.shape[1] == 1 and self.n_kv_heads != self.n_heads:
            # a decode step: the query heads that share a KV head become that head's query rows, which
            # the kernel runs without expanding K and V (measured 0.38 against 0.53 ms a layer at 128 rows)
            G = self.n_heads // self.n_kv_heads
            y = F.scaled_dot_product_attention(q.view(B, self.n_kv_heads, G, self.head_dim), k, v, attn_mask=mask)
            y = y.view(B, self.n_heads, 1, self.head_dim)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.n_kv_heads != self.n_heads)
        return self.o(y.transpose(1, 2).reshape(B, T, q_dim))


class SwiGLU(nn.Module):
    """down(SiLU(gate·x) ⊙ up·x), gate and up computed as one matmul."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.d_ff = cfg.d_ff
        self.gate_up = nn.Linear(cfg.d_model, 2 * cfg.d_ff, bias=False)
        self.gate_up.row_blocks = (cfg.d_ff, cfg.d_ff)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x):
        gate, up = self.gate_up(x).split(self.d_ff, dim=-1)
        return self.down(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(self, x, cos, sin, cache=None, mask=None):
        x = x + self.attn(self.attn_norm(x), cos, sin, cache, mask)
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if torch.get_default_device().type == "cpu":  # a meta build (shape checks) allocates nothing
            cfg.check_memory()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.padded_vocab, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.head = nn.Linear(cfg.d_model, cfg.padded_vocab, bias=False)
        if cfg.tied:
            self.head.weight = self.embed.weight
        cos, sin = rope_tables(cfg, cfg.max_seq_len)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.recompute = "none"  # activation recomputation in training forwards (set_recompute)
        self._policy = selective_policy(cfg.d_ff, cfg.d_model)
        self.reset_parameters()

    def to_dtype(self, dtype: torch.dtype) -> Transformer:
        """The weights in `dtype`, the RoPE tables kept in float32 (a bf16 angle table is off by
        whole tokens at long positions)."""
        cos, sin = self.rope_cos, self.rope_sin
        self.to(dtype)
        self.rope_cos, self.rope_sin = cos, sin
        return self

    def set_recompute(self, mode: str) -> Transformer:
        """Recompute activations in the backward pass: none, selective or block (model/recompute.py).
        A training choice, not part of the architecture: it changes memory and time, not results."""
        self.recompute = check_mode(mode)
        return self

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """N(0, σ²) with σ = init_std, σ/√(2L) on the residual output projections (spec §A7, 000:L461)."""
        std = self.cfg.init_std
        residual_std = std / math.sqrt(2 * self.cfg.n_layers)
        for name, p in self.named_parameters():
            if name.endswith(".bias"):
                p.zero_()
            elif name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(("attn.o.weight", "mlp.down.weight")):
                p.normal_(0.0, residual_std, generator=generator)
            else:
                p.normal_(0.0, std, generator=generator)

    def rope(self, positions: torch.Tensor | None, start: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin for positions start..start+length (shared by the batch), or for per-sequence
        `positions` (B, T) — generation with left-padded prompts starts each row at its own offset."""
        end = start + length if positions is None else int(positions.max()) + 1
        if dynamic_rope_past(self.cfg, end):
            cos, sin = rope_tables(self.cfg, end, device=self.rope_cos.device, seq_len=end)
        else:
            if end > self.rope_cos.shape[0]:  # generation past the trained context: extend the tables
                self.rope_cos, self.rope_sin = rope_tables(self.cfg, max(end, 2 * self.rope_cos.shape[0]), device=self.rope_cos.device)
            cos, sin = self.rope_cos, self.rope_sin
        if positions is None:
            return cos[start:end], sin[start:end]
        return cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)

    def hidden(self, tokens: torch.Tensor, start: int = 0, caches=None, mask=None, positions=None) -> torch.Tensor:
        """Final-norm hidden states (B, T, d) for token ids (B, T)."""
        cos, sin = self.rope(positions, start, tokens.shape[1])
        x = self.embed(tokens)
        recompute = self.recompute != "none" and caches is None and torch.is_grad_enabled()
        for i, layer in enumerate(self.layers):
            if recompute:
                x = run_block(layer, self.recompute, x, cos, sin, mask, self._policy)
            else:
                x = layer(x, cos, sin, None if caches is None else caches[i], mask)
        return self.norm(x)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None, *, z_loss: float = 0.0,
                reduction: str = "mean", start: int = 0, caches=None, mask=None, positions=None):
        """Logits (B, T, padded_vocab); with targets, (loss, stats) instead.

        The loss is the next-token cross-entropy in nats (mean over targets ≠ −100, or their sum)
        with an fp32 softmax (§A8), plus z_loss·(log Z)² (§A3); stats hold the cross-entropy alone
        and the max logit. With targets the full logits are never built (model/linear_ce.py).
        Training goes through forward (not a separate method) so DDP's and FSDP's hooks see
        every step."""
        h = self.hidden(tokens, start, caches, mask, positions)
        if targets is None:
            return self.head(h)
        loss, ce, max_logit = linear_cross_entropy(h.flatten(0, 1), self.head.weight, targets.reshape(-1),
                                                   z_loss=z_loss, reduction=reduction)
        return loss, {"ce": ce, "max_logit": max_logit}

    def n_params(self) -> int:
        """Distinct parameters (a tied table counted once), to check against ModelConfig.n_params."""
        return sum(p.numel() for p in {id(p): p for p in self.parameters()}.values())
