"""eval: normalizations, packed scoring = one-by-one scoring, KV-cache generation = recomputation,
the eval CLI on a trained checkpoint, compare, malformed task files."""

import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import llmctl, shared_file
from llmctl.eval.score import argmax_first, encode_pair, normalized_scores, score_items
from llmctl.model.config import ModelConfig
from llmctl.model.generate import Engine, EngineConfig, SamplingParams
from llmctl.model.transformer import Transformer
from test_train import SMALL, tokens  # noqa: F401  (the module fixture: a tokenizer and token splits)


def test_normalizations_pick_the_spec_answers():
    # spec 001-data-eval C22: none A, per-token C, per-char B, PMI D
    v = normalized_scores([-4, -9, -8, -6], [1, 3, 4, 2], [5, 30, 14, 10], [-6, -10, -11, -12])
    assert {k: "ABCD"[argmax_first(x)] for k, x in v.items()} == {"none": "A", "per_token": "C", "per_char": "B", "pmi": "D"}
    assert v["per_token"][2] == -2.0 and v["pmi"][3] == 6


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return Transformer(ModelConfig(vocab_size=200, n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, max_seq_len=64)).eval()


def encode(text):  # a toy byte tokenizer: enough for checking the arithmetic of scoring
    return [b % 190 + 10 for b in text.encode()]


def test_packed_scoring_equals_scoring_each_choice_alone(model):
    items = [[encode_pair(encode, "The river runs past the", c, 0) for c in [" old mill.", " town", " a", " x y z"]],
             [encode_pair(encode, "", c, 0) for c in ["Hello world", "Bye"]],
             [encode_pair(encode, "Alice went to the " + o, " to buy bread.", 0) for o in ["market", "bakery"]],
             # identical choices, and choices whose model inputs lie wholly in the shared prefix
             [encode_pair(encode, "Same", c, 0) for c in [" ab", " ab", " abc", "!"]]]
    got = score_items(model, items, max_tokens=80)
    for reqs, res in zip(items, got):
        for r, (lp, n) in zip(reqs, res):
            with torch.no_grad():
                # over the vocabulary's 200 ids: the head's padding rows (to 256) are no token
                logp = F.log_softmax(model(torch.tensor([r.tokens]))[..., :200].float(), -1)[0]
            ref = sum(logp[t - 1, r.tokens[t]].item() for t in range(r.start, len(r.tokens)))
            assert lp == pytest.approx(ref, abs=1e-4) and n == len(r.tokens) - r.start


def test_trailing_context_space_moves_to_the_continuation():
    r = encode_pair(lambda s: list(s.encode()), "Answer: ", "yes", 0)
    assert bytes(r.tokens[r.start:]) == b" yes"


def test_kv_cache_generation_equals_recomputation(model):
    engine = Engine(model, encode, lambda ids: " ".join(map(str, ids)), stop_ids=(), pad_id=0, config=EngineConfig(max_rows=3))
    prompts = ["a", "The river runs", "xyz xyz xyz xyz", "Q"]
    for params in (SamplingParams(max_new_tokens=24), SamplingParams(max_new_tokens=24, temperature=0.9, top_k=20, top_p=0.9, seed=3)):
        cached = engine.generate(prompts, params)
        fresh = engine.generate(prompts, params, use_cache=False)
        assert [g.ids for g in cached] == [g.ids for g in fresh]
        assert all(len(g.ids) == 24 and g.truncated for g in cached)
    again = engine.generate(prompts, SamplingParams(max_new_tokens=24, temperature=0.9, seed=3))
    assert [g.ids for g in again] == [g.ids for g in engine.generate(prompts, SamplingParams(max_new_tokens=24, temperature=0.9, seed=3))]


@pytest.fixture(scope="module")
def run(tokens, tmp_path_factory):  # noqa: F811
    d = tmp_path_factory.mktemp("evalrun")
    llmctl("train", tokens / "train", "-o", d / "run", *SMALL, "--max-tokens", "15360", check=True)
    rng = random.Random(0)
    with open(d / "cloze.jsonl", "w") as f:
        for _ in range(30):
            s = rng.choice(["the miller", "a farmer"]).capitalize() + " " + rng.choice(["carries", "sells"])
            f.write(json.dumps({"context": s, "choices": [" grain to town.", " zq xv.", " qqq.", " of the the."], "label": 0}) + "\n")
    with open(d / "sums.jsonl", "w") as f:
        for a in range(6):
            f.write(json.dumps({"question": f"What is {a} + {a}?", "answer": f"{a} + {a} = {2 * a}\n#### {2 * a}"}) + "\n")
    return d


def test_eval_cli_reports_scores_with_intervals(run, tokens, tmp_path):  # noqa: F811
    out = tmp_path / "res"
    p = llmctl("eval", run / "run", "-o", out, "-t", f"mc:{run / 'cloze.jsonl'}", "-t", f"gsm8k:{run / 'sums.jsonl'}",
               "-t", f"loss:{tokens / 'val'}", "--max-new-tokens", "8", "--pmi", "--json", check=True)
    res = json.loads(p.stdout)
    mc = res["tasks"]["mc:cloze"]
    # lm-evaluation-harness's names: acc is the plain sum of log-probs, acc_norm per character
    assert mc["n"] == 30 and set(mc["metrics"]) == {"acc", "acc_norm", "acc_per_token", "acc_pmi"}
    assert mc["headline"] == "acc_norm" and mc["reporting"]["normalization"] == "per_char"
    assert mc["metrics"]["acc_norm"]["mean"] > 0.9  # " grain to town." is what this grammar says
    a = mc["metrics"]["acc_norm"]
    assert a["interval"] == "wilson" and a["ci_low"] <= a["mean"] <= a["ci_high"]
    gen = res["tasks"]["gsm8k:sums"]
    assert gen["headline"] == "acc" and set(gen["metrics"]) == {"acc", "acc_flexible", "well_formed"}
    assert gen["reporting"]["decoding"]["temperature"] == 0 and gen["reporting"]["truncated_generations"] >= 0
    assert res["tasks"]["loss:val"]["headline"] == "bits_per_byte"
    assert 0 < res["tasks"][f"loss:val"]["metrics"]["bits_per_byte"]["mean"] < 8
    import pyarrow.parquet as pq
    rows = pq.read_table(out / "samples.parquet").to_pylist()
    assert len(rows) == 30 + 6 + res["tasks"]["loss:val"]["n"]
    mc_rows = [r for r in rows if r["task"] == "mc:cloze"]
    for m in ("acc", "acc_norm", "acc_per_token", "acc_pmi"):  # per item: each accuracy and the choice it picked
        assert sum(r[m] for r in mc_rows) / 30 == pytest.approx(mc["metrics"][m]["mean"])
        assert all(r[m] == float(r[f"pred_{m}"] == r["label"]) for r in mc_rows)
    assert all(r["score"] == r["acc_norm"] for r in mc_rows)  # the headline's
    # the same run twice, headlined by --norm: compare pairs a metric with itself only
    llmctl("eval", run / "run", "-o", tmp_path / "res2", "-t", f"mc:{run / 'cloze.jsonl'}", "-q", check=True)
    llmctl("eval", run / "run", "-o", tmp_path / "res3", "-t", f"mc:{run / 'cloze.jsonl'}", "--norm", "none", "-q", check=True)
    assert json.loads((tmp_path / "res3" / "results.json").read_text())["tasks"]["mc:cloze"]["headline"] == "acc"
    p = llmctl("eval", "compare", tmp_path / "res2", tmp_path / "res3")
    assert p.returncode == 2 and "A is scored by acc_norm, B by acc" in p.stderr.decode()
    for metric in ("acc", "acc_norm"):
        c = json.loads(llmctl("eval", "compare", tmp_path / "res2", tmp_path / "res3", "--metric", metric, "--json", check=True).stdout)
        assert c["tasks"][0]["n"] == 30 and c["tasks"][0]["metric"] == metric and c["tasks"][0]["diff"] == 0
    p = llmctl("eval", "compare", tmp_path / "res2", tmp_path / "res3", "--metric", "acc_bogus")
    assert p.returncode == 2 and "acc_bogus" in p.stderr.decode()
    # the table a person reads, in an 80-column terminal: no line wider, no header or number cut
    p = subprocess.run([sys.executable, "-m", "llmctl", "eval", "compare", tmp_path / "res2", tmp_path / "res2"],
                       capture_output=True, text=True, env={**os.environ, "COLUMNS": "80"}, check=True)
    assert "acc_norm" in p.stderr and "…" not in p.stderr and max(map(len, p.stderr.splitlines())) <= 80


def test_malformed_task_file_names_the_line(run, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"context": "a", "choices": [" b", " c"], "label": 0}\n{"context": "a", "choices": [" b"\n')
    p = llmctl("eval", run / "run", "-o", tmp_path / "r", "-t", f"mc:{bad}")
    assert p.returncode == 2 and f"{bad}:2" in p.stderr.decode()
    bad.write_text('{"context": "a", "choices": [" b", " c"], "label": 5}\n')
    p = llmctl("eval", run / "run", "-o", tmp_path / "r", "-t", f"mc:{bad}")
    assert p.returncode == 2 and f"{bad}:1" in p.stderr.decode() and "label" in p.stderr.decode()
    p = llmctl("eval", run / "run", "-o", tmp_path / "r", "-t", "nope:x")
    assert p.returncode == 2 and "KIND:PATH" in p.stderr.decode()


def test_gsm8k_native_file_loads(run, tmp_path):
    gsm = shared_file("gsm8k/test.jsonl")
    p = llmctl("eval", run / "run", "-o", tmp_path / "r", "-t", f"gsm8k:{gsm}", "--limit", "3", "--max-new-tokens", "4", "--json")
    assert p.returncode == 0, p.stderr.decode()
    assert json.loads(p.stdout)["tasks"]["gsm8k:test"]["n"] == 3


def test_generate_cli(run):
    p = llmctl("generate", run / "run", "-p", "The miller", "--max-new-tokens", "6", "--json", check=True)
    out = json.loads(p.stdout)
    assert out[0]["tokens"] <= 6 and out[0]["finish"] in ("eos", "length", "stop")


def test_pack_rows_places_every_item_once_within_the_width():
    from llmctl.eval.score import pack_rows

    lengths = [44, 15, 30, 29, 1, 16, 44, 12, 33, 10]
    rows = pack_rows(lengths, 60)
    assert sorted(k for r in rows for k in r) == list(range(len(lengths)))
    assert all(sum(lengths[k] for k in r) <= 60 for r in rows)
    assert len(rows) == 4  # 234 tokens in rows of 60: the fewest possible, ⌈234 / 60⌉


def test_row_streams_sample_the_distribution_and_repeat():
    """RowStreams' inverse-CDF draws follow the probabilities (χ² over 20,000 draws), never pick a
    zero-probability token, and are a function of the row's seed and draw index alone."""
    from llmctl.model.generate import RowStreams

    probs = torch.tensor([0.5, 0.0, 0.2, 0.25, 0.05], dtype=torch.float64)
    rows = 20_000
    streams = RowStreams(range(rows))
    cdf = probs.cumsum(-1)
    u = torch.from_numpy(streams.next_uniform())
    assert 0.0 <= float(u.min()) and float(u.max()) < 1.0
    ids = torch.searchsorted(cdf, (u * cdf[-1])[:, None], right=True)[:, 0]
    counts = torch.bincount(ids, minlength=5).double()
    assert counts[1] == 0
    expected = probs * rows
    chi2 = float((((counts - expected) ** 2)[expected > 0] / expected[expected > 0]).sum())
    assert chi2 < 18.5  # 3 degrees of freedom: p = 0.0003
    again = RowStreams([5, 6])
    first = RowStreams(range(rows))
    first.next_uniform()
    assert np.array_equal(again.next_uniform(), RowStreams([5, 6]).next_uniform())
    assert again.next_uniform()[0] != RowStreams([5]).next_uniform()[0]  # a row's k-th draw differs from its first
