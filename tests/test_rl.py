"""rl: the GRPO loop end to end on a tiny chat model — logging, rollouts, checkpoints, exact resume,
held-out accuracy, dynamic sampling."""

import json

import pyarrow.parquet as pq
import pytest

from conftest import llmctl
from llmctl.artifacts.checkpoint import load_checkpoint
from test_sft import SFT_ARGS, tok  # noqa: F401  (fixtures)
from test_train import SMALL, tokens  # noqa: F401

RL_ARGS = ["--steps", "2", "--prompts-per-step", "3", "-G", "4", "--max-new-tokens", "12", "--lr", "1e-3"]


@pytest.fixture(scope="module")
def sft_model(tokens, tmp_path_factory):  # noqa: F811
    """A base run, then a few SFT steps on sums so completions end in '#### n' sometimes."""
    d = tmp_path_factory.mktemp("rl")
    llmctl("train", tokens / "train", "-o", d / "base", *SMALL, "--max-steps", "3", check=True)
    with open(d / "sums.jsonl", "w") as f:
        for a in range(1, 40):
            f.write(json.dumps({"question": f"What is {a} plus {a % 7}?", "answer": f"{a} + {a % 7} = {a + a % 7}\n#### {a + a % 7}"}) + "\n")
    llmctl("train", "--sft", d / "sums.jsonl", "--init", d / "base", "-o", d / "sft", *SFT_ARGS[10:], check=True)
    # a reward this small model earns sometimes: "the completion contains a digit" (regex verifier)
    with open(d / "digits.jsonl", "w") as f:
        for a in range(1, 40):
            f.write(json.dumps({"prompt": f"What is {a} plus {a % 7}?", "answer": "[0-9]"}) + "\n")
    return d


def records(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_rl_end_to_end_logs_everything_the_spec_lists(sft_model, tmp_path):
    run = tmp_path / "rl"
    p = llmctl("rl", sft_model / "sft", "--prompts", sft_model / "digits.jsonl", "--verifier", "regex",
               "--eval", sft_model / "sums.jsonl", "-o", run, *RL_ARGS, "--json", check=True)
    assert json.loads(p.stdout)["counts"]["steps"] == 2
    recs = records(run)
    assert recs[0]["step"] == 0 and {"mean", "ci_low", "ci_high", "n"} <= set(recs[0]["eval"])
    step = recs[1]
    for key in ("reward_mean", "reward_std", "accuracy", "response_length", "truncation_rate", "zero_variance_share",
                "generate_s", "score_s", "train_s", "tokens_per_s", "groups_drawn"):
        assert key in step, key
    trained = [r for r in recs[1:] if r.get("updates")]
    assert trained, "no step had a group with different rewards"
    for key in ("entropy", "clip_frac", "ratio_gt2", "grad_norm", "trained_tokens"):
        assert key in trained[0], key
    assert 0 < trained[0]["zero_variance_share"] < 1 or trained[0]["groups_trained"] > 0
    rows = pq.read_table(run / "rollouts" / "step-000001.parquet").to_pylist()
    assert len(rows) == step["groups_drawn"] * 4
    assert {"prompt", "completion", "reward", "advantage", "length", "truncated", "step"} <= set(rows[0])
    ck = load_checkpoint(run)
    assert ck.trainer_state["step"] == 2 and ck.trainer_state["chat"] is True
    llmctl("plot", run, "-o", tmp_path / "plots", check=True)
    assert {"reward.png", "accuracy.png", "entropy.png", "length.png"} <= {p.name for p in (tmp_path / "plots").iterdir()}


def test_rl_resume_repeats_the_uninterrupted_run(sft_model, tmp_path):
    full, cut = tmp_path / "full", tmp_path / "cut"
    args = ["rl", sft_model / "sft", "--prompts", sft_model / "digits.jsonl", "--verifier", "regex", *RL_ARGS, "-q"]
    llmctl(*args, "-o", full, check=True)
    llmctl(*[a if a != "2" else "1" for a in args], "-o", cut, check=True)  # --steps 1
    llmctl(*args, "-o", cut, "--resume", check=True)
    drop = ("generate_s", "score_s", "train_s", "tokens_per_s")
    strip = lambda rs: [{k: v for k, v in r.items() if k not in drop} for r in rs]
    assert strip(records(full)) == strip(records(cut))
    assert any(r.get("updates") for r in records(full))  # the resumed step trained, not just sampled
    a = pq.read_table(full / "rollouts" / "step-000002.parquet").to_pylist()
    assert a == pq.read_table(cut / "rollouts" / "step-000002.parquet").to_pylist()
    assert (full / "checkpoints" / "step-000002" / "model.safetensors").read_bytes() == \
        (cut / "checkpoints" / "step-000002" / "model.safetensors").read_bytes()


def test_rl_usage_errors(sft_model, tmp_path):
    p = llmctl("rl", sft_model / "sft", "--prompts", sft_model / "sums.jsonl", "-o", tmp_path / "r", "--kl", "k3")
    assert p.returncode == 2 and "kl-coef" in p.stderr.decode()
    p = llmctl("rl", sft_model / "sft", "--prompts", tmp_path / "missing.jsonl", "-o", tmp_path / "r")
    assert p.returncode == 2 and "not found" in p.stderr.decode()
    p = llmctl("rl", sft_model / "sft", "--prompts", sft_model / "sums.jsonl", "-o", tmp_path / "r", "--adv-std", "zz")
    assert p.returncode == 2 and "adv_std" in p.stderr.decode()
