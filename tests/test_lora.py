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


@pytest.mark.parametrize("targets", [["q", "k", "v", "o", "gate", "up", "down"], ["q", "v", "up"]])
def test_merged_training_step_has_the_unmerged_gradients(targets):
    """The training step's one-matmul form (_MergedLoRA) against y = Wx + s·B·A·x through autograd
    (the form dropout takes: a Dropout(0) module selects it), gradients of A, B and the loss."""
    from torch import nn

    from llmctl.model.lora import lora_layers

    x = batch(B=2, T=12)
    runs = []
    for unmerged in (False, True):
        model = attach(tiny(4, qkv_bias=True), LoraConfig(rank=3, alpha=6, targets=targets), torch.Generator().manual_seed(0))
        randomize_b(model)
        if unmerged:
            for m in lora_layers(model):
                m.dropout = nn.Dropout(0.0)
        loss, _ = model.train()(x[:, :-1], x[:, 1:])
        loss.backward()
        runs.append((loss.item(), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}))
    (l1, g1), (l2, g2) = runs
    assert abs(l1 - l2) <= 1e-6 and g1.keys() == g2.keys()
    assert max((g1[n] - g2[n]).abs().max().item() for n in g1) <= 1e-6
    assert all(g1[n].abs().sum() > 0 for n in g1)


def test_dropout_applies_in_training_only():
    model = attach(tiny(), LoraConfig(rank=4, dropout=0.5, targets=["q", "v"]))
    randomize_b(model)
    x = batch()
    with torch.no_grad():
        still = model.eval()(x)
        assert torch.equal(model(x), still)
        assert not torch.equal(model.train()(x), still)


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


# -- train --sft with --lora-*, export, PEFT ---------------------------------------------------

from conftest import llmctl  # noqa: E402
from test_sft import SFT_ARGS, chats, tok  # noqa: E402,F401  (fixtures)
from test_train import SMALL, step_losses, tokens  # noqa: E402,F401  (tokens is a fixture)
from llmctl.model.load import load_checkpoint, load_model  # noqa: E402

LORA = ["--lora-rank", "4", "--lora-alpha", "8", "--lora-targets", "q,k,v,o,gate,up,down"]
RUN = [*SFT_ARGS[10:], "--max-tokens", "12288", "--lr", "1e-2"]  # 12 steps


@pytest.fixture(scope="module")
def base(tokens, tmp_path_factory):
    out = tmp_path_factory.mktemp("base") / "base"
    llmctl("train", tokens / "train", "-o", out, *SMALL, "--max-steps", "3", check=True)
    return out


def one_line_exit_2(p) -> str:
    err = p.stderr.decode().strip()
    errors = [line for line in err.splitlines() if line.startswith("llmctl: error:")]
    assert p.returncode == 2 and len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def test_lora_sft_trains_adapters_only_and_resumes_bitwise(base, chats, tmp_path):
    full, cut = tmp_path / "full", tmp_path / "cut"
    args = ["train", "--sft", chats, "--init", base, *LORA, *RUN]
    p = llmctl(*args, "-o", full, check=True)
    assert "LoRA r 4" in p.stderr.decode()
    losses = [loss for _, loss in step_losses(full)]
    assert len(losses) == 12 and sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.1  # the base is 3 steps old: most of its loss is in the frozen tables
    ck = load_checkpoint(full, merged=False)
    assert ck.tensors and all(".lora_" in k for k in ck.tensors)
    assert ck.lora.rank == 4 and ck.lora_base["path"] == str(load_checkpoint(base).path)
    opt = torch.load(ck.path / "optimizer.pt", weights_only=True)
    assert len(opt["state"]) == len(ck.tensors)  # AdamW moments of the adapters alone
    assert (ck.path / "model.safetensors").stat().st_size < (load_checkpoint(base).path / "model.safetensors").stat().st_size / 4

    p = llmctl("generate", full, "-p", "What is the subject of: the miller carries grain.", "--max-new-tokens", "8", check=True)
    assert p.stdout.strip()  # generation runs on base + adapters
    llmctl(*args, "-o", cut, "--max-steps", "5", check=True)
    llmctl(*args, "-o", cut, "--resume", check=True)
    assert step_losses(cut) == step_losses(full)  # bitwise

    p = llmctl(*args, "-o", cut, "--resume", "--lora-rank", "8")
    assert "LoRA settings" in one_line_exit_2(p)
    from llmctl.train.lora import resume

    with pytest.raises(UsageError, match="not the base this LoRA run adapts"):
        model = Transformer(ck.config)
        resume(model, ck, _retrained(base, tmp_path), None, lambda m: None)


def _retrained(base, tmp_path):
    """A copy of the base checkpoint with its weights changed (same architecture, another hash)."""
    import shutil
    from safetensors.torch import load_file, save_file

    src = load_checkpoint(base).path
    dst = tmp_path / "other" / "step-000003"
    shutil.copytree(src, dst)
    t = load_file(str(dst / "model.safetensors"))
    t["norm.weight"] = t["norm.weight"] + 0.5
    save_file(t, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def test_resume_on_another_base_and_a_changed_base_are_refused(base, chats, tmp_path):
    run = tmp_path / "run"
    args = ["train", "--sft", chats, *LORA, *RUN, "--max-steps", "2"]
    llmctl(*args, "--init", base, "-o", run, check=True)
    other = _retrained(base, tmp_path)
    p = llmctl(*args, "--init", other, "-o", run, "--resume")
    one_line_exit_2(p)
    # the base changed in place: every reader of the LoRA checkpoint refuses it
    import shutil
    f = load_checkpoint(base).path / "model.safetensors"
    saved = tmp_path / "saved.safetensors"
    shutil.copyfile(f, saved)
    try:
        shutil.copyfile(other / "model.safetensors", f)
        with pytest.raises(UsageError, match="not the checkpoint these adapters were trained on"):
            load_model(run)
        assert "not the checkpoint these adapters" in one_line_exit_2(llmctl("export", run, "--merge", "-o", tmp_path / "m"))
    finally:
        shutil.copyfile(saved, f)


@pytest.mark.parametrize("flags, match", [(["--lora-rank", "0"], "--lora-rank"),
                                          (["--lora-rank", "4", "--lora-targets", "q,qkv"], "unknown target"),
                                          (["--lora-alpha", "4"], "go with --lora-rank"),
                                          (["--lora-rank", "4", "--lora-dropout", "1.5"], "--lora-dropout"),
                                          (["--lora-rank", "4", "--ema-decay", "0.9"], "--ema-decay")])
def test_bad_lora_flags_exit_2_one_line(chats, base, tmp_path, flags, match):
    p = llmctl("train", "--sft", chats, "--init", base, "-o", tmp_path / "r", *flags)
    assert match in one_line_exit_2(p)


def test_lora_needs_init(chats, tok, tmp_path):
    p = llmctl("train", "--sft", chats, "--tokenizer", tok, "-o", tmp_path / "r", "--lora-rank", "4")
    assert "--init" in one_line_exit_2(p)


@pytest.fixture(scope="module")
def qwen_base(tmp_path_factory):
    """A tiny random Qwen2 (q/k/v biases), saved by transformers and brought in with `llmctl import`."""
    from test_hf_models import build

    root = tmp_path_factory.mktemp("qwen")
    ck = root / "ck"
    llmctl("import", build("qwen2.5", root), "-o", ck, check=True)
    return ck


def test_adapter_export_loads_in_peft_with_llmctl_logits(qwen_base, chats, tmp_path):
    run = tmp_path / "run"
    llmctl("train", "--sft", chats, "--init", qwen_base, "-o", run, *LORA, "--seq-len", "128", "--batch-tokens", "512",
           "--micro-batch", "4", "--max-tokens", "2048", "--lr", "1e-2", "--threads", "1", check=True)
    for flags, out in (([], "base_hf"),):
        llmctl("export", qwen_base, "-o", tmp_path / out, *flags, check=True)
    llmctl("export", run, "--adapter", "-o", tmp_path / "adapter", check=True)
    llmctl("export", run, "--merge", "-o", tmp_path / "merged", check=True)
    assert "--merge" in one_line_exit_2(llmctl("export", run, "-o", tmp_path / "plain"))
    assert "not a LoRA checkpoint" in one_line_exit_2(llmctl("export", qwen_base, "--adapter", "-o", tmp_path / "a2"))
    ours, ck = load_model(run)
    assert ck.lora is not None and any(".lora_" in n for n in ours.state_dict())
    hf_base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base_hf", dtype=torch.float32)
    theirs = peft.PeftModel.from_pretrained(hf_base, tmp_path / "adapter").eval()
    merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32).eval()
    V = merged.config.vocab_size
    x = torch.randint(0, V, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = ours(x)[..., :V]
        with adapters_off(ours):
            assert (ours(x)[..., :V] - want).abs().max() > 1e-3  # the adapters were trained
        assert (theirs(x).logits - want).abs().max() <= 1e-4
        assert (merged(x).logits - want).abs().max() <= 1e-4
    cfg = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert cfg["r"] == 4 and cfg["lora_alpha"] == 8 and len(cfg["target_modules"]) == 7


# -- rl with --lora-* --------------------------------------------------------------------------

from test_rl import RL_ARGS, records, sft_model  # noqa: E402,F401  (fixture)


def test_rl_lora_trains_adapters_through_generation_and_resumes(sft_model, tmp_path):  # noqa: F811
    """GRPO with a k3 KL to the adapters-off model: generation runs through the adapters, checkpoints
    hold only them, and a run cut after step 1 and resumed repeats the uninterrupted one."""
    full, cut = tmp_path / "full", tmp_path / "cut"
    args = ["rl", sft_model / "sft", "--prompts", sft_model / "digits.jsonl", "--verifier", "regex", *RL_ARGS,
            "--kl", "k3", "--kl-coef", "0.1", *LORA, "-q"]
    llmctl(*args, "-o", full, check=True)
    llmctl(*[a if a != "2" else "1" for a in args], "-o", cut, check=True)  # --steps 1
    llmctl(*args, "-o", cut, "--resume", check=True)
    drop = ("generate_s", "score_s", "train_s", "tokens_per_s")
    strip = lambda rs: [{k: v for k, v in r.items() if k not in drop} for r in rs]  # noqa: E731
    assert strip(records(full)) == strip(records(cut))
    trained = [r for r in records(full) if r.get("updates")]
    assert trained and all(r["kl_ref"] >= 0 for r in trained)
    ck = load_checkpoint(full, merged=False)
    assert ck.lora is not None and all(".lora_" in k for k in ck.tensors)
    model, _ = load_model(full)
    assert any(".lora_" in n for n in model.state_dict())
    p = llmctl(*args, "-o", cut, "--resume", "--lora-rank", "8")
    assert "LoRA settings" in one_line_exit_2(p)


def test_a_bf16_base_trains_its_fp32_adapters_under_autocast():
    model = attach(tiny(), LoraConfig(rank=4, base_dtype="bfloat16")).train()
    assert all(p.dtype == (torch.float32 if ".lora_" in n else torch.bfloat16) for n, p in model.named_parameters())
    x = batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = model(x[:, :-1], x[:, 1:])
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    assert all(g is not None and g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads.values())
    assert all(g.abs().sum() > 0 for n, g in grads.items() if ".lora_B." in n)  # B = 0, A random: B learns first
    with torch.no_grad():  # the inference path (unmerged) on the bf16 base
        assert torch.isfinite(model(x)).all()
