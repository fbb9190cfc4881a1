"""Packed training batches that are a pure function of (seed, step).

The token stream of a tokens artifact (documents joined by EOS, docs/design.md §2) is cut into
non-overlapping windows of seq_len + 1 tokens. Each epoch visits every window once in an order
drawn from (seed, epoch); global sequence number g = step·batch_seqs + j lives in epoch
g // n_windows at position g % n_windows. So the batch at any step — and any rank's slice of it —
is arithmetic, and resume needs no loader state beyond the step (spec 001-systems-ops §A3:
"data order must be a pure function of (seed, index)").
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from llmctl.artifacts.tokens import TokenDataset
from llmctl.errors import UsageError


class PackedBatches:
    def __init__(self, dataset: TokenDataset, seq_len: int, seed: int = 0):
        self.dataset, self.seq_len, self.seed = dataset, seq_len, seed
        self.n_windows = (dataset.n_tokens - 1) // seq_len
        if self.n_windows < 1:
            raise UsageError(
                f"{dataset.path}: {dataset.n_tokens} tokens cannot fill one window of {seq_len + 1}"
            )
        self._order = lru_cache(maxsize=2)(self._epoch_order)

    def _epoch_order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(self.n_windows)

    def window_ids(self, first: int, count: int) -> np.ndarray:
        """Window indices of global sequence numbers first .. first+count-1."""
        g = np.arange(first, first + count, dtype=np.int64)
        out = np.empty(count, dtype=np.int64)
        for epoch in np.unique(g // self.n_windows):
            sel = g // self.n_windows == epoch
            out[sel] = self._order(int(epoch))[g[sel] % self.n_windows]
        return out

    def sequences(self, first: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of `count` sequences starting at global sequence number `first`."""
        rows = np.stack([
            self.dataset.window(int(w) * self.seq_len, self.seq_len + 1)
            for w in self.window_ids(first, count)
        ])
        rows = torch.from_numpy(rows)
        return rows[:, :-1], rows[:, 1:]

    def micro_batches(self, step: int, batch_seqs: int, micro: int, rank: int = 0, world: int = 1):
        """This rank's micro-batches of step `step`: the global batch is split by rank, then by micro."""
        per_rank = batch_seqs // world
        first = step * batch_seqs + rank * per_rank
        for i in range(0, per_rank, micro):
            yield self.sequences(first + i, min(micro, per_rank - i))


def eval_windows(dataset: TokenDataset, seq_len: int, max_windows: int | None = None):
    """Consecutive non-overlapping windows over a held-out artifact, in order (no shuffling)."""
    n = (dataset.n_tokens - 1) // seq_len
    if max_windows is not None:
        n = min(n, max_windows)
    for w in range(n):
        row = torch.from_numpy(dataset.window(w * seq_len, seq_len + 1))
        yield row[:-1], row[1:]
