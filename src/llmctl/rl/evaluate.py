"""rl's evaluation on the held-out prompts (`--eval`): greedy accuracy before the first step of a
fresh run and every eval_every steps, and the headroom at step 0.

The headroom: on the first --headroom-limit held-out prompts, G samples each at the rollouts'
temperature and top-p give pass@1, pass@G and maj@G next to greedy accuracy on the same prompts.
RL mostly sharpens a model toward answers it already samples (spec 001-posttrain-rl: "RL sharpens
more than it expands"; Yue et al. 2025, "Does Reinforcement Learning Really Incentivize Reasoning
Capacity in LLMs Beyond the Base Model?"), so maj@G − greedy is what perfect sharpening toward the
mode would add, and pass@G − greedy bounds what choosing the right sample every time could.

Under torchrun each rank answers (or samples) a contiguous slice of the prompts and every rank
gets the whole result.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np
import torch

from llmctl.eval.metrics import majority_vote, pass_at_k, summarize_scores
from llmctl.rl.config import RLConfig
from llmctl.rl.rollout import Prompter, row_seed, sample_groups
from llmctl.torchrt import distributed

# The headroom seeds are (seed, 0, eval position, this tag): four words, where a rollout's are three,
# (seed, step, prompt position), which SeedSequence pads with 0, so no headroom sample repeats one
HEADROOM_SEED_TAG = 1
# "Little headroom" when maj@G ≤ greedy (sharpening toward the mode adds nothing) and pass@G −
# greedy is under 10 points: the gain issue 9 asked of the demo's RL; even a policy that always
# picked its right sample among the G would not reach it on these prompts
HEADROOM_MIN_GAIN = 0.10


def group_scores(right: list[bool], answers: list[str | None] | None) -> tuple[float, float, float | None]:
    """One prompt's pass@1 (the share of its samples right), pass@G (some sample right: pass@k's
    estimator at k = n, spec 001-data-eval §A10) and maj@G: whether the most frequent extracted
    answer (eval's majority_vote; ties to the first, None never wins) is a right one. A verdict is
    a function of the extracted answer, so the winner's first sample speaks for all that gave it.
    answers None (the verifier extracts none): maj@G is None."""
    G, c = len(right), sum(right)
    maj = None
    if answers is not None:
        winner, _ = majority_vote(answers)
        maj = float(winner is not None and right[answers.index(winner)])
    return c / G, pass_at_k(G, c, G), maj


def _rank_slice(n: int, d: distributed.Dist) -> tuple[int, int]:
    """This rank's contiguous share [lo, hi) of n items."""
    return n * d.rank // d.world, n * (d.rank + 1) // d.world


class HeldOut:
    """The held-out prompts ({prompt, reference}) of a run, asked of `model` (trained in place
    between the calls), turned into ids by `prompter` and scored by `verifier`."""

    def __init__(self, model, prompts: list[dict], prompter: Prompter, verifier, cfg: RLConfig, dist: distributed.Dist):
        self.model, self.prompts, self.prompter, self.verifier, self.cfg, self.dist = model, prompts, prompter, verifier, cfg, dist

    def evaluate(self) -> dict:
        """Greedy accuracy (eval's summarize_scores: mean and interval)."""
        return summarize_scores(self.greedy_scores())

    @torch.no_grad()
    def greedy_scores(self) -> list[float]:
        """Each held-out prompt's greedy 0/1 score, the same list on every rank."""
        d, n = self.dist, len(self.prompts)
        lo, hi = _rank_slice(n, d)
        self.model.eval()
        engine = self.prompter.engine(self.model, self.cfg.engine_config())
        params = self.cfg.sampling(self.prompter.stop, greedy=True)
        part = self.prompts[lo:hi]
        gens = engine.generate([self.prompter.ids(p["prompt"]) for p in part], params) if part else []
        scores = [0.0] * n
        scores[lo:hi] = [float(bool(self.verifier.verify(g.text, p["reference"]).correct)) for g, p in zip(gens, part)]
        return distributed.all_reduce_sum(scores, d)

    @torch.no_grad()
    def headroom(self, greedy: list[float]) -> dict | None:
        """pass@1, pass@G and maj@G of G samples at the rollouts' temperature and top-p, and greedy
        accuracy (`greedy`: the held-out prompts' greedy scores), on the first headroom_limit
        held-out prompts; None when there are none (headroom_limit 0).

        A sample counts as correct as in evaluate(). maj@G is right when the most frequent extracted
        answer (eval's majority_vote) is a correct one; it is left out for a verifier that extracts
        no answer (Verifier.extracts_answers). The samples are seeded by (seed, position): a rerun
        gives the same numbers, on any number of ranks."""
        c, d, G = self.cfg, self.dist, self.cfg.group_size
        n = min(c.headroom_limit, len(self.prompts))
        if not n:
            return None
        lo, hi = _rank_slice(n, d)
        self.model.eval()
        params = c.sampling(self.prompter.stop)  # the rollouts' own
        seeds = [row_seed(c.seed, 0, i, HEADROOM_SEED_TAG) for i in range(lo, hi)]
        groups = sample_groups(self.prompter.engine(self.model, c.engine_config()), self.prompter, self.prompts,
                               list(range(lo, hi)), G, params, self.verifier, c.truncated, seeds) if hi > lo else []
        table = np.zeros((n, 3))
        for i, group in zip(range(lo, hi), groups):
            answers = [self.verifier.answer(s.text) for s in group] if self.verifier.extracts_answers else None
            table[i] = [0.0 if v is None else v for v in group_scores([bool(s.correct) for s in group], answers)]
        pass1, passG, maj = np.array(distributed.all_reduce_sum(table.ravel().tolist(), d)).reshape(n, 3).mean(0)
        out = {"n": n, "temperature": c.temperature, "top_p": c.top_p, "greedy": float(np.mean(greedy[:n])),
               "pass@1": float(pass1), f"pass@{G}": float(passG)}
        if self.verifier.extracts_answers:
            out[f"maj@{G}"] = float(maj)
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in out.items()}

    def step_zero(self, on_log: Callable[[str], None]) -> dict:
        """The record of step 0 of a fresh run: greedy accuracy and the headroom (with the seconds
        it took), each logged as it is measured."""
        greedy = self.greedy_scores()
        ev = summarize_scores(greedy)
        rec = {"step": 0, "eval": ev}
        on_log(f"step 0: held-out accuracy {ev['mean']:.3f} [{ev['ci_low']:.3f}, {ev['ci_high']:.3f}] (n={ev['n']})")
        t0 = time.perf_counter()
        if (hr := self.headroom(greedy)) is not None:
            rec["headroom"], rec["headroom_s"] = hr, round(time.perf_counter() - t0, 3)
            for line in headroom_lines(hr, self.cfg.group_size):
                on_log(line)
        return rec


def headroom_lines(hr: dict, G: int) -> list[str]:
    """The headroom as logged: its numbers, then a warning when RL has little to gain (HEADROOM_MIN_GAIN)."""
    maj = hr.get(f"maj@{G}")
    top_p = f", top-p {hr['top_p']:g}" if hr["top_p"] < 1 else ""
    lines = [f"step 0: headroom on {hr['n']} held-out prompts at T={hr['temperature']:g}{top_p}: greedy {hr['greedy']:.2f}, "
             f"pass@1 {hr['pass@1']:.2f}, " + ("" if maj is None else f"maj@{G} {maj:.2f}, ") + f"pass@{G} {hr[f'pass@{G}']:.2f}"]
    if (maj is None or maj <= hr["greedy"]) and hr[f"pass@{G}"] - hr["greedy"] < HEADROOM_MIN_GAIN:
        why = f"maj@{G} is the sharpening ceiling" if maj is not None else f"pass@{G} − greedy < {HEADROOM_MIN_GAIN:g}"
        lines.append(f"warning: RL mostly sharpens toward answers the model already samples ({why}): little headroom")
    return lines
