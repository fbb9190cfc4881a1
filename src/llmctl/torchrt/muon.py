"""Muon on the hidden matrices, AdamW on the rest, as one optimizer (`--optimizer muon`).

Muon (Jordan et al. 2024, "Muon: an optimizer for hidden layers"; Liu et al. 2025, "Muon is
Scalable for LLM Training"): SGD momentum whose update, for a weight matrix, is replaced by the
nearest semi-orthogonal matrix, found by five steps of a quintic Newton-Schulz iteration with
coefficients (3.4445, -4.7750, 2.0315). With the RMS match of Liu et al. the update of an n1 x n2
matrix is `0.2 * sqrt(max(n1, n2)) * NS5(M)`, the RMS an AdamW update has, so AdamW's learning rate
and weight decay carry over (the field guide's optimizer chapter). Only 2-D hidden matrices get
it: embeddings, the head, norm gains and biases stay on AdamW (Jordan: "the input and output
layers ... should be optimized by AdamW").

Why not torch.optim.Muon alone: it takes whole parameters only, and llmctl's attention and MLP
keep q, k, v (and gate, up) fused in one matrix; orthogonalizing the fused matrix is another
update than the recipe's, which treats each projection as its own matrix (nanochat, modded-nanogpt).
A Linear whose rows are several matrices says so (`row_blocks`, set by the model) and each block
is orthogonalized and RMS-matched alone. And a run needs one optimizer (its state dict, its
checkpoint, set_lr), so this class holds the Muon state itself and delegates the other groups to
torch's own AdamW (fused where it can be), sharing its groups and state.

Newton-Schulz runs in bfloat16 on a GPU, as the recipe does, and in float32 on a CPU (bfloat16
matmuls are emulated there: slower and no gain). Under FSDP2 a rank holds a shard of each matrix,
and the iteration needs the whole matrix, so Muon is refused there; DDP and one process work.
"""

from __future__ import annotations

import math

import torch
from torch import nn

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # Jordan et al. 2024: the quintic's (a, b, c)
NS_STEPS = 5
MOMENTUM = 0.95  # Jordan et al. 2024; Liu et al. 2025
RMS_MATCH = 0.2  # Liu et al. 2025: 0.2 * sqrt(max(n1, n2)) gives AdamW's update RMS
EPS = 1e-7


def newton_schulz5(g: torch.Tensor, steps: int = NS_STEPS, eps: float = EPS) -> torch.Tensor:
    """An approximately semi-orthogonal matrix with g's singular vectors: X = g / ||g||_F, then
    `steps` times X <- aX + (bA + cA^2)X with A = XX^T, on the wide orientation (fewer rows)."""
    a, b, c = NS_COEFFICIENTS
    x = g.to(torch.bfloat16 if g.is_cuda else torch.float32)
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T
    x = x / (x.norm() + eps)  # the spectral norm is at most the Frobenius norm: at most 1 now
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return (x.T if tall else x).to(g.dtype)


def muon_update(grad: torch.Tensor, blocks: tuple[int, ...], steps: int = NS_STEPS) -> torch.Tensor:
    """The RMS-matched orthogonalized update of a matrix whose rows are `blocks` matrices."""
    out = torch.empty_like(grad)
    row = 0
    for n in blocks:
        part = grad[row : row + n]
        out[row : row + n] = RMS_MATCH * math.sqrt(max(part.shape)) * newton_schulz5(part, steps)
        row += n
    return out


def muon_params(model: nn.Module) -> tuple[dict[int, tuple[int, ...]], list[str]]:
    """Which parameters Muon takes: {id(param): row blocks} and their names. The 2-D weights of
    the Linear layers inside the blocks; not the embedding, not the head (tied or not)."""
    skip = {id(p) for n, p in model.named_parameters() if n.endswith(("embed.weight", "head.weight"))}
    found: dict[int, tuple[int, ...]] = {}
    names = []
    for name, module in model.named_modules():
        w = getattr(module, "weight", None)
        if not isinstance(module, nn.Linear) or w is None or not w.requires_grad or id(w) in skip or w.ndim != 2:
            continue
        blocks = tuple(getattr(module, "row_blocks", None) or (w.shape[0],))
        if sum(blocks) != w.shape[0]:
            raise ValueError(f"{name}: row blocks {blocks} do not add up to its {w.shape[0]} rows")
        found[id(w)] = blocks
        names.append(f"{name}.weight")
    return found, names


class MuonAdamW(torch.optim.Optimizer):
    """One optimizer: group 0 is Muon's (2-D hidden matrices), the others torch.optim.AdamW's."""

    def __init__(self, muon: list[nn.Parameter], blocks: dict[int, tuple[int, ...]], adamw_groups: list[dict], *,
                 lr: float, weight_decay: float, betas: tuple[float, float], eps: float, momentum: float = MOMENTUM,
                 nesterov: bool = True, ns_steps: int = NS_STEPS, fused: bool | None = None):
        self.adamw = torch.optim.AdamW(adamw_groups, lr=lr, betas=betas, eps=eps, fused=fused)
        self.blocks = blocks  # by id(param): how its rows split into matrices (not state: the model says it)
        group = {"params": muon, "name": "muon", "lr": lr, "weight_decay": weight_decay, "momentum": momentum,
                 "nesterov": nesterov, "ns_steps": ns_steps}
        super().__init__([group, *self.adamw.param_groups], {})
        self._link()

    def _link(self) -> None:
        """AdamW works on this optimizer's own group dicts and state (load_state_dict makes new ones)."""
        self.adamw.param_groups = self.param_groups[1:]
        self.adamw.state = self.state

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self._link()

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        g = self.param_groups[0]
        for p in g["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p)
            buf = state["momentum_buffer"]
            buf.mul_(g["momentum"]).add_(p.grad)
            m = p.grad.add(buf, alpha=g["momentum"]) if g["nesterov"] else buf
            p.mul_(1 - g["lr"] * g["weight_decay"])  # decoupled, at AdamW's rate (the RMS match keeps it)
            p.add_(muon_update(m, self.blocks.get(id(p), (p.shape[0],)), g["ns_steps"]), alpha=-g["lr"])
        self.adamw.step()
        return loss


def make_muon(model: nn.Module, lr: float, weight_decay: float, betas: tuple[float, float], eps: float,
              fused: bool | None = None) -> MuonAdamW:
    """Muon on the hidden matrices; AdamW on the rest, with decay on no embedding, norm or bias
    (torchrt/optim.py's rule: the untied head is the only AdamW matrix, and it decays)."""
    blocks, _ = muon_params(model)
    params = {id(p): p for p in model.parameters() if p.requires_grad}
    muon = [p for i, p in params.items() if i in blocks]
    embed = {id(p) for n, p in model.named_parameters() if n.endswith("embed.weight")}
    decay = [p for i, p in params.items() if i not in blocks and p.ndim >= 2 and i not in embed]
    no_decay = [p for i, p in params.items() if i not in blocks and not (p.ndim >= 2 and i not in embed)]
    groups = [{"params": decay, "weight_decay": weight_decay, "name": "decay"},
              {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"}]
    return MuonAdamW(muon, blocks, groups, lr=lr, weight_decay=weight_decay, betas=betas, eps=eps, fused=fused)


__all__ = ["MuonAdamW", "make_muon", "muon_params", "muon_update", "newton_schulz5", "NS_COEFFICIENTS"]
