"""The GRPO family as arithmetic: advantages, the clipped surrogate, loss aggregation, KL estimators.

All of it follows spec 001-posttrain-rl §A6/§A7:
- advantage A_i = r_i − mean(r) over the group, divided by the group std (GRPO; population or
  Bessel), the batch std, or nothing (Dr. GRPO);
- per token, min(ρ·A, clip(ρ, 1−ε_low, 1+ε_high)·A) with ρ = π/π_old (DAPO's clip-higher when
  ε_high > ε_low);
- aggregation ("loss_agg_mode"): seq-mean-token-mean (GRPO: each response's token mean, then the
  mean over responses), token-mean (DAPO: every token of the batch weighs the same), seq-sum-const
  (Dr. GRPO: summed tokens over a constant, responses × max_new_tokens);
- KL to a reference: k3 = (δ − 1) − log δ (unbiased for KL(π‖π_ref), its gradient is the forward
  KL's) or k2 = ½ (log δ)², δ = π_ref/π.
"""

from __future__ import annotations

import torch

ADV_STD = ("group", "group-bessel", "batch", "none")
LOSS_AGG = ("seq-mean-token-mean", "token-mean", "seq-sum-const")
KL = ("none", "k1", "k2", "k3")


def advantages(rewards: torch.Tensor, std: str = "group", eps: float = 1e-6) -> torch.Tensor:
    """rewards (n_groups, G) → advantages of the same shape. A zero-variance group gets A = 0."""
    centered = rewards - rewards.mean(dim=1, keepdim=True)
    if std == "none":
        return centered
    if std == "group":
        scale = rewards.std(dim=1, keepdim=True, unbiased=False)
    elif std == "group-bessel":  # verl's torch.std
        scale = rewards.std(dim=1, keepdim=True, unbiased=True)
    elif std == "batch":
        scale = rewards.std(unbiased=False).expand_as(rewards[:, :1])
    else:
        raise ValueError(f"adv std must be one of {ADV_STD}")
    return torch.where(scale > eps, centered / scale.clamp_min(eps), torch.zeros_like(centered))


def rloo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """Leave-one-out baseline: A_i = r_i − mean_{j≠i} r_j = G/(G−1)·(r_i − r̄) (§A6)."""
    G = rewards.shape[1]
    return (rewards - rewards.mean(dim=1, keepdim=True)) * G / (G - 1)


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token estimator of KL(π‖π_ref) from samples of π (§A7)."""
    log_delta = ref_logp - logp
    if kind == "k1":
        return -log_delta
    if kind == "k2":
        return 0.5 * log_delta.pow(2)
    if kind == "k3":
        return torch.expm1(log_delta) - log_delta
    raise ValueError(f"kl must be one of {KL}")


def clipped_surrogate(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor,
                      clip_low: float, clip_high: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token PPO objective (to maximize), whether the clip zeroed the token's gradient, and ρ.

    adv broadcasts over tokens. A token's gradient is zero when the clipped branch is the minimum:
    A > 0 and ρ > 1 + ε_high, or A < 0 and ρ < 1 − ε_low."""
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * adv
    clipped = ratio.clamp(1 - clip_low, 1 + clip_high) * adv
    objective = torch.minimum(unclipped, clipped)
    zero_grad = ((adv > 0) & (ratio > 1 + clip_high)) | ((adv < 0) & (ratio < 1 - clip_low))
    return objective, zero_grad, ratio


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str, n_seqs_total: int,
              n_tokens_total: int, max_new_tokens: int) -> torch.Tensor:
    """Sum of this micro-batch's share of the batch loss; the normalizers are those of the WHOLE
    batch (all micro-batches), so accumulating micro-batches gives the batch loss exactly.

    per_token, mask: (B, T) for the micro-batch's responses; mask is 1 on scored tokens."""
    masked = per_token * mask
    if mode == "token-mean":
        return masked.sum() / max(1, n_tokens_total)
    if mode == "seq-mean-token-mean":
        per_seq = masked.sum(-1) / mask.sum(-1).clamp_min(1)
        return per_seq.sum() / max(1, n_seqs_total)
    if mode == "seq-sum-const":
        return masked.sum() / max(1, n_seqs_total * max_new_tokens)
    raise ValueError(f"loss_agg must be one of {LOSS_AGG}")
