"""Run by tests/test_mixture.py under torchrun: each rank writes the micro-batches it trains on
in the first steps of a mixture, built as `llmctl train --data …` builds them.

argv: OUT_DIR STEPS SPEC_JSON, where SPEC_JSON holds {"train": TrainConfig fields, "sources":
[{name, path, weight, max_epochs}]}."""

import json
import sys
from pathlib import Path

import torch

from llmctl.torchrt import distributed
from llmctl.train.config import TrainConfig
from llmctl.train.mixture import DataSource
from llmctl.train.pretrain import PretrainData

out, steps, spec = Path(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
d = distributed.init("cpu")
with distributed.session(d):
    cfg = TrainConfig(**spec["train"])
    data = PretrainData([DataSource(**{**s, "path": Path(s["path"])}) for s in spec["sources"]], None, cfg, mixture=True)
    batch_seqs = cfg.batch_tokens // cfg.seq_len
    batches = [data.batch(s, batch_seqs, cfg.micro_batch, d)[0] for s in range(steps)]
    torch.save(batches, out / f"rank{d.rank}.pt")
