"""`llmctl embed --embedder llmctl:CKPT`: an llmctl checkpoint (or an imported model) as a text
encoder, and `make_embedder`, the one place an --embedder name becomes an Embedder (data/ cannot
import the model, so the checkpoint backend lives here and the command asks this module).

A document's vector is the mean of the model's final hidden states (after the final norm:
Transformer.hidden, what the head reads) over the document's tokens, in float32, not normalized.
The model reads the document after its start token (Vocab.doc_start: BOS where its prompts get
one, else the EOS that precedes every document in pretraining), which is not pooled: its state is
the same for every document. Documents are right-padded into a batch; attention is causal, so the
padding changes no real token's state and is left out of the mean. At most the context less that
start token is read (max_tokens); the rest is cut and counted (data/embedders.py).

Weights are chosen as inference chooses them (`auto`: the EMA where the run kept one); a LoRA
checkpoint is its base with the adapters merged, and its hash covers both.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from llmctl.artifacts.checkpoint import open_checkpoint, weights_file
from llmctl.artifacts.manifest import file_sha256
from llmctl.data.embedders import Embedder, open_embedder, register_backend
from llmctl.errors import UsageError
from llmctl.model.load import load_model, model_config, read_lora
from llmctl.model.lora import LORA_FILE
from llmctl.tokenizer.vocab import Vocab

WEIGHTS = "auto"  # as generate and eval load a checkpoint


@dataclass
class Loaded:
    model: Any
    vocab: Vocab


@dataclass(frozen=True)
class CheckpointEmbedder(Embedder):
    def load(self) -> Loaded:
        model, ck = load_model(self.path, "cpu", WEIGHTS, merge=True)
        if ck.tokenizer_file is None:
            raise UsageError(f"--embedder {self.name}: {ck.path} has no tokenizer.json")
        return Loaded(model, Vocab(ck.path))

    def measure(self, loaded: Loaded) -> tuple[int, int]:
        return loaded.model.cfg.d_model, loaded.model.cfg.max_seq_len - 1  # one position for the start token

    def embed(self, texts: list[str]) -> tuple[np.ndarray, list[bool]]:
        loaded = self.model()  # loaded outside inference mode: its weights stay ordinary tensors
        with torch.inference_mode():
            return self._pooled(loaded, texts)

    def _pooled(self, loaded: Loaded, texts: list[str]) -> tuple[np.ndarray, list[bool]]:
        clipped, cut = self.clip(texts)
        ids = loaded.vocab.encoder.encode_arrays(clipped)
        cut = [c or len(a) > self.max_tokens for c, a in zip(cut, ids)]
        ids = [a[: self.max_tokens] for a in ids]
        lengths = torch.tensor([len(a) for a in ids])
        width = 1 + int(lengths.max()) if len(ids) else 1
        tokens = torch.full((len(ids), width), loaded.vocab.pad_id, dtype=torch.long)
        tokens[:, 0] = loaded.vocab.doc_start
        for row, a in enumerate(ids):
            tokens[row, 1 : 1 + len(a)] = torch.from_numpy(a.astype(np.int64))
        hidden = loaded.model.hidden(tokens).float()[:, 1:]  # the start token's state is not the document's
        mask = (torch.arange(width - 1)[None, :] < lengths[:, None]).unsqueeze(-1)
        pooled = (hidden * mask).sum(1) / lengths.clamp(min=1)[:, None]
        return pooled.numpy().astype(np.float32, copy=False), cut


def checkpoint_embedder(spec: str, path: str) -> CheckpointEmbedder:
    """The embedder of the checkpoint `path` (a run, its checkpoints/ or a step directory), weights
    hashed and the architecture checked, nothing loaded yet."""
    ck = open_checkpoint(path)
    model_config(ck)  # a config.json that does not parse is one line here, before any work
    f, _ = weights_file(ck.path, WEIGHTS)
    digest = file_sha256(f)
    if (ck.path / LORA_FILE).is_file():  # the adapters mean nothing without their base
        _, base = read_lora(ck.path)
        digest = hashlib.sha256(f"{digest}\n{base['sha256']}".encode()).hexdigest()
    pooling = "mean of final-norm hidden states over the document's tokens, not normalized"
    return CheckpointEmbedder(spec, "llmctl", str(ck.path.resolve()), digest, pooling)


register_backend("llmctl", checkpoint_embedder)  # so that data/ can open one (open_embedder) once this is imported


def make_embedder(spec: str) -> Embedder:
    """The embedder an --embedder value names: minilm, sentence-transformers:MODEL, llmctl:CKPT."""
    return open_embedder(spec)


__all__ = ["CheckpointEmbedder", "checkpoint_embedder", "make_embedder"]
