"""Packed training batches that are a pure function of (seed, step).

The token stream of a tokens artifact (documents joined by EOS, docs/design.md §2) is cut into
non-overlapping windows of seq_len + 1 tokens. Each epoch visits every window once in an order
drawn from (seed, epoch); global sequence number g = step·batch_seqs + j lives in epoch
g // n_windows at position g % n_windows. So the batch at any step — and any rank's slice of it —
is arithmetic, and resume needs no loader state beyond the step (spec 001-systems-ops §A3:
"data order must be a pure function of (seed, index)").

WindowOrder is that order, the one implementation of it: PackedBatches (one tokens artifact),
each source of a mixture (train/mixture.py SourceWindows) and SFT's packed conversation rows
(train/sft.py PackedChats) draw their windows through it, and all three split a step into
micro-batches by SequenceBatches.micro_batches.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from functools import lru_cache

import numpy as np
import torch

from llmctl.artifacts.tokens import TokenDataset
from llmctl.errors import UsageError


class WindowOrder:
    """Epoch orders of n_windows windows: draw k (0, 1, 2, …) takes window k mod n_windows of
    epoch k // n_windows, each epoch a permutation drawn from (seed, epoch). `stream` i > 0 spawns
    its generators from (seed, epoch) by i (a mixture's source i), so streams draw independent
    orders while stream 0 keeps the single-source one; `cached` epochs' orders are kept."""

    def __init__(self, n_windows: int, seed: int, stream: int = 0, cached: int = 2):
        self.n_windows, self.seed, self.stream = n_windows, seed, stream
        self.epoch = lru_cache(maxsize=cached)(self._epoch)

    def _epoch(self, epoch: int) -> np.ndarray:
        ss = [self.seed, epoch] if self.stream == 0 else np.random.SeedSequence([self.seed, epoch], spawn_key=(self.stream,))
        return np.random.default_rng(ss).permutation(self.n_windows)

    def window_ids(self, draws: np.ndarray) -> np.ndarray:
        """Window of each draw index k (ascending): window k mod W of epoch k // W's order."""
        out = np.empty(len(draws), dtype=np.int64)
        if not len(draws):
            return out
        w = self.n_windows
        first, last = int(draws[0]) // w, int(draws[-1]) // w
        cuts = np.searchsorted(draws, np.arange(first + 1, last + 1) * w) if last > first else []
        for epoch, lo, hi in zip(range(first, last + 1), [0, *cuts], [*cuts, len(draws)]):
            out[lo:hi] = self.epoch(epoch)[draws[lo:hi] - epoch * w]
        return out

    def consecutive(self, first: int, count: int) -> np.ndarray:
        """Window indices of draws first .. first+count-1."""
        return self.window_ids(np.arange(first, first + count, dtype=np.int64))


class SequenceBatches(ABC):
    """A loader addressed by global sequence number: `sequences(first, count)` gives the rows of
    sequences first .. first+count-1, and a step's micro-batches follow from it."""

    @abstractmethod
    def sequences(self, first: int, count: int) -> tuple[torch.Tensor, ...]:
        """The rows (inputs, targets, …) of sequences first .. first+count-1."""

    def micro_batches(self, step: int, batch_seqs: int, micro: int, rank: int = 0, world: int = 1):
        """This rank's micro-batches of step `step`: the global batch is split by rank, then by micro."""
        per_rank = batch_seqs // world
        first = step * batch_seqs + rank * per_rank
        for i in range(0, per_rank, micro):
            yield self.sequences(first + i, min(micro, per_rank - i))


class PackedBatches(SequenceBatches):
    """The windows of one tokens artifact in WindowOrder (pretraining goes through the one-source
    mixture of train/mixture.py, which gives these batches byte for byte)."""

    def __init__(self, dataset: TokenDataset, seq_len: int, seed: int = 0):
        self.dataset, self.seq_len, self.seed = dataset, seq_len, seed
        self.n_windows = (dataset.n_tokens - 1) // seq_len
        if self.n_windows < 1:
            raise UsageError(
                f"{dataset.path}: {dataset.n_tokens} tokens cannot fill one window of {seq_len + 1}"
            )
        self.order = WindowOrder(self.n_windows, seed)

    def sequences(self, first: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of `count` sequences starting at global sequence number `first`."""
        rows = np.stack([
            self.dataset.window(int(w) * self.seq_len, self.seq_len + 1)
            for w in self.order.consecutive(first, count)
        ])
        rows = torch.from_numpy(rows)
        return rows[:, :-1], rows[:, 1:]


def eval_windows(dataset: TokenDataset, seq_len: int, max_windows: int | None = None):
    """Consecutive non-overlapping windows over a held-out artifact, in order (no shuffling)."""
    n = (dataset.n_tokens - 1) // seq_len
    if max_windows is not None:
        n = min(n, max_windows)
    for w in range(n):
        row = torch.from_numpy(dataset.window(w * seq_len, seq_len + 1))
        yield row[:-1], row[1:]
