"""--optimizer muon (torchrt/muon.py): Newton-Schulz against the iteration written out in numpy,
one step against the recipe's update by hand, which tensors get Muon (and the fused blocks each
alone), a state dict that resumes bitwise, and train's CLI: a run, a resume equal to the
uninterrupted run, the groups in the manifest, and what muon does not go with."""

import copy
import json

import numpy as np
import pytest
import torch

from conftest import llmctl
from llmctl.model.config import ModelConfig
from llmctl.model.transformer import Transformer
from llmctl.torchrt.muon import NS_COEFFICIENTS, make_muon, muon_params, muon_update, newton_schulz5
from test_train import SMALL, step_losses, tokens  # noqa: F401  (the module's token artifacts)


def ns5_numpy(g: np.ndarray) -> np.ndarray:
    a, b, c = NS_COEFFICIENTS
    x = g.T if g.shape[0] > g.shape[1] else g
    x = x / (np.linalg.norm(x) + 1e-7)
    for _ in range(5):
        A = x @ x.T
        x = a * x + (b * A + c * A @ A) @ x
    return x.T if g.shape[0] > g.shape[1] else x


@pytest.mark.parametrize("shape", [(3, 5), (5, 3), (4, 4)])
def test_newton_schulz_is_the_quintic_iteration(shape):
    g = np.random.default_rng(0).normal(size=shape)
    got = newton_schulz5(torch.tensor(g, dtype=torch.float32)).double().numpy()
    assert np.allclose(got, ns5_numpy(g), atol=1e-5)
    s = np.linalg.svd(got, compute_uv=False)
    assert s.min() > 0.5 and s.max() < 1.5  # near-orthogonal, not exactly: the coefficients trade that for speed


def tiny_model(**kw) -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(vocab_size=64, n_layers=2, d_model=16, n_heads=4, n_kv_heads=2, d_ff=24, max_seq_len=8, **kw))


@pytest.mark.parametrize("kw", [{}, {"tied": False}, {"qk_norm": True, "qkv_bias": True}])
def test_muon_takes_the_hidden_matrices_only(kw):
    model = tiny_model(**kw)
    blocks, names = muon_params(model)
    assert sorted(names) == sorted(f"layers.{i}.{m}.weight" for i in range(2) for m in ("attn.qkv", "attn.o", "mlp.gate_up", "mlp.down"))
    assert blocks[id(model.layers[0].attn.qkv.weight)] == (16, 8, 8)  # 4 query heads, 2 KV heads of 4
    assert blocks[id(model.layers[0].mlp.gate_up.weight)] == (24, 24)
    opt = make_muon(model, lr=0.01, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8)
    groups = {g["name"]: g for g in opt.param_groups}
    assert {id(p) for p in groups["muon"]["params"]} == set(blocks)
    decay = {id(p) for p in groups["decay"]["params"]}
    assert decay == ({id(model.head.weight)} if kw.get("tied") is False else set())  # the untied head: AdamW, decayed
    assert id(model.embed.weight) in {id(p) for p in groups["no_decay"]["params"]}
    assert sum(p.numel() for g in opt.param_groups for p in g["params"]) == sum(p.numel() for p in model.parameters())


def test_one_step_is_the_recipes_update():
    model = tiny_model()
    opt = make_muon(model, lr=0.02, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8)
    w = model.layers[0].attn.o.weight
    before = w.detach().clone().double().numpy()
    loss = model(torch.randint(0, 64, (2, 8)), targets=torch.randint(0, 64, (2, 8)))
    (loss[0] if isinstance(loss, tuple) else loss).backward()
    g = w.grad.double().numpy()
    opt.step()
    m = g + 0.95 * g  # the first step: buffer = g, Nesterov looks one momentum step ahead
    want = before * (1 - 0.02 * 0.1) - 0.02 * 0.2 * np.sqrt(16) * ns5_numpy(m)
    assert np.allclose(w.detach().double().numpy(), want, atol=1e-5)


def test_a_fused_matrix_is_orthogonalized_block_by_block():
    g = torch.randn(32, 16)
    got = muon_update(g, (16, 8, 8))
    for rows, part in ((slice(0, 16), g[:16]), (slice(16, 24), g[16:24]), (slice(24, 32), g[24:])):
        assert torch.allclose(got[rows], 0.2 * np.sqrt(max(part.shape)) * newton_schulz5(part))
    assert not torch.allclose(got, 0.2 * np.sqrt(32) * newton_schulz5(g))  # not the whole matrix at once


def test_the_state_dict_resumes_bitwise():
    def steps(model, opt, n, seed):
        gen = torch.Generator().manual_seed(seed)
        for _ in range(n):
            opt.zero_grad()
            x = torch.randint(0, 64, (2, 8), generator=gen)
            out = model(x, targets=x)
            (out[0] if isinstance(out, tuple) else out).backward()
            opt.step()

    a = tiny_model()
    oa = make_muon(a, lr=0.01, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8)
    steps(a, oa, 2, 0)
    b = tiny_model()
    b.load_state_dict(a.state_dict())
    ob = make_muon(b, lr=0.01, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8)
    ob.load_state_dict(copy.deepcopy(oa.state_dict()))  # as from a file: load_state_dict keeps the tensors it is given
    assert ob.adamw.state is ob.state and ob.adamw.param_groups[0] is ob.param_groups[1]
    steps(a, oa, 3, 1)
    steps(b, ob, 3, 1)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_train_with_muon_resumes_bitwise_and_names_its_groups(tokens, tmp_path):  # noqa: F811
    full, cut = tmp_path / "full", tmp_path / "cut"
    args = ["train", tokens / "train", "--val", tokens / "val", *SMALL, "--optimizer", "muon", "--max-tokens", "3072", "-q"]
    llmctl(*args, "-o", full, check=True)
    llmctl(*args, "-o", cut, "--max-steps", "5", check=True)
    llmctl(*args, "-o", cut, "--resume", check=True)
    assert step_losses(cut) == step_losses(full) and len(step_losses(full)) == 12
    m = json.loads((full / "manifest.json").read_text())
    groups = {g["name"]: g for g in m["config"]["optimizer_groups"]}
    assert set(groups) == {"muon", "decay", "no_decay"} and groups["muon"]["tensors"] == 8
    assert m["config"]["train"]["optimizer"] == "muon"
    adamw = tmp_path / "adamw"
    llmctl(*[a for a in args if a not in ("--optimizer", "muon")], "-o", adamw, check=True)
    assert step_losses(adamw)[0] == step_losses(full)[0]  # the same first loss: only the updates differ
    assert step_losses(adamw)[-1] != step_losses(full)[-1]


@pytest.mark.parametrize("extra, words", [
    (["--optimizer", "sgd"], "optimizer must be one of adamw, muon"),
    (["--optimizer", "muon", "--fsdp"], "--optimizer muon does not go with --fsdp"),
])
def test_what_muon_does_not_go_with(tokens, tmp_path, extra, words):  # noqa: F811
    p = llmctl("train", tokens / "train", "-o", tmp_path / "r", *SMALL, *extra)
    err = p.stderr.decode()
    assert p.returncode == 2 and words in err and len(err.strip().splitlines()) == 1, err
