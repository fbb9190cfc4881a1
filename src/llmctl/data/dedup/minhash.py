"""MinHash signatures and LSH band keys, vectorized with numpy (spec 001-data-eval §A5).

Shingles are word n-grams (default 5) of the normalized words (normalize.normalized_words). Each distinct word is hashed once
(blake2b, 64 bits; cached per process); an n-gram's hash mixes its words' hashes, so a document
costs one numpy pass instead of a Python loop over shingles. The K = bands x rows hash functions
are h_i(x) = a_i * x + b_i (mod 2^64) with odd a_i from a fixed seed; a document's signature is
the minimum of each h_i over its shingles, computed for a whole batch of documents at once
(np.minimum.reduceat). P(min equal) = J, so two documents share one band's key with
probability J^rows, and are flagged with P(flag | J) = 1 - (1 - J^rows)^bands.
"""

from __future__ import annotations

import hashlib

import numpy as np

MASK = np.uint64(0xFFFFFFFFFFFFFFFF)
_GOLD = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / golden ratio, the usual multiplicative mixer


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


class Shingler:
    def __init__(self, ngram: int = 5):
        self.ngram = ngram
        self._words: dict[str, int] = {}

    def word_hashes(self, words: list[str]) -> np.ndarray:
        cache = self._words
        out = np.empty(len(words), dtype=np.uint64)
        for i, w in enumerate(words):
            h = cache.get(w)
            if h is None:
                h = cache[w] = int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "little")
            out[i] = h
        if len(cache) > 5_000_000:  # bound memory on huge vocabularies
            cache.clear()
        return out

    def shingles(self, words: list[str]) -> np.ndarray:
        """Distinct 64-bit hashes of the word n-grams; a text shorter than n words is one shingle."""
        if not words:
            return np.empty(0, dtype=np.uint64)
        w = self.word_hashes(words)
        n = min(self.ngram, len(w))
        with np.errstate(over="ignore"):
            h = np.zeros(len(w) - n + 1, dtype=np.uint64)
            for k in range(n):  # position-dependent combination, so "a b" != "b a"
                h = _mix(h * _GOLD + w[k : len(w) - n + 1 + k])
        return np.unique(h)


class MinHasher:
    def __init__(self, bands: int = 14, rows: int = 8, seed: int = 1):
        self.bands, self.rows = bands, rows
        rng = np.random.default_rng(seed)
        k = bands * rows
        self.a = rng.integers(1, 2**63, size=k, dtype=np.uint64) * np.uint64(2) + np.uint64(1)  # odd
        self.b = rng.integers(0, 2**63, size=k, dtype=np.uint64)

    def signatures(self, shingle_sets: list[np.ndarray], block: int = 1 << 13) -> np.ndarray:
        """(n_docs, K) uint64 minima. Documents without shingles get all-max signatures."""
        k = len(self.a)
        sig = np.full((len(shingle_sets), k), MASK, dtype=np.uint64)
        start = 0
        while start < len(shingle_sets):
            # a block of documents whose shingles fit in about `block` values: small enough that the
            # (K, block) temporaries stay in cache (1<<13 measured ~3x faster than 1<<17)
            end, total = start, 0
            while end < len(shingle_sets) and (total == 0 or total + len(shingle_sets[end]) <= block):
                total += len(shingle_sets[end])
                end += 1
            sets = shingle_sets[start:end]
            lengths = np.array([len(s) for s in sets])
            nonempty = lengths > 0
            if nonempty.any():
                flat = np.concatenate([s for s in sets if len(s)])
                with np.errstate(over="ignore"):
                    # multiply-add mod 2^64 (the shingles are already well mixed): the order of the
                    # results is set by their high bits, where this family is close to min-wise
                    hashed = flat[None, :] * self.a[:, None]
                    hashed += self.b[:, None]
                offsets = np.concatenate(([0], np.cumsum(lengths[nonempty])[:-1]))
                mins = np.minimum.reduceat(hashed, offsets, axis=1).T  # (docs, K)
                sig[start:end][nonempty] = mins
            start = end
        return sig

    def band_keys(self, sig: np.ndarray) -> np.ndarray:
        """(n_docs, bands) uint64: each band's rows folded into one key (band index mixed in, so
        equal rows in different bands never collide)."""
        n = sig.shape[0]
        view = sig.reshape(n, self.bands, self.rows)
        with np.errstate(over="ignore"):
            key = np.broadcast_to(np.arange(self.bands, dtype=np.uint64) + np.uint64(1), (n, self.bands)).copy()
            for r in range(self.rows):
                key = _mix(key * _GOLD + view[:, :, r])
        return key
