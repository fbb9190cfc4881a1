"""AdamW with the spec's parameter groups (or Muon with them: muon.py), and learning-rate schedules
measured in tokens.

Spec 001-arch-optim-scaling §A4/§A10: β = (0.9, 0.95), ε = 1e-8, weight decay 0.1 on matrices
only — never on embeddings, norm gains or biases — and global-norm clipping at 1.0. §A5: schedules
are specified in tokens (so changing the batch does not silently change them) and checked in steps.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay 2-D weight matrices except the embedding table (and a head tied to it)."""
    embed = {id(p) for name, p in model.named_parameters() if name.endswith("embed.weight")}
    decay, no_decay = [], []
    for p in {id(p): p for p in model.parameters() if p.requires_grad}.values():
        (decay if p.ndim >= 2 and id(p) not in embed else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay, "name": "decay"},
        {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"},
    ]


def make_optimizer(model: nn.Module, lr: float, weight_decay: float, betas: tuple[float, float],
                   eps: float, fused: bool | None = None, optimizer: str = "adamw") -> torch.optim.Optimizer:
    """AdamW with these groups, or Muon on the hidden matrices and AdamW on the rest (muon.py)."""
    if optimizer == "muon":
        from llmctl.torchrt.muon import make_muon

        return make_muon(model, lr, weight_decay, betas, eps, fused=fused)
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=betas, eps=eps, fused=fused)


def describe_groups(opt: torch.optim.Optimizer) -> list[dict]:
    """Each group of `opt` by name, with its parameters, peak rate and weight decay (a run's config)."""
    return [{"name": g.get("name", str(i)), "params": sum(p.numel() for p in g["params"]), "tensors": len(g["params"]),
             "lr": g["lr"], "weight_decay": g["weight_decay"],
             **({"update": "0.2*sqrt(max(n1, n2))*NS5(momentum), each fused block alone"} if g.get("name") == "muon" else {})}
            for i, g in enumerate(opt.param_groups)]


def set_lr(opt: torch.optim.Optimizer, lr: float) -> float:
    """Give every parameter group the step's rate (train and rl set it before each update)."""
    for group in opt.param_groups:
        group["lr"] = lr
    return lr


def lr_at(tokens: float, *, peak: float, total: float, warmup: float, schedule: str,
          cooldown_frac: float = 0.2, cooldown: str = "linear", final_frac: float = 0.0) -> float:
    """Learning rate of the step that ends at `tokens` tokens (so step 0 already has a nonzero rate).

    wsd: linear warmup, flat at peak, then decay over the last cooldown_frac of the run, linear
    or 1−√ (spec §A5, L2277); cosine: to final_frac·peak, 10% by default (L2273); linear: to zero
    (D2Z); constant: the peak after warmup (RL's usual rate, verl's default); decay: a WSD decay
    branch — from a stable-phase checkpoint, the whole run is the cooldown, linear or 1−√ down to
    final_frac·peak (MiniCPM, Hu et al. 2024; Hägele et al. 2024, "Scaling Laws and
    Compute-Optimal Training beyond Fixed Training Durations"; spec §A5)."""
    if warmup > 0 and tokens < warmup:
        return peak * tokens / warmup
    if schedule == "constant":
        return peak
    if schedule == "decay":
        y = min(1.0, max(0.0, tokens - warmup) / max(1.0, total - warmup))
        frac = 1 - math.sqrt(y) if cooldown == "sqrt" else 1 - y
        return final_frac * peak + (peak - final_frac * peak) * frac
    x = min(1.0, (tokens - warmup) / max(1.0, total - warmup))  # progress after warmup
    if schedule == "cosine":
        floor = peak * (final_frac if final_frac else 0.1)
        return floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * x))
    if schedule == "linear":
        return peak * (1 - x)
    if schedule == "wsd":
        start = total * (1 - cooldown_frac)
        if tokens <= start:
            return peak
        y = min(1.0, (tokens - start) / max(1.0, total - start))
        frac = 1 - math.sqrt(y) if cooldown == "sqrt" else 1 - y
        return final_frac * peak + (peak - final_frac * peak) * frac
    raise ValueError(f"unknown schedule {schedule!r}")
