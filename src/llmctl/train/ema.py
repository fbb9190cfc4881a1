"""An exponential moving average of the weights (`train --ema-decay D`).

After every optimizer step that is applied (a skipped step — non-finite, or a spike under
`--on-spike skip-batch` — changes nothing):

    θ_ema ← d_t·θ_ema + (1 − d_t)·θ,   d_t = min(D, (1 + t)/(10 + t)),

t the number of updates before this one. The warm-up of the decay is TensorFlow's
`tf.train.ExponentialMovingAverage(decay, num_updates)`: early on, when θ moves fast, the average
follows it (d = 0.1 at the first update, 0.5 at the 9th, D = 0.999 from about the 9,000th); without
it the average would hold the random initialization for ~1/(1 − D) steps. θ_ema starts as the
run's first weights and is kept in fp32 whatever the compute dtype.

Where it pays: spec 000-003 (the 0.5B run, 000:L170-176) found no gain after a full decay of the
rate (0.443 vs 0.445 average accuracy), so it is off by default; it stands in for a decay in a run
that ends with the rate still high — constant-rate, stopped early or truncated runs — and is
"checked before committing to a decay" (spec 001-arch-optim-scaling §A9-A10: DeepSeek-V3 keeps an
EMA). The average is a second copy of the model (4 bytes a parameter), validated beside the raw
weights, saved as ema.safetensors in every checkpoint, and what eval, generate, export and rl load
by default (artifacts/checkpoint.py, `--weights`).
"""

from __future__ import annotations

import copy

import torch

from llmctl.model.load import apply_weights
from llmctl.model.transformer import Transformer


def ema_decay_at(decay: float, updates: int) -> float:
    """d_t = min(D, (1 + t)/(10 + t)) for the update that follows `updates` earlier ones."""
    return min(decay, (1 + updates) / (10 + updates))


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (FSDP2), else the tensor: the average is elementwise, shard by shard."""
    return t.to_local() if hasattr(t, "to_local") else t


class EMA:
    """The averaged weights as a Transformer of their own (so validation runs on them as on the
    model), in fp32, never trained (requires_grad off)."""

    def __init__(self, decay: float, start: Transformer, tensors: dict[str, torch.Tensor] | None = None,
                 updates: int = 0, where: str = "ema.safetensors"):
        """`start`: the model (unwrapped, before this process's first step) whose weights begin the
        average, unless `tensors` (a checkpoint's ema.safetensors) are given."""
        self.decay, self.updates = decay, updates
        model = copy.deepcopy(start).float()
        if tensors is not None:
            apply_weights(model, tensors, where)
        self.model = model.requires_grad_(False).eval()

    @torch.no_grad()
    def update(self, params: list[torch.Tensor]) -> None:
        """One update toward `params` (the model's parameters, in the order of its .parameters())."""
        d = ema_decay_at(self.decay, self.updates)
        mine = [_local(p) for p in self.model.parameters()]
        theirs = [_local(p).detach().float() for p in params]
        torch._foreach_lerp_(mine, theirs, 1.0 - d)  # θ_ema + (1 − d)(θ − θ_ema) = d·θ_ema + (1 − d)·θ
        self.updates += 1
