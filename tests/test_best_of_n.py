"""`llmctl best-of-n` (rl/best_of_n.py): rejection sampling into SFT chats and preference pairs."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import llmctl
from preflib import SUBJECTS, make_checkpoint, write_jsonl
from llmctl.rl.best_of_n import BestOfNConfig, Scored, run_best_of_n, select
from llmctl.tokenizer.vocab import Vocab
from llmctl.train.pairs import read_pairs

PROMPTS = [{"prompt": f"Say something about the river number {i}.", "answer": "[aeiou]"} for i in range(6)]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A tiny chat model taught, by a few SFT steps, to answer briefly and end its turn (a random
    one never stops, and a cut sample is never kept)."""
    d = tmp_path_factory.mktemp("bon")
    ck, _ = make_checkpoint(d)
    write_jsonl(d / "prompts.jsonl", PROMPTS)
    write_jsonl(d / "chats.jsonl", [{"messages": [{"role": "user", "content": f"Say something about {s} number {i}."},
                                                  {"role": "assistant", "content": s}]}
                                    for i in range(40) for s in SUBJECTS[i % 3: i % 3 + 1]])
    llmctl("train", "--sft", d / "chats.jsonl", "--init", ck, "-o", d / "sft", "--seq-len", "64", "--batch-tokens", "512",
           "--micro-batch", "8", "--max-steps", "40", "--lr", "3e-3", "--threads", "1", "--eval-every", "0", "--quiet", check=True)
    return d, d / "sft"


def _s(prompt: str, completion: str, reward: float, usable: bool = True) -> Scored:
    return Scored(prompt, completion, reward, reward > 0, usable)


def test_select_keeps_the_best_pairs_best_with_worst_and_skips_what_cannot_be_used():
    groups = [
        [_s("p", "a", 0.0), _s("p", "b", 1.0), _s("p", "c", 1.0), _s("p", "d", 0.5)],  # ties: the first sampled
        [_s("q", "e", 0.2), _s("q", "f", 0.2)],  # all equal: kept, no pair
        [_s("r", "g", 1.0, usable=False), _s("r", "h", 0.0)],  # the cut one is never kept
        [_s("s", "i", 1.0, usable=False)],  # nothing usable: nothing at all
    ]
    kept, pairs = select(groups, None)
    assert [k.completion for k in kept] == ["b", "e", "h"]
    assert [(b.completion, w.completion) for b, w in pairs] == [("b", "a")]
    kept, _ = select(groups, 0.5)
    assert [k.completion for k in kept] == ["b", "c", "d"]


def test_best_of_n_from_a_checkpoint(base, tmp_path):
    d, ck = base
    cfg = BestOfNConfig(n=4, max_new_tokens=16, verifier="regex", seed=3)
    m = run_best_of_n(tmp_path / "a", cfg, str(ck), str(d / "prompts.jsonl"))
    c = m.counts
    assert c["prompts"] == 6 and c["samples"] == 24 and 0 < c["kept"] <= 6  # some finish within the budget
    sft = [json.loads(x) for x in (tmp_path / "a" / "sft.jsonl").read_text().splitlines()]
    pairs = [json.loads(x) for x in (tmp_path / "a" / "pairs.jsonl").read_text().splitlines()]
    assert len(sft) == c["kept"] and len(pairs) == c["pairs"]
    assert all(r["messages"][0]["role"] == "user" and r["messages"][1]["role"] == "assistant" for r in sft)
    assert all(p["chosen_reward"] > p["rejected_reward"] and p["chosen"] != p["rejected"] for p in pairs)
    # selection raises the reward of what is kept, and best-of-n is at least one sample's accuracy
    assert c["kept_reward_mean"] >= c["reward_mean"] and c["best_of_n_accuracy"] >= c["pass_at_1"]
    # each sample has its own generator: the same files whatever the generation batch
    again = run_best_of_n(tmp_path / "b", BestOfNConfig(n=4, max_new_tokens=16, verifier="regex", seed=3, gen_batch=4),
                          str(ck), str(d / "prompts.jsonl"))
    assert [o["sha256"] for o in again.outputs] == [o["sha256"] for o in m.outputs]
    # what it writes is what dpo and train-rm read
    if pairs:
        read = read_pairs(tmp_path / "a" / "pairs.jsonl", Vocab(ck).require_chat(), 64)
        assert len(read.pairs) == len(pairs)


def test_best_of_n_from_rl_rollouts(tmp_path):
    run = tmp_path / "run"
    (run / "rollouts").mkdir(parents=True)
    rows = [{"step": 1, "prompt": "p", "completion": c, "reward": r, "correct": r > 0, "truncated": t, "masked": t}
            for c, r, t in (("x", 0.0, False), ("y", 1.0, False), ("z", 1.0, True))]
    pq.write_table(pa.Table.from_pylist(rows), run / "rollouts" / "step-000001.parquet")
    rows2 = [{**r, "step": 2, "prompt": "q", "completion": r["completion"] + "2"} for r in rows]
    pq.write_table(pa.Table.from_pylist(rows2), run / "rollouts" / "step-000002.parquet")
    m = run_best_of_n(tmp_path / "out", BestOfNConfig(), from_rollouts=str(run))
    assert m.counts["prompts"] == 2 and m.counts["unusable"] == 2 and m.counts["pairs"] == 2
    pairs = [json.loads(x) for x in (tmp_path / "out" / "pairs.jsonl").read_text().splitlines()]
    assert [(p["prompt"], p["chosen"], p["rejected"]) for p in pairs] == [("p", "y", "x"), ("q", "y2", "x2")]


def test_best_of_n_cli_errors_and_rerun(base, tmp_path):
    d, ck = base
    out = tmp_path / "o"
    for args, why in ((["-n", "1"], "-n must be >= 2"), (["--temperature", "0"], "--temperature must be > 0"),
                      (["--top-p", "nan"], "--top-p")):
        p = llmctl("best-of-n", ck, "--prompts", d / "prompts.jsonl", "-o", out, *args)
        err = p.stderr.decode().strip()
        assert p.returncode == 2 and why in err and len(err.splitlines()) == 1, err
    p = llmctl("best-of-n", "-o", out)
    assert p.returncode == 2 and "--from-rollouts" in p.stderr.decode()
    (tmp_path / "not-a-run").mkdir()
    p = llmctl("best-of-n", "--from-rollouts", tmp_path / "not-a-run", "-o", out)
    assert p.returncode == 2 and "no rollouts" in p.stderr.decode() and not out.exists()
    args = ["best-of-n", ck, "--prompts", d / "prompts.jsonl", "-o", out, "-n", "2", "--max-new-tokens", "4", "--verifier", "regex"]
    assert llmctl(*args).returncode == 0
    before = (out / "sft.jsonl").stat().st_mtime_ns
    p = llmctl(*args)  # its own finished output: nothing to do
    assert p.returncode == 0 and (out / "sft.jsonl").stat().st_mtime_ns == before
