"""Loss, perplexity and bits per byte of a model on a tokens artifact.

Bits per byte makes runs with different tokenizers comparable (spec 001-arch-optim-scaling §A1):
bpb = Σ nats over predicted tokens / (ln 2 · Σ UTF-8 bytes those tokens stand for). Each token's
byte length comes from the tokenizer; special tokens (EOS between documents) stand for no text,
so they are left out of both sums — their loss is not a property of the text.
"""

from __future__ import annotations

import json
import math
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from llmctl.artifacts.tokens import TokenDataset
from llmctl.errors import UsageError


def token_byte_lengths(tokenizer_json: str | Path, size: int) -> np.ndarray:
    """UTF-8 bytes each id decodes to (0 for special/added tokens and unused padded ids). A file
    that is empty, not JSON or not a tokenizer's shape is one usage error naming it."""
    path = Path(tokenizer_json)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ValueError(f"a JSON {type(data).__name__}, not an object")
        return _byte_lengths(data, size)
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise UsageError(f"{path}: not a Hugging Face tokenizer.json ({type(e).__name__}: {e})") from e


def _byte_lengths(data: dict, size: int) -> np.ndarray:
    from tokenizers import Tokenizer

    lengths = np.zeros(size, dtype=np.int64)
    added = {t["id"] for t in data.get("added_tokens", [])}
    pre = json.dumps(data.get("pre_tokenizer") or {})
    if data.get("model", {}).get("type") == "BPE" and "ByteLevel" in pre:
        # byte-level BPE: every character of a vocabulary entry stands for exactly one byte
        for token, idx in data["model"]["vocab"].items():
            if idx < size and idx not in added:
                lengths[idx] = len(token)
        return lengths
    try:
        tok = Tokenizer.from_str(json.dumps(data))
    except Exception as e:  # tokenizers raises a bare Exception on a shape it cannot read
        raise ValueError(str(e).splitlines()[0] if str(e) else type(e).__name__) from e
    for idx in range(min(size, tok.get_vocab_size(with_added_tokens=True))):
        if idx not in added:
            lengths[idx] = len(tok.decode([idx], skip_special_tokens=False).encode("utf-8"))
    return lengths


def windows(dataset: TokenDataset, seq_len: int, max_windows: int | None = None) -> int:
    n = (dataset.n_tokens - 1) // seq_len
    return n if max_windows is None else min(n, max_windows)


@torch.no_grad()
def evaluate_loss(model, dataset: TokenDataset, seq_len: int, token_bytes: np.ndarray | None,
                  batch_size: int = 8, max_windows: int | None = None, device="cpu",
                  autocast=None, rank: int = 0, world: int = 1, keep_windows: bool = False) -> dict:
    """Sums over consecutive windows (rank r takes every world-th window); the caller all-reduces
    the sums when world > 1. Returns nats, predicted tokens, text tokens, bytes."""
    n = windows(dataset, seq_len, max_windows)
    ids = list(range(rank, n, world))
    byte_table = torch.from_numpy(token_bytes) if token_bytes is not None else None
    sums = {"nats": 0.0, "tokens": 0, "text_nats": 0.0, "text_tokens": 0, "bytes": 0}
    per_window: list[tuple[float, int]] = []  # (text nats, bytes) of each window, for error bars
    model.eval()
    for i in range(0, len(ids), batch_size):
        rows = np.stack([dataset.window(w * seq_len, seq_len + 1) for w in ids[i : i + batch_size]])
        rows = torch.from_numpy(rows).to(device)
        x, y = rows[:, :-1], rows[:, 1:]
        with autocast or nullcontext():
            logits = model(x)
        nats = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none")
        sums["nats"] += float(nats.sum())
        sums["tokens"] += y.numel()
        if byte_table is not None:
            b = byte_table[y.cpu()]
            text = b > 0
            window_nats = (nats.view(y.shape).cpu() * text).sum(-1)
            per_window += zip(window_nats.tolist(), b.sum(-1).tolist())
            sums["text_nats"] += float(window_nats.sum())
            sums["text_tokens"] += int(text.sum())
            sums["bytes"] += int(b.sum())
    if keep_windows:
        sums["windows"] = per_window
    return sums


def summarize(sums: dict[str, float]) -> dict[str, float]:
    """loss (nats/token over all predicted tokens), perplexity, and bits per byte over text tokens."""
    loss = sums["nats"] / max(1, sums["tokens"])
    out = {"loss": loss, "perplexity": math.exp(min(loss, 700)), "tokens": int(sums["tokens"])}
    if sums["bytes"]:
        out["bits_per_byte"] = sums["text_nats"] / (math.log(2) * sums["bytes"])
        out["bytes"] = int(sums["bytes"])
    return out


def unigram_bits_per_byte(train: TokenDataset, val: TokenDataset, token_bytes: np.ndarray) -> float:
    """The baseline a language model must beat: each token's frequency in `train` (add-one
    smoothed over the vocabulary), scored on `val`'s text tokens."""
    size = len(token_bytes)
    counts = np.ones(size, dtype=np.float64)
    for shard in train.shards:
        counts += np.bincount(np.asarray(shard), minlength=size)[:size]
    log_p = np.log(counts / counts.sum())
    val_counts = np.zeros(size, dtype=np.float64)
    for shard in val.shards:
        val_counts += np.bincount(np.asarray(shard), minlength=size)[:size]
    text = token_bytes > 0
    nats = -(val_counts[text] * log_p[text]).sum()
    return float(nats / (math.log(2) * (val_counts[text] * token_bytes[text]).sum()))
