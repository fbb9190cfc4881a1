"""Byte-level BPE: training with Hugging Face `tokenizers`, encoding with tiktoken.

Training (spec 001-data-eval §A9, 004-scratch §B1): 256 byte symbols, nothing unknown; a regex
pre-tokenizer so merges never cross pieces (cl100k-style by default: case-insensitive
contractions, digit runs of at most 3, newlines grouped; GPT-2's as an option); special tokens
reserved up front, in a fixed order, at ids 0..k-1. The result is a `tokenizer.json` that
`PreTrainedTokenizerFast(tokenizer_file=...)` loads unchanged.

Encoding runs the same merges through tiktoken (`fast_encoder`): its rank of a token is the
token's id, which is its merge order, and it uses the same pre-tokenizer regex. No special token
is ever allowed when encoding, so "<|endoftext|>" typed in a web page stays text (spec: user
text must never become special tokens). Tests check the ids equal the `tokenizers` ids.
"""

from __future__ import annotations

import json
import os
import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from llmctl.errors import UsageError

# cl100k's pre-tokenizer (tiktoken's published pattern string)
CL100K_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
# GPT-2's (spec §A9)
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
PATTERNS = {"cl100k": CL100K_PATTERN, "gpt2": GPT2_PATTERN}

EOS = "<|endoftext|>"
CHAT_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|pad|>"]


def special_tokens(reserved: int = 10) -> list[str]:
    """Fixed order: the document separator, the chat tokens SFT/RL use, then reserved slots."""
    return [EOS, *CHAT_TOKENS, *[f"<|reserved_{i}|>" for i in range(reserved)]]


@dataclass
class TrainTokenizerConfig:
    vocab_size: int = 8192
    pattern: str = "cl100k"  # cl100k | gpt2
    max_chars: int = 50_000_000  # train on a seeded sample of at most this many characters
    seed: int = 0
    reserved: int = 10  # reserved special ids after the chat tokens (16 specials in all)
    min_frequency: int = 2
    overwrite: bool = False
    extra: dict = field(default_factory=dict)


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-ins for the 256 bytes (what ByteLevel writes into tokenizer.json)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = keep[:]
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(keep, map(chr, chars)))


def build_tokenizer(pattern: str):
    """An untrained byte-level BPE `tokenizers.Tokenizer` with our pre-tokenizer and decoder."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    if pattern not in PATTERNS:
        raise UsageError(f"unknown pre-tokenizer pattern {pattern!r} (cl100k or gpt2)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PATTERNS[pattern]), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def sample_indices(lengths: list[int], max_chars: int, seed: int) -> list[int]:
    """A seeded sample of whole non-empty documents holding at most `max_chars` characters, as
    indices in input order (reservoir-free: keep each document with the probability that fits the
    budget). Taking lengths, not texts, lets a caller make Python strings of the sample only."""
    total = sum(lengths)
    if total <= max_chars:
        return [i for i, n in enumerate(lengths) if n]
    rng = random.Random(seed)
    keep_p = max_chars / total
    out, used = [], 0
    for i, n in enumerate(lengths):
        if n and rng.random() < keep_p and used + n <= max_chars:
            out.append(i)
            used += n
    return out


def train(texts: list[str], cfg: TrainTokenizerConfig):
    from tokenizers import pre_tokenizers, trainers

    specials = special_tokens(cfg.reserved)
    if cfg.vocab_size < 256 + len(specials) + 1:
        raise UsageError(f"--vocab-size must be at least {256 + len(specials) + 1} (256 bytes + {len(specials)} special tokens + 1 merge)")
    tok = build_tokenizer(cfg.pattern)
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size,
        min_frequency=cfg.min_frequency,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tok


# ---------------------------------------------------------------------------------------------
# Loading and the fast encoder


@dataclass
class TokenizerInfo:
    path: str
    vocab_size: int
    eos_id: int | None
    special: dict[str, int]
    pattern: str | None  # the regex when it is one of ours (tiktoken can then encode)


def load(path: str):
    from tokenizers import Tokenizer

    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise UsageError(f"tokenizer not found: {path}")
    try:
        return Tokenizer.from_file(str(p)), p
    except Exception as e:  # tokenizers raises a bare Exception on bad JSON
        raise UsageError(f"{p}: not a Hugging Face tokenizer.json ({str(e).splitlines()[0]})") from e


def info(tok, path: Path) -> TokenizerInfo:
    special = {t.content: i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    eos = special.get(EOS)
    if eos is None:  # a released model's tokenizer: take its usual end-of-text token
        for name in ("</s>", "<|end_of_text|>", "<|eot_id|>", "<eos>", "<|im_end|>"):
            if name in special:
                eos = special[name]
                break
    data = json.loads(path.read_text(encoding="utf-8"))
    pattern = None
    pre = data.get("pre_tokenizer") or {}
    for p in pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else []:
        regex = (p.get("pattern") or {}).get("Regex") if p.get("type") == "Split" else None
        if regex in PATTERNS.values():
            pattern = regex
    return TokenizerInfo(str(path), tok.get_vocab_size(with_added_tokens=True), eos, special, pattern)


@lru_cache(maxsize=4)
def fast_encoder(path: str):
    """A tiktoken Encoding with our merges, or None when the tokenizer is not one of ours
    (then the `tokenizers` encoder is used; it gives the same ids, more slowly)."""
    import tiktoken

    tok, p = load(path)
    meta = info(tok, p)
    data = json.loads(p.read_text(encoding="utf-8"))
    model = data.get("model", {})
    if meta.pattern is None or model.get("type") != "BPE" or data.get("normalizer") is not None:
        return None
    to_byte = {c: b for b, c in _byte_to_unicode().items()}
    ranks: dict[bytes, int] = {}
    for token, idx in model["vocab"].items():
        if token in meta.special:
            continue
        try:
            ranks[bytes(to_byte[c] for c in token)] = idx
        except KeyError:
            return None  # not byte-level after all
    # The special tokens are registered although they are never allowed: tiktoken's
    # special-token scan is about 2x slower with none registered (measured, tiktoken 0.14).
    return tiktoken.Encoding(name=f"llmctl-{p.stem}", pat_str=meta.pattern, mergeable_ranks=ranks, special_tokens=meta.special)


def ordinary(tok):
    """The same tokenizer without its added tokens: text that looks like "<|endoftext|>" is then
    encoded as the characters it is, never as the special id."""
    from tokenizers import Tokenizer

    data = json.loads(tok.to_str())
    data["added_tokens"] = []
    data["post_processor"] = None
    return Tokenizer.from_str(json.dumps(data))


@lru_cache(maxsize=4)
def encoder(path: str, threads: int = 1) -> "Encoder":
    """One Encoder per tokenizer and process (tasks of a worker reuse it)."""
    return Encoder(path, threads)


_NONE: frozenset[str] = frozenset()  # no special token allowed, none refused: all text is ordinary


class Encoder:
    """encode_arrays(texts) -> one uint32 id array per text; ordinary text only (specials never
    injected). With threads > 1 a batch is spread over a thread pool (tiktoken drops the GIL)."""

    CHUNK = 16  # documents per pool task: enough to amortize a future, small enough to balance

    def __init__(self, path: str, threads: int = 1):
        self.tok, p = load(path)
        self.info = info(self.tok, p)
        self.fast = fast_encoder(str(p))
        self.plain = None if self.fast is not None else ordinary(self.tok)
        self.threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid = 0  # the process that made the pool: a forked worker inherits no threads

    def encode_arrays(self, texts: list[str]) -> list[np.ndarray]:
        if self.fast is None:
            return [np.asarray(e.ids, dtype=np.uint32) for e in self.plain.encode_batch(texts, add_special_tokens=False)]
        if self.threads <= 1 or len(texts) <= self.CHUNK:
            return self._encode_fast(texts)
        if self._pool_pid != os.getpid():
            self._pool, self._pool_pid = ThreadPoolExecutor(self.threads), os.getpid()
        chunks = [texts[i : i + self.CHUNK] for i in range(0, len(texts), self.CHUNK)]
        return [a for part in self._pool.map(self._encode_fast, chunks) for a in part]

    def _encode_fast(self, texts: list[str]) -> list[np.ndarray]:
        # encode_to_numpy skips the Python int list that encode_ordinary builds; with nothing
        # allowed and nothing disallowed, special-looking text is encoded as ordinary text.
        enc = self.fast.encode_to_numpy
        out = []
        for t in texts:
            try:
                out.append(enc(t, allowed_special=_NONE, disallowed_special=_NONE))
            except UnicodeEncodeError:  # lone surrogates: replaced, as encode_ordinary does
                t = t.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
                out.append(enc(t, allowed_special=_NONE, disallowed_special=_NONE))
        return out

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [a.tolist() for a in self.encode_arrays(texts)]

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)
