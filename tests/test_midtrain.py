"""Midtraining / continued pretraining: `train TOKENS --init CKPT [--init-optimizer]` under its own
schedule, the WSD decay branch, and a lineage with both parents. The test that matters: a run
stopped at the end of its stable phase and continued as a decay branch equals the run trained on
in one go, weight for weight."""

import json

import pytest
import torch

from conftest import llmctl
from test_train import SMALL, tokens  # noqa: F401  (tokens is a fixture)
from llmctl.model.load import load_checkpoint
from llmctl.torchrt.optim import lr_at

# 32 steps of 256 tokens; WSD: 1,024 warmup tokens, flat to 4,096, then linear to zero by 8,192
RUN = [*SMALL, "--max-tokens", "8192", "--schedule", "wsd", "--set", "train.cooldown_frac=0.5",
       "--set", "train.warmup_tokens=1024", "--checkpoint-every", "1000", "--eval-every", "1000"]


def test_decay_branch_schedule_is_the_wsd_cooldown():
    wsd = [lr_at(t, peak=1.0, total=8192, warmup=1024, schedule="wsd", cooldown_frac=0.5) for t in range(4352, 8193, 256)]
    branch = [lr_at(t, peak=1.0, total=4096, warmup=0, schedule="decay") for t in range(256, 4097, 256)]
    assert wsd == branch and branch[-1] == 0.0 and branch[0] == 1 - 1 / 16
    assert lr_at(1024, peak=1.0, total=4096, warmup=0, schedule="decay", cooldown="sqrt") == 0.5


def test_stable_phase_plus_decay_branch_equals_one_run(tokens, tmp_path):  # noqa: F811
    whole, stable, branch = tmp_path / "whole", tmp_path / "stable", tmp_path / "branch"
    llmctl("train", tokens / "train", "-o", whole, *RUN, check=True)
    llmctl("train", tokens / "train", "-o", stable, *RUN, "--max-steps", "16", check=True)
    p = llmctl("train", tokens / "train", "-o", branch, "--init", stable, "--init-optimizer", *SMALL[10:], "--schedule",
               "decay", "--max-tokens", "4096", "--checkpoint-every", "1000", "--eval-every", "1000", check=True)
    assert "from step 16 on" in p.stderr.decode()
    a, b = load_checkpoint(whole), load_checkpoint(branch)
    assert a.trainer_state["step"] == 32 and b.trainer_state["step"] == 16
    assert all(torch.equal(a.tensors[k], b.tensors[k]) for k in a.tensors)
    losses = lambda d: [r["loss"] for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines()) if "loss" in r]  # noqa: E731
    assert losses(branch) == losses(whole)[16:]
    inputs = json.loads((branch / "manifest.json").read_text())["inputs"]
    assert [i["kind"] for i in inputs] == ["tokens", "run"] and inputs[1]["path"] == str(stable.resolve())
    cfg = json.loads((branch / "config.json").read_text())
    assert cfg["init"].endswith("step-000016") and cfg["data_offset_steps"] == 16 and cfg["train"]["init_optimizer"]


def test_midtraining_on_other_data_starts_its_order_at_zero(tokens, tmp_path):  # noqa: F811
    stable, fresh = tmp_path / "stable", tmp_path / "fresh"
    llmctl("train", tokens / "train", "-o", stable, *SMALL, "--max-steps", "4", check=True)
    p = llmctl("train", tokens / "val", "-o", fresh, "--init", stable, *SMALL[10:], "--max-steps", "2", check=True)
    assert "from step" not in p.stderr.decode()  # the val artifact is other data: its order starts at 0
    assert json.loads((fresh / "config.json").read_text())["data_offset_steps"] == 0


def test_init_usage_errors(tokens, tmp_path):  # noqa: F811
    p = llmctl("train", tokens / "train", "-o", tmp_path / "a", *SMALL, "--init-optimizer")
    assert p.returncode == 2 and "--init-optimizer needs --init" in p.stderr.decode()
    p = llmctl("train", tokens / "train", "-o", tmp_path / "b", "--init", tmp_path / "missing", *SMALL[10:])
    assert p.returncode == 2 and "not found" in p.stderr.decode()
    stable = tmp_path / "stable"
    llmctl("train", tokens / "train", "-o", stable, *SMALL, "--max-steps", "1", check=True)
    (stable / "checkpoints" / "step-000001" / "tokenizer.json").write_text(
        (stable / "checkpoints" / "step-000001" / "tokenizer.json").read_text().replace('"<|pad|>"', '"<|pad2|>"'))
    p = llmctl("train", tokens / "train", "-o", tmp_path / "c", "--init", stable, *SMALL[10:])
    err = p.stderr.decode().strip()
    assert p.returncode == 2 and "its tokenizer is not the one" in err and len(err.splitlines()) == 1
    p = llmctl("train", tokens / "train", "-o", tmp_path / "d", "--init", stable, *SMALL)
    assert p.returncode == 2 and "--set model.* cannot change it" in p.stderr.decode()


@pytest.mark.parametrize("schedule", ["decay"])
def test_decay_is_a_train_schedule(schedule, tokens, tmp_path):  # noqa: F811
    run = tmp_path / "r"
    llmctl("train", tokens / "train", "-o", run, *SMALL, "--schedule", schedule, "--max-steps", "3", check=True)
    lrs = [r["lr"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "lr" in r]
    assert lrs == sorted(lrs, reverse=True) and lrs[0] < 3e-3  # no warmup: falling from the first step
