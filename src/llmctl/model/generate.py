"""The generation engine shared by `llmctl generate`, eval and rl: batched prefill, then decode
with a KV cache (spec 001-systems-ops §A5: "always use a KV cache").

Prompts of different lengths are left-padded to a common length; each row's RoPE positions start
at 0 at its first real token and padded keys are masked out, so a row's tokens are the ones it
would get alone. Per step: temperature, then top-k, then top-p (the order is recorded in
`SamplingParams.describe`, as the spec asks); greedy when temperature is 0. A row stops at any of
the stop ids (a model's EOS ids, a chat template's turn end), at a stop string, or at
max_new_tokens (then it is marked truncated).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from llmctl.model.transformer import Transformer
from llmctl.tokenizer.vocab import Vocab


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 0.0  # 0: greedy (deterministic)
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    seed: int = 0
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

    @property
    def truncated(self) -> bool:
        return self.finish == "length"


SMALL_WORK = 2e8  # parameters × tokens per forward below which a CPU forward runs on one thread


class cpu_threads_for:
    """One CPU thread while a small model runs small forwards (decode steps, scoring batches):
    the threads' synchronization then costs more than the work, and on a loaded machine a
    descheduled thread stalls every op — measured 20× slower with 2 threads under load."""

    def __init__(self, model, tokens_per_forward: int):
        device = next(model.parameters()).device
        small = model.cfg.n_params() * tokens_per_forward < SMALL_WORK
        self.n = 1 if device.type == "cpu" and small else None
        self.old = None

    def __enter__(self):
        if self.n:
            self.old = torch.get_num_threads()
            torch.set_num_threads(self.n)

    def __exit__(self, *exc):
        if self.old:
            torch.set_num_threads(self.old)


class KVCache:
    """Keys and values of one layer for a batch: (B, h_kv, capacity, d_h), filled up to `length`."""

    def __init__(self, batch: int, n_kv_heads: int, head_dim: int, capacity: int, dtype, device):
        shape = (batch, n_kv_heads, capacity, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = k.shape[2]
        self.k[:, :, self.length : self.length + t] = k
        self.v[:, :, self.length : self.length + t] = v
        return self.k[:, :, : self.length + t], self.v[:, :, : self.length + t]


def _filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        probs = sorted_logits.softmax(-1)
        # drop a token when the tokens ranked above it already hold top_p of the mass
        drop = probs.cumsum(-1) - probs >= top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return logits


class Engine:
    """`Engine(model, encode, decode, stop_ids).generate(prompts, params)` → one Generation per prompt.
    `Engine.for_vocab` builds one with a checkpoint's ids (tokenizer/vocab.py)."""

    def __init__(self, model: Transformer, encode: Callable[[str], list[int]], decode: Callable[[list[int]], str],
                 stop_ids: Sequence[int] = (), pad_id: int = 0, batch_size: int = 16):
        self.model, self.encode, self.decode = model, encode, decode
        self.stop_ids, self.pad_id, self.batch_size = frozenset(stop_ids), pad_id, batch_size
        self.vocab = model.cfg.vocab_size  # padded rows of the head are never sampled

    @classmethod
    def for_vocab(cls, model: Transformer, vocab: Vocab, chat: bool, batch_size: int = 16) -> Engine:
        """An engine that encodes, decodes, pads and stops as `vocab` says (a chat prompt stops at
        the template's turn end first)."""
        return cls(model, vocab.encode, vocab.decode, vocab.stop_ids(chat), pad_id=vocab.pad_id, batch_size=batch_size)

    @property
    def device(self):
        return next(self.model.parameters()).device

    def generate(self, prompts: Sequence[str | list[int]], params: SamplingParams, use_cache: bool = True,
                 seeds: Sequence[int] | None = None) -> list[Generation]:
        """`seeds` (one per prompt) gives every row its own random stream (RowStreams), so a row's
        tokens do not depend on which other rows share its batch (rl's data-parallel ranks sample
        the same completions as one process); without it one generator seeded by params.seed
        serves all rows."""
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"generate: {len(seeds)} seeds for {len(prompts)} prompts")
        with cpu_threads_for(self.model, self.batch_size):
            return self._generate(prompts, params, use_cache, seeds)

    def _generate(self, prompts, params: SamplingParams, use_cache: bool, seeds: Sequence[int] | None = None) -> list[Generation]:
        ids = [p if isinstance(p, list) else self.encode(p) for p in prompts]
        gen = torch.Generator(device="cpu").manual_seed(params.seed)
        out: list[Generation] = []
        for i in range(0, len(ids), self.batch_size):
            batch = ids[i : i + self.batch_size]
            run = self._generate_cached if use_cache else self._generate_uncached
            out.extend(run(batch, params, gen if seeds is None else RowStreams(seeds[i : i + self.batch_size])))
        return out

    # -- one batch ---------------------------------------------------------------------------

    @torch.no_grad()
    def _generate_cached(self, prompts: list[list[int]], params: SamplingParams, gen) -> list[Generation]:
        model, dev = self.model, self.device
        B, width = len(prompts), max(1, max(len(p) for p in prompts))
        pad = torch.tensor([width - len(p) for p in prompts], device=dev)
        tokens = torch.tensor([[self.pad_id] * (width - len(p)) + p for p in prompts], device=dev)
        capacity = width + params.max_new_tokens
        cfg = model.cfg
        dtype = next(model.parameters()).dtype
        caches = [KVCache(B, cfg.n_kv_heads, cfg.head_dim, capacity, dtype, dev) for _ in range(cfg.n_layers)]
        key_valid = torch.arange(capacity, device=dev)[None, :] >= pad[:, None]  # (B, capacity)
        positions = (torch.arange(width, device=dev)[None, :] - pad[:, None]).clamp(min=0)
        causal = torch.ones(width, width, dtype=torch.bool, device=dev).tril()
        mask = (causal[None] & key_valid[:, None, :width])[:, None]  # (B, 1, T, T)
        # a fully padded query row would make softmax NaN; let pad queries see themselves
        mask = mask | torch.eye(width, dtype=torch.bool, device=dev)[None, None]
        logits = model(tokens, caches=caches, mask=mask, positions=positions)[:, -1]
        for c in caches:
            c.length = width
        state = _RowState(prompts, params, self)
        for step in range(params.max_new_tokens):
            next_ids, logp = self._sample(logits, params, gen)
            state.append(next_ids, logp)
            if state.all_done() or step == params.max_new_tokens - 1:
                break
            pos = (width + step - pad)[:, None]
            step_mask = key_valid[:, None, None, : width + step + 1]
            logits = model(next_ids[:, None].to(dev), caches=caches, mask=step_mask, positions=pos)[:, -1]
            for c in caches:
                c.length += 1
        return state.results()

    @torch.no_grad()
    def _generate_uncached(self, prompts: list[list[int]], params: SamplingParams, gen) -> list[Generation]:
        """The reference: every step recomputes each row's whole sequence (no padding, no cache)."""
        state = _RowState(prompts, params, self)
        seqs = [list(p) for p in prompts]
        for step in range(params.max_new_tokens):
            logits = torch.cat([self.model(torch.tensor([s or [self.pad_id]], device=self.device))[:, -1] for s in seqs])
            next_ids, logp = self._sample(logits, params, gen)
            state.append(next_ids, logp)
            if state.all_done():
                break
            for s, t in zip(seqs, next_ids.tolist()):
                s.append(t)
        return state.results()

    def _sample(self, logits: torch.Tensor, params: SamplingParams, gen) -> tuple[torch.Tensor, torch.Tensor]:
        """gen: one torch.Generator for the batch, or RowStreams (a stream per row)."""
        logits = logits[:, : self.vocab].float().cpu()
        if params.temperature <= 0:
            ids = logits.argmax(-1)
            return ids, torch.log_softmax(logits, -1).gather(-1, ids[:, None])[:, 0]
        logits = _filter_logits(logits / params.temperature, params.top_k, params.top_p)
        logp = torch.log_softmax(logits, -1)
        probs = logp.exp()
        if isinstance(gen, RowStreams):  # inverse CDF: the first token whose cumulative mass exceeds u
            cdf = probs.double().cumsum(-1)
            u = torch.from_numpy(gen.next_uniform()) * cdf[:, -1]
            ids = torch.searchsorted(cdf, u[:, None], right=True)[:, 0].clamp_max(probs.shape[-1] - 1)
        else:
            ids = torch.multinomial(probs, 1, generator=gen)[:, 0]
        return ids, logp.gather(-1, ids[:, None])[:, 0]


class RowStreams:
    """One random stream per row, counter-based: the k-th uniform of a row is splitmix64(seed + k·γ)
    (Steele, Lea & Flood 2014), so a row's samples depend on its seed alone, not on which rows share
    its batch or on how many ranks split the work — and all rows draw in one vectorized step, where
    a torch.Generator per row would cost a Python call per row per token."""

    GAMMA = np.uint64(0x9E3779B97F4A7C15)

    def __init__(self, seeds: Sequence[int]):
        self.seeds = np.array([s % 2**64 for s in seeds], dtype=np.uint64)
        self.k = 0

    def next_uniform(self) -> np.ndarray:
        """(rows,) float64 in [0, 1), the next draw of every row."""
        self.k += 1
        with np.errstate(over="ignore"):  # uint64 arithmetic wraps modulo 2**64, as splitmix64 wants
            z = self.seeds + np.uint64(self.k) * self.GAMMA
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            z = z ^ (z >> np.uint64(31))
        return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53


class _RowState:
    """Per-row bookkeeping: generated ids, stop detection, finish reasons."""

    def __init__(self, prompts: list[list[int]], params: SamplingParams, engine: Engine):
        self.prompts, self.params, self.engine = prompts, params, engine
        self.ids: list[list[int]] = [[] for _ in prompts]
        self.logprobs: list[list[float]] = [[] for _ in prompts]
        self.finish: list[str | None] = [None] * len(prompts)
        self.stop_id: list[int | None] = [None] * len(prompts)
        self.text: list[str | None] = [None] * len(prompts)

    def append(self, next_ids: torch.Tensor, logp: torch.Tensor) -> None:
        for r, (t, lp) in enumerate(zip(next_ids.tolist(), logp.tolist())):
            if self.finish[r] is not None:
                continue
            if t in self.engine.stop_ids:
                self.finish[r], self.stop_id[r] = "eos", t
                continue
            self.ids[r].append(t)
            self.logprobs[r].append(lp)
            if self.params.stop:
                text = self.engine.decode(self.ids[r])
                cut = min((text.find(s) for s in self.params.stop if s in text), default=-1)
                if cut >= 0:
                    self.finish[r], self.text[r] = "stop", text[:cut]

    def all_done(self) -> bool:
        return all(f is not None for f in self.finish)

    def results(self) -> list[Generation]:
        out = []
        for r, p in enumerate(self.prompts):
            finish = self.finish[r] or "length"
            text = self.text[r] if self.text[r] is not None else self.engine.decode(self.ids[r])
            out.append(Generation(list(p), self.ids[r], text, self.logprobs[r], finish, self.stop_id[r]))
        return out
