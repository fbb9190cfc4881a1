"""Checkpoint → model (model/load.py): metadata reads no weights, and `train --init` (pretraining
and SFT) reads each weights file of the checkpoint once — counted at safetensors' load_file, the
one call that reads them."""

import collections
import os
from pathlib import Path

import pytest
import safetensors.torch

from test_train import SMALL, tokens  # noqa: F401  (tokens is a fixture)
from llmctl.artifacts import checkpoint
from llmctl.artifacts.checkpoint import open_checkpoint
from llmctl.cli import main
from llmctl.model.load import load_checkpoint, model_config
from llmctl.train.config import TrainConfig
from llmctl.train.mixture import DataSource
from llmctl.train.sft import resolve_sft
from llmctl.train.trainer import init_checkpoint


@pytest.fixture
def reads(monkeypatch):
    """{file name: [bytes of each read]} of every checkpoint weights file read from here on."""
    seen = collections.defaultdict(list)
    real = safetensors.torch.load_file

    def counted(filename, *a, **kw):
        seen[Path(filename).name].append(os.path.getsize(filename))
        return real(filename, *a, **kw)

    monkeypatch.setattr(checkpoint, "load_file", counted)
    return seen


def llmctl(*args):
    try:
        main(["--quiet", *map(str, args)])
    except SystemExit as e:
        assert not e.code, f"llmctl {' '.join(map(str, args))} exited {e.code}"


@pytest.fixture(scope="module")
def base(tokens, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("base") / "run"
    llmctl("train", tokens / "train", "-o", out, *SMALL, "--max-steps", "2")
    return out


def test_metadata_reads_no_weights(base, tokens, reads):  # noqa: F811
    ck = open_checkpoint(base)
    assert ck.step == 2 and ck.tokenizer_file is not None and model_config(ck).d_model == 64
    path, cfg, offset = init_checkpoint(base, [DataSource("train", tokens / "train")], TrainConfig())
    assert path == ck.path and cfg == model_config(ck) and offset == 0
    cfg, opts = resolve_sft(tokens / "chats.jsonl", None, base, None, 0.0)  # train --sft --init's set-up
    assert cfg == model_config(ck) and opts.tokenizer == ck.tokenizer_file
    assert not reads


def test_init_reads_each_weights_file_once(base, tokens, tmp_path, reads):  # noqa: F811
    llmctl("train", tokens / "train", "-o", tmp_path / "mid", "--init", base, *SMALL[10:], "--max-steps", "1")
    size = os.path.getsize(open_checkpoint(base).path / "model.safetensors")
    assert dict(reads) == {"model.safetensors": [size]}
    assert load_checkpoint(tmp_path / "mid").trainer_state["step"] == 1

