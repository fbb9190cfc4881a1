"""The GRPO family as arithmetic: advantages, the clipped surrogate, loss aggregation, KL estimators.

All of it follows spec 001-posttrain-rl §A6/§A7:
- advantage A_i = r_i − mean(r) over the group, divided by the group std (GRPO; population or
  Bessel), the batch std, or nothing (Dr. GRPO); or RLOO's leave-one-out A_i = r_i − mean_{j≠i} r_j;
- per token, min(ρ·A, clip(ρ, 1−ε_low, 1+ε_high)·A) with ρ = π/π_old (DAPO's clip-higher when
  ε_high > ε_low), or with GSPO's length-normalized sequence ratio in place of ρ;
- aggregation ("loss_agg_mode"): seq-mean-token-mean (GRPO: each response's token mean, then the
  mean over responses), token-mean (DAPO: every token of the batch weighs the same), seq-sum-const
  (Dr. GRPO: summed tokens over a constant, responses × max_new_tokens);
- KL to a reference: k3 = (δ − 1) − log δ (unbiased for KL(π‖π_ref), its gradient is the forward
  KL's) or k2 = ½ (log δ)², δ = π_ref/π;
- rollout correction: the engine's log-probs of the sampled tokens against the trainer's, their gap,
  and truncated or masked importance weights (TIS / MIS) that correct for the difference.
"""

from __future__ import annotations

import torch

ADV_STD = ("group", "group-bessel", "batch", "none")
LOSS_AGG = ("seq-mean-token-mean", "token-mean", "seq-sum-const")
KL = ("none", "k1", "k2", "k3")
ADV_ESTIMATORS = ("grpo", "rloo")
RATIO_LEVELS = ("token", "sequence")
IS_CORRECTIONS = ("none", "tis", "mis")
# The cap C of the rollout importance weights: verl's algorithm.rollout_correction.rollout_is_threshold
# default, 2.0 ("typical: 2.0-5.0", verl/trainer/config/algorithm/rollout_correction.yaml); TRL 1.16's
# GRPOConfig.vllm_importance_sampling_clip_max defaults to 3.0.
IS_CAP = 2.0
# verl's SAFETY_BOUND (rollout_corr_helper.py): log-ratios are clamped to ±20 before exp, so a weight
# stays finite in float32 however far the two log-probs are apart
LOG_RATIO_BOUND = 20.0


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


def rloo_advantages(rewards: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Leave-one-out baseline: A_i = r_i − mean_{j≠i} r_j = G/(G−1)·(r_i − r̄) (§A6; Kool et al. 2019,
    Ahmadian et al. 2024). No std division: the baseline alone centers the group.

    rewards (n_groups, G); valid (same shape, bool) marks the samples that count: the mean leaves
    out the invalid ones too, so it runs over the group's G_valid samples, and an invalid sample
    gets A = 0 (its reward is never read). A group with fewer than 2 valid samples has no
    leave-one-out baseline: A = 0."""
    valid = torch.ones_like(rewards, dtype=torch.bool) if valid is None else valid.bool()
    r = torch.where(valid, rewards, torch.zeros_like(rewards))
    n = valid.sum(dim=1, keepdim=True)
    baseline = (r.sum(dim=1, keepdim=True) - r) / (n - 1).clamp_min(1)
    return torch.where(valid & (n >= 2), r - baseline, torch.zeros_like(r))


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


def sequence_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO's sequence importance ratio (Zheng et al. 2025, "Group Sequence Policy Optimization"):
    s_i = exp((1/|y_i|) Σ_t (log π(y_i,t) − log π_old(y_i,t))), the geometric mean of the token
    ratios over the response's scored tokens (mask 1). (B, T) in, (B, 1) out, differentiable."""
    n = mask.sum(-1, keepdim=True).clamp_min(1)
    return torch.exp(((logp - old_logp) * mask).sum(-1, keepdim=True) / n)


def clipped_surrogate(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor,
                      clip_low: float, clip_high: float, level: str = "token",
                      mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token PPO objective (to maximize), whether the clip zeroed the token's gradient, and ρ.

    adv broadcasts over tokens. A token's gradient is zero when the clipped branch is the minimum:
    A > 0 and ρ > 1 + ε_high, or A < 0 and ρ < 1 − ε_low.

    level "sequence" (GSPO, needs the response mask): every token of response i takes GSPO-token's
    ratio s_i,t = sg[s_i]·π(y_t)/sg[π(y_t)] (sg: stop-gradient). Its value is s_i at every token
    and its gradient s_i·∇log π(y_t), so the clip keeps or zeroes a whole response at once, and
    under seq-mean-token-mean aggregation (each response's token mean) the loss and its gradient
    are GSPO's sequence objective, s_i·A_i·(1/|y_i|) Σ_t ∇log π(y_t) where unclipped; the other
    --loss-agg modes weigh the same per-response terms by length as they do for token ratios.
    GSPO clips s_i far tighter than token ratios (ε 3e-4 low, 4e-4 high in the paper), since a
    mean log-ratio moves much less than a token's."""
    if level == "token":
        ratio = torch.exp(logp - old_logp)
    elif level == "sequence":
        if mask is None:
            raise ValueError("clipped_surrogate: the sequence ratio needs the response mask")
        ratio = sequence_ratio(logp, old_logp, mask).detach() * torch.exp(logp - logp.detach())
    else:
        raise ValueError(f"ratio level must be one of {RATIO_LEVELS}")
    unclipped = ratio * adv
    clipped = ratio.clamp(1 - clip_low, 1 + clip_high) * adv
    objective = torch.minimum(unclipped, clipped)
    zero_grad = ((adv > 0) & (ratio > 1 + clip_high)) | ((adv < 0) & (ratio < 1 - clip_low))
    return objective, zero_grad, ratio


def per_token_loss(objective: torch.Tensor, weight: torch.Tensor | None = None, kl: torch.Tensor | None = None,
                   kl_coef: float = 0.0) -> torch.Tensor:
    """The per-token loss to minimize: −objective (the clipped surrogate), times the rollout importance
    weight when there is one (importance_weights: it corrects the policy-gradient term for sampling
    under the engine's numerics), plus kl_coef · the KL estimate, unweighted — TRL multiplies its
    vLLM importance ratio into the surrogate's per-token loss before it adds β·KL."""
    loss = -objective if weight is None else -objective * weight
    return loss if kl is None else loss + kl_coef * kl


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


def importance_weights(train_logp: torch.Tensor, rollout_logp: torch.Tensor, mode: str, cap: float,
                       mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token rollout importance weights and the rollout/trainer log-prob gap.

    train_logp: the trainer's log-prob of each sampled token under the policy that sampled it (π_old:
    at μ = 1 the training forward's, detached; at μ > 1 the recomputed old log-probs); rollout_logp:
    the engine's log-prob of the same token when it sampled it. Both are log softmax(z / T), so they
    differ only by numerics (kernels, batch shapes, precision, another engine) — a difference that
    makes the samples slightly off-policy for the trainer. The ratio r = π_old / π_rollout, then
    - "none": w = 1;
    - "tis" (truncated IS): w = min(r, cap) — TRL's vllm_importance_sampling_mode "token_truncate"
      with vllm_importance_sampling_clip_max, verl's rollout_is "token" with rollout_is_threshold;
    - "mis" (masked IS): w = r, or 0 where r > cap — TRL's "token_mask".
    w is detached (no gradient flows through it); the caller multiplies the per-token policy-gradient
    loss by it, not the KL term (as TRL does). (B, T) tensors in; w (B, T) out.

    stats are sums over the mask's tokens, so micro-batches and ranks add up exactly: gap_sum
    (Σ |train_logp − rollout_logp|), gap_max, weight_sum (Σ w), capped (tokens whose ratio exceeds the
    cap: truncated under tis, masked under mis), tokens."""
    if mode not in IS_CORRECTIONS:
        raise ValueError(f"is correction must be one of {IS_CORRECTIONS}")
    on = mask.bool()
    log_ratio = (train_logp - rollout_logp).detach().float().masked_fill(~on, 0.0)
    gap = log_ratio.abs()
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))
    over = (ratio > cap) & on
    if mode == "tis":
        w = ratio.clamp(max=cap)
    elif mode == "mis":
        w = ratio.masked_fill(over, 0.0)
    else:
        w = torch.ones_like(ratio)
    w = w.masked_fill(~on, 0.0)
    stats = {"gap_sum": float(gap.sum()), "gap_max": float(gap.max()) if gap.numel() else 0.0,
             "weight_sum": float(w.sum()), "capped": float(over.sum()), "tokens": float(on.sum())}
    return w, stats
