"""train: activation recomputation (same loss and gradients as none), the EMA of the weights (its
formula by hand, bitwise resume, what eval and export load) and what a loss spike does
(--on-spike skip-batch leaves the weights alone; rewind goes back to the checkpoint, skips the
spiking data and resumes to the same bits). In-process runs of a 2-layer model on a tiny corpus."""

import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

from llmctl.model.load import load_checkpoint, load_model
from llmctl.tokenizer import bpe
from llmctl.data.tokenize import TokenizeConfig, run_tokenize, train_tokenizer
from llmctl.errors import StageFailed, UsageError
from llmctl.model.config import ModelConfig
from llmctl.model.transformer import Transformer
from llmctl.runtime.options import RunOptions
from llmctl.train.config import TrainConfig
from llmctl.train.ema import EMA, ema_decay_at
from llmctl.train.mixture import DataSource
from llmctl.train.pretrain import PretrainData
from llmctl.train.sft import attention_mask
from llmctl.train.trainer import data_index, fit

MODEL = ModelConfig(vocab_size=300, n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_ff=128, max_seq_len=32)


def cfg(**kw) -> TrainConfig:
    """20 steps of 8 sequences of 32 tokens, two micro-batches each."""
    base = dict(seq_len=32, batch_tokens=256, micro_batch=4, max_tokens=5120, lr=3e-3, eval_every=0, threads=1,
                spike_window=10, checkpoint_every=6, keep_checkpoints=10)
    return TrainConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    d = tmp_path_factory.mktemp("stability")
    rng = random.Random(1)
    words = ["the miller", "a farmer", "carries", "watches", "grain", "the river", "twelve baskets", "to town"]
    pq.write_table(pa.table({"text": [" ".join(rng.choice(words) for _ in range(60)) + "." for _ in range(200)]}),
                   d / "docs.parquet")
    train_tokenizer([str(d / "docs.parquet")], str(d / "tok"), bpe.TrainTokenizerConfig(vocab_size=300))
    for split in ("train", "val"):
        c = TokenizeConfig(tokenizer=str(d / "tok" / "tokenizer.json"), split=split, val_fraction=0.1)
        run_tokenize([str(d / "docs.parquet")], str(d / split), c, RunOptions(workers=1))
    return d


class Spiky(PretrainData):
    """Pretraining data whose batches at the data indices in `bad` have their loss multiplied by 30:
    a spike that the test places, where normal use has none. `seen` lists the data indices asked for."""

    def __init__(self, tokens, bad=(), val=False):
        super().__init__([DataSource("train", tokens / "train")], tokens / "val" if val else None, cfg())
        self.bad, self.seen, self.now = set(bad), [], None

    def batch(self, step, batch_seqs, micro, dist):
        self.seen.append(step)
        self.now = step
        return super().batch(step, batch_seqs, micro, dist)

    def loss(self, model, batch, z_loss):
        loss, ce, top = super().loss(model, batch, z_loss)
        return (loss * 30, ce * 30, top) if self.now in self.bad else (loss, ce, top)


def train(tokens, out, c, source=None, **kw):
    return fit(source or Spiky(tokens), out, MODEL, c, **kw)


def records(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def losses(run):
    return [(r["step"], r["loss"]) for r in records(run) if "loss" in r]


def tensors(run, step=None, name="model.safetensors"):
    ck = run / "checkpoints" / (f"step-{step:06d}" if step is not None else (run / "checkpoints" / "latest").read_text().strip())
    return load_file(str(ck / name))


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# -- recompute --------------------------------------------------------------------------------

@pytest.mark.parametrize("arch,masked", [({}, False), ({}, True), ({"qkv_bias": True, "o_bias": True, "qk_norm": True}, False)])
def test_recompute_gives_the_same_loss_and_gradients(arch, masked):
    """fp32: selective and block recomputation against none, on the explicit CPU attention (no
    mask), the SDPA kernel (SFT's block-diagonal mask), biased projections (addmm) and q/k norms;
    the loss goes through linear_ce with a z-loss."""
    mc = ModelConfig(**{**MODEL.to_dict(), **arch})
    torch.manual_seed(0)
    x = torch.randint(0, 300, (4, 33))
    segments = torch.zeros(4, 32, dtype=torch.long)
    segments[:, 20:] = 1
    kw = {"mask": attention_mask(segments)} if masked else {}
    out = {}
    for mode in ("none", "selective", "block"):
        torch.manual_seed(1)
        model = Transformer(mc).set_recompute(mode)
        loss, _ = model(x[:, :-1], x[:, 1:], z_loss=1e-4, **kw)
        loss.backward()
        out[mode] = loss.item(), {n: p.grad for n, p in model.named_parameters()}
    for mode in ("selective", "block"):
        assert out[mode][0] == pytest.approx(out["none"][0], abs=1e-6)
        assert max((out[mode][1][n] - g).abs().max().item() for n, g in out["none"][1].items()) < 1e-6
    with pytest.raises(UsageError, match="none, selective, block"):
        Transformer(MODEL).set_recompute("full")


def test_recompute_and_a_rewind_point_change_no_loss(tokens, tmp_path):
    """--recompute in the trainer, and --on-spike rewind's step-0 checkpoint (written before AdamW
    has a state: saving must not give it one), leave the losses as they were."""
    log = []
    train(tokens, tmp_path / "none", cfg(max_steps=3))
    train(tokens, tmp_path / "block", cfg(max_steps=3, recompute="block", on_spike="rewind"), on_log=log.append)
    assert losses(tmp_path / "none") == losses(tmp_path / "block")
    assert any("recompute block" in line for line in log)
    assert not (tmp_path / "block" / "checkpoints" / "step-000000" / "optimizer.pt").exists()


# -- EMA --------------------------------------------------------------------------------------

def test_ema_update_by_hand():
    """θ_ema ← d·θ_ema + (1 − d)·θ with d = min(D, (1 + t)/(10 + t)), t the updates before."""
    assert [ema_decay_at(0.999, t) for t in (0, 8)] == [0.1, 0.5]
    assert ema_decay_at(0.999, 8989) < 0.999 == ema_decay_at(0.999, 8990)
    model = Transformer(ModelConfig(vocab_size=64, n_layers=1, d_model=8, n_heads=2, d_ff=16))
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(1.0)
    ema = EMA(0.5, model)
    params = list(model.parameters())
    with torch.no_grad():
        for p in params:
            p.fill_(3.0)
    ema.update(params)  # d = 0.1: 0.1·1 + 0.9·3
    assert all(torch.allclose(p, torch.full_like(p, 2.8)) for p in ema.model.parameters())
    with torch.no_grad():
        for p in params:
            p.fill_(-8.0)
    ema.update(params)  # d = 2/11: (2/11)·2.8 + (9/11)·(−8) = −6.036…
    assert all(torch.allclose(p, torch.full_like(p, 2 / 11 * 2.8 - 9 / 11 * 8)) for p in ema.model.parameters())
    for _ in range(20):
        ema.update(params)
    assert ema.updates == 22 and ema_decay_at(0.5, ema.updates) == 0.5  # the warm-up is over: d = D
    assert all(p.dtype == torch.float32 and not p.requires_grad for p in ema.model.parameters())


def test_ema_resumes_bitwise_and_is_what_eval_and_export_load(tokens, tmp_path):
    from llmctl.eval.runner import EvalConfig, run_eval
    from llmctl.eval.tasks import parse_task
    from llmctl.model.hf_export import export_hf

    whole, split = tmp_path / "whole", tmp_path / "split"
    train(tokens, whole, cfg(ema_decay=0.9), source=Spiky(tokens, val=True))
    train(tokens, split, cfg(ema_decay=0.9, max_steps=8), source=Spiky(tokens, val=True))
    train(tokens, split, cfg(ema_decay=0.9), source=Spiky(tokens, val=True), resume=True)
    assert losses(whole) == losses(split)
    assert same(tensors(whole), tensors(split))
    ema = tensors(whole, name="ema.safetensors")
    assert same(ema, tensors(split, name="ema.safetensors"))
    raw = tensors(whole)
    assert not same(ema, raw) and all(v.dtype == torch.float32 for v in ema.values())
    state = load_checkpoint(whole).trainer_state
    assert state["ema_updates"] == 20 and state["ema_decay"] == 0.9
    val = [r for r in records(whole) if "val" in r][-1]
    assert val["val_ema"]["loss"] != val["val"]["loss"]

    # inference takes the EMA by default, the raw weights with --weights raw
    model, ck = load_model(whole)
    assert ck.weights == "ema" and same({k: v for k, v in model.state_dict().items() if k in ema}, ema)
    assert load_model(whole, weights="raw")[1].weights == "raw"
    for weights in ("auto", "raw"):
        run_eval(str(whole), [parse_task(f"loss:{tokens / 'val'}")], tmp_path / f"eval-{weights}", EvalConfig(weights=weights))
    ev = {w: json.loads((tmp_path / f"eval-{w}" / "results.json").read_text()) for w in ("auto", "raw")}
    assert ev["auto"]["weights"] == "ema" and ev["raw"]["weights"] == "raw"
    loss = {w: [t["metrics"]["loss"]["value"] for t in ev[w]["tasks"].values()] for w in ev}
    assert loss["auto"] != loss["raw"]
    export_hf(whole, tmp_path / "hf")
    export_hf(whole, tmp_path / "hf-raw", weights="raw")
    embed, vocab = "model.embed_tokens.weight", ck.config.vocab_size
    assert torch.equal(load_file(str(tmp_path / "hf" / "model.safetensors"))[embed], ema["embed.weight"][:vocab])
    assert torch.equal(load_file(str(tmp_path / "hf-raw" / "model.safetensors"))[embed], raw["embed.weight"][:vocab])
    train(tokens, tmp_path / "plain", cfg(max_steps=1))
    assert load_model(tmp_path / "plain")[1].weights == "raw"  # no EMA: the raw weights, whatever the default
    with pytest.raises(UsageError, match="no ema.safetensors"):
        load_model(tmp_path / "plain", weights="ema")


# -- loss spikes ------------------------------------------------------------------------------

def test_data_index_passes_over_skipped_data():
    state = {"skipped_data": [3, 4, 9]}
    assert [data_index(state, s) for s in range(8)] == [0, 1, 2, 5, 6, 7, 8, 10]
    assert [data_index({}, s) for s in range(3)] == [0, 1, 2]


def test_flag_marks_the_spike_and_takes_the_step(tokens, tmp_path):
    train(tokens, tmp_path / "run", cfg(max_steps=16), source=Spiky(tokens, bad={14}))
    spikes = [r for r in records(tmp_path / "run") if "spike" in r]
    assert [r["step"] for r in spikes] == [15] and spikes[0]["spike"] > 6 and "spike_skipped" not in spikes[0]


def test_skip_batch_leaves_the_weights_unchanged(tokens, tmp_path):
    run = tmp_path / "run"
    m = train(tokens, run, cfg(on_spike="skip-batch", checkpoint_every=1, keep_checkpoints=30, ema_decay=0.9),
              source=Spiky(tokens, bad={14}))
    assert m.counts["spike_skipped_steps"] == 1 and m.counts["steps"] == 20
    rec = {r["step"]: r for r in records(run) if "loss" in r}
    assert rec[15]["spike_skipped"] and rec[15]["spike"] > 6 and "spike" not in rec[16]
    for name in ("model.safetensors", "ema.safetensors"):
        assert same(tensors(run, 14, name), tensors(run, 15, name))
        assert not same(tensors(run, 15, name), tensors(run, 16, name))
    opt = [torch.load(run / "checkpoints" / f"step-{s:06d}" / "optimizer.pt", weights_only=True) for s in (14, 15)]
    assert all(torch.equal(opt[0]["state"][k]["exp_avg"], opt[1]["state"][k]["exp_avg"]) for k in opt[0]["state"])


def test_rewind_skips_the_spiking_data_and_resume_reproduces_it(tokens, tmp_path):
    whole, split = tmp_path / "whole", tmp_path / "split"
    source = Spiky(tokens, bad={14})
    m = train(tokens, whole, cfg(on_spike="rewind", ema_decay=0.9), source=source)
    # checkpoints at 6 and 12: the spike at data index 14 (step 15) goes back to step 12 and skips it
    assert source.seen == [*range(15), 12, 13, *range(15, 21)]
    assert m.counts["steps"] == 20 and m.counts["rewinds"] == 1 and m.counts["skipped_data_steps"] == 1
    recs = records(whole)
    event = next(r for r in recs if "rewind" in r)["rewind"]
    assert event["spike_step"] == 15 and event["to_step"] == 12 and event["skipped_data"] == [14]
    steps = [r for r in recs if "loss" in r]
    assert [r["step"] for r in steps] == list(range(1, 21)) and not any("spike" in r for r in steps)
    assert [r.get("data_step", r["step"] - 1) for r in steps] == [*range(14), *range(15, 21)]
    assert load_checkpoint(whole).trainer_state["skipped_data"] == [14]
    # stopped after the rewind and resumed: the same data, the same bits
    train(tokens, split, cfg(on_spike="rewind", ema_decay=0.9, max_steps=17), source=Spiky(tokens, bad={14}))
    again = Spiky(tokens, bad={14})
    train(tokens, split, cfg(on_spike="rewind", ema_decay=0.9), source=again, resume=True)
    assert again.seen == list(range(18, 21)) and losses(split) == losses(whole)
    for name in ("model.safetensors", "ema.safetensors"):
        assert same(tensors(whole, name=name), tensors(split, name=name))


def test_rewinds_without_progress_give_up(tokens, tmp_path):
    source = Spiky(tokens, bad=set(range(14, 40)))
    with pytest.raises(StageFailed, match="2 rewind"):
        train(tokens, tmp_path / "run", cfg(on_spike="rewind", max_rewinds=2), source=source)
    assert source.seen == [*range(15), 12, 13, 15, 12, 13, 16]
