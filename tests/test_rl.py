"""rl: the GRPO loop end to end on a tiny chat model — logging, rollouts, checkpoints, exact resume,
held-out accuracy and the step-0 headroom, dynamic sampling, RLOO and GSPO."""

import json
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import torch

from conftest import llmctl
from llmctl.model.load import load_checkpoint
from llmctl.config import build_config
from llmctl.errors import UsageError
from llmctl.rl.config import RLConfig
from llmctl.rl.evaluate import group_scores
from llmctl.rl.grpo import rloo_advantages
from llmctl.rl.rewards import make_verifier
from llmctl.rl.rollout import Prompter
from llmctl.rl.sandbox import missing_protections
from llmctl.rl.trainer import run_rl
from llmctl.tasks import read_prompts
from test_sft import SFT_ARGS, tok  # noqa: F401  (fixtures)
from test_train import SMALL, tokens  # noqa: F401

# the seed fixes the draws: with it the 2 steps include groups with mixed rewards, which the tests need
RL_ARGS = ["--steps", "2", "--prompts-per-step", "3", "-G", "4", "--max-new-tokens", "12", "--lr", "1e-3", "--seed", "1"]


@pytest.fixture(scope="module")
def sft_model(tokens, tmp_path_factory):  # noqa: F811
    """A base run, then a few SFT steps on sums so completions end in '#### n' sometimes."""
    d = tmp_path_factory.mktemp("rl")
    llmctl("train", tokens / "train", "-o", d / "base", *SMALL, "--max-steps", "3", check=True)
    with open(d / "sums.jsonl", "w") as f:
        for a in range(1, 40):
            f.write(json.dumps({"question": f"What is {a} plus {a % 7}?", "answer": f"{a} + {a % 7} = {a + a % 7}\n#### {a + a % 7}"}) + "\n")
    llmctl("train", "--sft", d / "sums.jsonl", "--init", d / "base", "-o", d / "sft", *SFT_ARGS[10:], check=True)
    # a reward this small model earns sometimes: "the completion contains a digit" (regex verifier)
    with open(d / "digits.jsonl", "w") as f:
        for a in range(1, 40):
            f.write(json.dumps({"prompt": f"What is {a} plus {a % 7}?", "answer": "[0-9]"}) + "\n")
    return d


def records(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_rl_end_to_end_logs_everything_the_spec_lists(sft_model, tmp_path):
    run = tmp_path / "rl"
    p = llmctl("rl", sft_model / "sft", "--prompts", sft_model / "digits.jsonl", "--verifier", "regex",
               "--eval", sft_model / "sums.jsonl", "-o", run, *RL_ARGS, "--warmup-steps", "2", "--json", check=True)
    assert json.loads(p.stdout)["counts"]["steps"] == 2
    recs = records(run)
    assert recs[0]["step"] == 0 and {"mean", "ci_low", "ci_high", "n"} <= set(recs[0]["eval"])
    step = recs[1]
    for key in ("reward_mean", "reward_std", "accuracy", "response_length", "truncation_rate", "zero_variance_share",
                "generate_s", "score_s", "train_s", "tokens_per_s", "groups_drawn"):
        assert key in step, key
    trained = [r for r in recs[1:] if r.get("updates")]
    assert trained, "no step had a group with different rewards"
    for key in ("entropy", "clip_frac", "ratio_gt2", "grad_norm", "trained_tokens", "lr"):
        assert key in trained[0], key
    assert all(r["lr"] == pytest.approx(1e-3 * min(1, r["step"] / 2)) for r in trained)  # --warmup-steps 2
    assert 0 < trained[0]["zero_variance_share"] < 1 or trained[0]["groups_trained"] > 0
    rows = pq.read_table(run / "rollouts" / "step-000001.parquet").to_pylist()
    assert len(rows) == step["groups_drawn"] * 4
    assert {"prompt", "completion", "reward", "advantage", "length", "truncated", "step"} <= set(rows[0])
    ck = load_checkpoint(run)
    assert ck.trainer_state["step"] == 2 and ck.trainer_state["chat"] is True
    llmctl("plot", run, "-o", tmp_path / "plots", check=True)
    assert {"reward.png", "accuracy.png", "entropy.png", "length.png"} <= {p.name for p in (tmp_path / "plots").iterdir()}


def test_rl_resume_repeats_the_uninterrupted_run(sft_model, tmp_path):
    full, cut = tmp_path / "full", tmp_path / "cut"
    args = ["rl", sft_model / "sft", "--prompts", sft_model / "digits.jsonl", "--verifier", "regex", *RL_ARGS, "-q"]
    llmctl(*args, "-o", full, "--recompute", "block", check=True)  # recomputation changes no bit of the run
    llmctl(*[a if a != "2" else "1" for a in args], "-o", cut, check=True)  # --steps 1
    llmctl(*args, "-o", cut, "--resume", check=True)
    drop = ("generate_s", "score_s", "train_s", "tokens_per_s")
    strip = lambda rs: [{k: v for k, v in r.items() if k not in drop} for r in rs]
    assert strip(records(full)) == strip(records(cut))
    assert any(r.get("updates") for r in records(full))  # the resumed step trained, not just sampled
    a = pq.read_table(full / "rollouts" / "step-000002.parquet").to_pylist()
    assert a == pq.read_table(cut / "rollouts" / "step-000002.parquet").to_pylist()
    assert (full / "checkpoints" / "step-000002" / "model.safetensors").read_bytes() == \
        (cut / "checkpoints" / "step-000002" / "model.safetensors").read_bytes()


def test_rl_usage_errors(sft_model, tmp_path):
    p = llmctl("rl", sft_model / "sft", "--prompts", sft_model / "sums.jsonl", "-o", tmp_path / "r", "--kl", "k3")
    assert p.returncode == 2 and "kl-coef" in p.stderr.decode()
    p = llmctl("rl", sft_model / "sft", "--prompts", tmp_path / "missing.jsonl", "-o", tmp_path / "r")
    assert p.returncode == 2 and "not found" in p.stderr.decode()
    p = llmctl("rl", sft_model / "sft", "--prompts", sft_model / "sums.jsonl", "-o", tmp_path / "r", "--adv-std", "zz")
    assert p.returncode == 2 and "adv_std" in p.stderr.decode()
    p = llmctl("rl", sft_model / "sft", "--prompts", sft_model / "sums.jsonl", "-o", tmp_path / "r", "--adv-estimator", "zz")
    err = p.stderr.decode()
    assert p.returncode == 2 and err.strip() == "llmctl: error: rl: adv_estimator must be one of grpo, rloo, got 'zz'", err
    for field, message in (("ratio_level", "rl: ratio_level must be one of token, sequence, got 'zz'"),
                           ("headroom_limit", "rl: headroom_limit must be >= 0 (0 turns the headroom off), got -1")):
        with pytest.raises(UsageError) as e:
            RLConfig(**{field: -1 if field == "headroom_limit" else "zz"}).check()
        assert str(e.value) == message


def test_rl_help_lists_the_estimator_ratio_and_headroom_flags():
    out = llmctl("rl", "--help", check=True).stdout.decode()
    for flag in ("--adv-estimator", "--ratio-level", "--headroom-limit"):
        assert flag in out, flag


@pytest.mark.skipif(bool(missing_protections()), reason=f"no python sandbox here: {'; '.join(missing_protections())}")
def test_rl_python_verifier_runs_its_completions_in_the_sandbox(sft_model, tmp_path):
    """--verifier python end to end (as root in CI, with the uid drop): the sandbox is checked once
    and its isolation logged, and every completion is scored (no masked sample) in it."""
    with open(tmp_path / "code.jsonl", "w") as f:
        for a in range(1, 10):
            f.write(json.dumps({"prompt": f"Write f() returning {a}.", "tests": [f"assert f() == {a}"]}) + "\n")
    run = tmp_path / "rl"
    p = llmctl("rl", sft_model / "sft", "--prompts", tmp_path / "code.jsonl", "--verifier", "python", "-o", run,
               "--steps", "1", "--prompts-per-step", "2", "-G", "2", "--max-new-tokens", "12", "--truncated", "zero",
               "--seed", "1", check=True)
    assert "python verifier: sandbox landlock+seccomp+rlimits" in p.stderr.decode()
    assert records(run)[-1]["masked_share"] == 0.0


def test_prompter_takes_the_plain_prompt_and_stop_strings_from_the_family_that_read_the_prompts(tmp_path):
    """Without a chat template a prompt is written in the format of the task family that read it:
    GSM8K's for {question, answer} records, MATH's for MATH's (it was GSM8K's for every family);
    a file of both is refused; a chat checkpoint uses its template and no stop strings."""
    class Plain:  # a vocabulary without a chat template: a prompt's ids are its bytes
        def prompt_ids(self, text):
            return list(text.encode())

    class Chat(Plain):
        def require_chat(self):
            return self

    files = {"gsm": {"question": "What is 2 plus 2?", "answer": "2 + 2 = 4\n#### 4"},
             "math": {"problem": "What is $1+1$?", "solution": "So $\\boxed{2}$."}}
    for name, rec in files.items():
        (tmp_path / f"{name}.jsonl").write_text(json.dumps(rec) + "\n")
    (tmp_path / "both.jsonl").write_text("".join(json.dumps(r) + "\n" for r in files.values()))

    prompts, families = read_prompts(tmp_path / "gsm.jsonl")
    p = Prompter(Plain(), False, families)
    assert bytes(p.ids(prompts[0]["prompt"])).decode() == "Question: What is 2 plus 2?\nAnswer:"
    assert p.stop == ("\n\nQuestion:", "Question:", "\n\n")
    prompts, families = read_prompts(tmp_path / "math.jsonl")
    p = Prompter(Plain(), False, families)
    assert bytes(p.ids(prompts[0]["prompt"])).decode() == "Problem: What is $1+1$?\nAnswer:"
    assert p.stop == ("Problem:",)

    _, families = read_prompts(tmp_path / "both.jsonl")
    with pytest.raises(UsageError, match=r"rl: both.jsonl holds prompts of 2 task families \(prompt-answer, math\)"):
        Prompter(Plain(), False, families, "both.jsonl")
    assert Prompter(Chat(), True, families).stop == ()


# -- RLOO, GSPO and the headroom at step 0 ---------------------------------------------------

def test_verifiers_name_the_answer_a_vote_counts():
    assert make_verifier("math").answer("so 3 + 4 = 7\n#### 1,000") == "1000"
    assert make_verifier("math", format_reward=0.1).answer("#### 7") == "7"
    assert make_verifier("exact", ignore_case=True).answer("  Paris ") == "paris"
    assert [make_verifier(n).extracts_answers for n in ("math", "exact", "regex", "python")] == [True, True, False, False]


def test_group_scores_by_hand():
    # pass@1 = 2/4, some sample right, and the vote ("7", twice) is right
    assert group_scores([True, False, True, False], ["7", "3", "7", None]) == (0.5, 1.0, 1.0)
    # one right sample out-voted: pass@4 sees it, maj@4 does not
    assert group_scores([False, False, True, False], ["3", "3", "7", None]) == (0.25, 1.0, 0.0)
    # a 2-2 tie goes to the answer that came first; no answer at all never wins
    assert group_scores([False, True, False, True], ["4", "5", "4", "5"]) == (0.5, 1.0, 0.0)
    assert group_scores([False, False], [None, None]) == (0.0, 0.0, 0.0)
    assert group_scores([True, False], None) == (0.5, 1.0, None)


def test_rl_rloo_gspo_end_to_end(sft_model, tmp_path):
    """--adv-estimator rloo writes leave-one-out advantages over each kept group's unmasked samples,
    --ratio-level sequence trains; the headroom of a verifier with no answers to vote on has no maj@G."""
    run = tmp_path / "rl"
    p = llmctl("rl", sft_model / "sft", "--prompts", sft_model / "digits.jsonl", "--verifier", "regex",
               "--eval", sft_model / "digits.jsonl", "-o", run, *RL_ARGS, "--adv-estimator", "rloo",
               "--ratio-level", "sequence", "--json", check=True)
    cfg = json.loads((run / "config.json").read_text())["rl"]
    preset = build_config(RLConfig, "rl", "arith", {})  # the flags' defaults come from it
    assert (cfg["adv_estimator"], cfg["ratio_level"], cfg["headroom_limit"]) == ("rloo", "sequence", preset.headroom_limit)
    recs = records(run)
    trained = [r for r in recs[1:] if r.get("updates")]
    assert trained and all(r["grad_norm"] > 0 for r in trained)
    groups = 0
    for step in (1, 2):
        rows = pq.read_table(run / "rollouts" / f"step-{step:06d}.parquet").to_pylist()
        for i in range(0, len(rows), 4):
            adv = [r["advantage"] for r in rows[i : i + 4]]
            if any(adv):  # a kept group
                rewards = torch.tensor([[r["reward"] for r in rows[i : i + 4]]], dtype=torch.float64)
                valid = torch.tensor([[not r["masked"] for r in rows[i : i + 4]]])
                assert adv == pytest.approx(rloo_advantages(rewards, valid)[0].tolist()), (step, i)
                groups += 1
    assert groups
    hr = recs[0]["headroom"]
    assert set(hr) == {"n", "temperature", "top_p", "greedy", "pass@1", "pass@4"}  # regex: the reference is the pattern
    assert hr["n"] == 39 and hr["greedy"] == pytest.approx(recs[0]["eval"]["mean"]) and hr["pass@4"] >= hr["pass@1"] > 0
    err = p.stderr.decode()
    assert f"at T=0.7, top-p 0.95: greedy {hr['greedy']:.2f}, pass@1 {hr['pass@1']:.2f}, pass@4 {hr['pass@4']:.2f}" in err
    assert ("warning: RL mostly sharpens" in err) == (hr["pass@4"] - hr["greedy"] < 0.10)


def test_rl_headroom_at_step_0(sft_model, tmp_path):
    """Step 0 logs greedy accuracy next to pass@1, pass@G and maj@G on the same held-out prompts;
    on answers the model never writes all four are 0 and a warning says RL has little to sharpen;
    --headroom-limit caps the prompts, 0 turns the headroom off."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps({"question": f"What is {a} plus 1?", "answer": "#### 987654321"}) + "\n" for a in range(5)))
    base = dict(steps=1, prompts_per_step=3, group_size=4, max_new_tokens=24, seed=1, verifier="math", device="cpu")

    def rl(eval_file, limit):
        logs = []
        cfg = build_config(RLConfig, "rl", "arith", {**base, "headroom_limit": limit})
        out = tmp_path / f"{eval_file.stem}-{limit}"
        m = run_rl(str(sft_model / "sft"), str(sft_model / "sums.jsonl"), out, cfg, eval_file=str(eval_file), on_log=logs.append)
        return records(out)[0], logs, m.counts

    first, logs, counts = rl(sft_model / "sums.jsonl", 100)
    hr = first["headroom"]
    assert set(hr) == {"n", "temperature", "top_p", "greedy", "pass@1", "pass@4", "maj@4"}
    assert hr["n"] == first["eval"]["n"] == 39 and (hr["temperature"], hr["top_p"]) == (0.7, 0.95)  # the arith preset's
    assert hr["greedy"] == pytest.approx(first["eval"]["mean"])  # all 39 prompts: the step-0 greedy answers themselves
    assert all(0 <= hr[k] <= 1 for k in ("greedy", "pass@1", "pass@4", "maj@4"))
    assert hr["pass@4"] >= hr["pass@1"] and hr["pass@4"] >= hr["maj@4"]  # a right vote is a right sample
    assert first["headroom_s"] > 0
    assert logs[1] == (f"step 0: headroom on 39 held-out prompts at T=0.7, top-p 0.95: greedy {hr['greedy']:.2f}, "
                       f"pass@1 {hr['pass@1']:.2f}, maj@4 {hr['maj@4']:.2f}, pass@4 {hr['pass@4']:.2f}")
    assert {k: v for k, v in counts.items() if k.startswith("headroom")} == {
        "headroom_n": 39, "headroom_greedy": hr["greedy"], "headroom_pass@1": hr["pass@1"], "headroom_pass@4": hr["pass@4"],
        "headroom_maj@4": hr["maj@4"]}

    first, logs, counts = rl(bad, 3)
    assert first["eval"]["n"] == 5 and first["headroom"] == {"n": 3, "temperature": 0.7, "top_p": 0.95, "greedy": 0.0,
                                                             "pass@1": 0.0, "pass@4": 0.0, "maj@4": 0.0}
    assert [line for line in logs if line.startswith("warning: ")] == [
        "warning: RL mostly sharpens toward answers the model already samples (maj@4 is the sharpening ceiling): little headroom"]
    assert counts["headroom_n"] == 3

    first, logs, counts = rl(bad, 0)
    assert "headroom" not in first and not any("headroom" in line for line in logs)
    assert not any(k.startswith("headroom") for k in counts)


# -- data parallel under torchrun ------------------------------------------------------------

def test_per_row_seeds_make_a_sample_independent_of_its_batch():
    """rl gives each sample its own generator (seed, step, prompt position, sample): a rank that
    generates only its half of the prompts draws the same completions as one process."""
    import torch

    from llmctl.model.config import ModelConfig
    from llmctl.model.generate import Engine, EngineConfig, SamplingParams
    from llmctl.model.transformer import Transformer

    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=64, n_layers=1, d_model=32, n_heads=2, max_seq_len=64)).eval()
    engine = Engine(model, lambda s: [ord(ch) % 64 for ch in s], lambda ids: " ".join(map(str, ids)), stop_ids=(),
                    config=EngineConfig(max_rows=4))
    prompts, seeds = ["ab", "a longer prompt", "xyz", "q", "hello"], [11, 12, 13, 14, 15]
    params = SamplingParams(max_new_tokens=10, temperature=1.0)
    whole = [g.ids for g in engine.generate(prompts, params, seeds=seeds)]
    halves = [g.ids for g in engine.generate(prompts[:2], params, seeds=seeds[:2]) + engine.generate(prompts[2:], params, seeds=seeds[2:])]
    assert whole == halves
    assert [g.ids for g in engine.generate(prompts[::-1], params, seeds=seeds[::-1])] == whole[::-1]
    assert whole != [g.ids for g in engine.generate(prompts, params, seeds=[s + 100 for s in seeds])]


# A setting where every cross-rank path matters: dynamic sampling (kept groups sit unevenly on the
# ranks), batch-std advantages (a statistic of all ranks' rewards), token-mean (the global token
# count normalizes), micro-batches that do not line up with groups. eps = 1 makes AdamW's first
# step lr·g / (|g| + 1) ≈ lr·g instead of lr·sign(g), so the parameter update shows the gradient
# itself, scale included (a rank normalizing by its own token count fails it, and the logged
# grad_norm, by 2.5×). gen_batch = 2 prompts × G: one process and each rank batch the same rows.
PARITY = """
prompts_per_step = 4
group_size = 4
max_new_tokens = 12
temperature = 1.0
lr = 0.1
eps = 1.0
adv_std = "batch"
loss_agg = "token-mean"
dynamic_sampling = true
max_draws = 2
truncated = "zero"
verifier = "regex"
micro_batch = 3
gen_batch = 8
checkpoint_every = 1
keep_checkpoints = 3
eval_every = 1
eval_limit = 6
"""


def torchrun(*args, nproc: int = 2):
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
                           "-m", "llmctl", *map(str, args)],
                          capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)


def test_rl_two_ranks_match_one_process_and_resume(sft_model, tmp_path):
    """2 gloo ranks, each sampling half of every draw, make the single-process update: the same
    rollouts, metrics and (to float rounding) parameters after one step; stopped after step 1 and
    resumed under torchrun, the run goes on as the uninterrupted single-process one."""
    preset = tmp_path / "parity.toml"
    preset.write_text(PARITY)
    one, two = tmp_path / "one", tmp_path / "two"
    args = ["rl", sft_model / "sft", "--prompts", sft_model / "digits.jsonl", "--config", preset, "-q",
            "--eval", sft_model / "digits.jsonl", "--seed", "1"]  # held out: each rank answers 3 of the 6
    llmctl(*args, "--steps", "2", "-o", one, check=True)
    for extra in (["--steps", "1"], ["--steps", "2", "--resume"]):
        p = torchrun(*args, *extra, "-o", two)
        assert p.returncode == 0, p.stderr.decode()[-3000:]
    assert json.loads((two / "config.json").read_text())["world_size"] == 2

    for step in (1, 2):  # every sample, reward and advantage, in the same order
        name = f"step-{step:06d}.parquet"
        rows = pq.read_table(one / "rollouts" / name).to_pylist()
        assert pq.read_table(two / "rollouts" / name).to_pylist() == rows
        # the trained groups (nonzero advantages) came from both ranks' halves of the draws
        slots = {(i // 4) % 4 for i, r in enumerate(rows) if r["advantage"] != 0}
        assert slots & {0, 1} and slots & {2, 3}, (step, slots)
    timing = ("generate_s", "score_s", "train_s", "tokens_per_s", "headroom_s")
    a, b = records(one), records(two)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [0, 1, 2]
    assert all(r["updates"] == 1 and r["grad_norm"] > 0 for r in a[1:])
    for ra, rb in zip(a, b):
        assert set(ra) == set(rb)
        assert rb["eval"] == ra["eval"] and ra["eval"]["n"] == 6
        for k in set(ra) - set(timing) - {"eval"}:
            assert rb[k] == (None if ra[k] is None else pytest.approx(ra[k], rel=1e-5, abs=1e-6)), (ra["step"], k)

    def params(run, step):
        return load_checkpoint(run / "checkpoints" / f"step-{step:06d}").tensors

    start = load_checkpoint(sft_model / "sft").tensors
    for step in (1, 2):
        p1, p2 = params(one, step), params(two, step)
        assert p1.keys() == p2.keys()
        update = sum(float((p1[k].double() - start[k].double()).pow(2).sum()) for k in p1) ** 0.5
        diff = sum(float((p2[k].double() - p1[k].double()).pow(2).sum()) for k in p1) ** 0.5
        assert update > 0.01, update  # a real step (‖Δθ‖ ≈ lr·‖g‖ here)
        assert diff <= 1e-5 * update, (step, diff, update)


def test_rl_prompts_per_step_must_split_over_ranks(sft_model, tmp_path):
    p = torchrun("rl", sft_model / "sft", "--prompts", sft_model / "digits.jsonl", "--verifier", "regex",
                 "-o", tmp_path / "r", *RL_ARGS)  # --prompts-per-step 3 over 2 ranks
    assert p.returncode != 0
    assert "--prompts-per-step 3 does not split over 2 ranks" in p.stderr.decode()
    assert not (tmp_path / "r" / "metrics.jsonl").exists()
