"""The runs of a scaling ladder, read for `llmctl plan fit` (plan/fit.py does the math), and its
two plots.

A point is a finished `llmctl train` run: N is the model's total parameter count, embeddings and
head included (`ModelConfig.n_params`), D the tokens it trained on (a decay branch's with those
its WSD run had trained on before the branch point), C = C_token·D with C_token from
llmctl's one FLOPs formula (`ModelConfig.flops_per_token`, model/flops.py) at the run's sequence
length, and L its final validation loss in nats/token or bits per byte: the field guide's scaling
chapter, Table 6.4 ("count total parameters including the head, and all FLOPs"; "use final
losses"). A run that cannot be a point is excluded with its reason, never silently used.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from llmctl.artifacts.manifest import MANIFEST, file_sha256, read_manifest
from llmctl.errors import UsageError

# the manifest count each target is read from (train's counts, train/pretrain.py)
TARGETS = {"loss": ("val_loss", "nats/token"), "bpb": ("val_bits_per_byte", "bits/byte")}


@dataclass
class RunPoint:
    path: str
    n_params: int
    tokens: int
    flops: float
    target: float  # the final validation loss or bits per byte
    loss: float  # val_loss, kept for the divergence check and the table
    manifest_sha256: str


@dataclass
class Excluded:
    path: str
    reason: str


def read_run(path: str | Path, target: str = "loss") -> RunPoint:
    """One run as a point of the ladder; a ValueError says why it is not one."""
    from llmctl.model.config import ModelConfig

    p = Path(path)
    if not p.is_dir():
        raise ValueError("not a directory")
    if not (p / MANIFEST).is_file():
        raise ValueError("unfinished: no manifest.json (a run writes it last)")
    try:
        m = read_manifest(p)
    except UsageError as e:
        raise ValueError(str(e)) from None
    if m.kind != "run":
        raise ValueError(f"not a training run (an artifact of kind {m.kind!r})")
    if m.stage != "train":
        raise ValueError(f"not a pretraining run (stage {m.stage!r})")
    counts, config = m.counts or {}, m.config or {}
    # a decay branch of a ladder (plan/ladder.py) continues its WSD run on the same data: its D is the
    # tokens the --init weights had trained on (init_tokens) plus its own; other continued runs are no point
    before = counts.get("init_tokens", 0)
    if any(i.get("kind") not in ("tokens", None) for i in m.inputs) and not before:
        raise ValueError("continued from a checkpoint on other data: its tokens are not all the model's D")
    try:
        model = ModelConfig.from_dict(config.get("model"), where="config.model")
    except UsageError as e:
        raise ValueError(str(e)) from None
    key, _ = TARGETS[target]
    value, loss = counts.get(key), counts.get("val_loss")
    if not isinstance(value, (int, float)) or not isinstance(loss, (int, float)):
        raise ValueError(f"no validation metric {key} (train with --val)")
    if not (math.isfinite(value) and math.isfinite(loss)):
        raise ValueError(f"non-finite validation loss ({loss} nats, {value} {key})")
    # a model that predicts worse than the uniform guess over its vocabulary learned nothing, or diverged
    if loss >= math.log(model.vocab_size):
        raise ValueError(f"diverged: val_loss {loss:.4g} at or above ln V = {math.log(model.vocab_size):.4g}, the uniform guess")
    if value <= 0:
        raise ValueError(f"{key} {value} is not positive")
    tokens, seq_len = counts.get("tokens"), config.get("train", {}).get("seq_len")
    if not isinstance(tokens, int) or tokens <= 0 or not isinstance(before, int):
        raise ValueError("trained on no tokens")
    tokens += before
    if not isinstance(seq_len, int) or seq_len <= 0:
        raise ValueError("no train.seq_len in its config")
    return RunPoint(str(p), model.n_params(), tokens, model.flops_per_token(seq_len) * tokens, float(value), float(loss),
                    file_sha256(p / MANIFEST))


def read_runs(paths: list[str], target: str = "loss") -> tuple[list[RunPoint], list[Excluded]]:
    """The usable runs among `paths`, and the others with their reasons. A run given twice (by
    another path, a link, or a copy of the same manifest) is used once."""
    if target not in TARGETS:
        raise UsageError(f"--target must be one of {', '.join(TARGETS)}, got {target!r}")
    points: list[RunPoint] = []
    excluded: list[Excluded] = []
    seen: dict[str, str] = {}
    for path in paths:
        try:
            real = str(Path(path).resolve())
        except OSError as e:
            excluded.append(Excluded(str(path), f"unreadable path ({e.strerror})"))
            continue
        if real in seen:
            excluded.append(Excluded(str(path), f"duplicate of {seen[real]}"))
            continue
        seen[real] = str(path)
        try:
            pt = read_run(path, target)
        except (ValueError, OSError) as e:
            excluded.append(Excluded(str(path), str(e)))
            continue
        if (twin := next((q for q in points if q.manifest_sha256 == pt.manifest_sha256), None)) is not None:
            excluded.append(Excluded(str(path), f"duplicate of {twin.path} (the same manifest)"))
            continue
        points.append(pt)
    return points, excluded


def as_dicts(items: list) -> list[dict]:
    return [asdict(x) for x in items]


def fit_runs(paths: list[str], target: str = "loss", budget: float | None = None, holdout: str | None = None,
             rounds: int = 200, out: Path | None = None, seed: int = 0) -> dict:
    """`llmctl plan fit`: read the runs, fit the law both ways with bootstrap intervals, predict the
    held-out run, and with `out` write fit.json and the two plots there. Fewer than
    fit.MIN_RUNS usable runs is a usage error naming every excluded run's reason."""
    from llmctl.plan import fit

    from llmctl.artifacts.atomic import directory_only
    from llmctl.artifacts.lock import output_lock

    if target not in TARGETS:
        raise UsageError(f"--target must be one of {', '.join(TARGETS)}, got {target!r}")
    if out is not None:
        directory_only(out, "plan fit's output (fit.json and plots)")
    try:
        import scipy.optimize  # noqa: F401  (L-BFGS-B: the scaling extra)
    except ImportError:
        raise UsageError("plan fit needs scipy for L-BFGS: pip install 'llmctl[scaling]'") from None
    held = None
    if holdout is not None:
        try:
            held = read_run(holdout, target)
        except (ValueError, OSError) as e:
            raise UsageError(f"--holdout {holdout}: {e}") from None
    points, excluded = read_runs(paths, target)
    if held is not None:  # never fitted on the run it is checked against
        kept = [p for p in points if p.manifest_sha256 != held.manifest_sha256]
        excluded += [Excluded(p.path, "held out (--holdout)") for p in points if p not in kept]
        points = kept
    if len(points) < fit.MIN_RUNS:
        why = "; ".join(f"{e.path}: {e.reason}" for e in excluded)
        raise UsageError(f"{len(points)} usable run(s) of {len(paths)}; a fit needs at least {fit.MIN_RUNS}" + (f" ({why})" if why else ""))
    n, d, y, c = ([getattr(p, k) for p in points] for k in ("n_params", "tokens", "target", "flops"))
    par = fit.fit_parametric(n, d, y)
    law = par.constants
    budget_given = budget is not None
    budget = float(budget if budget is not None else max(c))
    iso = fit.fit_isoflop(n, d, y, c)
    a, b = fit.frontier_exponents(law)
    n_opt, d_opt = fit.optimal(budget, law)
    frontier = math.isfinite(n_opt)
    result = {
        "target": target, "unit": TARGETS[target][1],
        "runs": as_dicts(points), "excluded": as_dicts(excluded),
        "parametric": {"E": law.E, "A": law.A, "B": law.B, "alpha": law.alpha, "beta": law.beta, "a": a, "b": b,
                       "objective": par.objective, "starts": par.starts, "at_best": par.at_best, "agree": par.agree,
                       "spread": par.spread, "on_edge": par.on_edge},
        "bootstrap": {"rounds": rounds, "level": 0.95, "seed": seed,
                      "intervals": fit.bootstrap(n, d, y, rounds, budget, law, seed=seed)},
        "isoflop": {"a": iso.a, "b": iso.b, "why": iso.why,
                    "budgets": [{"flops": g.flops, "runs": len(g.n), "n_opt": g.n_opt, "d_opt": g.d_opt, "loss_opt": g.loss_opt,
                                 "used": g.used, "why": g.why} for g in iso.budgets]},
        "budget": {"flops": budget, "given": budget_given, "n_opt": n_opt if frontier else None,
                   "d_opt": d_opt if frontier else None, "tokens_per_param": d_opt / n_opt if frontier else None,
                   "loss": law.loss(n_opt, d_opt) if frontier else None, "isoflop": iso.at(budget)},
        "holdout": None, "warnings": list(par.warnings), "files": [],
    }
    if not frontier:
        result["warnings"].append("the fitted law has no compute-optimal frontier (alpha + beta = 0)")
    if iso.why:
        result["warnings"].append(f"no IsoFLOP exponents: {iso.why}")
    if held is not None:
        pred = law.loss(held.n_params, held.tokens)
        result["holdout"] = {**asdict(held), "measured": held.target, "predicted": pred, "error": pred - held.target,
                             "relative_error": (pred - held.target) / held.target}
    if out is not None:
        with output_lock(out):
            result["files"] = _write(out, result, points, law, iso, c, budget, held)
    return result


def _write(out: Path, result: dict, points: list[RunPoint], law, iso, c: list[float], budget: float, held: RunPoint | None) -> list[str]:
    """fit.json and the two plots in `out`, each written atomically; fit.json last."""
    from llmctl.plan import fit

    out.mkdir(parents=True, exist_ok=True)
    lo, hi = math.log(min(c)), math.log(max(c + [budget]))
    grid = [math.exp(lo + (hi - lo) * i / 50) for i in range(51)]
    files = [plot_isoflop(iso.budgets, out / "isoflop.png", result["unit"]),
             plot_ladder(points, law, [(x, fit.frontier_loss(law, x)) for x in grid], out / "ladder.png", result["unit"],
                         (held.flops, held.target) if held is not None else None)]
    result["files"] = [str(f) for f in [*files, out / "fit.json"]]
    write_json(out / "fit.json", result)
    _manifest(out, result, points, held)
    return result["files"]


def _manifest(out: Path, result: dict, points: list[RunPoint], held: RunPoint | None) -> None:
    """OUT's manifest (kind "fit"), written last: its inputs are the runs fitted (and the held-out
    one, role "holdout"), so `llmctl lineage` and `llmctl report OUT` follow them back to the data."""
    from llmctl.artifacts.manifest import Manifest, input_ref, output_entry, write_manifest

    p = result["parametric"]
    inputs = [{**input_ref(pt.path), "role": "fitted"} for pt in points]
    inputs += [{**input_ref(held.path), "role": "holdout"}] if held is not None else []
    counts = {"runs": len(points), "excluded": len(result["excluded"]), **{k: p[k] for k in ("E", "A", "B", "alpha", "beta")},
              "starts_at_best": p["at_best"], "starts": p["starts"]}
    if result["holdout"] is not None:
        counts.update({k: result["holdout"][k] for k in ("predicted", "measured", "relative_error")})
    write_manifest(out, Manifest(kind="fit", stage="plan fit",
                                 config={"target": result["target"], "budget": result["budget"]["flops"],
                                         "bootstrap": result["bootstrap"]["rounds"]},
                                 inputs=inputs, outputs=[output_entry(out / n, None, out) for n in ("fit.json", "isoflop.png", "ladder.png")],
                                 counts=counts))


# -- plots (matplotlib, Agg; the style of train/plots.py) ------------------------------------


def plot_isoflop(budgets: list, path: Path, ylabel: str) -> Path:
    """Loss against N per budget (fit.Budget), each with its parabola and its minimum."""
    import numpy as np

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for i, b in enumerate(budgets):
        color = f"C{i % 10}"
        ax.plot(b.n, b.loss, "o", color=color, ms=4, label=f"C = {b.flops:.3g}")
        if b.coef is not None:
            x = np.linspace(math.log(min(b.n)), math.log(max(b.n)), 100)
            ax.plot(np.exp(x), np.polyval(b.coef, x), "-", color=color, lw=1)
        if b.used:
            ax.plot([b.n_opt], [b.loss_opt], "*", color=color, ms=10)
    ax.set_xscale("log")
    return _save(fig, ax, path, "IsoFLOP curves: loss against size per budget (* the minimum)", "parameters N", ylabel, plt)


def plot_ladder(points: list[RunPoint], constants, frontier: list[tuple[float, float]], path: Path, ylabel: str,
                holdout: tuple[float, float] | None = None) -> Path:
    """ln(L − Ê) against compute: the runs, and the fitted law's compute-optimal frontier. The floor
    E is the least certain term of the law (the guide), and this plot shows what it does to the rest."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    above = [(p.flops, p.target - constants.E) for p in points if p.target > constants.E]
    if above:
        ax.plot(*zip(*above), "o", ms=4, label="runs")
    if frontier:
        ax.plot(*zip(*[(c, loss - constants.E) for c, loss in frontier]), "-", lw=1, label="fitted frontier")
    if holdout is not None and holdout[1] > constants.E:
        ax.plot([holdout[0]], [holdout[1] - constants.E], "s", ms=6, label="held out")
    ax.set_xscale("log")
    from matplotlib.ticker import NullFormatter

    ax.xaxis.set_minor_formatter(NullFormatter())  # a decade or less of C: minor labels would run into each other
    return _save(fig, ax, path, f"L − Ê against compute (Ê = {constants.E:.4g})", "training FLOPs C", f"L − Ê ({ylabel})", plt,
                 log=True)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, ax, path: Path, title: str, xlabel: str, ylabel: str, plt, log: bool = False) -> Path:
    from llmctl.artifacts.atomic import atomic_path
    from llmctl.train.plots import save_figure

    with atomic_path(path, suffix=".png") as tmp:  # the suffix: matplotlib reads the format from the name
        save_figure(fig, ax, tmp, title, xlabel, ylabel, log, legend=bool(ax.get_legend_handles_labels()[0]))
    plt.close(fig)
    return path


def write_json(path: Path, obj: dict) -> Path:
    from llmctl.artifacts.atomic import write_text

    return write_text(path, json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n")
