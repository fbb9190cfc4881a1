"""The rollout/trainer log-prob gap and rollout importance weights (issue 33): rl compares the
engine's log-probs of the sampled tokens with the trainer's, logs the gap, and with
--is-correction tis|mis weighs each token's policy-gradient term by a truncated (or masked)
importance ratio, as TRL and verl do."""

import math

import pytest
import torch

from conftest import llmctl
from llmctl.errors import UsageError
from llmctl.rl.config import RLConfig
from llmctl.rl.grpo import IS_CAP, aggregate, clipped_surrogate, importance_weights, per_token_loss
from llmctl.rl.rollout import Sample, sequence_batch
from test_rl import RL_ARGS, records, sft_model  # noqa: F401  (fixtures)
from test_sft import tok  # noqa: F401
from test_train import tokens  # noqa: F401

# Two responses of 4 and 2 scored tokens. Row 0's ratios π_train/π_rollout are 1, 3, 1/2, 3/2; row 1's
# are 5/2 and e^-8, then two padding positions whose log-probs are garbage and must count for nothing.
TRAIN = torch.tensor([[-1.0, -2.0, -0.5, -0.7], [-0.2, -9.0, -50.0, 0.0]])
ROLLOUT = torch.tensor([[-1.0, -2.0 - math.log(3), -0.5 + math.log(2), -0.7 - math.log(1.5)],
                        [-0.2 - math.log(2.5), -1.0, 0.0, -40.0]])
MASK = torch.tensor([[1.0, 1, 1, 1], [1, 1, 0, 0]])


def test_weights_and_gap_by_hand():
    e8 = math.exp(-8)
    expected = {"none": [[1, 1, 1, 1], [1, 1, 0, 0]],
                "tis": [[1, 2, 0.5, 1.5], [2, e8, 0, 0]],  # min(r, 2)
                "mis": [[1, 0, 0.5, 1.5], [0, e8, 0, 0]]}  # r, or 0 where r > 2
    for mode, w_hand in expected.items():
        w, stats = importance_weights(TRAIN, ROLLOUT, mode, 2.0, MASK)
        assert torch.allclose(w, torch.tensor(w_hand, dtype=torch.float32), rtol=1e-5, atol=1e-9), (mode, w)
        assert not w.requires_grad
        # |log r| over the 6 scored tokens: 0, ln 3, ln 2, ln 1.5, ln 2.5, 8
        assert stats["gap_sum"] == pytest.approx(math.log(3 * 2 * 1.5 * 2.5) + 8, rel=1e-6)
        assert stats["gap_max"] == pytest.approx(8.0, rel=1e-6)
        assert stats["tokens"] == 6
        assert stats["capped"] == 2  # ratios 3 and 2.5 exceed the cap: truncated (tis) or masked (mis)
        assert stats["weight_sum"] == pytest.approx(sum(map(sum, w_hand)), rel=1e-5)
    with pytest.raises(ValueError):
        importance_weights(TRAIN, ROLLOUT, "zz", 2.0, MASK)


def test_a_far_apart_token_keeps_a_finite_weight():
    """A log-ratio of 200 (a token the engine nearly never samples) overflows exp in float32; it is
    clamped at 20 first (verl's safety bound), so tis caps it and mis masks it, never inf or nan."""
    train, rollout, mask = torch.tensor([[0.0, -1.0]]), torch.tensor([[-200.0, -1.0]]), torch.ones(1, 2)
    for mode, first in (("tis", 3.0), ("mis", 0.0), ("none", 1.0)):
        w, stats = importance_weights(train, rollout, mode, 3.0, mask)
        assert w.tolist() == [[first, 1.0]], mode
        assert stats["gap_max"] == 200.0 and stats["capped"] == 1
    w, _ = importance_weights(rollout, train, "tis", 3.0, mask)  # the other way: the weight is ~0, not nan
    assert torch.isfinite(w).all() and w[0, 0] < 1e-8


def test_the_weight_multiplies_the_surrogate_and_not_the_kl_term():
    """Token-mean loss at μ = 1 (π_old = π detached, so ρ = 1 and the surrogate is A per token) with
    tis, against the hand computation: L = Σ_t (−w_t·A_i + β·kl_t) / n_tokens, and ∂L/∂logp_t =
    (−w_t·A_i + β·∂kl_t/∂logp_t) / n_tokens."""
    logp = TRAIN.clone().requires_grad_(True)
    adv = torch.tensor([[0.5], [-1.0]])

    def loss_with(mode):
        objective, _, ratio = clipped_surrogate(logp, logp.detach(), adv, 0.2, 0.28)
        assert torch.allclose(ratio, torch.ones_like(ratio))
        w, _ = importance_weights(logp.detach(), ROLLOUT, mode, 2.0, MASK)
        kl = 0.5 * (logp - TRAIN + 0.1).pow(2)  # a k2-shaped term with a nonzero value and gradient
        loss = aggregate(per_token_loss(objective, w, kl, 0.3), MASK, "token-mean", 2, 6, 4)
        loss.backward()
        return loss, objective

    loss, objective = loss_with("tis")
    w_hand = torch.tensor([[1, 2, 0.5, 1.5], [2, math.exp(-8), 0, 0]])
    kl_hand, dkl_hand = 0.5 * 0.01, 0.1  # at logp = TRAIN: ½·0.1², ∂/∂logp = 0.1
    hand = (-(w_hand * adv) + 0.3 * kl_hand) * MASK
    assert loss.item() == pytest.approx(float(hand.sum()) / 6, rel=1e-5)
    grad_hand = (-(w_hand * adv) + 0.3 * dkl_hand) * MASK / 6
    assert torch.allclose(logp.grad, grad_hand, rtol=1e-5, atol=1e-7)
    # mis: the masked tokens (ratios 3 and 2.5) carry only their KL term
    logp.grad = None
    loss_with("mis")
    assert float(logp.grad[0, 1]) == pytest.approx(0.3 * dkl_hand / 6, rel=1e-5)
    assert float(logp.grad[1, 0]) == pytest.approx(0.3 * dkl_hand / 6, rel=1e-5)
    # no weight, no KL: the plain surrogate
    assert torch.equal(per_token_loss(objective), -objective)


def _sample(prompt, completion, lps):
    return Sample(0, 0, prompt, completion, "", 0.0, None, False, False, lps)


def test_rollout_logprobs_sit_where_their_tokens_are_targets():
    a = _sample([5, 6, 7], [8, 9], [-0.1, -0.2])
    b = _sample([5], [8, 9, 10, 2], [-1.0, -2.0, -3.0, -4.0])
    inputs, targets, mask, rollout = sequence_batch([a, b])
    assert targets.tolist() == [[-100, -100, 8, 9], [8, 9, 10, 2]]
    assert rollout.dtype == torch.float32
    assert torch.equal(rollout, torch.tensor([[0, 0, -0.1, -0.2], [-1, -2, -3, -4]]))
    assert torch.equal(rollout != 0, mask.bool())
    with pytest.raises(ValueError, match="2 rollout log-probs for 3 completion ids"):
        sequence_batch([_sample([5], [8, 9, 10], [-1.0, -2.0])])


def test_config_checks_the_correction_and_its_cap():
    assert RLConfig().is_correction == "none" and RLConfig().is_cap == IS_CAP == 2.0
    RLConfig(is_correction="tis", is_cap=1.0).check()
    with pytest.raises(UsageError) as e:
        RLConfig(is_correction="zz").check()
    assert str(e.value) == "rl: is_correction must be one of none, tis, mis, got 'zz'"
    with pytest.raises(UsageError, match="is_cap must be >= 1"):
        RLConfig(is_correction="mis", is_cap=0.5).check()


def test_rl_logs_the_gap_and_applies_tis_and_mis(sft_model, tmp_path):  # noqa: F811
    """End to end on a tiny chat model: every trained step logs the gap between the engine's and the
    trainer's log-probs, which for the same fp32 model on one machine is float rounding; tis and mis
    log their weights (all ≈ 1, none capped at 2), and tis's update is then none's; mis with
    --epochs 2 takes π_old from the recomputed old log-probs."""
    args = ["rl", sft_model / "sft", "--prompts", sft_model / "digits.jsonl", "--verifier", "regex", *RL_ARGS, "-q"]
    runs = {}
    for name, extra in (("none", []), ("tis", ["--is-correction", "tis"]),
                        ("mis", ["--is-correction", "mis", "--is-cap", "3", "--epochs", "2"])):
        llmctl(*args, *extra, "-o", tmp_path / name, check=True)
        runs[name] = [r for r in records(tmp_path / name) if r.get("updates")]
        assert runs[name], name
        for r in runs[name]:
            assert 0 <= r["logprob_gap_mean"] <= r["logprob_gap_max"] < 1e-5, (name, r)
    assert all(not any(k.startswith("is_") for k in r) for r in runs["none"])
    for r in runs["tis"]:
        assert r["is_weight_mean"] == pytest.approx(1.0, abs=1e-5) and r["is_truncated_frac"] == 0
    for r in runs["mis"]:
        assert r["is_weight_mean"] == pytest.approx(1.0, abs=1e-5) and r["is_masked_frac"] == 0 and r["updates"] == 2
    first_none, first_tis = runs["none"][0], runs["tis"][0]
    assert first_none["step"] == first_tis["step"] and first_none["reward_mean"] == first_tis["reward_mean"]
    assert first_tis["grad_norm"] == pytest.approx(first_none["grad_norm"], rel=1e-4)


def test_bfloat16_rollouts_open_a_gap_that_tis_truncates(sft_model, tmp_path):  # noqa: F811
    """Rollouts from a bfloat16 copy of the policy (--gen-dtype) score their tokens with bf16
    rounding: the gap is orders of magnitude above fp32's. With the cap at 1, tis truncates the tokens
    the trainer finds likelier than the engine did (weight 1) and keeps the others' ratios, each at
    least exp(−gap_max): a token off by any amount is truncated or weighs below 1."""
    llmctl("rl", sft_model / "sft", "--prompts", sft_model / "digits.jsonl", "--verifier", "regex", *RL_ARGS, "-q",
           "--gen-dtype", "bfloat16", "--is-correction", "tis", "--is-cap", "1", "-o", tmp_path / "bf16", check=True)
    trained = [r for r in records(tmp_path / "bf16") if r.get("updates")]
    assert trained
    for r in trained:
        assert 1e-4 < r["logprob_gap_mean"] <= r["logprob_gap_max"], r
        assert math.exp(-r["logprob_gap_max"]) <= r["is_weight_mean"] <= 1 and 0 <= r["is_truncated_frac"] <= 1, r
        assert r["is_truncated_frac"] > 0 or r["is_weight_mean"] < 1, r


def test_rl_refuses_a_bad_correction_or_cap_in_one_line(sft_model, tmp_path):  # noqa: F811
    base = ["rl", sft_model / "sft", "--prompts", sft_model / "digits.jsonl", "-o", tmp_path / "r"]
    for extra, line in ((["--is-correction", "zz"], "llmctl: error: rl: is_correction must be one of none, tis, mis, got 'zz'"),
                        (["--is-cap", "0.5"], "llmctl: error: --is-cap must be >= 1, got 0.5")):
        p = llmctl(*base, *extra)
        assert p.returncode == 2 and p.stderr.decode().strip() == line, p.stderr.decode()
    assert not (tmp_path / "r").exists()
