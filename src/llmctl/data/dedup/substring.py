"""dedup --substring: cut every span of >= N units that already occurred earlier in the corpus.

Lee et al. 2022 ("Deduplicating Training Data Makes Language Models Better", ExactSubstr) find
every repeated span of >= 50 tokens with a suffix array over the whole corpus, built in parts and
merged when it does not fit in memory. Here the units (UTF-8 bytes, or tokens) of the documents
that survived document-level dedup are laid end to end in input order, and cut into shards that
fit `--memory`. The question asked of each unit position i is its longest previous factor
(LPF): the longest prefix of the suffix at i that also starts at an earlier position. LPF >= N
means the span [i, i + LPF) is a later copy; the union of those spans is what is cut, so the
first occurrence of every repeat is kept and every later one removed.

LPF over shard a followed by shard b, read at b's positions, sees every earlier position in a
and in b; the union over all a < b (shard 0 alone) therefore sees the whole corpus before each
position. That is S(S-1)/2 + 1 tasks for S shards, each holding two shards: memory bounded by
`--memory`, work quadratic in S (Lee et al.'s merge is one pass over all S part-arrays on disk;
this trades that for tasks that are independent, resumable and spread over the executor). The
suffix array and LPF are pydivsufsort's (libdivsufsort and its compiled LPF); what is written here
is the layout, the clipping and the interval arithmetic.

Every document ends in a separator (0xFF, which no UTF-8 text holds; for tokens a key no token
has), and a match is clipped at its own document's end: the earlier copy then ends at a
separator too, so no span crosses documents. In bytes a cut is shrunk to whole characters.
Tokens are the GPT-2 pre-tokenizer's pieces (a word with its leading space, a number, a run of
punctuation, a run of spaces): about 1.3 GPT-2 tokens each on English web text, and no
vocabulary to ship or download.
"""

from __future__ import annotations

import ctypes
from array import array
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import regex

from llmctl.hashing import h64

UNITS = ("tokens", "bytes")
SEP_BYTE = 0xFF
SEP_TOKEN = np.uint64(0)
# Peak resident bytes per unit of one pair task, measured with ru_maxrss on 40 MB of text
# (benchmarks/substring_scale.py's): ~23 for bytes (the units, the suffix array, LCP and LPF as
# int32); ~53 for tokens, whose 8-byte keys become dense ids sorted as multi-byte symbols, plus
# the copy a shard pair's concatenation makes.
COST_PER_UNIT = {"bytes": 24, "tokens": 64}
BLOCK = 1 << 22  # positions read back from the LPF array at a time
# GPT-2's pre-tokenizer pattern (openai/gpt-2 encoder.py); every character falls in one piece.
GPT2_PIECES = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


def utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")  # lone surrogates survive from some JSON inputs


# ---------------------------------------------------------------------------------------------
# units


def encode_bytes(texts: list[str]) -> dict[str, np.ndarray]:
    """units: every text's UTF-8 bytes, each followed by SEP_BYTE; starts: where each begins."""
    blobs = [utf8(t) for t in texts]
    lengths = np.array([len(b) + 1 for b in blobs], dtype=np.int64)
    units = np.frombuffer(b"".join(b + bytes([SEP_BYTE]) for b in blobs), dtype=np.uint8)
    return {"units": units, "starts": np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)}


def encode_tokens(texts: list[str]) -> dict[str, np.ndarray]:
    """units: a 64-bit key per piece of every text, each text followed by SEP_TOKEN; starts as in
    encode_bytes; byte_start / byte_end: each unit's bytes within its text (a separator's are empty)."""
    vocab: dict[str, int] = {}
    # typed arrays, not lists: 8 bytes a token instead of a Python int object each
    ids, byte_start, byte_end = array("q"), array("q"), array("q")
    lengths = []
    for text in texts:
        pos = 0
        pieces = GPT2_PIECES.findall(text)
        for p in pieces:
            n = len(utf8(p)) if not p.isascii() else len(p)
            ids.append(vocab.setdefault(p, len(vocab)))
            byte_start.append(pos)
            pos += n
            byte_end.append(pos)
        ids.append(-1)
        byte_start.append(pos)
        byte_end.append(pos)
        lengths.append(len(pieces) + 1)
    keys = np.array([h64(p) or 1 for p in vocab] + [int(SEP_TOKEN)], dtype=np.uint64)  # -1 -> the separator
    return {
        "units": keys[np.frombuffer(ids, dtype=np.int64)] if ids else np.zeros(0, np.uint64),
        "starts": np.concatenate(([0], np.cumsum(lengths, dtype=np.int64))).astype(np.int64),
        "byte_start": np.frombuffer(byte_start, dtype=np.int64).copy(),
        "byte_end": np.frombuffer(byte_end, dtype=np.int64).copy(),
    }


def encode(texts: list[str], unit: str) -> dict[str, np.ndarray]:
    return encode_bytes(texts) if unit == "bytes" else encode_tokens(texts)


# ---------------------------------------------------------------------------------------------
# shards and tasks


def plan_shards(doc_units: np.ndarray, cap: int) -> list[tuple[int, int]]:
    """Contiguous [first doc, end doc) ranges of at most `cap` units each (a document longer than
    cap is a shard of its own); cap = memory / (2 shards x cost per unit)."""
    shards, lo, total = [], 0, 0
    for d, n in enumerate(doc_units.tolist()):
        if total and total + n > cap:
            shards.append((lo, d))
            lo, total = d, 0
        total += n
    if lo < len(doc_units):
        shards.append((lo, len(doc_units)))
    return shards


def shard_pairs(n_shards: int) -> list[tuple[int, int]]:
    """(a, b): LPF over shard a then shard b, read at b's positions; (0, 0) is shard 0 alone."""
    return [(0, 0)] * (n_shards > 0) + [(a, b) for b in range(1, n_shards) for a in range(b)]


def shard_cap(memory: int, unit: str) -> int:
    return max(1, memory // (2 * COST_PER_UNIT[unit]))


# ---------------------------------------------------------------------------------------------
# repeats


def later_copies(units: np.ndarray, sep_mask: np.ndarray, region: int, min_len: int) -> np.ndarray:
    """[start, end) ranges (merged, positions in `units`) of every span of >= min_len units at a
    position >= region that also starts at an earlier position. sep_mask marks the separators."""
    if region >= len(units):
        return np.zeros((0, 2), np.int64)
    lpf = _lpf(units)
    seps = np.flatnonzero(sep_mask)
    found = []
    # in blocks: five int64 arrays the length of the whole shard pair would cost more than the sort
    for lo in range(region, len(units), BLOCK):
        pos = np.arange(lo, min(lo + BLOCK, len(units)), dtype=np.int64)
        # the distance from each position to its document's separator: a match ends there at the latest
        nxt = seps[np.searchsorted(seps, pos)] if len(seps) else np.full(len(pos), len(units))
        length = np.minimum(lpf[pos].astype(np.int64), nxt - pos)
        hit = length >= min_len
        found.append(np.stack([pos[hit], pos[hit] + length[hit]], axis=1))
    return merge(np.concatenate(found))


def merge(iv: np.ndarray) -> np.ndarray:
    """Union of [start, end) ranges, sorted, touching ones joined."""
    if len(iv) == 0:
        return np.zeros((0, 2), np.int64)
    iv = iv[np.argsort(iv[:, 0], kind="stable")]
    ends = np.maximum.accumulate(iv[:, 1])
    new = np.ones(len(iv), dtype=bool)
    new[1:] = iv[1:, 0] > ends[:-1]
    group = np.cumsum(new) - 1
    out = np.zeros((int(new.sum()), 2), np.int64)
    out[:, 0] = iv[new, 0]
    np.maximum.at(out[:, 1], group, iv[:, 1])
    return out


def _lpf(units: np.ndarray) -> np.ndarray:
    import pydivsufsort  # the extra's dependency, loaded only when --substring runs

    if units.dtype != np.uint8:  # 64-bit keys -> dense ids: the sort's keys get as short as they can
        units = np.unique(units, return_inverse=True)[1].astype(np.int32).ravel()
    else:
        units = np.ascontiguousarray(units).copy()  # pydivsufsort refuses read-only buffers
    with _one_omp_thread():
        return pydivsufsort.longest_previous_factor(units)


@contextmanager
def _one_omp_thread():
    """libdivsufsort sorts with OpenMP. A process forked after an OpenMP parallel region hangs in
    its next one (libgomp keeps a thread pool the child lacks), and the executor forks its workers;
    with torch imported first the sort's symbols bind to torch's libgomp, so OMP_NUM_THREADS read
    at import does not reach it. One thread for the sort, on every libgomp it may use, then back."""
    libs = []
    for lib in _gomp_libs():
        try:
            libs.append((lib, lib.omp_get_max_threads()))
            lib.omp_set_num_threads(1)
        except AttributeError:
            continue
    try:
        yield
    finally:
        for lib, n in libs:
            lib.omp_set_num_threads(n)


def _gomp_libs() -> list:
    import pydivsufsort

    out = [ctypes.CDLL(None)]
    libs = Path(pydivsufsort.__file__).parent.parent / "pydivsufsort.libs"
    for f in sorted(libs.glob("libgomp*")) if libs.is_dir() else []:
        out.append(ctypes.CDLL(str(f)))
    return out


def snap_utf8(buf: np.ndarray, start: int, end: int) -> tuple[int, int]:
    """Shrink the byte range [start, end) of one document to whole characters (a continuation
    byte, 0b10xxxxxx, never starts or ends a cut)."""
    while start < end and (int(buf[start]) & 0xC0) == 0x80:
        start += 1
    while end > start and end < len(buf) and (int(buf[end]) & 0xC0) == 0x80:
        end -= 1
    return start, end


def memory_bytes(text: str) -> int:
    """'8G', '512M', '2000000' -> bytes; a clear ValueError otherwise."""
    t = text.strip().upper().removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(t[-1:], 1)
    num = t[:-1] if t[-1:] in "KMGT" and t[-1:] else t
    try:
        value = float(num)
    except ValueError:
        raise ValueError(f"--memory must look like 8G, 512M or a byte count, not {text!r}") from None
    if not (value * mult >= 1) or value == float("inf"):
        raise ValueError(f"--memory must be a size of at least one byte, not {text!r}")
    return int(value * mult)

