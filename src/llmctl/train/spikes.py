"""What the training loop does with a step's loss: take the update, skip it, or rewind.

Loss spikes. A step's loss is a spike when it lies more than spike_zscore standard deviations above
the mean of the last spike_window finite losses (at least max(10, spike_window/2) of them; the
window travels in the checkpoints, so a resumed run flags what the uninterrupted one did). Spec
000-003 flags at 4 SD over a moving average (000:L521); 6 is the default here, the 0.5B run's
window is not given. What a spike does is --on-spike:
  flag        it is marked in metrics.jsonl ("spike": z) and the step is taken (the default);
  skip-batch  the step's update is not applied: no optimizer step (Adam's moments and step count
              stay), no EMA update; counted (spike_skipped_steps) and marked. Steps not applied in a
              row, for either reason, abort the run at max_bad_steps;
  rewind      the 0.5B run's playbook (spec 000-003 §B5, 000:L511, after PaLM: restart ~100 steps
              earlier and skip 200-500 batches; 001-arch-optim-scaling §D 10, L2619): the step is not applied,
              the run goes back to its last checkpoint (weights, optimizer, EMA, RNG — the path of
              --resume; a run with this setting writes a step-0 checkpoint so there is always one),
              and the data steps from the spiking one back over rewind_skip − 1 more (never before
              the checkpoint) are skipped from then on: the replay meets the following batches
              where the window was. The skipped data steps are kept in trainer_state.json
              ("skipped_data"), so a resumed run maps steps to data the same way. A run that spikes
              again before getting past the step it rewound from rewinds again, at most
              max_rewinds times in a row, then stops (exit 1). Skipping only postpones a spike
              whose cause is the model state (001-arch-optim-scaling §E: PaLM's replays of the
              batch did not spike); the cap keeps a run from looping on one.

A step whose loss or gradient norm is not finite is never applied (counted as skipped_steps).

SpikePolicy holds the decision bookkeeping — the loss window, the steps not applied in a row, the
rewind streak in the trainer's state — and says per step what to do (`observe`); the trainer
carries it out (train/trainer.py: Trainer.run, and Trainer._rewind, which restores the checkpoint).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from llmctl.errors import StageFailed
from llmctl.train.config import TrainConfig


@dataclass(frozen=True)
class Action:
    """What to do with one step: apply its update, skip it (counted), or rewind (the step is not
    applied and the run goes back to its last checkpoint)."""

    finite: bool  # the loss and the gradient norm are finite
    z: float | None  # the spike's z-score (rounded to 2 places), None when the loss is not a spike
    rewind: bool = False
    skip_spike: bool = False  # --on-spike skip-batch skipped the update

    @property
    def apply(self) -> bool:
        return self.finite and not self.skip_spike and not self.rewind

    @property
    def counter(self) -> str:
        """The trainer-state count a step not applied adds one to."""
        return "skipped_steps" if not self.finite else "spike_skipped_steps"

    def marks(self) -> dict:
        """The step's entries in metrics.jsonl about it."""
        if not self.finite:
            return {"skipped": True}
        if self.z is None:
            return {}
        return {"spike": self.z, **({"spike_skipped": True} if self.skip_spike else {})}


class SpikePolicy:
    """The loss window of the spike detector and the steps not applied in a row."""

    def __init__(self, cfg: TrainConfig, recent: Iterable[float] = ()):
        self.window, self.zscore, self.on_spike = cfg.spike_window, cfg.spike_zscore, cfg.on_spike
        self.max_bad_steps = cfg.max_bad_steps
        self.restart(recent)

    def restart(self, recent: Iterable[float]) -> None:
        """Start from a checkpoint's window (its trainer_state's recent_losses), no bad steps."""
        self.recent: deque[float] = deque(recent, maxlen=self.window)
        self.bad_in_row = 0
        self.last: Action | None = None

    def spike(self, loss: float) -> float | None:
        """The z-score of a finite `loss` against the window when it is a spike, else None."""
        if len(self.recent) < max(10, self.window // 2):
            return None
        mean, std = float(np.mean(self.recent)), float(np.std(self.recent))
        if std > 0 and (loss - mean) / std > self.zscore:
            return round((loss - mean) / std, 2)
        return None

    def observe(self, loss: float, finite: bool) -> Action:
        """The action for a step of (all-reduced) `loss`, `finite` when it and the gradient norm
        are. A rewind leaves the window as it is (restart it from the checkpoint rewound to);
        otherwise a finite loss joins the window and the steps not applied in a row are counted."""
        z = self.spike(loss) if finite else None
        if z is not None and self.on_spike == "rewind":
            return Action(finite, z, rewind=True)
        action = Action(finite, z, skip_spike=z is not None and self.on_spike == "skip-batch")
        self.bad_in_row = 0 if action.apply else self.bad_in_row + 1
        if finite:
            self.recent.append(loss)
        self.last = action
        return action

    @staticmethod
    def stepped(state: dict, step: int) -> None:
        """After 0-based step `step`: a run past the step its last rewind went back from ends its
        rewind streak (Trainer._rewind counts it against max_rewinds)."""
        if state.get("rewind_streak") and step >= state["rewind_step"]:
            state["rewind_streak"] = 0

    def check(self, step: int) -> None:
        """Stop the run when max_bad_steps steps in a row were not applied (`step`: the last, 1-based)."""
        if self.bad_in_row >= self.max_bad_steps:
            why = ("had a non-finite loss or gradient" if not self.last.finite else
                   "were loss spikes whose update --on-spike skip-batch skipped")
            raise StageFailed(
                f"train: {self.bad_in_row} steps in a row {why} (last at step {step}); "
                "lower --lr, check the data, or resume from an earlier checkpoint")
