"""The one 64-bit hash llmctl uses wherever a stable, seedless, cross-process hash of a string is
needed (dedup's exact keys and URL keys, tokenize's train/val split, the classifier's sample
split, decontam's word hashes). Python's `hash()` is salted per process; blake2b with an 8-byte
digest is stable, fast, and has no dependency. Lone surrogates (which survive from some JSON
inputs) are hashed as their UTF-8-like bytes instead of raising."""

from __future__ import annotations

import hashlib


def h64(text: str) -> int:
    """blake2b-64 of `text`'s UTF-8 bytes, as an unsigned little-endian integer."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")
