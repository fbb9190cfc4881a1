"""rl: the curves of an rl run (train/plots.py: reward, accuracy with the held-out accuracy and its
interval, entropy, length, share of zero-variance groups), the held-out evaluations and headroom it
logged, and a few sampled completions of its first and last step (rollouts/step-*.parquet, in
their stored order: the best-rewarded completion of each of the first groups, so the table shows
several prompts) with their rewards; and what its gain is made of, beside its control runs
(rl_gain.py)."""

from __future__ import annotations

import json

from llmctl.report.collect import Artifact, Lineage
from llmctl.report.page import Figure, Section, Table
from llmctl.report.sections import rl_gain
from llmctl.report.sections.common import Images, per_artifact
from llmctl.train.plots import RL_CURVES, plot_run, read_metrics

GROUPS_SHOWN = 4
MAX_CHARS = 400  # a completion is cut here in the table (the Parquet file has it whole)


def sections(lineage: Lineage, images: Images) -> list[Section]:
    return per_artifact(lineage.stage("rl"), "rl", images, lambda a, s, im: _fill(a, s, im, lineage))


def _fill(a: Artifact, s: Section, images: Images, lineage: Lineage) -> None:
    m, c, cfg = a.manifest, a.manifest.counts, a.manifest.config
    steps, _ = read_metrics(a.path) if (a.path / "metrics.jsonl").is_file() else ([], [])
    trained = [r for r in steps if "reward_mean" in r]
    G = cfg.get("group_size")
    s.facts = {k: v for k, v in {
        "control run": cfg.get("control") if cfg.get("control", "none") != "none" else None,
        "steps": c.get("steps"),
        "prompts drawn": c.get("prompts_drawn"),
        "prompts per step × group size": f"{cfg.get('prompts_per_step')} × {G}" if G else None,
        "verifier": cfg.get("verifier"),
        "learning rate": cfg.get("lr"),
        "loss aggregation": cfg.get("loss_agg"),
        "KL": cfg.get("kl"),
        "wall seconds": m.wall_seconds,
        "final held-out accuracy": c.get("eval_accuracy"),
        "its 95% interval": [c["eval_ci_low"], c["eval_ci_high"]] if "eval_ci_low" in c else None,
        "held-out prompts": c.get("eval_n"),
        "first-step reward": trained[0]["reward_mean"] if trained else None,
        "last-step reward": trained[-1]["reward_mean"] if trained else None,
        "optimizer updates": sum(r.get("updates", 0) for r in trained) if trained else None,
    }.items() if v is not None}
    head = {k.removeprefix("headroom_"): v for k, v in c.items() if k.startswith("headroom_")}
    if head:
        s.tables.append(Table(list(head), [list(head.values())],
                              "headroom before step 0: greedy, pass@1, pass@G and majority@G on held-out prompts"))
    held = [[r["step"], r["eval"].get("n"), r["eval"]["mean"], r["eval"].get("ci_low"), r["eval"].get("ci_high")] for r in steps if r.get("eval")]
    if held:
        s.tables.append(Table(["step", "n", "held-out accuracy", "95% low", "95% high"], held, "held-out accuracy (greedy)"))
    curve_keys = ("reward_mean", "accuracy", "entropy", "response_length", "zero_variance_share")
    if trained:
        s.tables.append(Table(["step", *curve_keys], [[r["step"], *(r.get(k) for k in curve_keys)] for r in trained], "per step"))
        folder = images.folder(s.key)
        titles = {name: t for name, t, *_ in RL_CURVES}
        for path in plot_run(a.path, folder):
            s.figures.append(Figure(images.rel(path), titles.get(path.name, path.stem)))
    rl_gain.add(a, s, lineage, images)
    s.tables += _samples(a)


def _samples(a: Artifact) -> list[Table]:
    import pyarrow.parquet as pq

    files = sorted((a.path / "rollouts").glob("step-*.parquet"))
    chosen = files[:1] + files[-1:] if len(files) > 1 else files
    tables = []
    for f in chosen:
        groups: dict = {}  # prompt_index -> its samples, groups in stored order
        for r in pq.read_table(f).to_pylist():
            groups.setdefault(r.get("prompt_index"), []).append(r)
        best = [max(g, key=lambda r: r.get("reward") or 0.0) for g in list(groups.values())[:GROUPS_SHOWN]]
        tables.append(Table(["step", "prompt", "completion", "reward", "correct", "advantage", "of the group's rewards"],
                            [[r.get("step"), _cut(r.get("prompt")), _cut(r.get("completion")), r.get("reward"), r.get("correct"),
                              r.get("advantage"), [x.get("reward") for x in g]] for r, g in zip(best, groups.values())],
                            f"sampled completions ({f.name}): the best-rewarded of each of the first {len(best)} groups"))
    return tables


def _cut(text) -> str:
    text = text if isinstance(text, str) else json.dumps(text, ensure_ascii=False)
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS] + " …"
