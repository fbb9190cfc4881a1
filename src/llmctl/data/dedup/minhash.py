"""MinHash signatures and LSH band keys, vectorized with numpy (spec 001-data-eval §A5).

Everything works on a batch of documents at once, from normalize.normalized_codes (the normalized
texts as one array of code points, 0 between words), with no Python loop over words or shingles:

- a word's hash is the polynomial sum_k c_k P^k (mod 2^64) of its code points, mixed. One
  cumulative sum over the batch gives every word's sum; multiplying by the inverse of P^start
  makes a word's hash independent of where it stands, so a document's hashes do not depend on
  the batch it is read in;
- a shingle (word n-gram, default 5) hashes as a mixed sum of its words' hashes, each times a
  constant of its position (so "a b" != "b a"); windows that would cross into the next document
  are dropped, and a document shorter than n words is one shingle of all its words;
- the K = bands x rows hash functions are h_i(x) = a_i * x + b_i (mod 2^64) with odd a_i from a
  fixed seed; a document's signature is the minimum of each h_i over its shingles
  (np.minimum.reduceat). P(min equal) = J, so two documents share one band's key with
  probability J^rows, and are flagged with P(flag | J) = 1 - (1 - J^rows)^bands.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MASK = np.uint64(0xFFFFFFFFFFFFFFFF)
_GOLD = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / golden ratio, the usual multiplicative mixer
_P = 0x100000001B3  # the FNV prime; odd, so it has an inverse mod 2^64


def s_curve(j, bands: int, rows: int):
    """P(a pair at Jaccard j is flagged) = 1 - (1 - j^rows)^bands."""
    return 1.0 - (1.0 - np.asarray(j, dtype=float) ** rows) ** bands


def threshold(bands: int, rows: int) -> float:
    """The J where the S-curve is steepest, approximately (1/bands)^(1/rows)."""
    return (1.0 / bands) ** (1.0 / rows)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: spreads every input bit over the output (uint64 in, uint64 out)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class _Powers:
    """P^k and P^-k (mod 2^64) for k < n, kept for the next batch unless n is huge (one very
    long document must not pin hundreds of MB for the rest of the run)."""

    KEEP = 1 << 22

    def __init__(self):
        self.up = self.down = np.ones(1, dtype=np.uint64)

    def __call__(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        if len(self.up) >= n:
            return self.up, self.down
        n = max(n, min(2 * len(self.up), self.KEEP))
        up, down = np.ones(n, dtype=np.uint64), np.ones(n, dtype=np.uint64)
        np.cumprod(np.full(n - 1, _P, dtype=np.uint64), out=up[1:])  # wraps mod 2^64
        np.cumprod(np.full(n - 1, pow(_P, -1, 1 << 64), dtype=np.uint64), out=down[1:])
        if n <= self.KEEP:
            self.up, self.down = up, down
        return up, down


_powers = _Powers()


def _segment_hashes(values: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """sum_k values[s + k] * P^k (mod 2^64) over each segment [s, e) of consecutive bounds."""
    up, down = _powers(len(values) + 1)
    acc = np.zeros(len(values) + 1, dtype=np.uint64)
    np.cumsum(values * up[: len(values)], out=acc[1:])
    return (acc[bounds[1:]] - acc[bounds[:-1]]) * down[bounds[:-1]]


@dataclass
class Words:
    """The hashed words of a batch of documents: document i's are hashes[starts[i]:starts[i + 1]]."""

    hashes: np.ndarray  # uint64
    starts: np.ndarray  # int64, documents + 1

    @classmethod
    def of(cls, codes: np.ndarray, doc_starts: np.ndarray) -> Words:
        """From normalize.normalized_codes(texts)."""
        in_word = codes != 0
        first = np.flatnonzero(in_word[1:] & ~in_word[:-1]) + 1  # every document ends with a 0
        if len(codes) and in_word[0]:
            first = np.concatenate(([0], first))
        # a word's segment runs to the next word's first character: the 0s between add nothing
        hashes = _mix(_segment_hashes(codes, np.append(first, len(codes))))
        return cls(hashes, np.searchsorted(first, doc_starts))

    def counts(self) -> np.ndarray:
        return np.diff(self.starts)

    def text_keys(self) -> np.ndarray:
        """One 64-bit hash per document of its whole word sequence: equal normalized texts, equal keys."""
        return _mix(_segment_hashes(self.hashes, self.starts) + self.counts().astype(np.uint64) * _GOLD)


class Shingler:
    def __init__(self, ngram: int = 5):
        self.ngram = ngram
        # one odd constant per position in the n-gram
        self.weights = _mix(np.arange(1, ngram + 1, dtype=np.uint64) * _GOLD) | np.uint64(1)

    def shingles(self, words: Words) -> tuple[np.ndarray, np.ndarray]:
        """(hashes, offsets): document i's shingle hashes are hashes[offsets[i]:offsets[i + 1]]."""
        w, n, counts = words.hashes, self.ngram, words.counts()
        h = w * self.weights[0]
        for k in range(1, n):  # the window starting at each word, running on past its document
            h[: max(len(w) - k, 0)] += w[k:] * self.weights[k]
        short = np.flatnonzero((counts > 0) & (counts < n))
        if len(short):  # one shingle of all its words, in place of its first window
            h[words.starts[short]] = self._short(w, words.starts[short], counts[short])
        # keep the windows that start at most n - 1 words before their document's end
        last = np.where(counts >= n, words.starts[1:] - n, words.starts[:-1])
        keep = np.arange(len(w)) <= np.repeat(last, counts)
        per_doc = np.where(counts >= n, counts - n + 1, np.minimum(counts, 1))
        return _mix(h[keep]), np.concatenate(([0], np.cumsum(per_doc)))

    def _short(self, w: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
        h = np.zeros(len(starts), dtype=np.uint64)
        for k in range(self.ngram - 1):
            has = counts > k
            h[has] += w[starts[has] + k] * self.weights[k]
        return h


class MinHasher:
    def __init__(self, bands: int = 14, rows: int = 8, seed: int = 1):
        self.bands, self.rows = bands, rows
        rng = np.random.default_rng(seed)
        k = bands * rows
        self.a = rng.integers(1, 2**63, size=k, dtype=np.uint64) * np.uint64(2) + np.uint64(1)  # odd
        self.b = rng.integers(0, 2**63, size=k, dtype=np.uint64)

    def signatures(self, shingles: np.ndarray, offsets: np.ndarray, block: int = 1 << 13) -> np.ndarray:
        """(n_docs, K) uint64 minima; document i's shingles are shingles[offsets[i]:offsets[i + 1]].
        Documents without shingles get all-max signatures."""
        n, k = len(offsets) - 1, len(self.a)
        sig = np.full((k, n), MASK, dtype=np.uint64)  # transposed: each block writes whole rows
        # blocks of whole documents with about `block` shingles: the (K, block) values stay in
        # cache (1<<13 measured ~3x faster than 1<<17), in one buffer reused for every block
        buf = np.empty((k, block), dtype=np.uint64)
        start = 0
        while start < n:
            end = max(int(np.searchsorted(offsets, offsets[start] + block, side="right")) - 1, start + 1)
            flat = shingles[offsets[start] : offsets[end]]
            if len(flat) > buf.shape[1]:  # one document longer than a block
                buf = np.empty((k, len(flat)), dtype=np.uint64)
            hashed = buf[:, : len(flat)]
            # multiply-add mod 2^64 (the shingles are already well mixed): the order of the results
            # is set by their high bits, where this family is close to min-wise
            np.multiply(flat[None, :], self.a[:, None], out=hashed)
            hashed += self.b[:, None]
            heads = offsets[start:end] - offsets[start]
            nonempty = offsets[start + 1 : end + 1] > offsets[start:end]
            if nonempty.all():
                sig[:, start:end] = np.minimum.reduceat(hashed, heads, axis=1)
            elif nonempty.any():  # reduceat would give an empty document its next one's value
                sig[:, start + np.flatnonzero(nonempty)] = np.minimum.reduceat(hashed, heads[nonempty], axis=1)
            start = end
        return sig.T

    def band_keys(self, sig: np.ndarray) -> np.ndarray:
        """(n_docs, bands) uint64: each band's rows folded into one key (band index mixed in, so
        equal rows in different bands never collide)."""
        n = sig.shape[0]
        view = sig.reshape(n, self.bands, self.rows)
        key = np.broadcast_to(np.arange(self.bands, dtype=np.uint64) + np.uint64(1), (n, self.bands)).copy()
        for r in range(self.rows):
            key = _mix(key * _GOLD + view[:, :, r])
        return key
