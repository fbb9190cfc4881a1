"""Mixtures of tokens artifacts: which source each global sequence slot draws from and which of
that source's windows it takes, as a pure function of (seed, slot), so a resumed run, each DDP
rank's slice and a single-source run keep the guarantees of train/loader.py.

Definitions (spec 001-data-eval §A6). A mixture is sources i with weights w_i (normalized to sum
1, kept as exact fractions: `0.6` is 3/5). Global slot g = step·batch_seqs + j is one training
sequence. A source's *epoch* is one pass over its windows of seq_len + 1 tokens in an order drawn
from (seed, epoch); its k-th draw takes window k mod W_i of epoch k // W_i: the WindowOrder of
train/loader.py, the single-source loader's (source 0's orders are that loader's, so a one-source
mixture gives the single-source run's batches byte for byte; the others' orders are spawned from
(seed, i)).

Which source a slot draws from: blocks. The slots are cut into blocks of M = m·batch_seqs slots
(m = 1 unless a weight is under 1/batch_seqs: then the smallest m with w_min·M ≥ 1). Block b gives
source i A_i((b+1)M) − A_i(bM) slots, where A(n) apportions n slots by largest remainder
(Hamilton: floor(w_i·n), then one more to the largest fractional parts, ties to the earlier
source). Because the rounding is applied to cumulative totals, every source's count after any
block is within one of w_i·n, and the draws of source i before block b are known by arithmetic;
w_i·M ≥ 1 makes A non-decreasing, so no block's count is negative. Inside a block the slots are
shuffled by a seeded permutation (one generator per chunk of blocks, spawned from (seed, chunk)),
so each rank's slice holds every source. With M = batch_seqs each global batch holds each
source's share to the sequence.

Caps (max_epochs) and renormalization. Source i may draw at most cap_i = floor(max_epochs·W_i)
windows. The schedule is a list of phases computed before step 1: a phase keeps its active set
and weights until the first block in which a capped source reaches its cap (found by binary
search on A, O(log) apportionments). In that block the sources reaching their caps take exactly
what is left to them and the slots they leave go to the remaining sources by their weights
(largest remainder again); the next phase starts at the next block with the exhausted sources
dropped and the others' weights renormalized. So the assignment at slot g depends only on g and
the configuration, never on what ran before it, and the draws of each source up to any block are
arithmetic: O(phases) to find the phase, O(K) for the counts. When every source is capped the
mixture holds a finite number of slots and the run's token budget is cut to it (train/pretrain.py).

Upsampling (FineWeb-Edu / Zyda / DCLM / FineWeb2 style: "copy count is itself a quality
signal"). A source may repeat documents by a docs column kept with its tokens (`tokenize
--keep-column`): `upsample = {column = "dup_cluster_size", buckets = [[1, 1], [2, 2], [5, 3]]}`
means a document whose value is >= a bucket's threshold (the last such bucket) appears that many
times per epoch; values below the first threshold and nulls appear once, a repeat of 0 drops
the document. The source's epoch is then the stream of pass 0 (every document with repeat >= 1,
in order), pass 1 (those with repeat >= 2), …, cut into windows like any other stream: a
document's copies land in different windows, at places the epoch's shuffle scatters.

Cost: a chunk of blocks (>= 4096 slots) is computed at once with numpy (apportionment, shuffle,
draw indices, window ids) and cached; a step only slices it and copies its windows, the same
copies a single-source step makes (benchmarks/mixture.py measures both).
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from llmctl.artifacts.tokens import TokenDataset
from llmctl.errors import UsageError
from llmctl.train.loader import SequenceBatches, WindowOrder

MIX_TAG = 0x6D6978  # "mix": spawn key of the block shuffles (window orders use (seed, epoch) and (i,))
CHUNK_SLOTS = 4096  # slots computed at once and cached
MAX_REPEAT = 100  # most copies of a document per epoch (FineWeb2 caps its cluster-size weights at 10)
NAME = re.compile(r"^[A-Za-z0-9_-]+$")


# ---------------------------------------------------------------------------------------------
# what the user gives


@dataclass(frozen=True)
class Upsample:
    """Repeat counts per document by a kept docs column: ascending (threshold, repeats) buckets."""

    column: str
    buckets: tuple[tuple[float, int], ...]

    @classmethod
    def parse(cls, spec, where: str) -> Upsample:
        if not isinstance(spec, dict) or set(spec) != {"column", "buckets"}:
            raise UsageError(f"{where}: upsample must be a table {{column = \"NAME\", buckets = [[THRESHOLD, REPEATS], …]}}")
        column, buckets = spec["column"], spec["buckets"]
        if not isinstance(column, str) or not column:
            raise UsageError(f"{where}: upsample.column must be a column name")
        if not isinstance(buckets, list) or not buckets:
            raise UsageError(f"{where}: upsample.buckets must be a non-empty list of [threshold, repeats] pairs")
        out = []
        for b in buckets:
            if (not isinstance(b, list) or len(b) != 2 or isinstance(b[0], bool) or not isinstance(b[0], (int, float))
                    or isinstance(b[1], bool) or not isinstance(b[1], int)):
                raise UsageError(f"{where}: upsample bucket {b!r} must be [threshold, whole number of repeats]")
            if not 0 <= b[1] <= MAX_REPEAT:
                raise UsageError(f"{where}: upsample repeats must be between 0 and {MAX_REPEAT}, got {b[1]}")
            if out and b[0] <= out[-1][0]:
                raise UsageError(f"{where}: upsample thresholds must increase ({out[-1][0]} then {b[0]})")
            out.append((float(b[0]), int(b[1])))
        return cls(column, tuple(out))

    def repeats(self, values: np.ndarray, where: str) -> np.ndarray:
        """Copies of each document per epoch (nulls and values under the first threshold: 1)."""
        try:
            v = np.array([np.nan if x is None else x for x in values], dtype=np.float64) if values.dtype == object \
                else values.astype(np.float64)
        except (TypeError, ValueError):
            raise UsageError(f"{where}: upsample column {self.column!r} holds non-numbers") from None
        reps = np.ones(len(v), dtype=np.int64)
        for threshold, n in self.buckets:
            reps[v >= threshold] = n  # NaN compares False: a null keeps 1
        return reps

    def to_dict(self) -> dict:
        return {"column": self.column, "buckets": [[t, n] for t, n in self.buckets]}


@dataclass(frozen=True)
class DataSource:
    """One source of a mixture: a tokens artifact, its sampling weight, an optional cap in epochs,
    optional upsampling, and an optional held-out tokens artifact of its own."""

    name: str
    path: Path
    weight: float = 1.0
    max_epochs: float | None = None
    upsample: Upsample | None = None
    val: Path | None = None


def parse_data_flag(text: str) -> DataSource:
    """`--data NAME=TOKENS:WEIGHT`."""
    name, eq, rest = text.partition("=")
    path, colon, weight = rest.rpartition(":")
    if not eq or not colon or not path:
        raise UsageError(f"--data {text!r}: expected NAME=TOKENS:WEIGHT (e.g. web=out/tokens/web:0.6)")
    try:
        w = float(weight)
    except ValueError:
        raise UsageError(f"--data {text!r}: the weight {weight!r} is not a number") from None
    return _source(name, path, w, None, None, None, f"--data {text!r}")


def sources_from_tables(tables, where: str, base: Path) -> list[DataSource]:
    """The `[[data]]` array of tables of a train TOML (paths relative to the file)."""
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise UsageError(f"{where}: data must be an array of tables ([[data]])")
    known = {"name", "path", "weight", "max_epochs", "upsample", "val"}
    out = []
    for i, t in enumerate(tables):
        w = f"{where}: [[data]] {i + 1}"
        if unknown := sorted(set(t) - known):
            raise UsageError(f"{w}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        for key in ("name", "path"):
            if not isinstance(t.get(key), str):
                raise UsageError(f"{w}: {key} (a string) is required")
        rel = lambda p: p if p is None or Path(p).is_absolute() else str((base / p).resolve())  # noqa: E731
        if "val" in t and not isinstance(t["val"], str):
            raise UsageError(f"{w}: val must be a path")
        for key in ("weight", "max_epochs"):
            if key in t and (isinstance(t[key], bool) or not isinstance(t[key], (int, float))):
                raise UsageError(f"{w}: {key} must be a number, got {t[key]!r}")
        up = Upsample.parse(t["upsample"], w) if "upsample" in t else None
        out.append(_source(t["name"], rel(t["path"]), float(t.get("weight", 1.0)), t.get("max_epochs"), up, rel(t.get("val")), w))
    return out


def _source(name, path, weight, max_epochs, upsample, val, where) -> DataSource:
    from llmctl.bounds import check_value

    if not NAME.match(name):
        raise UsageError(f"{where}: source name {name!r} must be letters, digits, '_' or '-'")
    check_value("DataSource", "weight", weight, f"{where}: weight")
    check_value("DataSource", "max_epochs", max_epochs, f"{where}: max_epochs")
    return DataSource(name, Path(path), weight, float(max_epochs) if max_epochs is not None else None, upsample,
                      Path(val) if val else None)


def check_sources(sources: Sequence[DataSource]) -> None:
    names = [s.name for s in sources]
    if not sources:
        raise UsageError("train: a mixture needs at least one source")
    if dup := sorted({n for n in names if names.count(n) > 1}):
        raise UsageError(f"--data: source name {dup[0]!r} given twice")


# ---------------------------------------------------------------------------------------------
# one source's windows


class SourceWindows:
    """The windows of one source (its upsampled stream, when upsampled) and their epoch orders
    (WindowOrder stream `index`)."""

    def __init__(self, dataset: TokenDataset, seq_len: int, seed: int, index: int, name: str = "",
                 upsample: Upsample | None = None):
        self.dataset, self.seq_len, self.seed, self.index, self.name = dataset, seq_len, seed, index, name
        self.n_tokens = dataset.n_tokens
        self.repeats: np.ndarray | None = None
        if upsample is None:
            self.stream_tokens = dataset.n_tokens
        else:
            self.repeats = upsample.repeats(dataset.doc_column(upsample.column), f"{dataset.path}")
            self._build_runs(dataset.doc_starts(), self.repeats)
        self.n_windows = (self.stream_tokens - 1) // seq_len
        if self.n_windows < 1:
            raise UsageError(f"{dataset.path}: {self.stream_tokens} tokens cannot fill one window of {seq_len + 1}")
        self.order = WindowOrder(self.n_windows, seed, stream=index, cached=4)

    @property
    def upsampling(self) -> float:
        """Tokens of one epoch ÷ the source's own tokens (1 without upsampling)."""
        return self.stream_tokens / self.n_tokens

    def _build_runs(self, starts: np.ndarray, reps: np.ndarray) -> None:
        """The upsampled stream as runs of consecutive documents: pass p holds every document
        with more than p copies, in order; `_v` is each run's offset in the stream."""
        first, end = [], []
        for p in range(int(reps.max(initial=0))):
            edges = np.diff(np.concatenate(([0], (reps > p).astype(np.int8), [0])))
            lo, hi = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
            first.append(starts[lo])
            end.append(starts[hi])
        self._o = np.concatenate(first) if first else np.zeros(0, np.int64)  # original offset of each run
        lengths = (np.concatenate(end) - self._o) if end else np.zeros(0, np.int64)
        self._len = lengths
        self._v = np.concatenate(([0], np.cumsum(lengths)))[:-1]
        self.stream_tokens = int(lengths.sum())

    def window_ids(self, draws: np.ndarray) -> np.ndarray:
        """Window of each draw index k (ascending), in this source's WindowOrder."""
        return self.order.window_ids(draws)

    def fill(self, w: int, out: np.ndarray) -> None:
        """Write window w's seq_len + 1 tokens into `out`."""
        n = self.seq_len + 1
        if self.repeats is None:
            self.dataset.window(w * self.seq_len, n, out)
            return
        offset, got = w * self.seq_len, 0
        r = int(np.searchsorted(self._v, offset, side="right")) - 1
        while got < n:
            local = offset + got - int(self._v[r])
            take = min(n - got, int(self._len[r]) - local)
            self.dataset.window(int(self._o[r]) + local, take, out[got:got + take])
            got += take
            r += 1


# ---------------------------------------------------------------------------------------------
# the arithmetic: which source, how many draws before


def exact_weights(weights: Sequence[float]) -> tuple[list[int], int]:
    """Integer numerators over a common denominator: `0.6, 0.3, 0.1` is 6, 3, 1 over 10."""
    fr = [Fraction(repr(float(w))).limit_denominator(10**9) for w in weights]
    total = sum(fr)
    norm = [f / total for f in fr]
    den = math.lcm(*(f.denominator for f in norm))
    return [int(f * den) for f in norm], den


def apportion(num: Sequence[int], den: int, n: int) -> list[int]:
    """Largest remainder (Hamilton) apportionment of n slots by weights num/den (ties: lower index)."""
    q = [x * n for x in num]
    a = [v // den for v in q]
    left = n - sum(a)
    for i in sorted(range(len(num)), key=lambda i: (-(q[i] % den), i))[:left]:
        a[i] += 1
    return a


def apportion_many(num: Sequence[int], den: int, ns: np.ndarray) -> np.ndarray:
    """`apportion` of each n in `ns` at once: an (len(ns), K) int64 array."""
    k = len(num)
    big = den * int(ns.max(initial=0) + 1) >= 1 << 62
    nums = np.array(num, dtype=object if big else np.int64)
    q = ns.astype(object if big else np.int64)[:, None] * nums[None, :]
    a, rem = q // den, q % den
    left = ns.astype(np.int64) - a.sum(1).astype(np.int64)
    if big:  # exact ordering of huge remainders: per row in Python
        order = np.array([sorted(range(k), key=lambda i: (-row[i], i)) for row in rem], dtype=np.int64).reshape(len(ns), k)
    else:
        order = np.argsort(-rem, axis=1, kind="stable")
    ranks = np.empty_like(order)
    np.put_along_axis(ranks, order, np.broadcast_to(np.arange(k), order.shape), axis=1)
    return a.astype(np.int64) + (ranks < left[:, None])


@dataclass
class Phase:
    start: int  # first block
    end: int | None  # block after the last (None: the last phase, unbounded)
    num: list[int]  # weight numerators (0: source inactive)
    den: int
    used: list[int]  # draws of each source before `start`
    last: list[int] | None  # the final block's counts (sources reaching their caps in it)
    exhausted: list[int]  # sources whose cap is reached in the final block


class MixturePlan:
    """Per block: each source's draws before it and in it (module docstring: blocks, phases)."""

    def __init__(self, weights: Sequence[float], caps: Sequence[int | None], block: int):
        self.num, self.den = exact_weights(weights)
        self.caps, self.block, self.k = list(caps), block, len(caps)
        self.phases: list[Phase] = []
        self.total_slots: int | None = None  # slots the mixture holds (None: unbounded)
        self._build()
        self._starts = [p.start for p in self.phases]

    def _build(self) -> None:
        k, M = self.k, self.block
        used, active, start = [0] * k, list(range(k)), 0
        while active:
            num = [self.num[i] if i in active else 0 for i in range(k)]
            den = sum(num)
            capped = [i for i in active if self.caps[i] is not None]
            if not capped:
                self.phases.append(Phase(start, None, num, den, used, None, []))
                return
            A = lambda b: apportion(num, den, b * M)  # noqa: E731
            ends = {}
            for i in capped:
                need = self.caps[i] - used[i]
                lo, hi = 1, -(-need * den // (num[i] * M))  # at hi, floor(w_i·hi·M) >= need
                while lo < hi:
                    mid = (lo + hi) // 2
                    lo, hi = (lo, mid) if A(mid)[i] >= need else (mid + 1, hi)
                ends[i] = lo
            b = min(ends.values())
            before = A(b - 1)
            normal = [x - y for x, y in zip(A(b), before)]
            last, done = self._final_block(num, normal, before, used, active)
            self.phases.append(Phase(start, start + b, num, den, list(used), last, sorted(done)))
            used = [u + x + y for u, x, y in zip(used, before, last)]
            active = [i for i in active if i not in done]
            start += b
            if sum(last) < M:  # nobody left to take the block's slots: the mixture ends inside it
                self.total_slots = (start - 1) * M + sum(last)
                return
        self.total_slots = start * M

    def _final_block(self, num, normal, before, used, active) -> tuple[list[int], set[int]]:
        """Counts of a phase's last block: sources reaching their caps take what is left to them,
        the slots they leave go to the others by weight; repeated while that pushes one past its cap."""
        done: set[int] = set()
        while True:
            c = list(normal)
            for i in done:
                c[i] = self.caps[i] - used[i] - before[i]
            rest = [i for i in active if i not in done]
            spare = self.block - sum(c)
            if rest and spare:
                extra = apportion([num[i] if i in rest else 0 for i in range(self.k)], sum(num[i] for i in rest), spare)
                c = [x + y for x, y in zip(c, extra)]
            over = {i for i in rest if self.caps[i] is not None and used[i] + before[i] + c[i] >= self.caps[i]}
            if not over:
                return c, done
            done |= over
            if all(used[i] + before[i] + c[i] == self.caps[i] for i in over):
                return c, done  # they end exactly at their caps
            # else recompute with the new ones clipped to what is left to them

    def blocks(self, b0: int, b1: int) -> tuple[np.ndarray, np.ndarray]:
        """(draws before block b, draws in block b) for b in [b0, b1), each (b1 - b0, K)."""
        before = np.zeros((b1 - b0, self.k), dtype=np.int64)
        counts = np.zeros((b1 - b0, self.k), dtype=np.int64)
        b = b0
        while b < b1:
            p = self.phases[bisect_right(self._starts, b) - 1]
            if p.end is not None and b >= p.end:
                raise IndexError(f"block {b} is past the end of the mixture")
            stop = b1 if p.end is None else min(b1, p.end)
            normal_stop = stop if p.end is None or stop < p.end else p.end - 1
            if b < normal_stop:
                rel = np.arange(b - p.start, normal_stop - p.start + 1, dtype=np.int64)
                a = apportion_many(p.num, p.den, rel * self.block)
                before[b - b0 : normal_stop - b0] = np.array(p.used)[None, :] + a[:-1]
                counts[b - b0 : normal_stop - b0] = np.diff(a, axis=0)
            if normal_stop < stop:  # the phase's final block
                rel = p.end - 1 - p.start
                before[normal_stop - b0] = np.array(p.used) + np.array(apportion(p.num, p.den, rel * self.block))
                counts[normal_stop - b0] = p.last
            b = stop
        if (counts < 0).any():
            raise RuntimeError("mixture: a block with a negative count (block too small for the weights)")
        return before, counts


def block_size(num: Sequence[int], den: int, batch_seqs: int) -> int:
    """Whole batches, enough that the smallest weight gets >= 1 slot per block (w_min·M >= 1)."""
    m = max(1, -(-den // (min(x for x in num if x) * batch_seqs)))
    return m * batch_seqs


# ---------------------------------------------------------------------------------------------
# the batches


class MixedBatches(SequenceBatches):
    """Global slot → (source, window) and the token rows: the loader of a mixture, a
    SequenceBatches of train/loader.py like the single-source PackedBatches."""

    def __init__(self, sources: Sequence[SourceWindows], weights: Sequence[float], caps: Sequence[int | None],
                 batch_seqs: int, seed: int):
        self.sources, self.seed, self.k = list(sources), seed, len(sources)
        if self.k > np.iinfo(np.int16).max:
            raise UsageError(f"train: {self.k} sources; at most {np.iinfo(np.int16).max}")
        self.seq_len = self.sources[0].seq_len
        num, den = exact_weights(weights)
        self.block = block_size(num, den, batch_seqs)
        self.plan = MixturePlan(weights, caps, self.block)
        self.chunk_blocks = max(1, CHUNK_SLOTS // self.block)
        self.chunk_slots = self.chunk_blocks * self.block
        self._chunk = lru_cache(maxsize=2)(self._compute_chunk)
        self._fill = [x.fill for x in self.sources]

    @property
    def total_slots(self) -> int | None:
        return self.plan.total_slots

    def _compute_chunk(self, c: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(source of each slot, window of each slot, draws of each source before the chunk)."""
        first = c * self.chunk_slots
        end = first + self.chunk_slots if self.total_slots is None else min(first + self.chunk_slots, self.total_slots)
        if end <= first:
            raise IndexError(f"slot {first} is past the end of the mixture ({self.total_slots} slots)")
        if self.k == 1:  # one source: every slot is its next draw
            src = np.zeros(end - first, dtype=np.int16)
            k = np.arange(first, end, dtype=np.int64)
            return src, self.sources[0].window_ids(k), np.array([first], dtype=np.int64)
        b0 = c * self.chunk_blocks
        b1 = -(-end // self.block)
        before, counts = self.plan.blocks(b0, b1)
        M = self.block
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, c], spawn_key=(MIX_TAG,)))
        perms = rng.permuted(np.broadcast_to(np.arange(M), (self.chunk_blocks, M)), axis=1)[: b1 - b0]
        size = int(counts[-1].sum())  # M, except where the mixture ends inside its last block
        # each block's sources in order (counts[b, i] slots of source i), then that block's permutation
        ordered = np.repeat(np.tile(np.arange(self.k, dtype=np.int16), len(counts)), counts.ravel())  # int16: radix argsort
        full = ordered[: (len(counts) - 1) * M].reshape(-1, M) if size < M else ordered.reshape(-1, M)
        src = np.take_along_axis(full, perms[: len(full)], axis=1).ravel()
        if size < M:  # the last block's own permutation, restricted to its slots
            src = np.concatenate([src, ordered[len(full) * M:][perms[-1][perms[-1] < size]]])
        # slot order within each source: its draws before the chunk + 0, 1, 2, …
        by_source = np.argsort(src, kind="stable")
        n_of = np.bincount(src, minlength=self.k)
        wid = np.empty(len(src), dtype=np.int64)
        lo = 0
        for i, n in enumerate(n_of.tolist()):
            if n:
                wid[by_source[lo:lo + n]] = self.sources[i].window_ids(before[0, i] + np.arange(n, dtype=np.int64))
            lo += n
        return src, wid, before[0]

    def slots(self, first: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """(source, window) of global slots first .. first+count-1."""
        srcs, wids = [], []
        g, end = first, first + count
        while g < end:
            c = g // self.chunk_slots
            src, wid, _ = self._chunk(c)
            lo = g - c * self.chunk_slots
            hi = min(end - c * self.chunk_slots, len(src))
            if hi <= lo:
                raise IndexError(f"slot {g} is past the end of the mixture ({self.total_slots} slots)")
            srcs.append(src[lo:hi])
            wids.append(wid[lo:hi])
            g += hi - lo
        return (srcs[0], wids[0]) if len(srcs) == 1 else (np.concatenate(srcs), np.concatenate(wids))

    def drawn(self, n: int) -> np.ndarray:
        """Draws of each source among the first n slots."""
        if n == 0:
            return np.zeros(self.k, dtype=np.int64)
        c = (n - 1) // self.chunk_slots
        src, _, before = self._chunk(c)
        return before + np.bincount(src[: n - c * self.chunk_slots], minlength=self.k)

    def last_draw(self, i: int, draws: int) -> int:
        """The slot of source i's draw number `draws` (1-based): where its cap is reached."""
        b = next(p.end - 1 for p in self.plan.phases if i in p.exhausted)
        first = b * self.block
        src, _ = self.slots(first, min(self.block, (self.total_slots or math.inf) - first))
        before, _ = self.plan.blocks(b, b + 1)
        return first + int(np.flatnonzero(src == i)[draws - 1 - int(before[0, i])])

    def sequences(self, first: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of `count` sequences starting at global slot `first`."""
        src, wid = self.slots(first, count)
        rows = np.empty((count, self.seq_len + 1), dtype=np.int64)
        fill = self._fill
        for j, (s, w) in enumerate(zip(src.tolist(), wid.tolist())):
            fill[s](w, rows[j])
        rows = torch.from_numpy(rows)
        return rows[:, :-1], rows[:, 1:]
