"""Continuous batching: the engine's step loop over a pool of sequences (Yu et al. 2022, "Orca:
A Distributed Serving System for Transformer-Based Generative Models"; vLLM's scheduler).

A request is a prompt with n samples (each with its own seed). Each `step()`:
1. admits waiting requests while their blocks fit the KV budget (model/kv_pool.py) and the rows
   fit `max_rows`, and prefills their prompts in one forward — once per request however many
   samples it has, and after any prefix already in the pool's prefix cache; each sample then
   draws its first token from the shared last-position logits;
2. decodes one token for every running sequence in one forward.
A sequence leaves the moment it ends (a stop id, a stop string, max_new_tokens) and frees its
blocks, and a waiting request takes its place at the next step: no row computes past its end,
and no row waits for the longest of a fixed batch. When a decode step finds no block for a
sequence, the newest sequence is preempted: its blocks are freed and it waits again with its
tokens so far, re-prefilled when it comes back (vLLM's recompute preemption) — its draws continue
from its own counter, so its tokens are the ones it would have had.

One thread owns a Scheduler (a server runs it on its engine thread).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch

from llmctl.errors import UsageError
from llmctl.model.kv_pool import BlockPool, PagedCache
from llmctl.model.sampling import Generation, SamplingParams, sample_rows, splitmix_uniform


@dataclass
class EngineConfig:
    """Batch and memory limits (vLLM's max_num_seqs, KV cache size, max_num_batched_tokens)."""
    max_rows: int = 256  # sequences decoding at once at most
    kv_tokens: int = 0  # tokens the KV pool may hold; 0: as many as a quarter of the memory holds, at most 2^18
    block_size: int = 16  # tokens per KV block
    prefill_tokens: int = 4096  # tokens (padding included) per prefill forward, at least one prompt
    # the weights' precision while generating: auto keeps the model's on CPU (exact: greedy equals the
    # reference) and takes bfloat16 on a GPU; bfloat16 on a CPU with AMX is faster, its log-probs
    # then differ from a float32 trainer's (rl logs the gap and can correct for it, --is-correction)
    dtype: str = "auto"


@dataclass
class Request:
    id: str
    prompt_ids: list[int]
    params: SamplingParams
    seeds: list[int]  # one per sample: n = len(seeds)


@dataclass
class Update:
    request_id: str
    index: int  # the sample's index within its request
    new_ids: list[int]  # ids generated this step (a stop id is not one)
    done: Generation | None = None  # set on the step the sample ends


class Seq:
    """One sample in flight."""

    def __init__(self, request: Request, index: int, seed: int, tokens: list[int]):
        self.request, self.index, self.params = request, index, request.params
        self.prompt_tokens = tokens  # the prompt as prefilled (an empty prompt is one pad id)
        self.seed, self.draws = np.uint64(seed % 2**64), 0
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.policy: list[float] = []
        self.blocks: list[int] = []
        self.length = 0  # tokens whose keys and values are in the pool
        self.order = 0  # admission count: the newest is preempted first
        self.finish: str | None = None
        self.stop_id: int | None = None
        self.text: str | None = None


@dataclass
class Prefill:
    """Tokens to prefill and the sequences that go on from their last position."""
    tokens: list[int]
    seqs: list[Seq]
    start: int = 0  # tokens before it come from the prefix cache
    table: list[int] = field(default_factory=list)


def prefix_keys(tokens: list[int], block_size: int, blocks: int):
    """The prefix-cache keys of a prompt's first `blocks` full blocks: (parent key, the block's tokens),
    so a key names the whole token prefix up to its block's end."""
    key = ()
    for j in range(blocks):
        key = (key, tuple(tokens[j * block_size : (j + 1) * block_size]))
        yield key


def default_kv_tokens(bytes_per_token: int, device) -> int:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        have = free // 2
    else:
        from llmctl.bounds import machine_memory

        have = machine_memory() // 4
    return int(max(1024, min(1 << 18, have // bytes_per_token)))


class Scheduler:
    def __init__(self, engine, config: EngineConfig):
        self.engine, self.config, self.model = engine, config, engine.model
        cfg = self.model.cfg
        p = next(self.model.parameters())
        self.device = p.device
        per_token = cfg.n_layers * 2 * cfg.n_kv_heads * cfg.head_dim * p.element_size()
        budget = config.kv_tokens or default_kv_tokens(per_token, self.device)
        bs = config.block_size
        self.pool = BlockPool(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, bs, budget // bs, p.dtype, self.device)
        self.waiting: deque[Prefill] = deque()
        self.running: list[Seq] = []
        self.admitted = 0
        self.threads = None
        self.stats = {"prefill_tokens": 0, "prefix_hit_tokens": 0, "shared_prefill_rows": 0, "decode_steps": 0,
                      "decode_rows": 0, "preemptions": 0, "peak_rows": 0}

    # -- requests ----------------------------------------------------------------------------

    def add(self, request: Request) -> None:
        tokens = list(request.prompt_ids) or [self.engine.pad_id]
        need = math.ceil((len(tokens) + request.params.max_new_tokens) / self.pool.block_size) + 1
        if need > self.pool.max_blocks:
            raise UsageError(f"generation: a prompt of {len(tokens)} tokens plus {request.params.max_new_tokens} new ones "
                             f"needs {need * self.pool.block_size} KV tokens, over the budget of "
                             f"{self.pool.max_blocks * self.pool.block_size} tokens (EngineConfig.kv_tokens; serve --kv-tokens)")
        seqs = [Seq(request, i, s, tokens) for i, s in enumerate(request.seeds)]
        if seqs:
            self.waiting.append(Prefill(tokens, seqs))

    def abort(self, request_id: str) -> None:
        self.waiting = deque(g for g in self.waiting if g.seqs[0].request.id != request_id)
        for s in [s for s in self.running if s.request.id == request_id]:
            self._free(s)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def kv_bytes(self) -> dict:
        b = self.pool.block_bytes
        return {"peak_kv_bytes": self.pool.peak_in_use * b, "kv_allocated_bytes": self.pool.peak_capacity * b}

    # -- one step ----------------------------------------------------------------------------

    @torch.no_grad()
    def step(self) -> list[Update]:
        updates: list[Update] = []
        admitted = self._admit()
        if admitted:
            self._prefill(admitted, updates)
        if self.running:
            self._decode(updates)
        return updates

    def _admit(self) -> list[Prefill]:
        c, pool, out = self.config, self.pool, []
        rows, width, reserved = len(self.running), 0, 0
        while self.waiting:
            g = self.waiting[0]
            w = max(width, len(g.tokens))
            blocks = math.ceil(len(g.tokens) / pool.block_size) + len(g.seqs)  # the prompt's, then one per sample
            busy = bool(out or self.running)  # with nothing in flight the first request goes in whatever it needs
            if busy and (rows + len(g.seqs) > c.max_rows or reserved + blocks > pool.available()):
                break
            if out and (len(out) + 1) * w > c.prefill_tokens:
                break
            self.waiting.popleft()
            self._place(g)
            out.append(g)
            rows, width, reserved = rows + len(g.seqs), w, reserved + len(g.seqs)
        return out

    def _place(self, g: Prefill) -> None:
        """The prompt's blocks: a run of full blocks from the prefix cache, then fresh ones (at least
        its last token is computed: its logits are the first draw's)."""
        pool, bs = self.pool, self.pool.block_size
        for key in prefix_keys(g.tokens, bs, (len(g.tokens) - 1) // bs):
            block = pool.lookup(key)
            if block is None:
                break
            g.table.append(block)
        g.start = len(g.table) * bs
        for _ in range(math.ceil(len(g.tokens) / bs) - len(g.table)):
            g.table.append(self._allocate())
        self.stats["prefix_hit_tokens"] += g.start

    def _allocate(self) -> int:
        block = self.pool.allocate()
        while block is None:  # admission counted the blocks, so only a decode step gets here
            self._preempt()
            block = self.pool.allocate()
        return block

    def _prefill(self, groups: list[Prefill], updates: list[Update]) -> None:
        pool, bs = self.pool, self.pool.block_size
        B, T = len(groups), max(len(g.tokens) - g.start for g in groups)
        width = max(len(g.table) for g in groups)
        tokens = torch.full((B, T), self.engine.pad_id, dtype=torch.long)
        positions = torch.zeros((B, T), dtype=torch.long)  # a padded query sits at 0 and sees key 0 alone
        write = torch.zeros(B * T, dtype=torch.long)  # padding writes to block 0, never handed out
        table = torch.tensor([g.table + [0] * (width - len(g.table)) for g in groups])
        last = torch.zeros(B, dtype=torch.long)
        for r, g in enumerate(groups):
            n = len(g.tokens) - g.start
            tokens[r, :n] = torch.tensor(g.tokens[g.start :])
            positions[r, :n] = torch.arange(g.start, len(g.tokens))
            write[r * T : r * T + n] = torch.tensor(pool.slots(g.table, g.start, len(g.tokens)))
            last[r] = n - 1
        mask = (torch.arange(width * bs)[None, None, :] <= positions[:, :, None])[:, None]
        logits = self._forward(tokens, positions, write, table, mask, last)
        rows, row_logits = [], []
        for r, g in enumerate(groups):
            # the prompt's full blocks serve later prompts that share them
            for j, key in enumerate(prefix_keys(g.tokens, bs, len(g.tokens) // bs)):
                pool.remember(key, g.table[j])
            for i, s in enumerate(g.seqs):
                s.blocks = g.table if i == 0 else [pool.share(b) for b in g.table]
                s.length, s.order = len(g.tokens), self.admitted
                self.admitted += 1
                rows.append(s)
                row_logits.append(r)
            self.stats["prefill_tokens"] += len(g.tokens) - g.start
            self.stats["shared_prefill_rows"] += len(g.seqs) - 1
        self.running.extend(rows)
        self._sample(rows, logits[torch.tensor(row_logits)], updates)

    def _decode(self, updates: list[Update]) -> None:
        pool, bs = self.pool, self.pool.block_size
        for s in sorted(self.running, key=lambda s: s.order):
            if s.blocks:  # not preempted by an older sequence's room
                self._make_room(s)
        seqs = self.running
        if not seqs:
            return
        B = len(seqs)
        lengths = torch.tensor([s.length for s in seqs])
        width = max(len(s.blocks) for s in seqs)
        table = torch.tensor([s.blocks + [0] * (width - len(s.blocks)) for s in seqs])
        write = table[torch.arange(B), lengths // bs] * bs + lengths % bs
        tokens = torch.tensor([[s.ids[-1]] for s in seqs])
        mask = (torch.arange(width * bs)[None, :] <= lengths[:, None])[:, None, None]
        logits = self._forward(tokens, lengths[:, None], write, table, mask, torch.zeros(B, dtype=torch.long))
        for s in seqs:
            s.length += 1
        self.stats["decode_steps"] += 1
        self.stats["decode_rows"] += B
        self._sample(list(seqs), logits, updates)

    def _make_room(self, s: Seq) -> None:
        """A slot for s's next token: a new block at a block boundary, a private copy of a shared last block."""
        pool, bs = self.pool, self.pool.block_size
        if s.length % bs == 0 and s.length // bs == len(s.blocks):
            block = self._allocate_for(s)
            if block is not None:
                s.blocks.append(block)
        elif pool.refs[s.blocks[-1]] > 1:
            block = self._allocate_for(s)
            if block is not None:
                pool.copy(s.blocks[-1], block)
                pool.release(s.blocks[-1])
                s.blocks[-1] = block

    def _allocate_for(self, s: Seq) -> int | None:
        block = self.pool.allocate()
        while block is None:
            if self._preempt() is s:
                return None
            block = self.pool.allocate()
        return block

    def _preempt(self) -> Seq:
        if not self.running:
            raise UsageError("generation: the KV budget cannot hold one prompt (EngineConfig.kv_tokens; serve --kv-tokens)")
        victim = max(self.running, key=lambda s: s.order)
        if len(self.running) == 1 and not victim.ids:
            raise UsageError("generation: the KV budget cannot hold one sequence (EngineConfig.kv_tokens; serve --kv-tokens)")
        self._free(victim)
        victim.length = 0
        self.waiting.appendleft(Prefill(victim.prompt_tokens + victim.ids, [victim]))
        self.stats["preemptions"] += 1
        return victim

    def _free(self, s: Seq) -> None:
        for b in s.blocks:
            self.pool.release(b)
        s.blocks = []
        self.running.remove(s)

    def _forward(self, tokens, positions, write, table, mask, last) -> torch.Tensor:
        """Last-position logits (B, vocab) of one forward over the pool; the head runs on those rows only."""
        dev, model = self.device, self.model
        self._threads(tokens.numel())
        write, table = write.to(dev), table.to(dev)
        caches = [PagedCache(self.pool, i, write, table) for i in range(model.cfg.n_layers)]
        h = model.hidden(tokens.to(dev), caches=caches, mask=mask.to(dev), positions=positions.to(dev))
        h = h[torch.arange(h.shape[0], device=dev), last.to(dev)]
        return model.head(h)[:, : self.engine.vocab].float().cpu()

    def _threads(self, tokens: int) -> None:
        """One CPU thread for a small forward (see model/generate.cpu_threads_for's measurement)."""
        want = self.engine.threads_for(tokens)
        if want != self.threads:
            torch.set_num_threads(want)
            self.threads = want

    def _sample(self, seqs: list[Seq], logits: torch.Tensor, updates: list[Update]) -> None:
        for s in seqs:
            s.draws += 1
        temperature = torch.tensor([s.params.temperature for s in seqs], dtype=torch.float32)
        top_k = torch.tensor([s.params.top_k for s in seqs])
        top_p = torch.tensor([s.params.top_p for s in seqs], dtype=torch.float32)
        uniform = splitmix_uniform(np.array([s.seed for s in seqs], dtype=np.uint64),
                                   np.array([s.draws for s in seqs], dtype=np.uint64))
        ids, logp, policy = sample_rows(logits, temperature, top_k, top_p, uniform)
        for s, t, lp, pol in zip(seqs, ids.tolist(), logp.tolist(), policy.tolist()):
            self._accept(s, t, lp, pol, updates)
        self.stats["peak_rows"] = max(self.stats["peak_rows"], len(self.running))

    def _accept(self, s: Seq, t: int, lp: float, pol: float, updates: list[Update]) -> None:
        engine = self.engine
        s.policy.append(pol)
        if t in engine.stop_ids:
            s.finish, s.stop_id = "eos", t
        else:
            s.ids.append(t)
            s.logprobs.append(lp)
            if s.params.stop:
                text = engine.decode(s.ids)
                cut = min((text.find(x) for x in s.params.stop if x in text), default=-1)
                if cut >= 0:
                    s.finish, s.text = "stop", text[:cut]
            if s.finish is None and len(s.ids) >= s.params.max_new_tokens:
                s.finish = "length"
        done = None
        if s.finish is not None:
            self._free(s)
            text = s.text if s.text is not None else engine.decode(s.ids)
            done = Generation(list(s.request.prompt_ids), s.ids, text, s.logprobs, s.finish, s.stop_id, s.policy)
        updates.append(Update(s.request.id, s.index, [] if s.finish == "eos" else [t], done))
