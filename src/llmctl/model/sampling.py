"""What one generated row is and how its next token is drawn: the sampling settings, the result,
the per-row random streams and the one vectorized sampling step the engine runs for a whole batch
whose rows may each have their own settings (a server's requests do).

Per row: temperature, then top-k, then top-p (the order is recorded in `SamplingParams.describe`,
as spec 001-systems-ops asks); greedy when temperature is 0. A row draws its k-th token from the
k-th uniform of its own counter-based stream (RowStreams), by inverse CDF, so its tokens depend on
its seed alone — never on which rows share its batch, when it joined, or how many ranks split the
work.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 0.0  # 0: greedy (deterministic)
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    seed: int = 0  # rows without their own seed draw from row_seed(seed, their index)
    stop: Sequence[str] = ()

    def describe(self) -> dict:
        return {"max_new_tokens": self.max_new_tokens, "temperature": self.temperature, "top_k": self.top_k,
                "top_p": self.top_p, "seed": self.seed, "stop": list(self.stop),
                "order": "temperature, then top-k, then top-p" if self.temperature > 0 else "greedy"}


@dataclass
class Generation:
    prompt_ids: list[int]
    ids: list[int]  # generated token ids, the stop id excluded (after a stop string is cut: the ids that were generated)
    text: str  # generated text, cut before the first stop string
    logprobs: list[float] = field(default_factory=list)  # log p of each generated id, sampling distribution
    finish: str = "length"  # eos | stop | length
    stop_id: int | None = None  # the stop id that ended the row (finish "eos")
    # log softmax(z / T) (T = the temperature, 1 when greedy; no top-k or top-p) of each id of `ids`,
    # then of the stop id when finish is "eos": the policy's own log-probs of what a trainer trains
    # on (rl compares them with its forward's)
    policy_logprobs: list[float] = field(default_factory=list)

    @property
    def truncated(self) -> bool:
        return self.finish == "length"


def row_seed(*parts: int) -> int:
    """A 64-bit generator seed mixed from non-negative integers (numpy's SeedSequence)."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1, np.uint64)[0])


GAMMA = np.uint64(0x9E3779B97F4A7C15)


def splitmix_uniform(seeds: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """The draws-th uniform in [0, 1) of each row's stream: splitmix64(seed + draws·γ) (Steele, Lea &
    Flood 2014). seeds, draws: uint64 arrays of the same shape; float64 out."""
    with np.errstate(over="ignore"):  # uint64 arithmetic wraps modulo 2**64, as splitmix64 wants
        z = seeds + draws * GAMMA
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53


class RowStreams:
    """One random stream per row, counter-based: the k-th uniform of a row is splitmix64(seed + k·γ),
    so a row's samples depend on its seed alone, and all rows draw in one vectorized step, where a
    torch.Generator per row would cost a Python call per row per token."""

    def __init__(self, seeds: Sequence[int]):
        self.seeds = np.array([s % 2**64 for s in seeds], dtype=np.uint64)
        self.k = 0

    def next_uniform(self) -> np.ndarray:
        """(rows,) float64 in [0, 1), the next draw of every row."""
        self.k += 1
        return splitmix_uniform(self.seeds, np.full(self.seeds.shape, self.k, dtype=np.uint64))


NUCLEUS_TRIES = (32, 256)  # top-k widths tried for a row's nucleus before the full sort


def filter_logits(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Top-k then top-p, each row with its own k (0: off) and p (1: off); (B, V) logits in and out.

    Neither sorts the vocabulary when it need not: top-k reads the k-th value off `torch.topk`, and
    a row's nucleus (the most likely tokens until their mass reaches p) is looked for among its 32,
    then 256 most likely tokens, and only a row whose mass is spread wider than that is sorted whole
    (a sort of 64 rows × 3,367 logits took 8.6 ms on one core, topk(32) 0.6). Which path a row takes
    depends on that row alone, so a row's tokens still do not depend on its batch-mates."""
    V = logits.shape[-1]
    if bool((top_k > 0).any()):
        k = top_k.clamp(1, V)
        kth = torch.topk(logits, int(k.max()), dim=-1).values.gather(-1, (k - 1)[:, None])
        kth = torch.where((top_k > 0)[:, None], kth, torch.full_like(kth, float("-inf")))
        logits = logits.masked_fill(logits < kth, float("-inf"))
    todo = (top_p < 1.0).nonzero()[:, 0]
    if not len(todo):
        return logits
    keep = torch.ones_like(logits, dtype=torch.bool)
    keep[todo] = False
    lse = torch.logsumexp(logits.double(), -1)  # the nucleus's mass summed in float64: its edge is exact
    for width in (*NUCLEUS_TRIES, V):
        width = min(width, V)
        values, order = torch.topk(logits[todo], width, dim=-1)  # most likely first
        probs = torch.exp(values.double() - lse[todo, None])
        mass = probs.cumsum(-1)
        p = top_p[todo, None].double()
        done = (mass[:, -1] >= p[:, 0]) | (width == V)
        # keep a token while the tokens ranked above it hold less than top_p of the mass
        kept = (mass - probs < p) & done[:, None]
        keep[todo[:, None].expand_as(order)[kept], order[kept]] = True
        todo = todo[~done]
        if not len(todo):
            break
    return logits.masked_fill(~keep, float("-inf"))


def sample_rows(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                uniform: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One token for each row of `logits` (B, V; float32 on CPU).

    Returns (ids, log p of each id under the row's sampling distribution, log softmax(z / T) of it
    with T = the row's temperature, 1 when greedy: the policy's log-prob). A row with temperature 0
    takes the argmax; the others draw by inverse CDF with their `uniform` (B,) — the first token whose
    cumulative mass exceeds u."""
    greedy = temperature <= 0
    scale = torch.where(greedy, torch.ones_like(temperature), temperature)[:, None]
    policy = torch.log_softmax(logits if bool((scale == 1).all()) else logits / scale, -1)
    if bool(greedy.all()):
        ids = logits.argmax(-1)
        return ids, policy.gather(-1, ids[:, None])[:, 0], policy.gather(-1, ids[:, None])[:, 0]
    hot = ~greedy
    if bool((top_k[hot] > 0).any() or (top_p[hot] < 1).any()):
        hot_logp = torch.log_softmax(filter_logits(logits[hot] / scale[hot], top_k[hot], top_p[hot]), -1)
    else:  # no filter: the sampling distribution is the policy's
        hot_logp = policy if bool(hot.all()) else policy[hot]
    cdf = hot_logp.exp().double().cumsum(-1)
    u = torch.from_numpy(uniform[hot.numpy()]) * cdf[:, -1]
    drawn = torch.searchsorted(cdf, u[:, None], right=True)[:, 0].clamp_max(cdf.shape[-1] - 1)
    drawn_logp = hot_logp.gather(-1, drawn[:, None])[:, 0]
    if bool(hot.all()):
        return drawn, drawn_logp, policy.gather(-1, drawn[:, None])[:, 0]
    ids = logits.argmax(-1)
    ids[hot] = drawn
    logp = policy.gather(-1, ids[:, None])[:, 0]  # a greedy row's: log softmax of its raw logits (scale 1)
    logp[hot] = drawn_logp
    return ids, logp, policy.gather(-1, ids[:, None])[:, 0]
