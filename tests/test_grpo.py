"""GRPO arithmetic against spec 001-posttrain-rl §C: advantages, the clip rule, aggregation, KL."""

import math

import pytest
import torch

from llmctl.rl.grpo import advantages, aggregate, clipped_surrogate, kl_estimate, rloo_advantages, sequence_ratio


def test_worked_advantages_g8_one_correct():
    r = torch.tensor([[1.0, 0, 0, 0, 0, 0, 0, 0]])
    expect = {"group": (2.646, -0.378), "group-bessel": (2.475, -0.354), "none": (0.875, -0.125)}
    for std, (hi, lo) in expect.items():
        a = advantages(r, std)
        assert (round(a[0, 0].item(), 3), round(a[0, 1].item(), 3)) == (hi, lo)
        assert a.sum().item() == pytest.approx(0, abs=1e-6)
    a = rloo_advantages(r)
    assert (round(a[0, 0].item(), 3), round(a[0, 1].item(), 3)) == (1.0, -0.143)


def test_rloo_worked_by_hand_with_masked_samples():
    a = rloo_advantages(torch.tensor([[1.0, 0, 0, 1]]))
    # A_0 = 1 − (0 + 0 + 1)/3, A_1 = 0 − (1 + 0 + 1)/3
    assert a[0].tolist() == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])
    # the last sample masked: its reward (99, never read) leaves the baseline, which runs over G_valid = 3
    r = torch.tensor([[1.0, 0, 1, 99], [1.0, 0, 0, 0], [1.0, 5, 0, 0]])
    valid = torch.tensor([[True, True, True, False], [True, True, True, True], [False, True, False, False]])
    a = rloo_advantages(r, valid)
    assert a[0].tolist() == pytest.approx([1 - 1 / 2, 0 - 2 / 2, 1 - 1 / 2, 0])
    assert a[1].tolist() == pytest.approx([1, -1 / 3, -1 / 3, -1 / 3])
    assert a[2].tolist() == [0, 0, 0, 0]  # one valid sample: no one left to be its baseline
    # filling the masked reward with the group mean (what grpo does) would give A_0 = 1 − (0 + 1 + 2/3)/3 = 4/9
    assert rloo_advantages(torch.tensor([[1.0, 0, 1, 2 / 3]]))[0, 0].item() == pytest.approx(4 / 9)


def test_sequence_ratio_is_the_geometric_mean_over_scored_tokens():
    old = torch.zeros(2, 3)
    logp = torch.tensor([[0.1, 0.3, 7.0], [-0.4, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1, 0], [1, 0, 0]])  # the padding's 7.0 must not count
    assert sequence_ratio(logp, old, mask)[:, 0].tolist() == pytest.approx([math.exp(0.2), math.exp(-0.4)])


def test_gspo_gradient_at_ratio_one_is_a_over_length_per_token():
    """With π_old = π (one pass) the GSPO gradient is A_i·(1/|y_i|)·Σ_t ∇log π(y_t): under
    seq-mean-token-mean every scored token of response i gets A_i/(|y_i|·n_seqs), as GRPO's would."""
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])
    adv = torch.tensor([[1.0], [-2.0], [0.5]])
    logp = torch.log(torch.tensor([[0.3, 0.5, 0.2, 0.9], [0.1, 0.7, 0.4, 0.4], [0.6, 0.2, 0.2, 0.2]])).requires_grad_()
    obj, zero, ratio = clipped_surrogate(logp, logp.detach(), adv, 0.2, 0.28, "sequence", mask)
    assert torch.all(ratio == 1) and not zero.any()
    aggregate(obj, mask, "seq-mean-token-mean", 3, int(mask.sum()), 4).backward()
    expect = adv / mask.sum(-1, keepdim=True) / 3 * mask  # A_i/|y_i| over 3 responses, 0 on padding
    assert torch.allclose(logp.grad, expect)
    assert logp.grad[0, 0].item() == pytest.approx(1 / 12) and logp.grad[1, 0].item() == pytest.approx(-1 / 3)


def test_gspo_token_form_is_the_sequence_objective():
    """GSPO-token under seq-mean-token-mean has the value and gradient of GSPO's objective
    (1/N)·Σ_i min(s_i·A_i, clip(s_i)·A_i), clipped responses included."""
    g = torch.Generator().manual_seed(0)
    logp = (-torch.rand(6, 5, generator=g) * 3).requires_grad_()
    old = logp.detach() + 0.8 * torch.randn(6, 5, generator=g)
    mask = torch.tensor([[1.0] * n + [0.0] * (5 - n) for n in (5, 3, 1, 4, 2, 5)])
    adv = torch.tensor([1.0, -1, 2, -0.5, -1, 1])[:, None]  # the last two responses get clipped
    obj, zero, _ = clipped_surrogate(logp, old, adv, 0.2, 0.28, "sequence", mask)
    token_form = aggregate(obj, mask, "seq-mean-token-mean", 6, int(mask.sum()), 5)
    (grad_token,) = torch.autograd.grad(token_form, logp)
    s = sequence_ratio(logp, old, mask)
    seq_form = torch.minimum(s * adv, s.clamp(0.8, 1.28) * adv).mean()
    (grad_seq,) = torch.autograd.grad(seq_form, logp)
    assert token_form.item() == pytest.approx(seq_form.item())
    assert torch.allclose(grad_token, grad_seq, atol=1e-6)
    clipped = zero[:, 0]
    assert clipped.any() and not clipped.all()  # the draw has both kinds
    assert torch.all(zero == clipped[:, None])  # one verdict per response
    assert torch.all(grad_token[clipped] == 0) and torch.all(grad_token[~clipped].abs().sum(-1) > 0)


def test_sequence_clip_takes_the_whole_response_where_token_clip_takes_one_token():
    old = torch.log(torch.full((2, 2), 0.1))
    new = torch.log(torch.tensor([[0.2, 0.1], [0.15, 0.1]])).requires_grad_()  # token ratios (2, 1), (1.5, 1)
    mask, pos = torch.ones(2, 2), torch.ones(2, 1)
    _, zero_tok, _ = clipped_surrogate(new, old, pos, 0.2, 0.28)
    assert zero_tok.tolist() == [[True, False], [True, False]]
    obj, zero_seq, ratio = clipped_surrogate(new, old, pos, 0.2, 0.28, "sequence", mask)
    # s = √2 ≈ 1.414 > 1.28: the whole first response is clipped; s = √1.5 ≈ 1.225 keeps the second
    assert ratio[:, 0].tolist() == pytest.approx([math.sqrt(2), math.sqrt(1.5)])
    assert zero_seq.tolist() == [[True, True], [False, False]]
    obj.sum().backward()
    assert torch.all(new.grad[0] == 0) and torch.all(new.grad[1] != 0)
    assert float((zero_seq * mask).sum() / mask.sum()) == 0.5  # clip_frac: the share of tokens in clipped responses
    with pytest.raises(ValueError, match="mask"):
        clipped_surrogate(new, old, pos, 0.2, 0.28, "sequence")


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
