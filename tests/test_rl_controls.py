"""rl --control: the random-reward and shuffled-answers control runs (rl/controls.py) — what they
draw, that they keep the real accuracy beside what they train on, that they say they are controls,
resume and data parallelism — and the per-step lengths of correct and wrong completions and the
zero-variance share of the trained groups, on the tiny chat model of test_rl.py."""

import json
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest

from conftest import llmctl
from llmctl.errors import UsageError
from llmctl.rl.config import RLConfig
from llmctl.rl.controls import RunningMean, random_rewards, same_reference, shuffled_references
from llmctl.rl.rewards import make_verifier
from llmctl.tasks import read_prompts
from test_render import check, screen  # noqa: F401  (fixture)
from test_rl import PARITY, records, sft_model, torchrun  # noqa: F401  (fixtures)
from test_train import tokens  # noqa: F401  (sft_model's)

P, G, SEED = 4, 8, 1
# --truncated zero: most of this model's 12-token completions are cut, and scored 0 they stay in the
# groups, which then vary (masked, most groups would hold one or two samples)
ARGS = ["--steps", "3", "--prompts-per-step", str(P), "-G", str(G), "--max-new-tokens", "12", "--truncated", "zero",
        "--lr", "1e-3", "--seed", str(SEED), "-q"]


def rollouts(run, step):
    return pq.read_table(run / "rollouts" / f"step-{step:06d}.parquet").to_pylist()


def steps(run):
    return [r for r in records(run) if "reward_mean" in r]


# -- the pieces ---------------------------------------------------------------------------------


def test_shuffled_references_are_a_seeded_derangement():
    for n in range(2, 40):
        perm = shuffled_references(n, 3)
        assert sorted(perm) == list(range(n)), n  # a permutation: every reference is used once
        assert all(perm[i] != i for i in range(n)), (n, perm)  # no prompt keeps its own
        assert shuffled_references(n, 3) == perm
    assert shuffled_references(30, 0) != shuffled_references(30, 1)


def test_random_rewards_are_bernoulli_at_p_and_a_function_of_the_sample_alone():
    whole = random_rewards(0.3, 7, 2, range(0, 400), 25)  # 10,000 draws
    assert set(np.unique(whole)) <= {0.0, 1.0}
    assert abs(whole.mean() - 0.3) < 4 * (0.3 * 0.7 / whole.size) ** 0.5
    # seeded by (seed, step, position, sample): a rank's slice of the draw gets the same rewards
    assert (random_rewards(0.3, 7, 2, range(200, 210), 25) == whole[200:210]).all()
    assert not (random_rewards(0.3, 7, 3, range(0, 400), 25) == whole).all()  # another step, other draws
    assert random_rewards(1.3, 7, 2, range(0, 4), 5).min() == 1 and random_rewards(-0.2, 7, 2, range(0, 4), 5).max() == 0


def test_running_mean_counts_unmasked_real_rewards_and_resumes_from_its_state():
    state = {}
    running = RunningMean(state)
    assert running.mean() == 0.0
    real = np.array([[1.0, 0.0, 0.1], [1.1, 0.0, 5.0]])
    valid = np.array([[True, True, True], [True, True, False]])  # the masked 5.0 is out
    assert running.add(real, valid) == pytest.approx(2.2 / 5)
    again = RunningMean(json.loads(json.dumps(state)))  # as the checkpoint's trainer_state.json holds it
    assert again.add(real, valid) == running.add(real, valid) == pytest.approx(4.4 / 10)


def test_same_reference_compares_canonical_answers():
    assert same_reference("6 + 6 = 12\n#### 12", "12")
    assert not same_reference("#### 12", "#### 13")
    assert same_reference("[0-9]", "[0-9]") and not same_reference("Paris", "Rome")


def test_a_bad_control_is_one_line_exit_2(tmp_path):
    p = llmctl("rl", tmp_path / "none", "--prompts", tmp_path / "p.jsonl", "-o", tmp_path / "r", "--control", "zz")
    err = p.stderr.decode()
    assert p.returncode == 2 and err.strip() == ("llmctl: error: rl: control must be one of none, random-reward, "
                                                 "shuffled-answers, got 'zz'"), err
    assert not (tmp_path / "r").exists()
    with pytest.raises(UsageError, match="--control random-reward"):
        RLConfig(control="random-reward", reward_model="rm").check()
    assert "--control" in llmctl("rl", "--help", check=True).stdout.decode()


def test_a_control_steps_line_names_it_and_the_real_reward(screen):  # noqa: F811
    from llmctl.cli import render

    rec = {"step": 12, "control": "shuffled-answers", "reward_mean": 0.203125, "real_reward_mean": 0.734375,
           "accuracy": 0.71875, "response_length": 1234.5, "zero_variance_share": 0.375, "generate_s": 123.4, "train_s": 45.6,
           "eval": {"mean": 0.5167, "ci_low": 0.4601, "ci_high": 0.5732}}
    render.rl_step(rec, 1000)
    check(screen, "step 12/1000", "shuffled-answers 0.203", "real 0.734", "acc 0.719")


# -- runs ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(sft_model, tmp_path_factory):  # noqa: F811
    """The real run and its random-reward control on the same seed (the control also stopped after
    step 2 and resumed), on test_rl.py's 'the completion has a digit' reward; and a shuffled-answers
    run on sums with the math verifier (distinct answers, so a shuffled reference mostly pays wrong ones)."""
    d = tmp_path_factory.mktemp("controls")
    digits = ["rl", sft_model / "sft", "--prompts", sft_model / "digits.jsonl", "--verifier", "regex", *ARGS]
    llmctl(*digits, "-o", d / "real", "--no-dynamic-sampling", check=True)
    llmctl(*digits, "-o", d / "random", "--control", "random-reward", check=True)
    llmctl(*[a if a != "3" else "2" for a in digits], "-o", d / "cut", "--control", "random-reward", check=True)
    llmctl(*digits, "-o", d / "cut", "--control", "random-reward", "--resume", check=True)
    sums = [a if a != "12" else "32" for a in ARGS]  # room for "a + b = c\n#### c"
    llmctl("rl", sft_model / "sft", "--prompts", sft_model / "sums.jsonl", "--verifier", "math", *sums,
           "-o", d / "shuffled", "--control", "shuffled-answers", check=True)
    return d


def test_random_reward_draws_bernoulli_at_the_real_running_mean(runs):
    """Every trained reward is the Bernoulli draw of its (seed, step, position, sample) at the running
    mean of the unmasked real rewards of the draws so far, and their sum is its expectation within
    its noise; the first draw's samples are the real run's (same weights, same seeds), and the
    control's mean reward on them is the real run's within its noise."""
    run = runs / "random"
    running, position, diffs, variance, first = RunningMean({}), 0, 0.0, 0.0, None
    for rec in steps(run):
        rows = rollouts(run, rec["step"])
        assert len(rows) == rec["groups_drawn"] * G
        for k in range(rec["groups_drawn"] // P):
            draw = rows[k * P * G : (k + 1) * P * G]
            real = np.array([r["real_reward"] for r in draw]).reshape(P, G)
            valid = ~np.array([r["masked"] for r in draw]).reshape(P, G)
            rate = min(1.0, max(0.0, running.add(real, valid)))
            drawn = random_rewards(rate, SEED, rec["step"] - 1, range(position, position + P), G)
            assert [r["reward"] for r in draw] == drawn.ravel().tolist(), (rec["step"], k)
            position += P
            diffs += float((drawn[valid] - rate).sum())
            variance += rate * (1 - rate) * int(valid.sum())
            first = first or (draw, valid, rate)
        assert rec["random_reward_p"] == pytest.approx(rate, abs=1e-6)
        assert rec["reward_mean"] == pytest.approx(np.mean([r["reward"] for r in rows]), abs=1e-6)
        assert rec["real_reward_mean"] == pytest.approx(np.mean([r["real_reward"] for r in rows]), abs=1e-6)
        assert rec["accuracy"] == pytest.approx(np.mean([bool(r["correct"]) for r in rows]), abs=1e-6)
    assert 0.1 < running.mean() < 0.9, "the real reward hardly varies: the test shows little"
    assert abs(diffs) <= 4 * variance ** 0.5  # the trained rewards' sum against its expectation, within 4 σ
    draw, valid, rate = first
    real_draw = rollouts(runs / "real", 1)[: P * G]
    assert [r["completion"] for r in real_draw] == [r["completion"] for r in draw]
    trained = [r["reward"] for r, v in zip(real_draw, valid.ravel()) if v]
    assert rate == pytest.approx(np.mean(trained))
    control = [r["reward"] for r, v in zip(draw, valid.ravel()) if v]
    assert abs(np.mean(control) - np.mean(trained)) <= 4 * (rate * (1 - rate) / len(control)) ** 0.5


def test_random_reward_advantages_are_zero_mean_per_group_and_it_trains(runs):
    run = runs / "random"
    trained = 0
    for rec in steps(run):
        rows = rollouts(run, rec["step"])
        for k in range(0, len(rows), G):
            group = [r for r in rows[k : k + G] if not r["masked"]]
            adv = [r["advantage"] for r in group]
            assert sum(adv) == pytest.approx(0, abs=1e-6)
            if any(adv):  # a trained group: its trained (random) rewards differ
                assert len({r["reward"] for r in group}) > 1
                trained += 1
    assert trained and all(r["updates"] == 1 for r in steps(run))


def test_a_resumed_control_repeats_the_uninterrupted_one(runs):
    drop = ("generate_s", "score_s", "train_s", "tokens_per_s")
    strip = lambda rs: [{k: v for k, v in r.items() if k not in drop} for r in rs]  # noqa: E731
    assert strip(records(runs / "random")) == strip(records(runs / "cut"))
    assert rollouts(runs / "random", 3) == rollouts(runs / "cut", 3)
    state = json.loads((runs / "cut" / "checkpoints" / "step-000003" / "trainer_state.json").read_text())
    assert state["real_reward_running"]["count"] > 0


def test_a_control_resumes_only_as_that_control(runs, sft_model, tmp_path):
    shutil.copytree(runs / "random", tmp_path / "random")
    p = llmctl("rl", sft_model / "sft", "--prompts", sft_model / "digits.jsonl", "--verifier", "regex", *ARGS,
               "--steps", "4", "-o", tmp_path / "random", "--resume")
    err = p.stderr.decode()
    assert p.returncode == 2 and len(err.strip().splitlines()) == 1, err
    assert "is a run with control random-reward, not none (--control random-reward)" in err
    assert not (tmp_path / "random" / "rollouts" / "step-000004.parquet").exists()


def test_a_control_says_it_is_one(runs):
    for name, control in (("random", "random-reward"), ("shuffled", "shuffled-answers")):
        m = json.loads((runs / name / "manifest.json").read_text())
        assert m["config"]["control"] == control and m["counts"]["control"] == control
        assert json.loads((runs / name / "config.json").read_text())["rl"]["control"] == control
        assert all(r["control"] == control for r in records(runs / name))
    m = json.loads((runs / "real" / "manifest.json").read_text())
    assert m["config"]["control"] == "none" and "control" not in m["counts"]
    assert all("control" not in r and "real_reward_mean" not in r for r in records(runs / "real"))
    assert "real_reward" not in rollouts(runs / "real", 1)[0]


def test_shuffled_answers_pays_for_another_prompts_answer_and_logs_the_real_accuracy(runs, sft_model):
    run = runs / "shuffled"
    prompts, _ = read_prompts(str(sft_model / "sums.jsonl"))
    perm = shuffled_references(len(prompts), SEED)
    cfg = json.loads((run / "config.json").read_text())["rl"]
    verifier = make_verifier("math", format_reward=cfg["format_reward"])  # the arith preset's 0.1 for '#### n'
    moved = 0
    for rec in steps(run):
        rows = rollouts(run, rec["step"])
        for r in rows:
            i, cut = r["prompt_index"], r["truncated"]  # --truncated zero: a cut completion scores 0
            assert r["reward"] == (0.0 if cut else verifier.verify(r["completion"], prompts[perm[i]]["reference"]).reward)
            own = verifier.verify(r["completion"], prompts[i]["reference"])
            assert r["real_reward"] == (0.0 if cut else own.reward) and r["correct"] == own.correct
            moved += r["reward"] != r["real_reward"]
        assert rec["accuracy"] == pytest.approx(np.mean([bool(r["correct"]) for r in rows]), abs=1e-6)
        assert rec["real_reward_mean"] == pytest.approx(np.mean([r["real_reward"] for r in rows]), abs=1e-6)
    same = sum(same_reference(prompts[perm[i]]["reference"], p["reference"]) for i, p in enumerate(prompts))
    counts = json.loads((run / "manifest.json").read_text())["counts"]
    assert counts["shuffled_same_reference"] == same < len(prompts) // 4
    assert moved, "no reward changed with the stand-in references: the test shows nothing"


def test_best_of_n_from_a_controls_rollouts_scores_by_the_real_reward(runs):
    from llmctl.rl.best_of_n import read_rollouts

    rows = [r for s in steps(runs / "shuffled") for r in rollouts(runs / "shuffled", s["step"])]
    real: dict = {}
    for r in rows:
        real.setdefault(r["prompt"], []).append(r["real_reward"])
    assert {g[0].prompt: [s.reward for s in g] for g in read_rollouts(runs / "shuffled")} == real
    assert any(r["reward"] != r["real_reward"] for r in rows)


def test_lengths_of_correct_and_wrong_and_the_zero_variance_of_the_trained_groups(runs):
    for name in ("real", "random", "shuffled"):
        for rec in steps(runs / name):
            rows = rollouts(runs / name, rec["step"])
            right = [r["length"] for r in rows if r["correct"] is True]
            wrong = [r["length"] for r in rows if r["correct"] is False]
            assert rec["length_correct"] == (pytest.approx(np.mean(right), abs=1e-6) if right else None)
            assert rec["length_wrong"] == (pytest.approx(np.mean(wrong), abs=1e-6) if wrong else None)
            # trained groups: under dynamic sampling those with advantages; without it, every group drawn
            groups = [[r for r in rows[k : k + G] if not r["masked"]] for k in range(0, len(rows), G)]
            kept = groups if name == "real" else [g for g in groups if any(r["advantage"] for r in g)]
            flat = [len({r.get("real_reward", r["reward"]) for r in g}) < 2 for g in kept]
            assert rec["zero_variance_kept"] == (pytest.approx(np.mean(flat), abs=1e-6) if kept else None)
            if name == "real":  # all drawn groups trained: the share of them with equal rewards, as zero_variance_share
                assert rec["zero_variance_kept"] == pytest.approx(rec["zero_variance_share"], abs=1e-6)


def test_random_reward_two_ranks_match_one_process(sft_model, tmp_path):
    """The random rewards and the running mean come from the all-reduced table: 2 gloo ranks, each
    sampling half of every draw, draw the same rewards and make the same run as one process."""
    preset = tmp_path / "parity.toml"
    preset.write_text(PARITY)
    one, two = tmp_path / "one", tmp_path / "two"
    args = ["rl", sft_model / "sft", "--prompts", sft_model / "digits.jsonl", "--config", preset, "-q", "--seed", "1",
            "--steps", "2", "--control", "random-reward"]
    llmctl(*args, "-o", one, check=True)
    p = torchrun(*args, "-o", two)
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    for step in (1, 2):
        assert rollouts(two, step) == rollouts(one, step)
    timing = ("generate_s", "score_s", "train_s", "tokens_per_s")
    for ra, rb in zip(records(one), records(two)):
        assert set(ra) == set(rb)
        assert rb["control"] == ra["control"] == "random-reward"
        for k in set(ra) - set(timing) - {"control"}:
            assert rb[k] == (None if ra[k] is None else pytest.approx(ra[k], rel=1e-5, abs=1e-6)), (ra["step"], k)
        assert ra["updates"] == 1  # the random rewards trained
