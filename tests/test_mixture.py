"""train mixtures: exact counts per source under weights and epoch caps, (seed, step) purity
(resume, 2 ranks, one source = the single-source loader), upsampling by a kept column, one
tokenizer for all sources, tokenize --keep-column, the epochs warning and --max-epochs."""

import json
import math
import os
import random
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from tokenizers import Tokenizer

from conftest import llmctl
from llmctl.artifacts.tokens import TokenDataset
from llmctl.tokenizer import bpe
from llmctl.data.tokenize import TokenizeConfig, run_tokenize, train_tokenizer
from llmctl.errors import UsageError
from llmctl.model.config import ModelConfig
from llmctl.runtime.options import RunOptions
from llmctl.train.config import TrainConfig
from llmctl.train.loader import PackedBatches, WindowOrder
from llmctl.train.mixture import DataSource, MixedBatches, SourceWindows, Upsample
from llmctl.train.pretrain import PretrainData
from llmctl.train.trainer import run_train

WORDS = "the miller carries grain to town a farmer watches the stone wall my sister sells twelve baskets".split()
SEQ = 32
MODEL = ModelConfig(vocab_size=300, n_layers=1, d_model=32, n_heads=2, n_kv_heads=1, d_ff=64, max_seq_len=SEQ)


def train_cfg(**kw) -> TrainConfig:
    base = dict(seq_len=SEQ, batch_tokens=10 * SEQ, micro_batch=5, max_tokens=40 * 10 * SEQ, eval_every=0, eval_windows=4,
                threads=1, device="cpu", peak_flops=1e9, checkpoint_every=1000)
    return TrainConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Sources a (300 docs), b (150), c (40), each doc `docN …` with kept columns `ident` (N) and
    `dup` (a cluster size, some null); and x, like a but tokenized with another tokenizer."""
    d = tmp_path_factory.mktemp("mixture")
    rng = random.Random(0)
    ident = 0
    for name, n in (("a", 300), ("b", 150), ("c", 40)):
        texts, idents = [], []
        for _ in range(n):
            texts.append(f"doc{ident} " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60))))
            idents.append(ident)
            ident += 1
        dup = [rng.choice([1, 1, 2, 3, 6, None]) for _ in range(n)]
        pq.write_table(pa.table({"text": texts, "ident": idents, "dup": dup}), d / f"{name}.parquet")
    train_tokenizer([str(d / "a.parquet")], str(d / "tok"), bpe.TrainTokenizerConfig(vocab_size=300))
    train_tokenizer([str(d / "a.parquet")], str(d / "tok2"), bpe.TrainTokenizerConfig(vocab_size=280))
    for name, tok in (("a", "tok"), ("b", "tok"), ("c", "tok"), ("x", "tok2")):
        cfg = TokenizeConfig(tokenizer=str(d / tok / "tokenizer.json"), keep_columns=["ident", "dup"])
        run_tokenize([str(d / f"{'a' if name == 'x' else name}.parquet")], str(d / name), cfg, RunOptions(workers=1))
    return d


def metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


# -- tokenize --keep-column ------------------------------------------------------------------

def test_keep_column_round_trip(data, tmp_path):
    """The kept columns come back one value per document, in .idx order, nulls kept, also after
    a by-document split; the meta files are outputs with their sha256; a missing column is exit 2."""
    tok = Tokenizer.from_file(str(data / "tok" / "tokenizer.json"))
    ds = TokenDataset(data / "b")
    ident, dup = ds.doc_column("ident"), ds.doc_column("dup")
    assert len(ident) == ds.n_docs == 150 and np.isnan(dup).any()
    assert all(tok.decode(ds.doc(i).tolist()).startswith(f"doc{int(ident[i])} ") for i in range(ds.n_docs))
    src = pq.read_table(data / "b.parquet").to_pydict()
    assert [None if math.isnan(v) else int(v) for v in dup] == src["dup"]
    m = json.loads((data / "b" / "manifest.json").read_text())
    assert m["config"]["keep_columns"] == ["ident", "dup"]
    meta = [o for o in m["outputs"] if o["file"].endswith(".meta.parquet")]
    assert len(meta) == 1 and meta[0]["rows"] == 150 and len(meta[0]["sha256"]) == 64
    with pytest.raises(UsageError, match="was not kept"):
        ds.doc_column("url")
    # a split keeps the columns of its own documents only
    cfg = TokenizeConfig(tokenizer=str(data / "tok" / "tokenizer.json"), split="val", val_fraction=0.3, keep_columns=["ident"])
    run_tokenize([str(data / "b.parquet")], str(tmp_path / "val"), cfg, RunOptions(workers=1))
    val = TokenDataset(tmp_path / "val")
    assert 0 < val.n_docs < 150
    assert all(tok.decode(val.doc(i).tolist()).startswith(f"doc{int(v)} ") for i, v in enumerate(val.doc_column("ident")))
    p = llmctl("tokenize", data / "b.parquet", "-o", tmp_path / "t", "-t", data / "tok", "--keep-column", "nope")
    err = p.stderr.decode().strip()
    assert p.returncode == 2 and "no column 'nope' to keep" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "t" / "manifest.json").exists()


# -- the arithmetic --------------------------------------------------------------------------

def hamilton(w: list[Fraction], n: int) -> list[int]:
    """Largest remainder apportionment of n, the plainest way."""
    q = [x * n for x in w]
    a = [math.floor(x) for x in q]
    for i in sorted(range(len(w)), key=lambda i: (-(q[i] - a[i]), i))[: n - sum(a)]:
        a[i] += 1
    return a


def reference_blocks(weights, caps, M, n_blocks):
    """Per-block counts by the rules read literally, one block at a time: cumulative Hamilton
    apportionment within a phase; the block where sources reach their caps gives them what is
    left and their slots to the others by weight; then the weights are renormalized."""
    k = len(weights)
    used, active, phase_used, r, out = [0] * k, list(range(k)), [0] * k, 0, []
    for _ in range(n_blocks):
        if not active:
            break
        total = sum(weights[i] for i in active)
        w = [weights[i] / total if i in active else Fraction(0) for i in range(k)]
        lo, hi = hamilton(w, r * M), hamilton(w, (r + 1) * M)
        c = [h - lo_ for h, lo_ in zip(hi, lo)]
        done = set()
        while True:
            cc = list(c)
            for i in done:
                cc[i] = caps[i] - used[i]
            rest = [i for i in active if i not in done]
            spare = M - sum(cc)
            if rest and spare:
                t = sum(weights[i] for i in rest)
                extra = hamilton([weights[i] / t if i in rest else Fraction(0) for i in range(k)], spare)
                cc = [x + y for x, y in zip(cc, extra)]
            over = {i for i in rest if caps[i] is not None and used[i] + cc[i] >= caps[i]}
            if not over:
                break
            done |= over
            if all(used[i] + cc[i] == caps[i] for i in over):
                break
        out.append(cc)
        used = [u + x for u, x in zip(used, cc)]
        r += 1
        if done:
            active = [i for i in active if i not in done]
            r = 0
    return out


def test_weights_and_caps_give_exact_counts(data):
    """0.6/0.3/0.1 over batches of 10: each batch holds exactly 6/3/1 until c has drawn its one
    epoch (its W_c windows: step W_c); then a and b share 2:1 until b's cap (max_epochs 1: 565
    windows, not a multiple of 3, so it lands inside a batch and what b leaves goes to a), then a
    alone; the counts of every batch equal the rules computed literally, block by block, and each
    source's draws are its own epoch order."""
    ws = [SourceWindows(TokenDataset(data / n), SEQ, 7, i) for i, n in enumerate("abc")]
    W = [w.n_windows for w in ws]
    assert W[2] < W[1] / 3  # c runs out before b
    caps = [None, W[1], W[2]]
    mb = MixedBatches(ws, [0.6, 0.3, 0.1], caps, batch_seqs=10, seed=7)
    steps = 400
    src, wid = mb.slots(0, steps * 10)
    per_step = np.stack([np.bincount(src[s * 10:(s + 1) * 10], minlength=3) for s in range(steps)])
    assert (per_step[: W[2]] == [6, 3, 1]).all()  # every batch holds each share exactly
    assert (per_step[W[2]:, 2] == 0).all() and per_step[:, 2].sum() == W[2]
    ref = np.array(reference_blocks([Fraction(6, 10), Fraction(3, 10), Fraction(1, 10)], caps, 10, steps))
    assert (per_step == ref).all()
    assert per_step[:, 1].sum() == min(W[1], ref[:, 1].sum())
    for i in range(3):  # the k-th draw of a source is window k of its (seed, epoch) order
        sel = src == i
        assert (wid[sel] == ws[i].window_ids(np.arange(sel.sum()))).all()
    assert sorted(wid[src == 2].tolist()) == list(range(W[2]))  # one epoch: each window once
    assert (mb.drawn(steps * 10) == per_step.sum(0)).all()


def test_every_source_capped_ends_the_mixture(data):
    ws = [SourceWindows(TokenDataset(data / n), SEQ, 1, i) for i, n in enumerate("abc")]
    caps = [ws[0].n_windows // 2, ws[1].n_windows, ws[2].n_windows * 2]
    mb = MixedBatches(ws, [0.6, 0.3, 0.1], caps, batch_seqs=10, seed=1)
    assert mb.total_slots == sum(caps)
    src, _ = mb.slots(0, mb.total_slots)
    assert np.bincount(src, minlength=3).tolist() == caps
    with pytest.raises(IndexError):
        mb.slots(mb.total_slots, 1)


def test_one_source_is_the_single_source_loader(data):
    """The one-source mixture gives PackedBatches' batches byte for byte (the demo's run is unchanged)."""
    ds = TokenDataset(data / "a")
    old = PackedBatches(ds, SEQ, 3)
    new = MixedBatches([SourceWindows(ds, SEQ, 3, 0)], [1.0], [None], batch_seqs=8, seed=3)
    for step in (0, 1, 5, 130, 131, 400):  # across epoch ends (1043 windows = 130.4 steps)
        for (x1, y1), (x2, y2) in zip(old.micro_batches(step, 8, 3, 1, 2), new.micro_batches(step, 8, 3, 1, 2)):
            assert torch.equal(x1, x2) and torch.equal(y1, y2)


def test_window_order_is_pinned_to_its_seeds():
    """The one window order (train/loader.py WindowOrder) that pretraining, mixtures and SFT share:
    epoch e of stream 0 is permutation(default_rng([seed, e])), stream i's is spawned from it by
    (i,), and draw k takes window k mod W of epoch k // W. Pinned, so a checkpoint's data position
    keeps meaning the same windows."""
    order, w = WindowOrder(37, 5), 37
    for e in (0, 1, 4):
        assert (order.epoch(e) == np.random.default_rng([5, e]).permutation(w)).all()
    spawned = np.random.default_rng(np.random.SeedSequence([5, 2], spawn_key=(3,))).permutation(w)
    assert (WindowOrder(w, 5, stream=3).epoch(2) == spawned).all()
    draws = np.array([0, 36, 37, 80, 200])
    want = [order.epoch(k // w)[k % w] for k in draws.tolist()]
    assert order.window_ids(draws).tolist() == want
    assert order.consecutive(70, 10).tolist() == [order.epoch(k // w)[k % w] for k in range(70, 80)]


def test_upsampling_repeats_documents_by_the_kept_column(data):
    """buckets [[2, 2], [5, 3]]: dup >= 5 three times, 2..4 twice, 1 and null once; the epoch's
    stream is pass 0 (every document) then pass 1 (dup >= 2) then pass 2 (dup >= 5)."""
    ds = TokenDataset(data / "c")
    up = Upsample.parse({"column": "dup", "buckets": [[2, 2], [5, 3]]}, "test")
    sw = SourceWindows(ds, SEQ, 0, 0, "c", up)
    dup = ds.doc_column("dup")
    reps = np.where(np.isnan(dup), 1, np.where(dup >= 5, 3, np.where(dup >= 2, 2, 1)))
    assert sw.repeats.tolist() == reps.tolist()
    docs = [np.append(ds.doc(i), ds.eos_id) for i in range(ds.n_docs)]
    stream = np.concatenate([d for p in range(3) for d, r in zip(docs, reps) if r > p])
    assert sw.stream_tokens == len(stream) == sum(len(d) * r for d, r in zip(docs, reps))
    row = np.empty(SEQ + 1, np.int64)
    for w in range(sw.n_windows):
        sw.fill(w, row)
        assert (row == stream[w * SEQ: w * SEQ + SEQ + 1]).all()
    # a mixture draws the upsampled epoch: every window once per epoch
    mb = MixedBatches([sw], [1.0], [sw.n_windows], batch_seqs=4, seed=0)
    assert mb.total_slots == sw.n_windows
    assert sorted(mb.slots(0, sw.n_windows)[1].tolist()) == list(range(sw.n_windows))
    for bad in ({"column": "dup"}, {"column": "dup", "buckets": [[5, 2], [2, 3]]}, {"column": "dup", "buckets": [[1, 1.5]]}):
        with pytest.raises(UsageError):
            Upsample.parse(bad, "test")


# -- runs --------------------------------------------------------------------------------------

def sources(data, **c):
    return [DataSource("a", data / "a", 0.6), DataSource("b", data / "b", 0.3, val=data / "b"),
            DataSource("c", data / "c", 0.1, max_epochs=c.get("max_epochs", 0.1),
                       upsample=Upsample.parse({"column": "dup", "buckets": [[2, 2], [5, 3]]}, "t"))]


def test_resume_mid_run_reproduces_the_mixture(data, tmp_path):
    """3 sources (one capped, upsampled, exhausted mid-run): a run stopped at step 9 and resumed
    has the uninterrupted run's losses bitwise and its tokens per source; validation per source."""
    cfg = train_cfg(eval_every=10)
    logs = []
    run_train(sources(data), tmp_path / "full", MODEL, cfg, on_log=logs.append)
    run_train(sources(data), tmp_path / "cut", MODEL, train_cfg(eval_every=10, max_steps=9))
    run_train(sources(data), tmp_path / "cut", MODEL, cfg, resume=True)
    full, cut = metrics(tmp_path / "full"), metrics(tmp_path / "cut")
    assert [(r["step"], r["loss"]) for r in full if "loss" in r] == [(r["step"], r["loss"]) for r in cut if "loss" in r]
    steps = [r for r in full if "loss" in r]
    assert steps[0]["source_tokens"] == {"a": 6 * SEQ, "b": 3 * SEQ, "c": SEQ}
    plan = {e["name"]: e for e in json.loads((tmp_path / "full" / "config.json").read_text())["data"]}
    cap = plan["c"]["sequences"]
    assert cap == math.floor(0.1 * plan["c"]["windows"]) and cap < 40  # c runs out mid-run
    assert steps[-1]["source_tokens"]["c"] == cap * SEQ == steps[cap]["source_tokens"]["c"]
    assert sum(steps[-1]["source_tokens"].values()) == 40 * 10 * SEQ
    assert [m for m in logs if "has drawn its 0.1 epoch" in m] == [
        f"step {cap}: source c has drawn its 0.1 epoch(s) ({cap * SEQ:,} tokens) and stops; weights from here: a 0.667, b 0.333"]
    vals = [r["val"] for r in full if "val" in r]
    assert len(vals) == 4 and set(vals[-1]) == {"sources"} and "bits_per_byte" in vals[-1]["sources"]["b"]
    m = json.loads((tmp_path / "full" / "manifest.json").read_text())
    assert m["counts"]["source_tokens"] == steps[-1]["source_tokens"] and len(m["inputs"]) == 4


def test_two_ranks_take_slices_of_the_same_batches(data, tmp_path):
    """torchrun, 2 gloo ranks: each rank's micro-batches are its slice of the single-process
    batches, bitwise, for a 3-source capped and upsampled mixture."""
    cfg = dict(seq_len=SEQ, batch_tokens=10 * SEQ, micro_batch=5, max_tokens=40 * 10 * SEQ, threads=1, device="cpu")
    srcs = [dict(name=s.name, path=str(s.path), weight=s.weight, max_epochs=s.max_epochs) for s in sources(data)]
    steps = 30
    spec = json.dumps({"train": cfg, "sources": srcs})
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        str(Path(__file__).with_name("mixture_ranks.py")), str(tmp_path), str(steps), spec],
                       capture_output=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    one = PretrainData([DataSource(**{**s, "path": Path(s["path"])}) for s in srcs], None, TrainConfig(**cfg), mixture=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    for s in range(steps):
        x, y = one.loader.sequences(s * 10, 10)
        got = [t for r in ranks for t in r[s]]
        assert torch.equal(torch.cat([a for a, _ in got]), x) and torch.equal(torch.cat([b for _, b in got]), y)


def test_epochs_warning_and_max_epochs_cap(data, tmp_path):
    """An over-epoched run warns before step 1, naming the fixed budget; --max-epochs cuts the
    budget (and the schedule) to whole batches of that many epochs."""
    logs = []
    cfg = train_cfg(max_tokens=200_000, max_steps=1)
    run_train(data / "c", tmp_path / "warn", MODEL, cfg, on_log=logs.append, budget_from="the tiny preset")
    warning = next(m for m in logs if m.startswith("warning:"))
    assert "Muennighoff" in warning and "the tiny preset trains 200,000 tokens whatever the data" in warning
    assert "pass --max-tokens or --max-epochs" in warning
    w = SourceWindows(TokenDataset(data / "c"), SEQ, 0, 0).n_windows
    logs = []
    run_train(data / "c", tmp_path / "cap", MODEL, train_cfg(max_tokens=200_000, max_epochs=2.0, max_steps=1), on_log=logs.append)
    budget = (2 * w // 10) * 10 * SEQ
    conf = json.loads((tmp_path / "cap" / "config.json").read_text())
    assert conf["train"]["max_tokens"] == budget and conf["data"][0]["epochs"] == pytest.approx((2 * w // 10) * 10 / w, abs=1e-4)
    assert any(f"the run trains {budget:,} tokens" in m and "the schedule spans them" in m for m in logs)
    assert not any(m.startswith("warning:") for m in logs)
    first = metrics(tmp_path / "cap")[0]
    assert first["lr"] == pytest.approx(3e-3 * 10 * SEQ / (0.1 * budget))  # warmup spans 10% of the cut budget


def test_cli_mixture_config_and_usage_errors(data, tmp_path):
    """[[data]] in a train TOML (paths relative to it, upsampling, max_epochs), --val NAME=TOKENS;
    and the one-line usage errors: different tokenizers, TOKENS with --data, a bad --data."""
    toml = tmp_path / "mix.toml"
    toml.write_text(f"""
[model]
vocab_size = 300
n_layers = 1
d_model = 32
n_heads = 2
n_kv_heads = 1
d_ff = 64

[train]
seq_len = {SEQ}
batch_tokens = {10 * SEQ}
micro_batch = 10
max_tokens = 600_000
eval_every = 0
eval_windows = 2
threads = 1

[[data]]
name = "web"
path = "{os.path.relpath(data / 'a', tmp_path)}"
weight = 0.9

[[data]]
name = "small"
path = "{data / 'c'}"
weight = 0.1
max_epochs = 3
upsample = {{column = "dup", buckets = [[2, 2], [5, 3]]}}
""")
    run = tmp_path / "run"
    p = llmctl("train", "-o", run, "--config", toml, "--max-steps", "2", "--val", f"small={data / 'c'}", check=True)
    err = p.stderr.decode()
    assert "data small: weight 0.100" in err and "upsampled" in err
    assert "warning: source web is seen" in err and f"the config {toml} trains 600,000 tokens whatever the data" in err
    conf = json.loads((run / "config.json").read_text())
    assert [e["name"] for e in conf["data"]] == ["web", "small"] and conf["data"][1]["max_epochs"] == 3
    assert conf["data"][1]["sequences"] == conf["data"][1]["windows"] * 3  # its cap binds
    last = metrics(run)[-1]
    assert set(last["val"]["sources"]) == {"small"}
    for argv, words in (
        (["--data", f"a={data / 'a'}:0.5", "--data", f"x={data / 'x'}:0.5"], "source a and source x were tokenized with different tokenizers (vocabulary 300 vs 280)"),
        ([str(data / "a"), "--data", f"a={data / 'a'}:1"], "give a TOKENS argument or --data sources, not both"),
        (["--data", f"a={data / 'a'}"], "expected NAME=TOKENS:WEIGHT"),
        (["--data", f"a={data / 'a'}:0"], "weight must be > 0"),
        (["--data", f"a={data / 'a'}:1", "--val", f"zz={data / 'a'}"], "no mixture source named 'zz'"),
    ):
        p = llmctl("train", *argv, "-o", tmp_path / "bad", "--config", toml)
        e = p.stderr.decode().strip()
        assert p.returncode == 2 and words in e and len(e.splitlines()) == 1, e
