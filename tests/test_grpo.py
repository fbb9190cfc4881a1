"""GRPO arithmetic against spec 001-posttrain-rl §C: advantages, the clip rule, aggregation, KL."""

import math

import pytest
import torch

from llmctl.rl.grpo import advantages, aggregate, clipped_surrogate, kl_estimate, rloo_advantages


def test_worked_advantages_g8_one_correct():
    r = torch.tensor([[1.0, 0, 0, 0, 0, 0, 0, 0]])
    expect = {"group": (2.646, -0.378), "group-bessel": (2.475, -0.354), "none": (0.875, -0.125)}
    for std, (hi, lo) in expect.items():
        a = advantages(r, std)
        assert (round(a[0, 0].item(), 3), round(a[0, 1].item(), 3)) == (hi, lo)
        assert a.sum().item() == pytest.approx(0, abs=1e-6)
    a = rloo_advantages(r)
    assert (round(a[0, 0].item(), 3), round(a[0, 1].item(), 3)) == (1.0, -0.143)


def test_seven_of_eight_correct_and_zero_variance_group():
    a = advantages(torch.tensor([[1.0] * 7 + [0.0], [1.0] * 8]), "group")
    assert round(a[0, 7].item(), 2) == -2.65  # C5
    assert torch.all(a[1] == 0)  # all equal: no signal, no gradient


def test_zero_variance_group_contributes_no_gradient():
    logp = torch.log(torch.full((4, 3), 0.3)).requires_grad_()
    adv = advantages(torch.tensor([[1.0, 1.0, 1.0, 1.0]]), "group").T  # (4, 1)
    obj, _, _ = clipped_surrogate(logp, logp.detach(), adv, 0.2, 0.28)
    aggregate(-obj, torch.ones(4, 3), "token-mean", 4, 12, 3).backward()
    assert torch.all(logp.grad == 0)


def test_clip_rule_zeroes_the_right_tokens():
    old = torch.log(torch.tensor([0.02, 0.02, 0.02, 0.02]))
    new = torch.log(torch.tensor([0.024, 0.0256, 0.027, 0.015])).requires_grad_()
    pos = torch.ones(4)
    obj, zero, ratio = clipped_surrogate(new, old, pos, 0.2, 0.28)
    # C7: with A > 0 the gradient dies past 1 + ε_high: 0.0256 = 0.02·1.28 is the last live value
    assert zero.tolist() == [False, False, True, False]
    obj.sum().backward()
    assert new.grad[2] == 0 and new.grad[0] != 0
    obj, zero, _ = clipped_surrogate(new.detach(), old, -pos, 0.2, 0.28)
    # A < 0: dies below 1 − ε_low (0.015/0.02 = 0.75 < 0.8); increases are never clipped
    assert zero.tolist() == [False, False, False, True]


def test_aggregation_worked_example_c3():
    # G = 4, rewards (1,1,0,0), lengths 100, 100, 100, 1000; per-token weights on the wrong answers
    lengths = [100, 100, 100, 1000]
    adv = advantages(torch.tensor([[1.0, 1, 0, 0]]), "group")[0]
    T = max(lengths)
    mask = torch.zeros(4, T)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    weights = {}
    for mode in ("seq-mean-token-mean", "token-mean", "seq-sum-const"):
        logp = torch.zeros(4, T, requires_grad=True)
        obj, _, _ = clipped_surrogate(logp, logp.detach(), adv[:, None], 0.2, 0.28)
        aggregate(obj, mask, mode, 4, sum(lengths), 4096).backward()
        weights[mode] = (logp.grad[2, 0].item(), logp.grad[3, 0].item())
    assert weights["seq-mean-token-mean"] == pytest.approx((-0.0025, -0.00025))
    assert weights["token-mean"] == pytest.approx((-1 / 1300, -1 / 1300))
    dr = advantages(torch.tensor([[1.0, 1, 0, 0]]), "none")[0]
    logp = torch.zeros(4, T, requires_grad=True)
    obj, _, _ = clipped_surrogate(logp, logp.detach(), dr[:, None], 0.2, 0.28)
    aggregate(obj, mask, "seq-sum-const", 4, sum(lengths), 4096).backward()
    assert logp.grad[3, 0].item() == pytest.approx(-0.5 / 16384)  # Dr. GRPO, Z = 4·4096


def test_kl_estimators_on_an_enumerated_softmax():
    """C8: E[k3] = KL(π‖π_ref); E[∇k1] = 0; E[∇k2] = ∇KL(π‖π_ref); E[∇k3] = ∇KL(π_ref‖π)."""
    g = torch.Generator().manual_seed(0)
    z = torch.randn(20, generator=g, dtype=torch.float64, requires_grad=True)
    ref = torch.log_softmax(torch.randn(20, generator=g, dtype=torch.float64), 0)
    def expectation(kind):
        logp = torch.log_softmax(z, 0)
        p = logp.exp().detach()  # samples come from π: the expectation weights are not differentiated
        return (p * kl_estimate(logp, ref, kind)).sum()
    def reverse():
        logp = torch.log_softmax(z, 0)
        return (logp.exp() * (logp - ref)).sum()
    def forward():
        return (ref.exp() * (ref - torch.log_softmax(z, 0))).sum()
    assert expectation("k3").item() == pytest.approx(reverse().item(), rel=1e-12)
    grads = {k: torch.autograd.grad(expectation(k), z)[0] for k in ("k1", "k2", "k3")}
    assert grads["k1"].abs().max().item() < 1e-12
    assert torch.allclose(grads["k2"], torch.autograd.grad(reverse(), z)[0], atol=1e-12)
    assert torch.allclose(grads["k3"], torch.autograd.grad(forward(), z)[0], atol=1e-12)


@pytest.mark.parametrize("std,agg", [("group", "seq-mean-token-mean"), ("none", "seq-sum-const"), ("batch", "token-mean")])
def test_tabular_bandit_learns_the_right_arm(std, agg):
    """Spec 002-rl §F, CI tier 2: a softmax policy over 5 arms, trained by these functions alone
    (group advantages, clipped surrogate, aggregation, Adam), reaches P(right arm) > 0.9 within 100
    steps; the same loop with every reward equal leaves the policy where it started."""
    def train(reward_of):
        gen = torch.Generator().manual_seed(0)
        logits = torch.zeros(5, requires_grad=True)
        opt = torch.optim.Adam([logits], lr=0.05)
        for step in range(100):
            probs = torch.softmax(logits.detach(), -1)
            if probs[3] > 0.9:
                return step, probs
            arms = torch.multinomial(probs, 4 * 8, replacement=True, generator=gen).view(4, 8)  # 4 groups of G = 8
            adv = advantages(reward_of(arms), std)
            logp = torch.log_softmax(logits, -1)[arms][..., None]  # one token per response
            obj, _, _ = clipped_surrogate(logp, logp.detach(), adv[..., None], 0.2, 0.28)
            loss = aggregate(-obj.view(32, 1), torch.ones(32, 1), agg, 32, 32, 1)
            opt.zero_grad()
            loss.backward()
            opt.step()
        return 100, torch.softmax(logits.detach(), -1)

    steps, probs = train(lambda arms: (arms == 3).float())
    assert steps < 100 and probs[3] > 0.9
    _, flat = train(lambda arms: torch.ones_like(arms, dtype=torch.float))
    assert torch.allclose(flat, torch.full((5,), 0.2))
