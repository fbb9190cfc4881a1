"""Log-likelihood of continuations, many choices per forward pass.

Each item's choices usually share one context. We lay an item out as one packed row: the token
prefix all its choices share, then each choice's remaining tokens as its own segment. A segment
attends to the shared prefix and to itself (a block mask), and its RoPE positions continue from
the prefix, so every choice is scored exactly as if it were alone after its context — but the
context is encoded once per item, and items are batched across the row dimension.

Tokenization follows lm-evaluation-harness: whitespace at the end of the context moves to the
start of the continuation; the continuation's tokens are those of encode(context + continuation)
past encode(context); an empty context is the EOS token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F


@dataclass
class Request:
    """One (context, continuation) to score: the whole token sequence and where scoring starts."""
    tokens: list[int]
    start: int  # index of the first continuation token (≥ 1)


def encode_pair(encode: Callable[[str], list[int]], context: str, continuation: str, start_id: int,
                add_bos: bool = False) -> Request:
    """The context's trailing spaces move to the continuation (lm-eval's rule). `start_id` starts an
    empty context (a model's BOS or the EOS before a document); with `add_bos` (a model whose
    tokenizer adds BOS) it starts every context, as the model saw text in training."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    head = [start_id] if add_bos or not context else []
    if not context:
        return Request(head + encode(continuation), 1)
    whole = encode(context + continuation)
    ctx = encode(context)
    return Request(head + whole, len(head) + len(ctx))


def _common_prefix(seqs: list[list[int]]) -> int:
    n = min(len(s) for s in seqs)
    for i in range(n):
        t = seqs[0][i]
        if any(s[i] != t for s in seqs[1:]):
            return i
    return n


@dataclass
class _Packed:
    tokens: list[int]
    positions: list[int]
    segment: list[int]  # -1: the shared prefix; j: choice j's own tokens
    # per choice: (indices in the packed row whose logits predict the continuation tokens, targets)
    gathers: list[tuple[list[int], list[int]]]


def pack_item(requests: list[Request]) -> _Packed:
    # a choice's last token predicts nothing that is scored: the model reads seq[:-1] (as the
    # harness feeds (context + continuation)[:-1]), so inputs are one token shorter than requests
    seqs = [r.tokens[:-1] for r in requests]
    p = _common_prefix(seqs)
    tokens, positions, segment = list(seqs[0][:p]), list(range(p)), [-1] * p
    gathers = []
    for j, (req, seq) in enumerate(zip(requests, seqs)):
        offset = len(tokens)
        tokens += seq[p:]  # empty when the choice's inputs all lie in the shared prefix
        positions += range(p, len(seq))
        segment += [j] * (len(seq) - p)
        # the logits at input position t − 1 predict token t; packed index of input position
        # i: i if i < p else offset + i − p
        idx = [(t - 1) if t - 1 < p else offset + t - 1 - p for t in range(req.start, len(req.tokens))]
        gathers.append((idx, req.tokens[req.start :]))
    return _Packed(tokens, positions, segment, gathers)


@torch.no_grad()
def score_items(model, items: list[list[Request]], max_tokens: int = 4096, pad_id: int = 0,
                on_batch: Callable[[int], None] | None = None) -> list[list[tuple[float, int]]]:
    """For each item, for each choice: (sum of log-probs of the continuation, its token count)."""
    from llmctl.model.generate import cpu_threads_for

    with cpu_threads_for(model, max_tokens):
        return _score_items(model, items, max_tokens, pad_id, on_batch)


def pack_rows(lengths: list[int], width: int) -> list[list[int]]:
    """First-fit decreasing: item indices per row, each row's lengths summing to ≤ width."""
    rows: list[list[int]] = []
    room: list[int] = []
    for k in sorted(range(len(lengths)), key=lambda k: -lengths[k]):
        r = next((r for r, free in enumerate(room) if free >= lengths[k]), None)
        if r is None:
            rows.append([])
            room.append(width)
            r = len(rows) - 1
        rows[r].append(k)
        room[r] -= lengths[k]
    return rows


def row_width(lengths: list[int], max_tokens: int) -> int:
    """Twice the longest item (measured on the cloze demo task, one thread: 1× 0.38 s, 2× 0.30 s,
    4× 0.32 s — wider rows pack tighter but every row pays attention over its whole width), capped
    by the batch's token budget unless one item alone exceeds it."""
    longest = max(lengths, default=1)
    return max(1, min(2 * longest, max(max_tokens, longest)))


def _score_items(model, items, max_tokens, pad_id, on_batch):
    """Items are packed several to a row (first-fit, rows as wide as twice the longest item, so a
    row wastes little to padding): each item keeps its own prefix and choice segments, attends only
    within itself, and restarts its positions at 0 — the result is that of scoring it alone."""
    packed = [pack_item(reqs) for reqs in items]
    lengths = [len(p.tokens) for p in packed]
    width = row_width(lengths, max_tokens)
    rows = pack_rows(lengths, width)
    rows_per_batch = max(1, max_tokens // width)
    results: list[list[tuple[float, int]]] = [[] for _ in items]
    device = next(model.parameters()).device
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    eye = torch.eye(width, dtype=torch.bool)
    for b in range(0, len(rows), rows_per_batch):
        batch = rows[b : b + rows_per_batch]
        tokens = torch.full((len(batch), width), pad_id, dtype=torch.long)
        positions = torch.zeros((len(batch), width), dtype=torch.long)
        seg = torch.full((len(batch), width), -2, dtype=torch.long)  # -2 padding, -1 an item's prefix, j its choice j
        item = torch.full((len(batch), width), -1, dtype=torch.long)  # which item of the row
        where: list[tuple[int, int, int]] = []  # (item index, row, offset in the row)
        for r, ks in enumerate(batch):
            at = 0
            for k in ks:
                pk, n = packed[k], lengths[k]
                tokens[r, at : at + n] = torch.tensor(pk.tokens)
                positions[r, at : at + n] = torch.tensor(pk.positions)
                seg[r, at : at + n] = torch.tensor(pk.segment)
                item[r, at : at + n] = len(where)
                where.append((k, r, at))
                at += n
        same_item = (item[:, :, None] == item[:, None, :]) & (item[:, None, :] >= 0)
        same_seg = (seg[:, :, None] == seg[:, None, :]) | (seg[:, None, :] == -1)
        mask = (causal[None] & same_item & same_seg) | eye[None]  # a padding query sees itself only
        hidden = model.hidden(tokens.to(device), mask=mask[:, None].to(device), positions=positions.to(device))
        # the head and softmax only where a continuation token is predicted (most positions are context)
        sel_rows = [r for k, r, _ in where for idx, _ in packed[k].gathers for _ in idx]
        sel_cols = [at + i for k, _, at in where for idx, _ in packed[k].gathers for i in idx]
        targets = torch.tensor([t for k, _, _ in where for _, tg in packed[k].gathers for t in tg])
        # over the vocabulary's ids, not the head's padding rows (model/config.py padded_vocab): the
        # exported model's softmax, which lm-evaluation-harness takes, has no such rows
        logits = model.head(hidden[torch.tensor(sel_rows), torch.tensor(sel_cols)])[:, : model.cfg.vocab_size].float()
        # log_softmax + gather in one row-wise kernel (the harness's log_softmax, then gather)
        token_lp = (-F.cross_entropy(logits, targets.to(device), reduction="none")).cpu()
        at = 0
        for k, _, _ in where:
            for idx, _ in packed[k].gathers:
                results[k].append((token_lp[at : at + len(idx)].sum().item(), len(idx)))
                at += len(idx)
        if on_batch:
            on_batch(len(where))
    return results


# lm-evaluation-harness's names for the accuracy each normalization gives: its `acc` is the plain
# sum of log-probs and its `acc_norm` the per-character score; the other two are not in the harness
METRIC_OF_NORM = {"none": "acc", "per_token": "acc_per_token", "per_char": "acc_norm", "pmi": "acc_pmi"}


def normalized_scores(logprobs: list[float], tokens: list[int], chars: list[int],
                      uncond: list[float]) -> dict[str, list[float]]:
    """The four cloze normalizations of spec 001-data-eval §A10, one score per choice:
    none = ln P(o|x) (the harness's acc); per_token = ÷ tokens(o); per_char = ÷ chars(o) (the
    harness's acc_norm); pmi = ln P(o|x) − ln P(o|"Answer:"). METRIC_OF_NORM names their accuracies."""
    return {
        "none": list(logprobs),
        "per_token": [lp / max(1, n) for lp, n in zip(logprobs, tokens)],
        "per_char": [lp / max(1, n) for lp, n in zip(logprobs, chars)],
        "pmi": [lp - lp0 for lp, lp0 in zip(logprobs, uncond)],
    }


def argmax_first(values: list[float]) -> int:
    """Index of the first maximum (numpy.argmax's tie rule, which the harness relies on)."""
    return max(range(len(values)), key=values.__getitem__)
