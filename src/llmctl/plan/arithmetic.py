"""The closed-form arithmetic of a training run: FLOPs, time, memory, scaling laws, checkpoints.

Every function is one formula of the field guide, cited in its docstring (`compute` =
spec 001-compute-appendix, `scaling` = 001-arch-optim-scaling, `ops` = 001-systems-ops; sources
in docs/design.md §7). Units: bytes, FLOPs, seconds; GB = 1e9 bytes (compute, "Unit rules").
Parameter counts of a model come from `llmctl.plan.arch.Arch` (dense Llama counts from
`ModelConfig`); nothing here knows about config files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmctl.errors import UsageError
from llmctl.model.recompute import RECOMPUTE_MODES as TRAIN_RECOMPUTE_MODES

GB = 1e9
GIB = 2**30
PF_DAY = 8.64e19  # compute §B4: one PF/s-day in FLOPs
SECONDS_PER_DAY = 86_400.0

# -- FLOPs ------------------------------------------------------------------------------------
# Training FLOPs per token (C_token, compute §B3) is model/flops.py's training_flops_per_token,
# the formula train's MFU uses too.


def attention_crossover_seq_len(n_matmul: float, n_layers: int, attn_dim: float) -> float:
    """Sequence length where causal attention FLOPs equal all the others: 12·L·h·d_h·(s+1)/2 =
    6·N_matmul, i.e. s_x + 1 = N_matmul/(L·h·d_h) (compute §B3, "about 57K (8B)")."""
    return n_matmul / (n_layers * attn_dim) - 1


def decode_flops_per_token(n_matmul: float, n_layers: int, attn_dim: float, ctx: float) -> tuple[float, float]:
    """Inference FLOPs per generated token: (weights 2·N_matmul, attention 4·L·h·d_h·ctx)
    (compute §B14; GQA saves bytes, not FLOPs, so h not h_kv)."""
    return 2 * n_matmul, 4 * n_layers * attn_dim * ctx


def training_flops(flops_per_token: float, tokens: float) -> float:
    """C = C_token·D; with C_token = 6N this is the 6ND rule (compute §B4)."""
    return flops_per_token * tokens


# -- time, cost, utilization ------------------------------------------------------------------


def training_seconds(flops: float, gpus: int, peak_flops: float, mfu: float) -> float:
    """T = C / (p·F·MFU)  (compute §B5)."""
    return flops / (gpus * peak_flops * mfu)


def gpu_hours(flops: float, peak_flops: float, mfu: float) -> float:
    """GPU-hours = C / (F·MFU·3600), independent of p while MFU holds (compute §B5)."""
    return flops / (peak_flops * mfu * 3600)


def reservation_flops(gpus: int, peak_flops: float, mfu: float, seconds: float, ettr: float = 1.0) -> float:
    """What a reservation delivers: C = p·F_peak·MFU·T·ETTR (compute §B5 L9858, ops §A7 step 1)."""
    return gpus * peak_flops * mfu * seconds * ettr


def step_seconds(flops_per_token: float, batch_tokens: float, gpus: int, achieved_flops: float) -> float:
    """T_step = C_token·B / (p·F_achieved)  (compute §B5 L9606, with 6N as C_token there)."""
    return flops_per_token * batch_tokens / (gpus * achieved_flops)


def tokens_per_second(gpus: int, peak_flops: float, mfu: float, flops_per_token: float) -> float:
    """tokens/s = p·F_peak·MFU / C_token  (compute §B5 L9868, ops §A7 step 4)."""
    return gpus * peak_flops * mfu / flops_per_token


def implied_utilization(flops: float, reported_gpu_hours: float, peak_flops: float) -> float:
    """u_implied = C / (GPU_hours·3600·F): end to end, restarts and slow stages included
    (compute §B8)."""
    return flops / (reported_gpu_hours * 3600 * peak_flops)


def cost(gpu_hours_: float, price_per_gpu_hour: float) -> float:
    """cost = GPU_hours · price per GPU-hour  (compute §B17)."""
    return gpu_hours_ * price_per_gpu_hour


def energy_joules(gpu_hours_: float, power_w: float, pue: float = 1.0) -> float:
    """E ≈ GPU_hours · P_GPU · PUE  (compute §B17)."""
    return gpu_hours_ * 3600 * power_w * pue


# -- memory -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recipe:
    """Bytes per parameter of the model states: weights w, gradients g, optimizer K (compute §B9)."""

    name: str
    weights: float
    grads: float
    optimizer: float  # K: everything the optimizer keeps, FP32 master copy included
    master: float  # the part of K that is the master copy (present from step 1; the moments are not)
    note: str

    @property
    def bytes_per_param(self) -> float:
        return self.weights + self.grads + self.optimizer


# compute §B9 [L458-469]. The FP32 gradient accumulation buffer is counted with the gradients
# (it is sharded from ZeRO-2 on, like them).
RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("bf16-adamw", 2, 2, 12, 4, "BF16 weights and grads; FP32 master + Adam m, v"),
    Recipe("bf16-adamw-fp32grad", 2, 6, 12, 4, "+ FP32 gradient accumulation buffer, as Llama 3"),
    Recipe("fp32-adamw", 4, 4, 8, 0, "FP32 weights and grads, Adam m, v"),
    Recipe("adamw-8bit", 2, 2, 6, 4, "8-bit Adam moments + FP32 master"),
    Recipe("sgd-momentum", 2, 2, 8, 4, "FP32 master + momentum"),
    # Muon keeps one momentum buffer per hidden matrix (torchrt/muon.py); the embedding and head keep
    # AdamW's two moments, 4 B/param more on their share, not itemized here
    Recipe("bf16-muon", 2, 2, 8, 4, "FP32 master + Muon momentum (the embedding and head: AdamW m, v)"),
    Recipe("fp32-muon", 4, 4, 4, 0, "FP32 weights and grads, Muon momentum (the embedding and head: AdamW m, v)"),
    Recipe("adafactor", 2, 2, 4, 4, "FP32 master, factored second moment in O(n+m): about 8 B/param"),
    Recipe("deepseek-v3", 0, 4, 8, 4, "FP32 master and grads, BF16 Adam moments (2+2+4+4); "
           "the low-precision working copy is not itemized"),
)}


def get_recipe(name: str) -> Recipe:
    try:
        return RECIPES[name]
    except KeyError:
        raise UsageError(f"unknown recipe {name!r}; one of {', '.join(RECIPES)}") from None


def model_state_bytes(n_params: float, recipe: Recipe, zero: int, p_dp: int) -> dict[str, float]:
    """Per-GPU model states under ZeRO (compute §B10): stage 0 keeps (w+g+K)·N everywhere;
    ZeRO-1 shards K (w·N + g·N + K·N/p); ZeRO-2 also g; ZeRO-3 also w: (w+g+K)·N/p."""
    if zero not in (0, 1, 2, 3):
        raise UsageError(f"--zero must be 0, 1, 2 or 3, got {zero}")
    if p_dp < 1:
        raise UsageError(f"data-parallel degree must be at least 1, got {p_dp}")
    shard = lambda stage: p_dp if zero >= stage else 1  # noqa: E731
    return {
        "weights": recipe.weights * n_params / shard(3),
        "grads": recipe.grads * n_params / shard(2),
        "optimizer": recipe.optimizer * n_params / shard(1),
    }


# One vocabulary with `train --recompute` (model/recompute.py): none, selective and block name the same
# choices there and predict what train keeps; norms and swiglu are two finer rows of the guide's
# Table 1.8 (a framework with a fused RMSNorm or SwiGLU kernel) that train does not offer. "full"
# is block's old name here.
RECOMPUTE_MODES = ("none", "norms", "swiglu", "selective", "block")
RECOMPUTE_ALIASES = {"full": "block"}
assert set(TRAIN_RECOMPUTE_MODES) <= set(RECOMPUTE_MODES)


def recompute_mode(mode: str) -> str:
    """`mode` in plan's vocabulary (an alias resolved), or a usage error naming the choices."""
    mode = RECOMPUTE_ALIASES.get(mode, mode)
    if mode not in RECOMPUTE_MODES:
        raise UsageError(f"--recompute must be one of {', '.join(RECOMPUTE_MODES)}, got {mode!r}")
    return mode


def activation_elements_per_token_layer(d: int, q_width: int, kv_width: int, d_ff: float,
                                        recompute: str = "none") -> float:
    """Elements a Llama block keeps for backward per token (compute §B11, L526): FlashAttention,
    unfused SwiGLU, no dropout: 4d + 2·h·d_h + 2·h_kv·d_h + 4·d_ff (q_width = h·d_h counts Q and
    the attention output, kv_width = h_kv·d_h counts K and V). Recomputing both RMSNorms saves 2d
    (norms), a fused SwiGLU 2·d_ff (swiglu); selective is both — 2d + 2·h·d_h + 2·h_kv·d_h + 2·d_ff,
    what `train --recompute selective` keeps: the block input and the output projection's output
    (from which both norms' inputs follow), Q/K/V, the attention output and gate/up (Table 1.8
    "both"); block recomputation keeps only the block input, d."""
    recompute = recompute_mode(recompute)
    if recompute == "block":
        return float(d)
    a = 4 * d + 2 * q_width + 2 * kv_width + 4 * d_ff
    if recompute in ("norms", "selective"):
        a -= 2 * d
    if recompute in ("swiglu", "selective"):
        a -= 2 * d_ff
    return a


def activation_bytes_per_element(recipe: Recipe) -> int:
    """Activations are kept in the compute dtype: 4 bytes for an FP32 recipe (fp32-adamw), else BF16's
    2 (compute §B11's formulas are BF16)."""
    return 4 if recipe.weights == 4 else 2


def gpt_activation_bytes_per_token_layer(d: int, n_heads: int, seq_len: int, flash: bool = True) -> float:
    """GPT layer (Korthikanti; 16-bit, MHA, 4d GeLU, dropout): A_layer = s·b·d·(34 + 5·h·s/d)
    bytes, per token 34d + 5·h·s; FlashAttention removes the s² part (compute §B11, L518)."""
    return 34 * d + (0 if flash else 5 * n_heads * seq_len)


def no_flash_extra_bytes_per_layer(n_heads: int, seq_len: int, micro_batch: int, bytes_per_element: int = 2) -> float:
    """Without FlashAttention add 2·h·s²·b bytes per layer (the attention probabilities, BF16;
    compute §B11), e·h·s²·b for e-byte activations. Selective and block recomputation recompute the
    attention core, so they keep none of it."""
    return bytes_per_element * n_heads * seq_len**2 * micro_batch


def logits_bytes(seq_len: int, micro_batch: int, vocab: int) -> float:
    """M_logits = 2·s·b·V + 4·s·b·V: a BF16 copy and the FP32 one (compute §B12); a fused loss
    removes most of it."""
    return 6 * seq_len * micro_batch * vocab


CUDA_CONTEXT_BYTES = 1.5 * GB  # compute §B13: illustrative, 1-2 GB
ZERO3_WINDOW_LAYERS = 2  # compute §B13: layers gathered at once under ZeRO-3 (illustrative)
HBM_SAFE_FRACTION = 0.8  # compute §B13: keep the estimate under about 80% of HBM (Fujii et al.)


def kv_cache_bytes_per_token(n_layers: int, kv_elements_per_layer: int, bytes_per_element: float = 2) -> float:
    """KV_bytes_per_token = 2·L·h_kv·d_h·e; for MLA L·(d_c + d_h^R)·e (compute §B15).
    `kv_elements_per_layer` is 2·h_kv·d_h, or d_c + d_h^R."""
    return n_layers * kv_elements_per_layer * bytes_per_element


# -- Chinchilla -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChinchillaConstants:
    """L(N, D) = E + A/N^alpha + B/D^beta (scaling §A11)."""

    key: str
    name: str
    E: float
    A: float
    B: float
    alpha: float
    beta: float

    def loss(self, n: float, d: float) -> float:
        """L(N, D) = E + A/N^α + B/D^β (scaling §A11, L2903), in nats/token."""
        return self.E + self.A / n**self.alpha + self.B / d**self.beta

    @property
    def G(self) -> float:
        """G = (α·A/(β·B))^(1/(α+β))  (scaling §A11, L2926)."""
        return (self.alpha * self.A / (self.beta * self.B)) ** (1 / (self.alpha + self.beta))

    @property
    def gamma(self) -> float:
        """γ = α·β/(α+β)  (scaling §A11; refit 0.178, unrounded 0.155)."""
        return self.alpha * self.beta / (self.alpha + self.beta)


CHINCHILLA: dict[str, ChinchillaConstants] = {c.key: c for c in (
    ChinchillaConstants("besiroglu", "Besiroglu et al. 2024 refit of Chinchilla (default)", 1.8172, 482.01, 2085.43, 0.3478, 0.3658),
    ChinchillaConstants("original", "Chinchilla (Hoffmann et al. 2022), printed", 1.69, 406.4, 410.7, 0.34, 0.28),
    ChinchillaConstants("unrounded", "Chinchilla (Hoffmann et al. 2022), unrounded", 1.6934, 406.4, 410.7, 0.3392, 0.2849),
)}


def get_constants(key: str) -> ChinchillaConstants:
    try:
        return CHINCHILLA[key]
    except KeyError:
        raise UsageError(f"unknown Chinchilla constants {key!r}; one of {', '.join(CHINCHILLA)}") from None


def compute_optimal(flops: float, c: ChinchillaConstants) -> tuple[float, float]:
    """(N_opt, D_opt) for C = 6ND: N_opt = G·(C/6)^(β/(α+β)), D_opt = C/(6·N_opt)
    (scaling §A11 L2926-2928, compute §F L8842; refit at 1e24: 95.9B params, 1.74T tokens)."""
    n = c.G * (flops / 6) ** (c.beta / (c.alpha + c.beta))
    return n, flops / (6 * n)


def optimal_tokens_for_params(n: float, c: ChinchillaConstants) -> float:
    """The D that makes N compute-optimal: invert N_opt = G·(C/6)^(β/(α+β)) for C, D = C/(6N)."""
    return (n / c.G) ** ((c.alpha + c.beta) / c.beta) / n


def twenty_tokens_rule(flops: float) -> tuple[float, float]:
    """N_opt ≈ sqrt(C/120), D_opt ≈ 20·N_opt (compute §F L8850, scaling §A11 L2934)."""
    n = math.sqrt(flops / 120)
    return n, 20 * n


def missizing_compute_fraction(rho: float, c: ChinchillaConstants) -> float:
    """C_needed/C = (R(ρ)/R*)^(-1/γ), R(ρ)/R* = (β·ρ^-α + α·ρ^β)/(α+β), ρ = N/N_opt at fixed C:
    the share of the budget an optimally sized model would need for the same loss; 1 minus it
    is the waste (scaling §A11 L2964, compute §F L8862: 2x off wastes ~16%, 10x ~82%)."""
    a, b = c.alpha, c.beta
    r = (b * rho ** (-a) + a * rho**b) / (a + b)
    return r ** (-1 / c.gamma)


# -- checkpoints and failures -----------------------------------------------------------------

CHECKPOINT_BYTES_PER_PARAM = 14  # ops §A2: 2 + 4 + 4 + 4 (weights, master, m, v); 12 min, 16 with grads


def mttf_seconds(n_nodes: int, failures_per_1000_node_days: float) -> float:
    """Job MTTF M = 1/(n_nodes·r_f)  (ops §A2 L6215, compute §F L9558; 2,048 nodes at 3.79 per
    1,000 node-days = 24/(nodes·r/1000) hours: 256 nodes (2,048 GPUs) at 3.79 -> 24.7 h, ops §B 13)."""
    return SECONDS_PER_DAY / (n_nodes * failures_per_1000_node_days / 1000)


def young_interval(write_s: float, mttf_s: float) -> float:
    """Young's optimal checkpoint interval τ* = sqrt(2·δ·M)  (ops §A2, compute §F L9578;
    δ 3.25 s, M 3 h: 265 s)."""
    return math.sqrt(2 * write_s * mttf_s)


def checkpoint_waste(interval_s: float, write_s: float, mttf_s: float, restart_s: float = 0.0) -> float:
    """f_waste = δ/τ + τ/(2M) + R/M  (ops §A2 L6337; at τ*: sqrt(2δ/M) + R/M)."""
    return write_s / interval_s + interval_s / (2 * mttf_s) + restart_s / mttf_s


def expected_ettr(interval_s: float, write_s: float, mttf_s: float, restart_s: float) -> float:
    """Kokolis: E[ETTR] ≈ (1 - (R + τ/2)/M) / (1 + δ/τ)  (ops §A2 L6365, compute §F L9588)."""
    return (1 - (restart_s + interval_s / 2) / mttf_s) / (1 + write_s / interval_s)
