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


@dataclass
class Request:
    """One (context, continuation) to score: the whole token sequence and where scoring starts."""
    tokens: list[int]
    start: int  # index of the first continuation token (≥ 1)


def encode_pair(encode: Callable[[str], list[int]], context: str, continuation: str, eos_id: int) -> Request:
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    if not context:
        ctx = [eos_id]
        return Request(ctx + encode(continuation), 1)
    whole = encode(context + continuation)
    ctx = encode(context)
    return Request(whole, len(ctx))


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
    seqs = [r.tokens for r in requests]
    # keep at least one token of each choice out of the prefix so every segment is non-empty
    p = min(_common_prefix(seqs), min(len(s) for s in seqs) - 1)
    tokens, positions, segment = list(seqs[0][:p]), list(range(p)), [-1] * p
    gathers = []
    for j, (req, seq) in enumerate(zip(requests, seqs)):
        offset = len(tokens)
        tokens += seq[p:]
        positions += range(p, len(seq))
        segment += [j] * (len(seq) - p)
        # packed index of original position t: t if t < p else offset + t - p
        idx = [(t - 1) if t - 1 < p else offset + t - 1 - p for t in range(req.start, len(seq))]
        gathers.append((idx, seq[req.start :]))
    return _Packed(tokens, positions, segment, gathers)


@torch.no_grad()
def score_items(model, items: list[list[Request]], max_tokens: int = 4096, pad_id: int = 0,
                on_batch: Callable[[int], None] | None = None) -> list[list[tuple[float, int]]]:
    """For each item, for each choice: (sum of log-probs of the continuation, its token count)."""
    from llmctl.model.generate import cpu_threads_for

    with cpu_threads_for(model, max_tokens):
        return _score_items(model, items, max_tokens, pad_id, on_batch)


def _score_items(model, items, max_tokens, pad_id, on_batch):
    packed = [pack_item(reqs) for reqs in items]
    order = sorted(range(len(packed)), key=lambda i: len(packed[i].tokens))
    results: list[list[tuple[float, int]]] = [[] for _ in items]
    device = next(model.parameters()).device
    i = 0
    while i < len(order):
        width = len(packed[order[i]].tokens)
        batch = [order[i]]
        while i + len(batch) < len(order):  # grow while the padded batch stays under max_tokens
            w = len(packed[order[i + len(batch)]].tokens)
            if w * (len(batch) + 1) > max_tokens:
                break
            batch.append(order[i + len(batch)])
            width = w
        i += len(batch)
        tokens = torch.full((len(batch), width), pad_id, dtype=torch.long)
        positions = torch.zeros((len(batch), width), dtype=torch.long)
        seg = torch.full((len(batch), width), -2, dtype=torch.long)
        for r, k in enumerate(batch):
            pk = packed[k]
            n = len(pk.tokens)
            tokens[r, :n] = torch.tensor(pk.tokens)
            positions[r, :n] = torch.tensor(pk.positions)
            seg[r, :n] = torch.tensor(pk.segment)
        causal = torch.ones(width, width, dtype=torch.bool).tril()
        same = (seg[:, :, None] == seg[:, None, :]) | (seg[:, None, :] == -1)
        mask = (causal[None] & same & (seg[:, None, :] != -2)) | torch.eye(width, dtype=torch.bool)[None]
        hidden = model.hidden(tokens.to(device), mask=mask[:, None].to(device), positions=positions.to(device))
        # the head and softmax only where a continuation token is predicted (most positions are context)
        rows = [r for r, k in enumerate(batch) for idx, _ in packed[k].gathers for _ in idx]
        cols = [i for k in batch for idx, _ in packed[k].gathers for i in idx]
        targets = torch.tensor([t for k in batch for _, tg in packed[k].gathers for t in tg])
        logits = model.head(hidden[torch.tensor(rows), torch.tensor(cols)]).float()
        token_lp = (logits.gather(-1, targets.to(device)[:, None])[:, 0] - torch.logsumexp(logits, -1)).cpu()
        at = 0
        for k in batch:
            for idx, _ in packed[k].gathers:
                results[k].append((token_lp[at : at + len(idx)].sum().item(), len(idx)))
                at += len(idx)
        if on_batch:
            on_batch(len(batch))
    return results


def normalized_scores(logprobs: list[float], tokens: list[int], chars: list[int],
                      uncond: list[float]) -> dict[str, list[float]]:
    """The four cloze normalizations of spec 001-data-eval §A10, one score per choice:
    none = ln P(o|x); per_token = ÷ tokens(o); per_char = ÷ chars(o) (acc_norm);
    pmi = ln P(o|x) − ln P(o|"Answer:")."""
    return {
        "none": list(logprobs),
        "per_token": [lp / max(1, n) for lp, n in zip(logprobs, tokens)],
        "per_char": [lp / max(1, n) for lp, n in zip(logprobs, chars)],
        "pmi": [lp - lp0 for lp, lp0 in zip(logprobs, uncond)],
    }


def argmax_first(values: list[float]) -> int:
    """Index of the first maximum (numpy.argmax's tie rule, which the harness relies on)."""
    return max(range(len(values)), key=values.__getitem__)
