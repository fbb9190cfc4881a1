"""The pretraining batch source: windows of a tokens artifact (train/loader.py), validated on a
held-out tokens artifact in loss, perplexity and bits per byte, beside the unigram floor. With
`init` (a checkpoint) it is continued pretraining or midtraining: the run starts from those
weights, and its lineage names both parents, the data and the checkpoint's run.

Each micro-batch's mean token loss is weighted by its share of the rank's sequences, so the
accumulated gradient is the mean over the rank's batch whatever the micro-batch split.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from llmctl.artifacts.checkpoint import owner_artifact
from llmctl.artifacts.manifest import input_ref
from llmctl.artifacts.tokens import TokenDataset
from llmctl.eval.loss import evaluate_loss, summarize, token_byte_lengths, unigram_bits_per_byte
from llmctl.torchrt import distributed
from llmctl.torchrt.distributed import Dist
from llmctl.train.loader import PackedBatches


class PretrainData:
    def __init__(self, tokens: Path, val: Path | None, seq_len: int, seed: int,
                 on_log: Callable[[str], None] = lambda m: None, init: Path | None = None, offset: int = 0):
        self.init = init  # None: the seeded initialization
        self.offset = offset  # steps of this data a parent run (--init) already trained on
        self.train = TokenDataset(tokens, verify=True)  # every shard checked against its sha256 before step 1
        self.val = TokenDataset(val, verify=True) if val else None
        self.seq_len, self.seed, self.on_log = seq_len, seed, on_log
        self.vocab_size = self.train.vocab_size
        self.tokenizer_file = self._tokenizer_file()
        self.has_val = self.val is not None
        self.loader: PackedBatches | None = None
        self.token_bytes = self.unigram_bpb = None

    def _tokenizer_file(self) -> Path | None:
        for cand in (self.train.path / "tokenizer.json", self.train.manifest.config.get("tokenizer")):
            if cand and Path(cand).is_file():
                return Path(cand)
        return None

    def describe(self) -> dict:
        return {"tokens": str(self.train.path), "val": str(self.val.path) if self.val else None,
                "init": str(self.init) if self.init else None, "data_offset_steps": self.offset}

    def start(self, padded_vocab: int) -> None:
        self.loader = PackedBatches(self.train, self.seq_len, self.seed)
        if self.tokenizer_file:
            self.token_bytes = token_byte_lengths(self.tokenizer_file, padded_vocab)
        if self.val is not None and self.token_bytes is not None:
            # the floor a language model must clear: token frequencies alone (printed beside val bpb)
            self.unigram_bpb = unigram_bits_per_byte(self.train, self.val, self.token_bytes)
            self.on_log(f"unigram baseline on the validation tokens: {self.unigram_bpb:.4f} bits/byte")

    def batch(self, step: int, batch_seqs: int, micro: int, dist: Dist):
        per_rank = batch_seqs // dist.world
        micro_batches = list(self.loader.micro_batches(step + self.offset, batch_seqs, micro, dist.rank, dist.world))
        return micro_batches, [x.shape[0] / per_rank for x, _ in micro_batches], None

    def loss(self, model, batch, z_loss: float):
        x, y = batch
        loss, stats = model(x, y, z_loss=z_loss)
        return loss, stats["ce"], stats["max_logit"]

    def validate(self, model, dist: Dist, micro: int, limit: int, autocast) -> dict:
        sums = evaluate_loss(model, self.val, self.seq_len, self.token_bytes, batch_size=micro, max_windows=limit,
                             device=dist.device, autocast=autocast, rank=dist.rank, world=dist.world)
        keys = sorted(sums)
        total = distributed.all_reduce_sum([float(sums[k]) for k in keys], dist)
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in summarize(dict(zip(keys, total))).items()}

    def checkpoint_state(self) -> dict:
        return {}

    def manifest(self, val: dict | None) -> tuple[dict, list[dict], dict]:
        inputs = [input_ref(self.train.path)] + ([input_ref(self.val.path)] if self.val else [])
        if self.init is not None:  # the second parent: the run (or import) the weights come from
            inputs.append(input_ref(owner_artifact(self.init)))
        counts = {f"val_{k}": v for k, v in (val or {}).items()}
        if self.unigram_bpb is not None:
            counts["val_unigram_bits_per_byte"] = round(self.unigram_bpb, 6)
        return {}, inputs, counts
