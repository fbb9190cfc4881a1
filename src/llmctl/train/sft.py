"""`llmctl train --sft CHATS`: supervised fine-tuning on conversations (spec 001-posttrain-rl §A1).

Data. Every record (a `messages` list, GSM8K {question, answer}, or {prompt, answer}) is rendered
with the model's chat template (llmctl's, tokenizer/chat.py, or an imported model's own,
tokenizer/chat_jinja.py; tokenizer/vocab.py picks) into ids and a loss mask. A seeded share of conversations
(`val_fraction`) is held out. Conversations are packed into rows of seq_len (input, target) pairs
by greedy best fit in file order: each goes into the open row with the least room that still fits
it, else a new row. A conversation of n tokens takes n − 1 slots (inputs ids[:-1], targets ids[1:]
with −100 where the mask is 0); one longer than seq_len is cut to seq_len + 1 tokens and counted.
Each row carries per-conversation positions restarted at 0 and segment ids; the attention mask is
block-diagonal causal (a token sees only earlier tokens of its own conversation), so packing
changes no conversation's logits. The tail of a row is padding: its own segment, targets −100.
Rows are visited like pretraining windows: epoch e in the order permutation(seed, e), so the batch
at step s is a pure function of (seed, s) and resume needs no loader state.

Loss. L = Σ_t m_t · (−log p(x_t | x_<t)) / Z with Z = Σ_t m_t over the WHOLE global batch (every
micro-batch of every rank; Z is all-reduced before the first backward). Each micro-batch
backpropagates its summed NLL · world / Z — DDP averages gradients over ranks, hence · world —
so the gradient is the same whatever the micro-batch size or the rank count (the spec's test:
1 micro-batch of 8 == 8 micro-batches of 1). A per-micro-batch mean would weight a token of a
short micro-batch more than one of a long one.

SFTData is this data as the training loop's batch source (train/trainer.py's BatchSource);
`run_sft` hands it to the loop.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from llmctl.errors import UsageError
from llmctl.tokenizer.vocab import Vocab
from llmctl.torchrt import distributed
from llmctl.train.loader import SequenceBatches, WindowOrder
from llmctl.train.trainer import fit


@dataclass
class SFTOptions:
    chats: Path  # JSONL(.gz) or Parquet of conversations
    tokenizer: Path  # tokenizer.json (the --init checkpoint's, or --tokenizer)
    init: Path | None = None  # a checkpoint directory whose weights start the run
    val_fraction: float = 0.0
    weights: str = "auto"  # which weights of `init`: auto (its EMA where it has one), ema or raw


@dataclass
class PackedRows:
    """n rows of seq_len slots: input ids, targets (−100 = no loss), segments, positions (all
    int32 in memory, 16 bytes a slot; batches are widened to int64)."""
    tokens: np.ndarray  # (n, T)
    targets: np.ndarray  # (n, T)
    segments: np.ndarray  # (n, T): conversation index within the row; padding −1
    positions: np.ndarray  # (n, T): restarted at 0 for each conversation (and the padding)
    conversations: int = 0
    truncated: int = 0
    dropped: int = 0  # conversations with no assistant token left to learn

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def loss_tokens(self) -> int:
        return int((self.targets != -100).sum())

    @property
    def fill(self) -> float:
        """Share of slots holding a conversation (1 − padding)."""
        return float((self.segments >= 0).mean()) if len(self) else 0.0


def pack(encoded: list[tuple[list[int], list[int]]], seq_len: int, pad_id: int) -> PackedRows:
    """Greedy best-fit packing of (ids, mask) conversations into rows of seq_len slots."""
    docs, truncated, dropped = [], 0, 0
    for ids, mask in encoded:
        if len(ids) - 1 > seq_len:
            ids, mask = ids[:seq_len + 1], mask[:seq_len + 1]
            truncated += 1
        if len(ids) < 2 or not any(mask[1:]):
            dropped += 1
            continue
        docs.append((ids, mask))
    rows: list[list[int]] = []  # doc indices per row
    open_rows: list[tuple[int, int]] = []  # (room left, row), sorted: best fit = first with room ≥ need
    for k, (ids, _) in enumerate(docs):
        need = len(ids) - 1
        i = bisect.bisect_left(open_rows, (need, -1))
        if i < len(open_rows):
            left, r = open_rows.pop(i)
        else:
            r, left = len(rows), seq_len
            rows.append([])
        rows[r].append(k)
        left -= need
        if left > 0:
            bisect.insort(open_rows, (left, r))
    n = len(rows)
    tokens = np.full((n, seq_len), pad_id, dtype=np.int32)
    targets = np.full((n, seq_len), -100, dtype=np.int32)
    segments = np.full((n, seq_len), -1, dtype=np.int32)
    positions = np.zeros((n, seq_len), dtype=np.int32)
    for r, members in enumerate(rows):
        o = 0
        for j, k in enumerate(members):
            ids, mask = docs[k]
            a, m = np.asarray(ids, dtype=np.int64), np.asarray(mask, dtype=bool)
            L = len(a) - 1
            tokens[r, o:o + L] = a[:-1]
            targets[r, o:o + L] = np.where(m[1:], a[1:], -100)
            segments[r, o:o + L] = j
            positions[r, o:o + L] = np.arange(L)
            o += L
        positions[r, o:] = np.arange(seq_len - o)
    return PackedRows(tokens, targets, segments, positions, len(docs), truncated, dropped)


def attention_mask(segments: torch.Tensor) -> torch.Tensor:
    """(B, 1, T, T) bool, True = attend: same segment and not in the future (block-diagonal causal)."""
    T = segments.shape[-1]
    causal = torch.ones(T, T, dtype=torch.bool, device=segments.device).tril()
    return ((segments[:, :, None] == segments[:, None, :]) & causal).unsqueeze(1)


def row_batch(rows: PackedRows, idx) -> tuple[torch.Tensor, ...]:
    """(tokens, targets, segments, positions) of the given rows. The (B, 1, T, T) mask is made from
    the segments where the model runs (attention_mask), so only (B, T) tensors travel to the device."""
    idx = np.asarray(idx, dtype=np.int64)
    return (torch.from_numpy(rows.tokens[idx].astype(np.int64)), torch.from_numpy(rows.targets[idx].astype(np.int64)),
            torch.from_numpy(rows.segments[idx]), torch.from_numpy(rows.positions[idx].astype(np.int64)))


class PackedChats(SequenceBatches):
    """Pretraining's (seed, step) arithmetic (WindowOrder) over packed conversation rows instead of
    windows: `micro_batches` yields (tokens, targets, segments, positions)."""

    def __init__(self, rows: PackedRows, seed: int = 0):
        if len(rows) < 1:
            raise UsageError("--sft: no conversation with an assistant turn to train on")
        self.rows, self.seq_len, self.seed = rows, rows.tokens.shape[1], seed
        self.n_windows = len(rows)
        self.order = WindowOrder(self.n_windows, seed)

    def sequences(self, first: int, count: int):
        return row_batch(self.rows, self.order.consecutive(first, count))


def read_conversations(path: Path) -> list[list[dict]]:
    from llmctl.tasks import read_records, to_messages, where

    if not Path(path).is_file():
        raise UsageError(f"--sft: chats file not found: {path}")
    records = read_records(path)
    if not records:
        raise UsageError(f"--sft: {path} holds no records")
    return [to_messages(r, where(path, r, i)) for i, r in enumerate(records)]


class SFTData:
    """The packed train rows and held-out rows of a chats file: the trainer's batch source."""

    def __init__(self, opts: SFTOptions, seq_len: int, seed: int, on_log=lambda m: None):
        if not 0.0 <= opts.val_fraction < 1.0:
            raise UsageError(f"--val-fraction must lie in [0, 1), got {opts.val_fraction}")
        self.opts, self.seed = opts, seed
        self.init, self.tokenizer_file = opts.init, opts.tokenizer
        self.init_weights = opts.weights
        self.loader: PackedChats | None = None
        vocab = Vocab(opts.tokenizer)
        self.template = vocab.require_chat()
        self.vocab_size = vocab.size
        convs = read_conversations(opts.chats)
        n_val = 0
        if opts.val_fraction > 0:
            n_val = max(1, round(opts.val_fraction * len(convs)))
            if n_val >= len(convs):
                raise UsageError(f"--val-fraction {opts.val_fraction} leaves no training conversation of {len(convs)}")
        held = set(np.random.default_rng([seed, 0x5F7]).permutation(len(convs))[:n_val].tolist())
        encoded = self.template.encode_many(convs)
        self.train = pack([e for i, e in enumerate(encoded) if i not in held], seq_len, self.template.pad_id)
        self.val = pack([e for i, e in enumerate(encoded) if i in held], seq_len, self.template.pad_id) if n_val else None
        for name, part in (("train", self.train), ("val", self.val)):
            if part is None:
                continue
            if part.truncated:
                on_log(f"warning: {part.truncated} {name} conversation(s) longer than seq_len {seq_len} were truncated")
            if part.dropped:
                on_log(f"warning: {part.dropped} {name} conversation(s) have no assistant token to learn and were skipped")
        on_log(f"sft: {self.train.conversations:,} conversations in {len(self.train):,} rows of {seq_len} "
               f"({100 * self.train.fill:.1f}% filled, {self.train.loss_tokens:,} assistant tokens)"
               + (f"; {self.val.conversations:,} held out" if self.val else ""))
        self.has_val = self.val is not None

    def describe(self) -> dict:
        """What config.json records about the data."""
        o = self.opts
        return {"sft": str(o.chats), "tokenizer": str(o.tokenizer), "init": str(o.init) if o.init else None,
                **({"init_weights": o.weights} if o.init else {}),
                "val_fraction": o.val_fraction, "chat_template": self.template.name}

    def start(self, padded_vocab: int) -> None:
        self.loader = PackedChats(self.train, self.seed)

    def batch(self, step: int, batch_seqs: int, micro: int, dist):
        """Each micro-batch backpropagates its summed NLL · world / Z, Z = the assistant-token count
        of the whole global batch (all-reduced), so the gradient is NLL_total / Z whatever the
        micro-batch split and rank count (spec 001-posttrain-rl §A1)."""
        micro_batches = list(self.loader.micro_batches(step, batch_seqs, micro, dist.rank, dist.world))
        local = float(sum(int((y != -100).sum()) for _, y, _, _ in micro_batches))
        z, = distributed.all_reduce_sum([local], dist)
        scale = dist.world / max(z, 1.0)
        return micro_batches, [scale] * len(micro_batches), z

    def loss(self, model, batch, z_loss: float):
        """(summed token NLL [+ z-loss term], summed NLL, max logit) of one micro-batch."""
        x, y, segments, positions = batch
        loss, stats = model(x, y, z_loss=z_loss, reduction="sum", mask=attention_mask(segments), positions=positions)
        return loss, stats["ce"], stats["max_logit"]

    def validate(self, model, dist, micro: int, limit: int, autocast) -> dict:
        nll, n = distributed.all_reduce_sum(list(self._val_sums(model, micro, dist.device, autocast, dist.rank,
                                                                dist.world, limit)), dist)
        loss = nll / max(n, 1.0)
        return {"loss": round(loss, 6), "perplexity": round(math.exp(min(loss, 50.0)), 4), "tokens": int(n)}

    @torch.no_grad()
    def _val_sums(self, model, micro: int, device, autocast, rank: int, world: int,
                  max_rows: int | None = None) -> tuple[float, float]:
        """(summed NLL over assistant tokens, their count) on this rank's share of the held-out rows."""
        n = len(self.val) if max_rows is None else min(len(self.val), max_rows)
        mine = list(range(rank, n, world))
        nll, count = 0.0, 0.0
        was_training = model.training
        model.eval()
        for i in range(0, len(mine), micro):
            x, y, seg, pos = (t.to(device) for t in row_batch(self.val, mine[i:i + micro]))
            with autocast:
                _, stats = model(x, y, reduction="sum", mask=attention_mask(seg), positions=pos)
            nll += float(stats["ce"])
            count += float((y != -100).sum())
        model.train(was_training)
        return nll, count

    def step_record(self, step: int) -> dict:
        return {}

    def checkpoint_state(self) -> dict:
        """eval, generate and rl read this: the model speaks the chat template."""
        return {"chat": True, "chat_template": self.template.name}

    def manifest(self, val: dict | None) -> tuple[dict, list[dict], dict]:
        counts = {"conversations": self.train.conversations, "rows": len(self.train),
                  "truncated": self.train.truncated, "assistant_tokens_per_epoch": self.train.loss_tokens}
        if self.val is not None:
            counts["val_conversations"] = self.val.conversations
        counts.update({f"val_{k}": v for k, v in (val or {}).items()})
        return {"sft": self.describe()}, self._inputs(), counts

    def _inputs(self) -> list[dict]:
        """Manifest inputs: the chats file, and the --init checkpoint's run (its lineage) when it has one."""
        from llmctl.artifacts.checkpoint import owner_artifact
        from llmctl.artifacts.manifest import input_ref

        refs = [input_ref(self.opts.chats)]
        if self.opts.init is not None:
            refs.append(input_ref(owner_artifact(self.opts.init)))
        return refs


def resolve_sft(chats: Path, model_cfg, init: Path | None, tokenizer: Path | None, val_fraction: float,
                weights: str = "auto"):
    """(model config, SFTOptions): with --init the checkpoint's architecture and tokenizer."""
    from llmctl.artifacts.checkpoint import open_checkpoint, weights_file
    from llmctl.model.load import model_config

    if init is not None:
        ck = open_checkpoint(init)  # its metadata: the weights are read once, when the model is built
        path = ck.path
        weights_file(path, weights)  # --weights ema on a checkpoint without an EMA: say so before any work
        if ck.tokenizer_file is None:
            raise UsageError(f"--init {path}: the checkpoint has no tokenizer.json")
        if tokenizer is not None:
            raise UsageError("--tokenizer and --init exclude each other: the --init checkpoint's tokenizer is used")
        return model_config(ck), SFTOptions(Path(chats), ck.tokenizer_file, path, val_fraction, weights)
    if tokenizer is None:
        raise UsageError("--sft needs --init CKPT (a pretrained checkpoint) or --tokenizer for a fresh model")
    tok = Path(tokenizer)
    tok = tok / "tokenizer.json" if tok.is_dir() else tok
    if not tok.is_file():
        raise UsageError(f"--tokenizer: not found: {tokenizer}")
    return model_cfg, SFTOptions(Path(chats), tok, None, val_fraction)


def run_sft(chats: Path, out: Path, model_cfg, cfg, init: Path | None = None, tokenizer: Path | None = None,
            val_fraction: float = 0.0, val: Path | None = None, on_log=None, weights: str = "auto", **kw):
    """`llmctl train --sft CHATS`: fine-tune on conversations (the trainer's other keywords pass through);
    `weights`: which weights of the --init checkpoint start the run (auto: its EMA where it has one)."""
    model_cfg, opts = resolve_sft(chats, model_cfg, init, tokenizer, val_fraction, weights)
    cfg.check()
    if val:
        raise UsageError("--sft holds out --val-fraction of the conversations; --val is for pretraining")
    data = SFTData(opts, cfg.seq_len, cfg.seed, on_log or (lambda m: None))
    return fit(data, out, model_cfg, cfg, on_log=on_log, **kw)
