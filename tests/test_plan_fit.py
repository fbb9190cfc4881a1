"""plan fit: the scaling-law fitter (plan/fit.py) recovers the guide's constants from losses made
with them, reproduces the frontier's worked numbers, finds the IsoFLOP exponent, excludes bad runs
with their reasons, and `llmctl plan fit` runs on real tiny runs."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np
import pytest
from rich.cells import cell_len
from rich.console import Console

from conftest import llmctl
from llmctl.plan import fit
from llmctl.plan.arithmetic import CHINCHILLA, compute_optimal, twenty_tokens_rule
from llmctl.plan.ladder_runs import read_runs
from test_train import tokens  # noqa: F401  (the module's token artifacts)


ladder = fit.synthetic_ladder  # losses made by a known law


# -- the math ---------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["besiroglu", "original", "unrounded"])
def test_noise_free_losses_give_back_the_constants(key):
    c = CHINCHILLA[key]
    n, d, loss, _ = ladder(c)
    p = fit.fit_parametric(n, d, loss)
    got = p.constants
    for name in fit.PARAMS:
        assert getattr(got, name) == pytest.approx(getattr(c, name), rel=1e-5), name
    assert p.agree and p.at_best >= 2 and not p.on_edge and not p.warnings


@pytest.mark.parametrize("key", ["besiroglu", "original"])
def test_noisy_losses_give_the_constants_inside_the_bootstrap_intervals(key):
    c = CHINCHILLA[key]
    n, d, loss, _ = ladder(c, noise=0.005, seed=1)
    p = fit.fit_parametric(n, d, loss)
    ci = fit.bootstrap(n, d, loss, rounds=80, budget=1e22, best=p.constants, seed=0)
    for name in fit.PARAMS:
        truth = getattr(c, name)
        assert ci[name]["lo"] <= truth <= ci[name]["hi"], (name, truth, ci[name])
        assert getattr(p.constants, name) == pytest.approx(truth, rel=0.5), name  # and near it
    n_true, d_true = compute_optimal(1e22, c)
    assert ci["n_opt"]["lo"] <= n_true <= ci["n_opt"]["hi"] and ci["d_opt"]["lo"] <= d_true <= ci["d_opt"]["hi"]
    assert p.agree


def test_frontier_worked_numbers():
    # the refit at 1e24 FLOPs: 95.9B parameters, 1.74T tokens (scaling §A11, compute §F)
    n, d = compute_optimal(1e24, CHINCHILLA["besiroglu"])
    assert n == pytest.approx(95.9e9, rel=2e-3) and d == pytest.approx(1.74e12, rel=3e-3)
    # the shorthand N_opt = sqrt(C/120), D = 20N is the same budget C = 6ND
    for flops in (1e21, 1e23, 1e25):
        n20, d20 = twenty_tokens_rule(flops)
        assert d20 == 20 * n20 and 6 * n20 * d20 == pytest.approx(flops)
        # and the refit's frontier keeps D/N near 20 (within 2x) over these budgets
        n, d = compute_optimal(flops, CHINCHILLA["besiroglu"])
        assert 10 < d / n < 40 and 0.5 < n / n20 < 2
    # the printed constants imply about 93 tokens per parameter... at large budgets (scaling §A11 L2972):
    # far from 20, which is why they are not for frontier use
    n, d = compute_optimal(1e24, CHINCHILLA["original"])
    assert d / n > 50
    # a law fitted to the refit's losses gives back its frontier
    fitted = fit.fit_parametric(*ladder(CHINCHILLA["besiroglu"])[:3]).constants
    assert compute_optimal(1e24, fitted)[0] == pytest.approx(95.9e9, rel=2e-3)
    assert fit.frontier_exponents(fitted)[0] == pytest.approx(0.3658 / (0.3478 + 0.3658), rel=1e-5)


@pytest.mark.parametrize("key", ["besiroglu", "original"])
def test_isoflop_recovers_the_exponent(key):
    c = CHINCHILLA[key]
    a_true, b_true = fit.frontier_exponents(c)
    iso = fit.fit_isoflop(*ladder(c))
    assert len(iso.budgets) == 4 and all(b.used for b in iso.budgets)
    assert iso.a == pytest.approx(a_true, abs=1e-6) and iso.b == pytest.approx(b_true, abs=1e-6)
    noisy = fit.fit_isoflop(*ladder(c, noise=0.003, seed=2))
    assert noisy.a == pytest.approx(a_true, abs=0.03) and noisy.a + noisy.b == pytest.approx(1, abs=1e-6)
    # a budget whose sizes all lie on one side of the minimum is kept out of the power law, with why
    n, d, loss, flops = ladder(c)
    one_side = fit.fit_isoflop(n[:3], d[:3], loss[:3], flops[:3])  # N_opt/10 to N_opt/2
    assert one_side.a is None and "minimum outside" in one_side.budgets[0].why


def test_a_flat_valley_is_reported():
    # four runs on a line of N = D: five parameters are not pinned down, and the fit says so
    c = CHINCHILLA["besiroglu"]
    n = np.array([1e7, 3e7, 1e8, 3e8])
    p = fit.fit_parametric(n, n, [c.loss(x, x) for x in n])
    assert any("underdetermined" in w for w in p.warnings)


# -- runs -------------------------------------------------------------------------------------


def fake_run(path, d_model: int = 64, n_layers: int = 2, tokens: int = 10_000, loss: float | None = 4.0,
             bpb: float | None = 2.0, kind: str = "run", vocab: int = 300) -> None:
    """A finished run's manifest as `llmctl train` writes it (config.model, config.train.seq_len,
    counts with the final validation metrics), without training."""
    path.mkdir(parents=True)
    counts = {"steps": 10, "tokens": tokens, "skipped_steps": 0}
    if loss is not None:
        counts["val_loss"] = loss
    if bpb is not None:
        counts["val_bits_per_byte"] = bpb
    model = {"vocab_size": vocab, "n_layers": n_layers, "d_model": d_model, "n_heads": 2, "d_ff": 2 * d_model, "max_seq_len": 32}
    manifest = {"kind": kind, "stage": "train", "config": {"model": model, "train": {"seq_len": 32}}, "counts": counts,
                "inputs": [{"kind": "tokens", "path": "tokens"}], "outputs": [], "errors": [], "command": ["llmctl", "train", str(path)]}
    (path / "manifest.json").write_text(json.dumps(manifest))


def fake_ladder(root, c=CHINCHILLA["besiroglu"]) -> list:
    """Nine fake runs whose losses follow `c` (3 widths x 3 token counts), sized so that the law's
    losses are those of language models (below ln V)."""
    from llmctl.model.config import ModelConfig

    paths = []
    for d_model in (512, 1024, 2048):
        cfg = ModelConfig(vocab_size=32_000, n_layers=8, d_model=d_model, n_heads=2, d_ff=2 * d_model, max_seq_len=32)
        for tokens in (10**9, 4 * 10**9, 16 * 10**9):
            p = root / f"run-{d_model}-{tokens}"
            loss = c.loss(cfg.n_params(), tokens)
            fake_run(p, d_model=d_model, n_layers=8, tokens=tokens, loss=loss, bpb=loss / 2, vocab=32_000)
            paths.append(p)
    return paths


def test_bad_runs_are_excluded_with_their_reasons(tmp_path):
    good = fake_ladder(tmp_path)
    fake_run(tmp_path / "nan", loss=float("nan"))
    fake_run(tmp_path / "inf-bpb", bpb=float("inf"))
    fake_run(tmp_path / "no-val", loss=None, bpb=None)
    fake_run(tmp_path / "diverged", loss=9.0)  # above ln 300
    fake_run(tmp_path / "docs", kind="docs")
    (tmp_path / "unfinished").mkdir()
    (tmp_path / "unfinished" / "metrics.jsonl").write_text("")
    bad = ["nan", "inf-bpb", "no-val", "diverged", "docs", "unfinished", "missing"]
    points, excluded = read_runs([*map(str, good), good[0], *(str(tmp_path / b) for b in bad)], target="bpb")
    assert [p.path for p in points] == [str(p) for p in good]
    why = {e.path.rsplit("/", 1)[-1]: e.reason for e in excluded}
    assert "duplicate of" in why[good[0].name]
    assert "non-finite" in why["nan"] and "non-finite" in why["inf-bpb"]
    assert "no validation metric val_bits_per_byte" in why["no-val"]
    assert "diverged" in why["diverged"]
    assert "not a training run" in why["docs"]
    assert "unfinished" in why["unfinished"] and "not a directory" in why["missing"]
    # N counts every parameter, the head and embeddings too; C is llmctl's FLOPs formula
    from llmctl.model.config import ModelConfig

    cfg = ModelConfig(vocab_size=32_000, n_layers=8, d_model=512, n_heads=2, d_ff=1024, max_seq_len=32)
    assert points[0].n_params == cfg.n_params() and points[0].flops == cfg.flops_per_token(32) * points[0].tokens


def test_fit_runs_on_fake_runs_recovers_and_predicts(tmp_path):
    from llmctl.plan.ladder_runs import fit_runs

    paths = fake_ladder(tmp_path)
    r = fit_runs([str(p) for p in paths[:-1]], holdout=str(paths[-1]), rounds=10, out=tmp_path / "out")
    assert r["holdout"]["relative_error"] == pytest.approx(0, abs=1e-4)
    assert {f.rsplit("/", 1)[-1] for f in r["files"]} == {"fit.json", "isoflop.png", "ladder.png"}
    assert json.loads((tmp_path / "out" / "fit.json").read_text())["parametric"]["alpha"] == pytest.approx(r["parametric"]["alpha"])


def test_the_tables_fit_80_columns(tmp_path):
    from llmctl.cli.plan import fit_tables
    from llmctl.plan.ladder_runs import fit_runs

    paths = fake_ladder(tmp_path)
    fake_run(tmp_path / "a-run-with-a-rather-long-name-in-a-deep-folder" / "that-did-not-finish", loss=None)
    r = fit_runs([str(p) for p in paths[1:]] + [str(tmp_path / "a-run-with-a-rather-long-name-in-a-deep-folder" / "that-did-not-finish")],
                 holdout=str(paths[0]), rounds=5, budget=1.2345e21)
    buf = io.StringIO()
    console = Console(file=buf, width=80, highlight=False, color_system=None)
    for t in fit_tables(r):
        console.print(t)
    lines = buf.getvalue().splitlines()
    assert lines and all(cell_len(ln) <= 80 for ln in lines) and "…" not in buf.getvalue()


# -- the command on real runs -----------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_runs(tokens, tmp_path_factory):  # noqa: F811  (test_train's token artifacts)
    """Four tiny runs (2 widths x 2 token budgets) trained with --val, a run without --val."""
    d = tmp_path_factory.mktemp("fit")
    small = ["--set", "model.n_layers=1", "--set", "model.n_heads=2", "--set", "model.d_ff=64", "--set", "model.max_seq_len=32",
             "--seq-len", "32", "--batch-tokens", "128", "--micro-batch", "4", "--threads", "1", "--set", "train.eval_windows=8", "-q"]
    runs = []
    for width, budget in ((32, 512), (32, 1024), (64, 512), (64, 1024)):
        out = d / f"run-{width}-{budget}"
        llmctl("train", tokens / "train", "-o", out, "--val", tokens / "val", "--set", f"model.d_model={width}", "--max-tokens", str(budget),
               *small, check=True)
        runs.append(out)
    llmctl("train", tokens / "train", "-o", d / "no-val", "--set", "model.d_model=32", "--max-tokens", "256", *small, check=True)
    return {"dir": d, "runs": runs, "no_val": d / "no-val"}


def test_cli_fits_real_runs_and_writes_fit_json_and_plots(tiny_runs, tmp_path):
    runs, out = tiny_runs["runs"], tmp_path / "fit"
    p = llmctl("plan", "fit", *runs[:3], tiny_runs["no_val"], "--holdout", runs[3], "-o", out, "--bootstrap", "10", "--json", check=True)
    r = json.loads(p.stdout)
    assert len(r["runs"]) == 3 and r["holdout"]["path"] == str(runs[3])
    assert any("no validation metric" in e["reason"] for e in r["excluded"])
    for name in ("fit.json", "isoflop.png", "ladder.png"):
        assert (out / name).stat().st_size > 0
    saved = json.loads((out / "fit.json").read_text())
    assert saved["parametric"]["alpha"] == r["parametric"]["alpha"]
    m = json.loads((runs[0] / "manifest.json").read_text())
    assert saved["runs"][0]["tokens"] == m["counts"]["tokens"] and saved["runs"][0]["target"] == m["counts"]["val_loss"]
    # bits per byte, and the tables for people
    p = llmctl("plan", "fit", *runs, "--bootstrap", "5", "--target", "bpb", check=True)
    assert "L = E + A/N^alpha" in p.stdout.decode() and "bits/byte" in p.stdout.decode()
    assert "underdetermined" in p.stderr.decode()
    # the planner is still the default command
    assert "parameters" in llmctl("plan", "--model", "tiny", "--tokens", "1e8", check=True).stdout.decode()


def test_cli_too_few_runs_is_one_line_exit_2(tiny_runs, tmp_path):
    runs = tiny_runs["runs"]
    for args in ([runs[0], runs[1]], [runs[0], runs[0], runs[0], tiny_runs["no_val"]],
                 [*runs[:3], "--holdout", tiny_runs["no_val"]], [*runs[:3], "--bootstrap", "-1"], [*runs[:3], "--target", "ppl"],
                 [*runs[:3], "-o", "-"]):
        p = llmctl("plan", "fit", *args)
        err = p.stderr.decode()
        assert p.returncode == 2, (args, err)
        assert len(err.strip().splitlines()) == 1 and err.startswith("llmctl: error: ") and "Traceback" not in err, err
    assert "a fit needs at least 3" in llmctl("plan", "fit", runs[0], runs[1]).stderr.decode()


def test_a_fit_is_an_artifact_the_report_shows(tmp_path):
    """plan fit -o writes a manifest (kind fit) whose inputs are the runs, so `llmctl report` of the
    fit walks back through them and shows the law, the held-out check and the two plots."""
    from llmctl.artifacts.manifest import read_manifest
    from llmctl.plan.ladder_runs import fit_runs

    runs = fake_ladder(tmp_path / "ladder")
    fit_runs([str(p) for p in runs[1:]], holdout=str(runs[0]), rounds=5, out=tmp_path / "fit")
    m = read_manifest(tmp_path / "fit")
    assert m.kind == "fit" and [i["role"] for i in m.inputs].count("fitted") == 8 and m.inputs[-1]["role"] == "holdout"
    assert {o["file"] for o in m.outputs} == {"fit.json", "isoflop.png", "ladder.png"}
    p = subprocess.run([sys.executable, "-m", "llmctl", "report", str(tmp_path / "fit"), "-o", str(tmp_path / "rep")],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    s = next(x for x in rep["sections"] if x["key"] == "scaling")
    assert s["facts"]["runs fitted"] == 8 and s["facts"]["their parameters agree"] is True
    law = {row[0]: row[1] for row in s["tables"][0]["rows"]}
    assert abs(law["alpha"] - CHINCHILLA["besiroglu"].alpha) < 1e-3  # noise-free losses: the law itself
    assert s["tables"][1]["rows"][0][0] == str(runs[0]) and len(s["figures"]) == 2
