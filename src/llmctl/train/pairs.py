"""Preference pairs for `llmctl dpo` and `llmctl train-rm`: read, checked, rendered, held out.

A record is `{prompt, chosen, rejected}` (JSONL, JSONL.gz or Parquet), in any of the shapes
preference data ships in:
- strings: the prompt is one user message, each completion one assistant message;
- TRL's conversational format: `prompt` a message list ending with the user's turn, `chosen` and
  `rejected` the assistant message(s) that continue it;
- UltraFeedback-style: `chosen` / `rejected` whole conversations that start with the prompt's
  messages (the prompt a string or a list, or absent: then the prompt is the messages the two
  conversations share, up to the last user turn, TRL's "implicit prompt").
An optional numeric `margin` is how much better chosen is (Llama 2's reward-model margin).

Each side is rendered with the checkpoint's chat template (tokenizer/vocab.py picks llmctl's or
an imported model's) as prompt + completion; the loss mask is the template's assistant mask with
the prompt's tokens zeroed, so only the completion's tokens (and the turn end closing them) count,
as in SFT. (TRL counts every token after the prompt: in ChatML also the newline after <|im_end|>,
which the model never generates; with llmctl's own template the two are the same tokens.)

Bad records never stop the run: a missing or mistyped field, an empty completion, chosen equal to
rejected, or a pair whose longer side does not fit seq_len + 1 tokens is skipped and counted
(`PairSet.skipped`, reason → count; the first of each reason is logged with its file:line). A
file that is not JSON, or where no pair is left, is a one-line error naming file:line.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from llmctl.errors import UsageError
from llmctl.torchrt import distributed
from llmctl.train.loader import SequenceBatches, WindowOrder

SKIP_REASONS = ("missing_field", "bad_messages", "empty_completion", "identical", "too_long")


@dataclass
class Pair:
    # (ids int32, loss mask bool) of prompt + chosen / rejected: numpy, not lists of Python ints,
    # which would take ~36 bytes a token (UltraFeedback's 60k pairs: gigabytes)
    chosen: tuple[np.ndarray, np.ndarray]
    rejected: tuple[np.ndarray, np.ndarray]
    margin: float = 0.0
    where: str = ""


@dataclass
class PairSet:
    pairs: list[Pair]
    skipped: dict[str, int] = field(default_factory=dict)
    first_skip: dict[str, str] = field(default_factory=dict)  # reason → "file:line: why"
    records: int = 0

    def __len__(self) -> int:
        return len(self.pairs)


class _Skip(Exception):
    def __init__(self, reason: str, why: str):
        super().__init__(why)
        self.reason = reason


def _messages(value, role: str, name: str) -> list[dict]:
    """A string as one message of `role`, or a message list checked for {role, content} strings."""
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if not isinstance(value, (list, tuple)) or not value:
        raise _Skip("bad_messages", f"{name} must be a string or a non-empty list of messages")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise _Skip("bad_messages", f"{name}[{i}] must be {{role, content}} strings")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def _implicit_prompt(chosen: list[dict], rejected: list[dict]) -> list[dict]:
    """The messages both conversations share, cut after the last shared user turn."""
    n = 0
    while n < min(len(chosen), len(rejected)) and chosen[n] == rejected[n]:
        n += 1
    users = [i for i in range(n) if chosen[i]["role"] == "user"]
    if not users:
        raise _Skip("missing_field", "no prompt field and no user turn shared by chosen and rejected")
    return chosen[:users[-1] + 1]


def split_record(rec: dict) -> tuple[list[dict], list[dict], list[dict], float]:
    """(prompt messages, chosen completion, rejected completion, margin) of one record."""
    for key in ("chosen", "rejected"):
        if rec.get(key) is None:
            raise _Skip("missing_field", f"no {key!r} field")
    chosen = _messages(rec["chosen"], "assistant", "chosen")
    rejected = _messages(rec["rejected"], "assistant", "rejected")
    if rec.get("prompt") is None:
        if isinstance(rec["chosen"], str) or isinstance(rec["rejected"], str):
            raise _Skip("missing_field", "no 'prompt' field")
        prompt = _implicit_prompt(chosen, rejected)
    else:
        prompt = _messages(rec["prompt"], "user", "prompt")
    if prompt[-1]["role"] != "user":
        raise _Skip("bad_messages", "the prompt must end with a user message")
    # UltraFeedback-style: a completion that repeats the prompt's messages continues after them
    chosen = chosen[len(prompt):] if chosen[:len(prompt)] == prompt else chosen
    rejected = rejected[len(prompt):] if rejected[:len(prompt)] == prompt else rejected
    for name, comp in (("chosen", chosen), ("rejected", rejected)):
        if not comp or any(m["role"] != "assistant" for m in comp):
            raise _Skip("bad_messages", f"{name} must continue the prompt with assistant message(s)")
        if not "".join(m["content"] for m in comp).strip():
            raise _Skip("empty_completion", f"{name} is empty")
    if chosen == rejected:
        raise _Skip("identical", "chosen and rejected are the same")
    margin = rec.get("margin", 0.0)
    if margin is None:
        margin = 0.0
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not math.isfinite(margin):
        raise _Skip("missing_field", f"margin must be a finite number, got {margin!r}")
    return prompt, chosen, rejected, float(margin)


def encode_side(template, prompt: list[dict], completion: list[dict]) -> tuple[list[int], list[int]]:
    """(ids, mask) of prompt + completion: the template's assistant mask past the prompt's tokens."""
    ids, mask = template.encode_chat(prompt + completion)
    n_prompt = len(template.prompt_ids(prompt))
    return ids, [0] * min(n_prompt, len(mask)) + mask[n_prompt:]


def read_pairs(path: Path, template, seq_len: int, what: str = "--pairs") -> PairSet:
    """Every usable pair of `path`, rendered; skips counted by reason."""
    from llmctl.tasks.files import read_records, where

    path = Path(path)
    if not path.is_file():
        raise UsageError(f"{what}: pairs file not found: {path}")
    records = read_records(path)
    out = PairSet([], records=len(records))

    def skip(reason: str, at: str, why: str) -> None:
        out.skipped[reason] = out.skipped.get(reason, 0) + 1
        out.first_skip.setdefault(reason, f"{at}: {why}")

    for i, rec in enumerate(records):
        at = where(path, rec, i)
        try:
            prompt, chosen, rejected, margin = split_record(rec)
            try:
                c = encode_side(template, prompt, chosen)
                r = encode_side(template, prompt, rejected)
            except UsageError as e:  # a role the template does not speak, a message it cannot render
                raise _Skip("bad_messages", str(e)) from e
            if max(len(c[0]), len(r[0])) - 1 > seq_len:
                raise _Skip("too_long", f"{max(len(c[0]), len(r[0]))} tokens do not fit seq_len {seq_len} + 1")
            if not any(c[1][1:]) or not any(r[1][1:]):
                raise _Skip("empty_completion", "a completion renders to no assistant token")
        except _Skip as s:
            skip(s.reason, at, str(s))
            continue
        out.pairs.append(Pair(*((np.asarray(ids, np.int32), np.asarray(mask, bool)) for ids, mask in (c, r)), margin, at))
    if not out.pairs:
        firsts = "; ".join(out.first_skip.values()) or f"{path} holds no records"
        raise UsageError(f"{what}: no usable pair in {path} ({firsts})")
    return out


def held_out(n: int, fraction: float, seed: int) -> set[int]:
    """The seeded share of pair indices held out (the same draw for a resumed run)."""
    if not 0.0 <= fraction < 1.0:
        raise UsageError(f"--val-fraction must lie in [0, 1), got {fraction}")
    if fraction == 0:
        return set()
    k = max(1, round(fraction * n))
    if k >= n:
        raise UsageError(f"--val-fraction {fraction} leaves no training pair of {n}")
    return set(np.random.default_rng([seed, 0x9A1]).permutation(n)[:k].tolist())


def pair_rows(pairs: list[Pair], pad_id: int, shift: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(inputs, targets, last) of 2·B rows — the B chosen sides, then the B rejected ones — padded
    on the right to the longest. shift (DPO): inputs ids[:-1], targets ids[1:] with −100 off the
    mask and on padding. Not shifted (reward model): inputs all ids, targets the mask. `last` is
    the index of each row's last real input (for a reward model, the turn end closing the completion)."""
    sides = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    cut = 1 if shift else 0
    width = max(len(ids) for ids, _ in sides) - cut
    x = torch.full((len(sides), width), pad_id, dtype=torch.long)
    y = torch.full((len(sides), width), -100, dtype=torch.long)
    last = torch.empty(len(sides), dtype=torch.long)
    for i, (ids, mask) in enumerate(sides):
        a = torch.as_tensor(np.asarray(ids), dtype=torch.long)
        m = torch.as_tensor(np.asarray(mask[cut:]), dtype=torch.bool)
        n = len(ids) - cut
        x[i, :n] = a[:n]
        y[i, :n] = torch.where(m, a[cut:], torch.full_like(a[cut:], -100))
        last[i] = n - 1
    return x, y, last


def skip_summary(pairs: PairSet) -> str:
    """One line: how many records were skipped and why."""
    if not pairs.skipped:
        return ""
    return ", ".join(f"{n} {reason.replace('_', ' ')}" for reason, n in sorted(pairs.skipped.items()))


class PairOrder(SequenceBatches):
    """Pretraining's (seed, step) arithmetic (WindowOrder) over pairs: a "sequence" of the
    trainer's batch is one pair, so batch_tokens / seq_len is pairs per step. `sequences` gives
    (pair indices,): the source builds the rows (and looks up what it caches per pair)."""

    def __init__(self, n: int, seed: int):
        self.n_windows = n
        self.order = WindowOrder(n, seed)

    def sequences(self, first: int, count: int):
        return (torch.from_numpy(self.order.consecutive(first, count)),)


@dataclass
class PairOptions:
    pairs: Path  # JSONL(.gz) or Parquet of {prompt, chosen, rejected}
    init: Path  # the checkpoint directory that starts the run (its tokenizer and chat template)
    tokenizer: Path
    val_fraction: float = 0.0
    weights: str = "auto"  # which weights of `init`: auto (its EMA where it has one), ema or raw


def resolve_init(init: Path, what: str) -> tuple[Path, Path, object]:
    """(checkpoint dir, its tokenizer.json, its architecture) of the checkpoint a preference stage starts from."""
    from llmctl.artifacts.checkpoint import open_checkpoint
    from llmctl.model.load import model_config

    ck = open_checkpoint(init)  # metadata only: the trainer reads the weights once
    if ck.tokenizer_file is None:
        raise UsageError(f"{what} {ck.path}: the checkpoint has no tokenizer.json")
    return ck.path, ck.tokenizer_file, model_config(ck)


class PairData(ABC):
    """What dpo and train-rm share as batch sources of the training loop (train/trainer.py's
    BatchSource): the pairs read and rendered once, a seeded held-out share, the order of the
    training pairs, and the manifest's inputs and skip counts. Subclasses add the loss."""

    stage = "pairs"

    def __init__(self, opts: PairOptions, seq_len: int, seed: int, on_log=lambda m: None):
        from llmctl.tokenizer.vocab import Vocab

        self.opts, self.seed, self.on_log = opts, seed, on_log
        self.init, self.tokenizer_file, self.init_weights = opts.init, opts.tokenizer, opts.weights
        vocab = Vocab(opts.tokenizer)
        self.template = vocab.require_chat()
        self.vocab_size = vocab.size
        self.all = read_pairs(opts.pairs, self.template, seq_len)
        held = held_out(len(self.all), opts.val_fraction, seed)
        self.train_idx = [i for i in range(len(self.all)) if i not in held]
        self.val_idx = sorted(held)
        self.has_val = bool(self.val_idx)
        self.loader: PairOrder | None = None
        if self.all.skipped:
            on_log(f"warning: skipped {sum(self.all.skipped.values())} of {self.all.records} records "
                   f"({skip_summary(self.all)}); first: " + "; ".join(self.all.first_skip.values()))
        on_log(f"{self.stage}: {len(self.train_idx):,} training pairs"
               + (f", {len(self.val_idx):,} held out" if self.val_idx else ""))

    def pairs_at(self, idx) -> list[Pair]:
        return [self.all.pairs[int(i)] for i in idx]

    def describe(self) -> dict:
        o = self.opts
        return {self.stage: {"pairs": str(o.pairs), "init": str(o.init), "init_weights": o.weights,
                             "tokenizer": str(o.tokenizer), "val_fraction": o.val_fraction,
                             "chat_template": self.template.name, **self.settings()}}

    def settings(self) -> dict:
        """The stage's own entries of config.json (its loss and its numbers)."""
        return {}

    def start(self, padded_vocab: int) -> None:
        self.loader = PairOrder(len(self.train_idx), self.seed)

    def train_pairs(self, step: int, batch_seqs: int, micro: int, dist):
        """This rank's micro-batches of step `step`, each a list of global pair indices."""
        for (local,) in self.loader.micro_batches(step, batch_seqs, micro, dist.rank, dist.world):
            yield [self.train_idx[int(i)] for i in local]

    def checkpoint_state(self) -> dict:
        return {}

    # -- the pair statistics: a subclass names them (STATS), keeps their sums over the step's
    # micro-batches in self._sums ([pairs, *STATS]) and gives its held-out batches (val_batch)

    STATS: tuple[str, ...] = ()

    def means(self, sums: list[float]) -> dict:
        """Per-pair means of the summed statistics ([pairs, *STATS]), with the reward margin."""
        n = max(sums[0], 1.0)
        m = {k: round(v / n, 6) for k, v in zip(self.STATS, sums[1:])}
        m["reward_margin"] = round(m["reward_chosen"] - m["reward_rejected"], 6)
        return m

    def step_record(self, step: int) -> dict:
        """The step's pair statistics, over the whole global batch (summed over ranks)."""
        sums = distributed.all_reduce_sum(list(self._sums), self._dist) if self._dist is not None else self._sums
        return self.means(sums)

    @abstractmethod
    def val_batch(self, idx: list[int], dist, micro: int) -> tuple:
        """The held-out pairs `idx` as a batch for `pair_stats`, on the device."""

    @abstractmethod
    def pair_stats(self, model, batch: tuple) -> tuple[torch.Tensor, dict, torch.Tensor]:
        """(per-pair losses, the batch's summed STATS, the max logit) of one micro-batch."""

    @torch.no_grad()
    def validate(self, model, dist, micro: int, limit: int, autocast) -> dict:
        """Loss and pair statistics on the held-out pairs (each rank its share, summed)."""
        val = self.val_idx[:limit] if limit else self.val_idx
        mine = val[dist.rank::dist.world]
        sums = [0.0] * (len(self.STATS) + 2)
        was = model.training
        model.eval()
        for i in range(0, len(mine), micro):
            idx = mine[i:i + micro]
            batch = self.val_batch(idx, dist, micro)
            with autocast:
                losses, stats, _ = self.pair_stats(model, batch)
            sums = [a + float(v) for a, v in zip(sums, [len(idx), *(stats[k] for k in self.STATS), losses.sum()])]
        model.train(was)
        sums = distributed.all_reduce_sum(sums, dist)
        return {"loss": round(sums[-1] / max(sums[0], 1.0), 6), **self.means(sums[:-1]), "pairs": int(sums[0])}

    def manifest(self, val: dict | None) -> tuple[dict, list[dict], dict]:
        counts = {"pairs": len(self.train_idx), "val_pairs": len(self.val_idx), "records": self.all.records,
                  **{f"skipped_{k}": v for k, v in sorted(self.all.skipped.items())}}
        counts.update({f"val_{k}": v for k, v in (val or {}).items()})
        return self.describe(), self._inputs(), counts

    def _inputs(self) -> list[dict]:
        from llmctl.artifacts.checkpoint import owner_artifact
        from llmctl.artifacts.manifest import input_ref

        return [input_ref(self.opts.pairs), input_ref(owner_artifact(self.opts.init))]
