"""Control runs (`llmctl rl --control`): the same run with the reward's link to the answers cut, so
that a gain the real run shows can be told from one any reward of that rate would give.

- ``random-reward``: each sample's reward is replaced by a seeded Bernoulli(p) draw in {0, 1}, the
  random reward of Shao et al. 2025 ("Spurious Rewards: Rethinking Training Signals in RLVR":
  reward 1 with probability γ, else 0, whatever the response). Here γ = p is the real reward's
  running mean (`RunningMean`), clipped to [0, 1], so the control is rewarded at the rate the real
  run is. Its draws are independent across samples, where the real reward's samples of one prompt
  share its difficulty, so its groups are all-equal (dropped by dynamic sampling) at their own rate,
  p^G + (1-p)^G (`zero_variance_share` is the control reward's, `zero_variance_kept` the real
  reward's). With std-scaled advantages (--adv-std group, group-bessel, batch) a two-valued
  reward's advantages do not depend on the two values, only on which samples got which, so {0, 1}
  loses nothing against the real reward's {min, max}; a real reward with a format bonus or partial
  credit (python) keeps its mean, not its spread. The verifier still runs on every sample (the
  compute and the logged accuracy are the real run's).
- ``shuffled-answers``: every prompt is scored against another prompt's reference, a seeded
  derangement of the prompt file fixed for the run (`shuffled_references`): the reward then pays
  for answers to other questions, at the rate such answers come up. A prompt whose stand-in
  reference happens to equal its own (two questions with the same answer) still pays for the
  right answer; the manifest counts those prompts.

Both are exact under resume and torchrun: the draws are functions of (seed, step, prompt position,
sample), computed from the all-reduced per-sample table every rank holds, and the running mean is
part of the checkpointed trainer state.
"""

from __future__ import annotations

import numpy as np

from llmctl.tasks.answers import reference_answer

CONTROLS = ("none", "random-reward", "shuffled-answers")

# the random reward's own stream, apart from the sampler's (which seeds torch generators by
# row_seed(row_seed(seed, step, position), sample)): numpy's SeedSequence of these five integers
RANDOM_REWARD_STREAM = 1


def shuffled_references(n: int, seed: int) -> list[int]:
    """perm[i]: the prompt whose reference prompt i is scored against. A seeded random cyclic order
    of all n prompts, each scored against the next one's reference: a permutation with no fixed
    point (a derangement) for n > 1, so no prompt keeps its own reference."""
    order = np.random.default_rng([seed, n]).permutation(n)
    perm = np.empty(n, dtype=np.int64)
    perm[order] = np.roll(order, -1)
    return perm.tolist()


def same_reference(a, b) -> bool:
    """Whether a stand-in reference pays what the prompt's own does: the same canonical answer
    (tasks/answers.py: a GSM8K solution's "#### n", a number) where both have one, else equal."""
    x, y = reference_answer(a), reference_answer(b)
    return x == y if x is not None and y is not None else a == b


class RunningMean:
    """The real reward's mean over the run so far: the sum and count of the real rewards of every
    unmasked sample (what a real run trains on) of every draw up to and including the current one,
    over all ranks. Its state is a plain dict kept in the trainer state, so a resumed run goes on
    from the saved sum, bit for bit."""

    def __init__(self, state: dict):
        self.state = state
        state.setdefault("sum", 0.0)
        state.setdefault("count", 0)

    def add(self, real: np.ndarray, valid: np.ndarray) -> float:
        """Count one draw's real rewards (where valid); returns the mean so far, 0 before any sample."""
        self.state["sum"] += float(real[valid].sum())
        self.state["count"] += int(valid.sum())
        return self.mean()

    def mean(self) -> float:
        return self.state["sum"] / self.state["count"] if self.state["count"] else 0.0


def random_rewards(p: float, seed: int, step: int, positions: range, group_size: int) -> np.ndarray:
    """(len(positions), group_size) rewards in {0, 1}: sample j of the prompt at global position q
    is 1 when its uniform, seeded by (seed, step, q, j), is below p (clipped to [0, 1])."""
    p = min(1.0, max(0.0, p))
    u = np.array([[np.random.default_rng([seed, step, q, j, RANDOM_REWARD_STREAM]).random() for j in range(group_size)]
                  for q in positions])
    return (u < p).astype(np.float64).reshape(len(positions), group_size)
