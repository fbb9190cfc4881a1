"""The chunked head + cross-entropy equals the plain `head(h).float()` → `F.cross_entropy` path."""

import pytest
import torch
import torch.nn.functional as F

from llmctl.model.linear_ce import linear_cross_entropy


def plain(h, w, t, z_loss, reduction):
    logits = F.linear(h, w)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    ce = F.cross_entropy(logits, t, ignore_index=-100, reduction=reduction)
    ok = t != -100
    z = torch.logsumexp(logits[ok], -1).pow(2)
    z = z.mean() if reduction == "mean" else z.sum()
    return ce + z_loss * z, ce, logits.max()


def inputs(n=37, d=16, v=101, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g, dtype=torch.float64)
    w = torch.randn(v, d, generator=g, dtype=torch.float64) * 0.3
    t = torch.randint(0, v, (n,), generator=g)
    t[::5] = -100  # rows without a target (SFT's prompt tokens, padding)
    return h, w, t


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("z_loss", [0.0, 1e-2])
@pytest.mark.parametrize("chunk_rows", [1, 8, 37, 64])
def test_loss_and_gradients_match_the_plain_path(reduction, z_loss, chunk_rows):
    h, w, t = inputs()
    h1, w1 = h.clone().requires_grad_(), w.clone().requires_grad_()
    loss1, ce1, max1 = plain(h1, w1, t, z_loss, reduction)
    (loss1 * 0.7).backward()  # a non-unit upstream gradient, as gradient accumulation gives
    h2, w2 = h.clone().requires_grad_(), w.clone().requires_grad_()
    loss2, ce2, max2 = linear_cross_entropy(h2, w2, t, z_loss=z_loss, reduction=reduction, chunk_rows=chunk_rows)
    (loss2 * 0.7).backward()
    assert loss2.item() == pytest.approx(loss1.item(), rel=1e-6)
    assert ce2.item() == pytest.approx(ce1.item(), rel=1e-6)
    assert max2.item() == pytest.approx(max1.item(), rel=1e-6)
    torch.testing.assert_close(h2.grad, h1.grad, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(w2.grad, w1.grad, rtol=1e-9, atol=1e-12)


def test_ignored_rows_get_no_gradient_and_all_ignored_is_zero():
    h, w, t = inputs()
    t[:] = -100
    h = h.requires_grad_()
    loss, ce, _ = linear_cross_entropy(h, w, t)
    loss.backward()
    assert ce.item() == 0.0
    assert torch.count_nonzero(h.grad) == 0


def test_bf16_autocast_rounds_like_the_autocast_path():
    h, w, t = (x.float() if x.is_floating_point() else x for x in inputs(n=64, d=32, v=256))
    h1, w1 = h.clone().requires_grad_(), w.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = F.linear(h1, w1)
    F.cross_entropy(logits.float(), t, ignore_index=-100).backward()
    h2, w2 = h.clone().requires_grad_(), w.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, ce, _ = linear_cross_entropy(h2, w2, t, chunk_rows=16)
    loss.backward()
    assert h2.grad.dtype == torch.float32 and w2.grad.dtype == torch.float32
    ref = F.cross_entropy(logits.float(), t, ignore_index=-100)
    assert ce.item() == pytest.approx(ref.item(), abs=1e-5)
    # the same bf16 logits, the gradient rounded once to bf16 before the matmuls: the results
    # differ only by the matmuls' own bf16 rounding
    torch.testing.assert_close(h2.grad, h1.grad, rtol=2e-2, atol=1e-5)
    torch.testing.assert_close(w2.grad, w1.grad, rtol=2e-2, atol=1e-5)


def test_without_grad_no_gradient_buffer_is_built():
    h, w, t = inputs()
    with torch.no_grad():
        loss, ce, _ = linear_cross_entropy(h, w, t)
    ref = plain(h, w, t, 0.0, "mean")[1]
    assert ce.item() == pytest.approx(ref.item(), rel=1e-6)
    assert not loss.requires_grad


def test_bad_reduction_is_refused():
    h, w, t = inputs()
    with pytest.raises(ValueError, match="reduction"):
        linear_cross_entropy(h, w, t, reduction="none")


def test_model_loss_equals_cross_entropy_of_its_logits():
    """Transformer.forward with targets (chunked head + explicit attention on CPU) against the
    logits path (SDPA) of the same model, in float64 so only the algorithm can differ."""
    from llmctl.model.config import ModelConfig
    from llmctl.model.transformer import Transformer

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=96, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=16)
    model = Transformer(cfg).double()
    x = torch.randint(0, 96, (3, 16))
    y = torch.randint(0, 96, (3, 16))
    y[0, :5] = -100
    loss, stats = model(x, y, z_loss=1e-3)
    loss.backward()
    fused = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.MATH):
        logits = model(x, mask=torch.ones(16, 16, dtype=torch.bool).tril())  # the SDPA path
    ref_loss, ref_ce, ref_max = plain_from_logits(logits, y, 1e-3)
    ref_loss.backward()
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-12)
    assert stats["ce"].item() == pytest.approx(ref_ce.item(), rel=1e-12)
    assert stats["max_logit"].item() == pytest.approx(ref_max.item(), rel=1e-6)
    for n, p in model.named_parameters():
        torch.testing.assert_close(fused[n], p.grad, rtol=1e-9, atol=1e-12, msg=n)


def plain_from_logits(logits, y, z_loss):
    flat, t = logits.flatten(0, 1), y.flatten()
    ce = F.cross_entropy(flat, t, ignore_index=-100)
    return ce + z_loss * torch.logsumexp(flat[t != -100], -1).pow(2).mean(), ce, logits.max()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_explicit_attention_equals_sdpa(dtype):
    from llmctl.model.transformer import explicit_causal_attention

    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 6, 19, 8, generator=g).to(dtype).requires_grad_()
    k = torch.randn(2, 3, 19, 8, generator=g).to(dtype).requires_grad_()
    v = torch.randn(2, 3, 19, 8, generator=g).to(dtype).requires_grad_()
    dy = torch.randn(2, 6, 19, 8, generator=g).to(dtype)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    ref_grads = torch.autograd.grad(ref, (q, k, v), dy)
    out = explicit_causal_attention(q, k, v)
    grads = torch.autograd.grad(out, (q, k, v), dy)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=5e-2, atol=5e-2)
    torch.testing.assert_close(out, ref, **tol)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, **tol)
