"""train: the model's arithmetic, schedules, optimizer groups, exact resume, DDP parity, guards,
export to transformers, checkpoints that fail cleanly."""

import json
import math
import os
import random
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from conftest import llmctl
from llmctl.model.load import load_checkpoint
from llmctl.tokenizer import bpe
from llmctl.data.tokenize import TokenizeConfig, run_tokenize, train_tokenizer
from llmctl.errors import UsageError
from llmctl.model.config import ModelConfig
from llmctl.model.transformer import Transformer
from llmctl.runtime.options import RunOptions
from llmctl.torchrt.optim import lr_at, param_groups
from llmctl.train.config import TrainConfig, load_run_config
from llmctl.train.trainer import run_train

SMALL = ["--set", "model.n_layers=2", "--set", "model.d_model=64", "--set", "model.n_heads=4",
         "--set", "model.n_kv_heads=2", "--set", "model.d_ff=128", "--seq-len", "32", "--batch-tokens", "256",
         "--micro-batch", "4", "--max-tokens", "5120", "--lr", "3e-3", "--eval-every", "5", "--threads", "1"]


def sentences(rng: random.Random, n: int) -> str:
    subjects = ["the miller", "a farmer", "the old bridge", "my sister", "the river", "our market"]
    verbs = ["carries", "watches", "builds", "sells", "remembers", "crosses"]
    objects = ["grain to town", "the stone wall", "twelve baskets", "the morning bread", "a red boat"]
    return " ".join(f"{rng.choice(subjects).capitalize()} {rng.choice(verbs)} {rng.choice(objects)}." for _ in range(n))


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    """A tokenizer, and train/val token artifacts from a small grammar-made corpus."""
    d = tmp_path_factory.mktemp("train")
    rng = random.Random(0)
    pq.write_table(pa.table({"text": [sentences(rng, 12) for _ in range(300)]}), d / "docs.parquet")
    train_tokenizer([str(d / "docs.parquet")], str(d / "tok"), bpe.TrainTokenizerConfig(vocab_size=300))
    for split in ("train", "val"):
        cfg = TokenizeConfig(tokenizer=str(d / "tok" / "tokenizer.json"), split=split, val_fraction=0.1)
        run_tokenize([str(d / "docs.parquet")], str(d / split), cfg, RunOptions(workers=1))
    return d


# -- model arithmetic ------------------------------------------------------------------------

@pytest.mark.parametrize("kw", [
    {}, {"tied": False}, {"n_kv_heads": 1}, {"qk_norm": True}, {"vocab_size": 1000, "d_ff": 200},
])
def test_parameter_formula_equals_module(kw):
    cfg = ModelConfig(**{"vocab_size": 500, "n_layers": 2, "d_model": 64, "n_heads": 4, **kw})
    assert Transformer(cfg).n_params() == cfg.n_params()
    assert cfg.padded_vocab % 64 == 0 and cfg.padded_vocab >= cfg.vocab_size


def test_parameter_formula_spec_oracles():
    llama3_8b = ModelConfig(vocab_size=128256, n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8, d_ff=14336, tied=False)
    assert llama3_8b.n_params() == 8_030_261_248  # spec 001-compute-appendix C0
    assert round(llama3_8b.flops_per_token(8192) / 1e9, 2) == 51.47  # C2, causal attention at 8K
    assert llama3_8b.kv_cache_bytes_per_token() == 131_072  # C11
    for preset, n in (("fineweb-0.5b", 489_288_960),):
        model, _ = load_run_config(preset, {})
        assert model.n_params() == n  # spec 000-003 D6


def test_step0_loss_is_ln_vocab():
    cfg = ModelConfig(vocab_size=4096, n_layers=4, d_model=192, n_heads=6, n_kv_heads=2, max_seq_len=128)
    torch.manual_seed(0)
    x = torch.randint(0, 4096, (8, 129))
    loss, _ = Transformer(cfg)(x[:, :-1], x[:, 1:])
    assert abs(loss.item() - math.log(4096)) < 0.1


def test_bad_architecture_is_a_usage_error():
    with pytest.raises(UsageError, match="must divide"):
        ModelConfig(d_model=100, n_heads=3)
    with pytest.raises(UsageError, match="n_kv_heads"):
        ModelConfig(d_model=64, n_heads=4, n_kv_heads=3)


# -- optimization ----------------------------------------------------------------------------

def test_schedule_shapes():
    kw = dict(peak=1.0, total=1000, warmup=100)
    wsd = [lr_at(t, schedule="wsd", cooldown_frac=0.2, **kw) for t in (50, 100, 500, 800, 900, 1000)]
    assert wsd == pytest.approx([0.5, 1.0, 1.0, 1.0, 0.5, 0.0])
    sqrt = lr_at(900, schedule="wsd", cooldown_frac=0.2, cooldown="sqrt", **kw)
    assert sqrt == pytest.approx(1 - math.sqrt(0.5))  # 1 − √ cooldown (spec §A5)
    assert lr_at(1000, schedule="cosine", **kw) == pytest.approx(0.1)  # cosine ends at 10% of peak
    assert lr_at(550, schedule="cosine", **kw) == pytest.approx(0.55)
    assert lr_at(1000, schedule="linear", **kw) == pytest.approx(0.0)
    assert lr_at(550, schedule="linear", **kw) == pytest.approx(0.5)
    assert [lr_at(t, schedule="constant", **kw) for t in (50, 100, 1000)] == pytest.approx([0.5, 1.0, 1.0])


def test_weight_decay_only_on_matrices_not_embeddings_or_gains():
    for tied in (True, False):
        model = Transformer(ModelConfig(vocab_size=100, n_layers=2, d_model=32, n_heads=2, tied=tied))
        decay, no_decay = param_groups(model, 0.1)
        names = {id(p): n for n, p in model.named_parameters()}
        assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
        assert all(p.ndim == 2 and "embed" not in names[id(p)] for p in decay["params"])
        assert {names[id(p)] for p in no_decay["params"]} >= {"embed.weight", "norm.weight", "layers.0.attn_norm.weight"}
        assert ("head.weight" in {names[id(p)] for p in decay["params"]}) == (not tied)


# -- runs ------------------------------------------------------------------------------------

def metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def step_losses(run):
    return [(r["step"], r["loss"]) for r in metrics(run) if "loss" in r]


def test_cli_run_logs_checkpoints_and_beats_the_start(tokens, tmp_path):
    run = tmp_path / "run"
    p = llmctl("train", tokens / "train", "-o", run, "--val", tokens / "val", "--checkpoint-every", "8",
               "--json", *SMALL, check=True)
    summary = json.loads(p.stdout)
    assert summary["counts"]["steps"] == 20 and summary["counts"]["tokens"] == 5120
    recs = [r for r in metrics(run) if "loss" in r]
    assert [r["step"] for r in recs] == list(range(1, 21))
    for key in ("tokens", "lr", "grad_norm", "clipped", "tokens_per_s", "mfu", "max_logit"):
        assert key in recs[0]
    assert recs[-1]["loss"] < recs[0]["loss"] - 1.0
    vals = [r["val"] for r in metrics(run) if "val" in r]
    assert len(vals) == 4 and vals[-1]["bits_per_byte"] < vals[0]["bits_per_byte"]
    ckpts = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert ckpts == ["latest", "step-000008", "step-000016", "step-000020"]
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-000020"
    ck = load_checkpoint(run)
    assert ck.trainer_state["step"] == 20 and ck.tokenizer_file is not None
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["kind"] == "run" and manifest["inputs"][0]["kind"] == "tokens"
    png = tmp_path / "plots"
    llmctl("plot", run, "-o", png, check=True)
    assert {"loss.png", "bits_per_byte.png", "lr.png", "grad_norm.png", "tokens_per_s.png"} <= {p.name for p in png.iterdir()}


def test_resume_after_sigterm_gives_bitwise_identical_losses(tokens, tmp_path):
    full, cut = tmp_path / "full", tmp_path / "cut"
    args = ["train", tokens / "train", "--val", tokens / "val", "--checkpoint-every", "1000", *SMALL, "--max-tokens", "40960"]
    llmctl(*args, "-o", full, check=True)
    proc = subprocess.Popen([sys.executable, "-m", "llmctl", *map(str, args), "-o", str(cut), "-q"],
                            stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline:
        m = cut / "metrics.jsonl"
        if m.is_file() and sum(1 for line in m.read_text().splitlines() if '"loss"' in line) >= 6:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, stderr.decode()
    assert "checkpoint saved" in stderr.decode()
    stopped_at = load_checkpoint(cut).trainer_state["step"]
    assert 6 <= stopped_at < 160  # checkpointed on the signal, not by the periodic rule
    llmctl(*args, "-o", cut, "--resume", check=True)
    assert step_losses(cut) == step_losses(full)  # bitwise, not approximately


def test_resume_and_overwrite_usage(tokens, tmp_path):
    run = tmp_path / "run"
    p = llmctl("train", tokens / "train", "-o", run, "--resume", *SMALL)
    assert p.returncode == 2 and "holds no checkpoint" in p.stderr.decode()
    llmctl("train", tokens / "train", "-o", run, "--max-steps", "2", *SMALL, check=True)
    p = llmctl("train", tokens / "train", "-o", run, *SMALL)
    assert p.returncode == 2 and "--resume" in p.stderr.decode()
    p = llmctl("train", tokens / "train", "-o", run, *SMALL, "--set", "model.n_layers=3", "--resume")
    assert p.returncode == 2 and "differs" in p.stderr.decode()


def test_nan_guard_counts_skips_then_aborts(tokens, tmp_path):
    run = tmp_path / "run"
    # a decay of 1e30 scales the weights by about -1e27 in the first update: the next losses are not finite
    p = llmctl("train", tokens / "train", "-o", run, *SMALL, "--set", "train.weight_decay=1e30",
               "--set", "train.max_bad_steps=3")
    assert p.returncode == 1, p.stderr.decode()
    assert "non-finite" in p.stderr.decode() and "Traceback" not in p.stderr.decode()
    recs = [r for r in metrics(run) if "loss" in r]
    assert [r.get("skipped", False) for r in recs][-3:] == [True, True, True]


@pytest.mark.parametrize("sharding", ["ddp", "fsdp", "ddp-muon"])
def test_two_processes_match_one(tokens, tmp_path, sharding):
    """2 gloo ranks (DDP, or FSDP2 with --fsdp; DDP with --optimizer muon) with the same global
    batch follow the single-process loss curve, and the checkpoint holds the full (unsharded) weights."""
    one, two = tmp_path / "one", tmp_path / "two"
    args = ["train", str(tokens / "train"), *map(str, SMALL), "--max-tokens", "2560", "-q",
            *(["--optimizer", "muon"] if sharding == "ddp-muon" else [])]
    llmctl(*args, "-o", one, check=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        "-m", "llmctl", *args, "-o", str(two), *(["--fsdp"] if sharding == "fsdp" else [])],
                       capture_output=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    a, b = step_losses(one), step_losses(two)
    assert [s for s, _ in a] == [s for s, _ in b]
    assert max(abs(x - y) for (_, x), (_, y) in zip(a, b)) < 1e-4
    assert json.loads((two / "config.json").read_text())["world_size"] == 2
    full = load_checkpoint(one).tensors
    assert {k: v.shape for k, v in load_checkpoint(two).tensors.items()} == {k: v.shape for k, v in full.items()}


def test_export_loads_in_transformers_with_equal_logits(tokens, tmp_path):
    transformers = pytest.importorskip("transformers")
    run = tmp_path / "run"
    llmctl("train", tokens / "train", "-o", run, *SMALL, "--max-steps", "3", "--set", "model.tied=false", check=True)
    llmctl("export", run, "-o", tmp_path / "hf", check=True)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    ours = Transformer(load_checkpoint(run).config)
    ours.load_state_dict(load_checkpoint(run).tensors)
    ids = torch.tensor([tok("The miller carries grain to town. A farmer")["input_ids"]])
    assert hf.config.vocab_size == len(tok) == 300  # cut to the tokenizer: the padding rows are not exported
    with torch.no_grad():
        diff = (ours(ids)[..., :300] - hf(ids).logits).abs().max().item()
    assert diff < 1e-4


def test_missing_or_corrupt_checkpoint_is_one_line(tokens, tmp_path):
    p = llmctl("export", tmp_path / "nothing", "-o", tmp_path / "hf")
    assert p.returncode == 2 and "not found" in p.stderr.decode()
    run = tmp_path / "run"
    llmctl("train", tokens / "train", "-o", run, *SMALL, "--max-steps", "2", check=True)
    (run / "checkpoints" / "step-000002" / "model.safetensors").write_bytes(b"\x00garbage")
    for args in (("export", run, "-o", tmp_path / "hf"), ("train", tokens / "train", "-o", run, "--resume", *SMALL)):
        p = llmctl(*args)
        err = p.stderr.decode().strip()
        assert p.returncode == 2 and "corrupt" in err and len(err.splitlines()) == 1, err


def test_run_dir_lifecycle(tmp_path):
    """torchrt.RunDir, the run directory train, rl and eval share: new / not empty / --overwrite
    (only the run's own entries go) / --resume (a checkpoint, the same model), metrics truncated
    past the checkpoint on resume, checkpoint then manifest."""
    from llmctl.artifacts.manifest import Manifest
    from llmctl.torchrt.rundir import RunDir

    out = tmp_path / "run"
    rd = RunDir(out)
    with pytest.raises(UsageError, match="holds no checkpoint"):
        rd.prepare(resume=True)
    rd.prepare()
    assert out.is_dir() and not rd.has_checkpoint()
    cfg = ModelConfig(vocab_size=64, n_layers=1, d_model=32, n_heads=2)
    rd.write_json("config.json", {"model": cfg.to_dict()})
    with rd.metrics(0) as m:
        for step in (1, 2, 3):
            m.log({"step": step, "loss": 1.0 / step})
    rd.checkpoint(2, cfg, Transformer(cfg).state_dict(), {"step": 2})
    rd.finish(Manifest(kind="run", stage="train"))
    assert rd.has_checkpoint() and (out / "manifest.json").is_file()
    (out / "plots").mkdir()
    with pytest.raises(UsageError, match="is not empty: pass --resume"):
        RunDir(out).prepare()
    with pytest.raises(UsageError, match="not empty \\(pass --overwrite\\)"):
        RunDir(out, resumable=False).check()
    with pytest.raises(UsageError, match="the model differs from this command's"):
        RunDir(out).prepare(resume=True, expect={"model": {**cfg.to_dict(), "n_layers": 2}})
    RunDir(out).prepare(resume=True, expect={"model": cfg.to_dict()})
    with RunDir(out).metrics(2) as m:  # resumed at step 2: step 3 runs again
        m.log({"step": 3, "loss": 0.5})
    assert [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()] == \
        [{"step": 1, "loss": 1.0}, {"step": 2, "loss": 0.5}, {"step": 3, "loss": 0.5}]
    RunDir(out).prepare(overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["plots"]
