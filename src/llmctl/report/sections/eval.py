"""eval: every score of every eval found for the lineage's models, with its interval (results.json),
and the paired comparisons between them: for each pair of evals, each task both scored, the paired
difference with its interval and McNemar counts (eval/compare.py, `llmctl eval compare`'s numbers)."""

from __future__ import annotations

import itertools
import json

from llmctl.errors import UsageError
from llmctl.eval.compare import compare_task, load_samples
from llmctl.report.collect import Artifact, Lineage, model_of
from llmctl.report.page import Section, Table
from llmctl.report.sections.common import Images, changed_note


def sections(lineage: Lineage, images: Images) -> list[Section]:
    if not lineage.evals:
        return []
    s = Section("eval", "eval", [str(a.path) for a in lineage.evals])
    measured, rows = [], []
    for ev in lineage.evals:
        s.notes += changed_note(ev)
        results = _results(ev)
        if results is None:
            s.notes.append(f"{ev.path}: results.json is missing or unreadable; its scores are not shown.")
            continue
        model = model_of(ev)
        measured.append([ev.path.name, str(model) if model else results.get("checkpoint"), results.get("step"),
                         results.get("weights"), ev.manifest.wall_seconds])
        for task, t in (results.get("tasks") or {}).items():
            for metric, v in (t.get("metrics") or {}).items():
                headline = "yes" if metric == t.get("headline") else ""
                if "mean" in v:
                    rows.append([ev.path.name, task, metric, headline, v.get("n"), v["mean"], v.get("ci_low"), v.get("ci_high"), v.get("interval")])
                else:  # a pooled value without an interval (loss, perplexity of a loss task)
                    rows.append([ev.path.name, task, metric, headline, v.get("n"), v.get("value"), None, None, None])
    s.tables.append(Table(["eval", "model", "checkpoint step", "weights", "wall seconds"], measured, "what each eval measured"))
    s.tables.append(Table(["eval", "task", "metric", "headline", "n", "score", "95% low", "95% high", "interval"], rows,
                          "every score with its 95% interval"))
    pairs, skipped = _pairs(lineage.evals)
    if pairs:
        s.tables.append(Table(["A", "B", "task", "metric", "n paired", "A", "B", "A − B", "95% low", "95% high", "A only right", "B only right"],
                              pairs, "paired comparisons (items scored in both; differences are A − B, A the later eval)"))
    elif len(lineage.evals) > 1:
        s.notes.append("No two evals share a task: no paired comparison.")
    s.notes += skipped
    return [s]


def _results(ev: Artifact) -> dict | None:
    try:
        data = json.loads((ev.path / "results.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _pairs(evals: list[Artifact]) -> tuple[list[list], list[str]]:
    loaded, rows, notes = {}, [], []
    for ev in evals:
        try:
            loaded[ev.path] = load_samples(ev.path)
        except UsageError as e:
            notes.append(f"{ev.path.name}: no per-item scores to pair ({e}).")
    for b, a in itertools.combinations([e for e in evals if e.path in loaded], 2):  # A: the later one
        (sa, ma), (sb, mb) = loaded[a.path], loaded[b.path]
        for task in sorted(sa.keys() & sb.keys()):
            if ma[task] and mb[task] and ma[task] != mb[task]:
                notes.append(f"{a.path.name} vs {b.path.name}, {task}: scored by {ma[task]} and {mb[task]}; not paired.")
                continue
            try:
                r = compare_task(task, sa[task], sb[task], ma[task] or mb[task])
            except UsageError as e:
                notes.append(f"{a.path.name} vs {b.path.name}: {e}.")
                continue
            rows.append([a.path.name, b.path.name, task, r["metric"], r["n"], r["mean_a"], r["mean_b"], r["diff"],
                         r["ci_low"], r["ci_high"], r.get("a_only"), r.get("b_only")])
    return rows, notes
