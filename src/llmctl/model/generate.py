"""The generation engine shared by `llmctl generate`, eval, rl and `llmctl serve`: continuous
batching over a paged KV pool (model/scheduler.py, model/kv_pool.py) with a KV cache throughout
(spec 001-systems-ops §A5: "always use a KV cache"), sampling as model/sampling.py draws it.

`Engine.generate` is the offline call: every prompt is submitted at once, identical prompts become
one request with a sample per row (their prefill computed once), and the scheduler runs until all
rows end. A row's tokens are the ones it would get alone: its RoPE positions start at 0 at its
first token, it attends over its own keys only, and it draws from its own seed. A row stops at any
of the stop ids (a model's EOS ids, a chat template's turn end), at a stop string, or at
max_new_tokens (then it is marked truncated). `use_cache=False` is the reference the tests hold
the engine to: every step recomputes each row's whole sequence.
"""

from __future__ import annotations

import copy
from typing import Callable, Sequence

import numpy as np
import torch

from llmctl.model.sampling import Generation, RowStreams, SamplingParams, row_seed, sample_rows, splitmix_uniform
from llmctl.model.scheduler import EngineConfig, Request, Scheduler
from llmctl.model.transformer import Transformer
from llmctl.tokenizer.vocab import Vocab

__all__ = ["Engine", "EngineConfig", "Generation", "RowStreams", "SamplingParams", "cpu_threads_for", "row_seed"]


SMALL_WORK = 2e8  # parameters × tokens per forward below which a CPU forward runs on one thread


def small_cpu_forward(model, tokens: int) -> bool:
    """A forward over `tokens` tokens of `model` that one CPU thread runs faster than several."""
    return next(model.parameters()).device.type == "cpu" and model.cfg.n_params() * tokens < SMALL_WORK


class cpu_threads_for:
    """One CPU thread while a small model runs small forwards (decode steps, scoring batches):
    the threads' synchronization then costs more than the work, and on a loaded machine a
    descheduled thread stalls every op — measured 20× slower with 2 threads under load."""

    def __init__(self, model, tokens_per_forward: int):
        self.n = 1 if small_cpu_forward(model, tokens_per_forward) else None
        self.old = None

    def __enter__(self):
        if self.n:
            self.old = torch.get_num_threads()
            torch.set_num_threads(self.n)

    def __exit__(self, *exc):
        if self.old:
            torch.set_num_threads(self.old)


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
GEN_DTYPES = ("auto", *DTYPES)


def generation_copy(model: Transformer, dtype: str) -> Transformer:
    """The model to generate with: itself, or a copy in `dtype` (EngineConfig.dtype; a copy, so a
    trainer's float32 weights stay as they are)."""
    have = next(model.parameters())
    want = DTYPES.get(dtype) or (torch.bfloat16 if have.device.type == "cuda" else have.dtype)
    if want == have.dtype:
        return model
    return copy.deepcopy(model).to_dtype(want).eval()


class Engine:
    """`Engine(model, encode, decode, stop_ids).generate(prompts, params)` → one Generation per prompt.
    `Engine.for_vocab` builds one with a checkpoint's ids (tokenizer/vocab.py)."""

    def __init__(self, model: Transformer, encode: Callable[[str], list[int]], decode: Callable[[list[int]], str],
                 stop_ids: Sequence[int] = (), pad_id: int = 0, config: EngineConfig | None = None):
        self.config = config or EngineConfig()
        self.model, self.encode, self.decode = generation_copy(model, self.config.dtype), encode, decode
        self.stop_ids, self.pad_id = frozenset(stop_ids), pad_id
        self.vocab = model.cfg.vocab_size  # padded rows of the head are never sampled
        self.max_threads = torch.get_num_threads()  # what a forward too big for one thread gets
        self.stats: dict = {}  # the last generate's: prefill and decode work, KV memory (Scheduler.stats)

    @classmethod
    def for_vocab(cls, model: Transformer, vocab: Vocab, chat: bool, config: EngineConfig | None = None) -> Engine:
        """An engine that encodes, decodes, pads and stops as `vocab` says (a chat prompt stops at
        the template's turn end first)."""
        return cls(model, vocab.encode, vocab.decode, vocab.stop_ids(chat), pad_id=vocab.pad_id, config=config)

    @property
    def device(self):
        return next(self.model.parameters()).device

    def threads_for(self, tokens: int) -> int:
        """CPU threads for a forward over `tokens` tokens (cpu_threads_for's rule)."""
        return 1 if small_cpu_forward(self.model, tokens) else self.max_threads

    def generate(self, prompts: Sequence[str | list[int]], params: SamplingParams, use_cache: bool = True,
                 seeds: Sequence[int] | None = None, on_done: Callable[[int], None] | None = None) -> list[Generation]:
        """`seeds` (one per prompt) gives every row its own random stream; without it row i draws from
        row_seed(params.seed, i). Either way a row's tokens do not depend on which other rows share its
        batch (rl's data-parallel ranks sample the same completions as one process). `on_done(k)`
        hears of rows as they end."""
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"generate: {len(seeds)} seeds for {len(prompts)} prompts")
        ids = [p if isinstance(p, list) else self.encode(p) for p in prompts]
        seeds = list(seeds) if seeds is not None else [row_seed(params.seed, i) for i in range(len(ids))]
        self.max_threads = torch.get_num_threads()
        try:
            if not use_cache:
                return self._generate_uncached(ids, params, seeds)
            return self._generate(ids, params, seeds, on_done)
        finally:
            torch.set_num_threads(self.max_threads)

    def _generate(self, ids: list[list[int]], params: SamplingParams, seeds: list[int], on_done) -> list[Generation]:
        scheduler = Scheduler(self, self.config)
        rows: dict[tuple, list[int]] = {}  # identical prompts: one request, a sample per row
        for i, p in enumerate(ids):
            rows.setdefault(tuple(p), []).append(i)
        requests = list(rows.values())
        for k, members in enumerate(requests):
            scheduler.add(Request(str(k), ids[members[0]], params, [seeds[i] for i in members]))
        out: list[Generation | None] = [None] * len(ids)
        while scheduler.has_work():
            for u in scheduler.step():
                if u.done is not None:
                    out[requests[int(u.request_id)][u.index]] = u.done
                    if on_done:
                        on_done(1)
        self.stats = {**scheduler.stats, **scheduler.kv_bytes()}
        return out

    @torch.no_grad()
    def _generate_uncached(self, prompts: list[list[int]], params: SamplingParams, seeds: list[int]) -> list[Generation]:
        """The reference: every step recomputes each row's whole sequence (no padding, no cache)."""
        seqs = [list(p) for p in prompts]
        n = len(seqs)
        done: list[Generation | None] = [None] * n
        out: list[list[int]] = [[] for _ in range(n)]
        lps: list[list[float]] = [[] for _ in range(n)]
        pols: list[list[float]] = [[] for _ in range(n)]
        seed_arr = np.array([s % 2**64 for s in seeds], dtype=np.uint64)
        temp = torch.full((n,), float(params.temperature))
        top_k, top_p = torch.full((n,), params.top_k), torch.full((n,), float(params.top_p))
        for step in range(1, params.max_new_tokens + 1):
            logits = torch.cat([self.model(torch.tensor([s or [self.pad_id]], device=self.device))[:, -1] for s in seqs])
            ids, logp, pol = sample_rows(logits[:, : self.vocab].float().cpu(), temp, top_k, top_p,
                                         splitmix_uniform(seed_arr, np.full(n, step, dtype=np.uint64)))
            for r, (t, lp, pp) in enumerate(zip(ids.tolist(), logp.tolist(), pol.tolist())):
                if done[r] is not None:
                    continue
                pols[r].append(pp)
                if t in self.stop_ids:
                    done[r] = Generation(prompts[r], out[r], self.decode(out[r]), lps[r], "eos", t, pols[r])
                    continue
                out[r].append(t)
                lps[r].append(lp)
                text = self.decode(out[r])
                cut = min((text.find(x) for x in params.stop if x in text), default=-1)
                if cut >= 0:
                    done[r] = Generation(prompts[r], out[r], text[:cut], lps[r], "stop", None, pols[r])
                elif step == params.max_new_tokens:
                    done[r] = Generation(prompts[r], out[r], text, lps[r], "length", None, pols[r])
                seqs[r].append(t)
            if all(d is not None for d in done):
                break
        return done
