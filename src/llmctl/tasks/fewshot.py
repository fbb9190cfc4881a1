"""Few-shot prompts: k solved examples drawn with a fixed seed from the task's own items (never the
item itself), written out before the item, or given to a chat model as earlier turns."""

from __future__ import annotations

import random

from llmctl.tasks.base import GenItem


def fewshot_indices(pool: list, index: int, shots: int, seed: int) -> list[int]:
    """k examples drawn with a fixed seed from the pool, never the item itself."""
    if shots <= 0:
        return []
    rng = random.Random(seed * 1_000_003 + index)
    return rng.sample([j for j in range(len(pool)) if j != index], min(shots, len(pool) - 1))


def fewshot_prefix(pool: list, index: int, shots: int, seed: int) -> str:
    """The k solved examples written out before the item, separated by blank lines."""
    return "".join(pool[j].fewshot_text + "\n\n" for j in fewshot_indices(pool, index, shots, seed))


def chat_messages(pool: list[GenItem], index: int, shots: int, seed: int) -> list[dict]:
    """The same item for a chat model (SFT/RL checkpoints): solved examples as earlier turns."""
    msgs = []
    for j in fewshot_indices(pool, index, shots, seed):
        msgs += [{"role": "user", "content": pool[j].question}, {"role": "assistant", "content": pool[j].answer}]
    return msgs + [{"role": "user", "content": pool[index].question}]
