"""llmctl train-rm: the Bradley–Terry loss on given rewards (value, margin, gradient sign), a run
whose held-out accuracy lands in the manifest, the checkpoint read back as a scorer that gives the
rewards training computed, bitwise resume, and one-line errors."""

import json
import math

import pytest
import torch

from conftest import llmctl
from preflib import SUBJECTS, final_weights, make_checkpoint, metrics, train_config, write_jsonl
from llmctl.errors import UsageError
from llmctl.model.reward import SCORE
from llmctl.train.reward_model import bt_loss, load_reward_model, run_train_rm


def records(n: int, seed: int = 3) -> list[dict]:
    """Learnable pairs: chosen names a subject, rejected answers in a fixed refusal."""
    import random

    rng = random.Random(seed)
    return [{"prompt": f"Name a subject, number {i}.", "chosen": rng.choice(SUBJECTS), "rejected": "I will not say.",
             **({"margin": 0.5} if i % 2 else {})} for i in range(n)]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    d = tmp_path_factory.mktemp("rm")
    ck, tok = make_checkpoint(d)
    write_jsonl(d / "pairs.jsonl", records(60))
    return d, ck, tok


def test_bt_loss_by_hand():
    r_c = torch.tensor([1.5, 0.0], requires_grad=True)
    r_r = torch.tensor([0.5, 0.0], requires_grad=True)
    loss = bt_loss(r_c, r_r)
    assert loss.tolist() == pytest.approx([math.log(1 + math.exp(-1.0)), math.log(2)])  # −log σ(1) = 0.3132617
    assert float(loss[0].detach()) == pytest.approx(0.3132616875, abs=1e-7)
    loss.sum().backward()
    assert r_c.grad.tolist() == pytest.approx([-1 / (1 + math.e), -0.5])  # −σ(−d): up the chosen reward
    assert r_r.grad.tolist() == pytest.approx([1 / (1 + math.e), 0.5])
    # Llama 2's margin: the pair must win by m; at d = m the loss is log 2
    assert float(bt_loss(torch.tensor(1.5), torch.tensor(0.5), torch.tensor(1.0))) == pytest.approx(math.log(2))


def test_rm_learns_and_scores(base, tmp_path):
    d, ck, tok = base
    m = run_train_rm(d / "pairs.jsonl", ck, tmp_path / "rm", train_config(lr=3e-3), val_fraction=0.2, epochs=4)
    assert m.stage == "train-rm" and m.counts["val_pairs"] == 12 and m.counts["pairs"] == 48
    assert m.counts["val_pref_accuracy"] >= 0.9, m.counts
    recs = metrics(tmp_path / "rm")
    assert recs[-1]["loss"] < recs[0]["loss"]
    scorer = load_reward_model(tmp_path / "rm")
    prompts = ["Name a subject, number 999."] * 2
    good, bad = scorer.score(prompts, ["the miller", "I will not say."])
    assert good > bad
    # the scorer reads the rewards training computes: the same rendering, the same last token
    from llmctl.train.pairs import PairOptions
    from llmctl.train.reward_model import RMData

    data = RMData(PairOptions(d / "pairs.jsonl", ck, tok), 64, 0)
    x, last, _ = data._rows([0])
    with torch.no_grad():
        r = scorer.model(x, last)
    rec = records(60)[0]
    assert scorer.score([rec["prompt"]] * 2, [rec["chosen"], rec["rejected"]]) == pytest.approx(r.tolist(), abs=1e-5)


def test_rm_resume_is_bitwise(base, tmp_path):
    d, ck, tok = base
    run_train_rm(d / "pairs.jsonl", ck, tmp_path / "a", train_config(max_steps=6, checkpoint_every=2), val_fraction=0.2)
    run_train_rm(d / "pairs.jsonl", ck, tmp_path / "b", train_config(max_steps=2, checkpoint_every=2), val_fraction=0.2)
    run_train_rm(d / "pairs.jsonl", ck, tmp_path / "b", train_config(max_steps=6, checkpoint_every=2), val_fraction=0.2,
                 resume=True)
    keys = ("loss", "pref_accuracy", "reward_margin", "grad_norm")
    assert [[r[k] for k in keys] for r in metrics(tmp_path / "a")] == [[r[k] for k in keys] for r in metrics(tmp_path / "b")]
    wa, wb = final_weights(tmp_path / "a"), final_weights(tmp_path / "b")
    assert SCORE in wa and wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_language_model_is_not_a_scorer(base):
    _, ck, _ = base
    with pytest.raises(UsageError, match="not a reward model"):
        load_reward_model(ck)


def test_cli_train_rm(base, tmp_path):
    d, ck, tok = base
    p = llmctl("train-rm", ck, "--pairs", d / "pairs.jsonl", "-o", tmp_path / "rm", "--seq-len", "64",
               "--batch-pairs", "8", "--micro-batch", "8", "--max-steps", "2", "--threads", "1", "--json", "-q", check=True)
    out = json.loads(p.stdout)
    assert out["stage"] == "train-rm" and "val_pref_accuracy" in out["counts"]
    write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "a", "chosen": "", "rejected": "b"}])
    p = llmctl("train-rm", ck, "--pairs", tmp_path / "bad.jsonl", "-o", tmp_path / "rm2")
    err = p.stderr.decode().strip()
    assert p.returncode == 2 and len(err.splitlines()) == 1 and "bad.jsonl:1: chosen is empty" in err


def test_rl_reward_model_adds_its_score_logged_apart(base, tmp_path):
    import pyarrow.parquet as pq

    d, ck, _ = base
    run_train_rm(d / "pairs.jsonl", ck, tmp_path / "rm", train_config(max_steps=2), val_fraction=0.2)
    write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": f"Name a subject, number {i}.", "answer": "[a-z]"} for i in range(4)])
    run = tmp_path / "rl"
    llmctl("rl", ck, "--prompts", tmp_path / "prompts.jsonl", "--verifier", "regex", "--reward-model", tmp_path / "rm",
           "--reward-model-coef", "0.5", "--verifier-coef", "2", "-o", run, "--steps", "1", "--prompts-per-step", "2",
           "-G", "2", "--max-new-tokens", "6", "--headroom-limit", "0", "--no-dynamic-sampling", "-q", check=True)
    step = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()][-1]
    assert "rm_score_mean" in step and "verifier_reward_mean" in step
    rows = pq.read_table(run / "rollouts" / "step-000001.parquet").to_pylist()
    scorer = load_reward_model(tmp_path / "rm")
    scores = scorer.score([r["prompt"] for r in rows], [r["completion"] for r in rows])
    for r, s in zip(rows, scores):
        assert r["rm_score"] == pytest.approx(s, abs=1e-5)
        if not r["truncated"]:
            assert r["reward"] == pytest.approx(2 * r["verifier_reward"] + 0.5 * r["rm_score"])
    assert step["rm_score_mean"] == pytest.approx(sum(scores) / len(scores), abs=1e-5)
    p = llmctl("rl", ck, "--prompts", tmp_path / "prompts.jsonl", "--verifier-coef", "0", "-o", tmp_path / "rl2")
    assert p.returncode == 2 and "--reward-model" in p.stderr.decode()
