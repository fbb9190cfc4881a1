"""plan ladder (plan/ladder.py, cli/plan_ladder.py): the grid's arithmetic (whole steps, branch
points at each cooldown's start, a shared warmup, tokens per parameter kept in range, sizes scaled
by the preset's ratios), and a real ladder run by make whose decay branch equals, step for step,
the same budget trained in one WSD run."""

import json
import shutil
import subprocess
import sys

import pytest

from conftest import llmctl
from llmctl.errors import UsageError
from llmctl.model.config import ModelConfig
from llmctl.plan.ladder import build_ladder, commands, makefile, parse_size, scaled
from test_train import step_losses, tokens  # noqa: F401  (the module's token artifacts)

BASE = ModelConfig(vocab_size=4096, n_layers=4, d_model=192, n_heads=6, n_kv_heads=2, d_ff=512, max_seq_len=256)


def test_sizes_follow_the_presets_ratios():
    m = scaled(BASE, 96, 2)
    assert (m.d_model, m.n_layers, m.n_heads, m.n_kv_heads, m.head_dim, m.d_ff) == (96, 2, 3, 1, 32, 256)
    assert parse_size("128x3") == (128, 3)
    for bad in ("128", "ax3", "0x2"):
        with pytest.raises(UsageError):
            parse_size(bad)
    with pytest.raises(UsageError, match="multiple of the preset's head dimension 32"):
        scaled(BASE, 100, 2)


def test_the_grid_branches_each_size_from_its_largest_budget():
    lad = build_ladder(BASE, [(64, 2), (96, 3), (128, 4), (192, 4)], [1e12, 3e12, 1e13, 3e13], seq_len=256, batch_tokens=8192)
    by_size: dict[str, list] = {}
    for r in lad.runs:
        assert r.tokens % (5 * 8192) == 0 and 2 <= r.tokens_per_param <= 200
        assert abs(r.flops - r.budget) / r.budget < 0.1  # whole steps move a run's compute a little
        by_size.setdefault(r.size.name, []).append(r)
    for runs in by_size.values():
        runs.sort(key=lambda r: r.tokens)
        assert runs[-1].parent is None and all(r.parent == runs[-1].name for r in runs[:-1])
        for r in runs[:-1]:
            assert r.branch_step * 8192 == 0.8 * r.tokens  # the start of its own cooldown
    assert lad.warmup_tokens == round(0.1 * min(r.tokens for r in lad.runs) / 8192) * 8192
    assert set(lad.bracketed) == {1e12, 3e12, 1e13, 3e13}
    budgets = {r.budget for r in lad.runs}
    assert all(sum(r.budget == b for r in lad.runs) >= 2 for b in budgets - {min(budgets)})  # several D/N per budget
    cmds = commands(lad, "toks", "val", "tiny", "out", ["--optimizer", "muon"])
    branch = next(r for r in lad.runs if r.parent)
    argv = cmds[branch.name]
    assert "--init" in argv and argv[argv.index("--schedule") + 1] == "decay" and not any(a.startswith("model.") for a in argv)
    assert argv[-2:] == ["--optimizer", "muon"]
    parent = " ".join(cmds[branch.parent])
    steps = parent.split("train.branch_steps=[")[1].split("]")[0]
    assert str(branch.branch_step) in steps.split(",")
    mk = makefile(lad, cmds, "out")
    assert f"out/{branch.name}/manifest.json: out/{branch.parent}/manifest.json" in mk and "\nfit: all\n" in mk
    with pytest.raises(UsageError, match="no --size trains"):
        build_ladder(BASE, [(64, 2), (96, 3)], [1e3], seq_len=256, batch_tokens=8192)


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_a_ladder_made_by_make_branches_exactly(tokens, tmp_path):  # noqa: F811
    preset = tmp_path / "nano.toml"
    preset.write_text("[model]\nvocab_size = 300\nn_layers = 1\nd_model = 32\nn_heads = 2\nn_kv_heads = 1\nd_ff = 64\nmax_seq_len = 32\n\n"
                      "[train]\nseq_len = 32\nbatch_tokens = 256\nmicro_batch = 8\nlr = 3e-3\nthreads = 1\neval_every = 5\n")
    small = ModelConfig(vocab_size=300, n_layers=1, d_model=32, n_heads=2, n_kv_heads=1, d_ff=64, max_seq_len=32)
    fpt = small.flops_per_token(32)
    budgets = [fpt * 2560, fpt * 5120]  # 10 and 20 steps of the smaller size
    mk = tmp_path / "ladder.mk"
    p = llmctl("--json", "plan", "ladder", tokens / "train", "--val", tokens / "val", "-o", mk, "--config", preset, "--runs",
               tmp_path / "runs", "--size", "32x1", "--size", "48x1", *[x for b in budgets for x in ("--budget", repr(b))],
               "--min-tpp", "0.01", "--max-tpp", "1000")
    assert p.returncode == 0, p.stderr.decode()
    info = json.loads(p.stdout)
    assert len(info["runs"]) == 4 and sum(r["branch_of"] is not None for r in info["runs"]) == 2
    make = subprocess.run(["make", "-f", str(mk), "all", f"LLMCTL={sys.executable} -m llmctl -q"], capture_output=True, text=True, timeout=600)
    assert make.returncode == 0, make.stderr[-3000:]
    branch = next(r for r in info["runs"] if r["branch_of"] and r["run"].startswith("d32"))
    # the same budget in one WSD run, with the ladder's warmup: equal to the branch, loss for loss
    direct = tmp_path / "direct"
    llmctl("train", tokens / "train", "--val", tokens / "val", "-o", direct, "--config", preset, "--max-tokens", str(branch["tokens"]),
           "--set", f"train.warmup_tokens={info['warmup_tokens']}", check=True)
    whole = step_losses(direct)
    cut = step_losses(tmp_path / "runs" / branch["run"])
    assert [loss for _, loss in cut] == [loss for _, loss in whole[branch["branch_step"]:]]
