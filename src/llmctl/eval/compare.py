"""Paired comparison of two eval runs (`llmctl eval compare A B`, spec 001-data-eval §A11).

Each results directory holds ``results.json`` (which names each task's headline metric) and
``samples.parquet`` (one row per item per task, columns ``task``, ``item``, ``score`` = the headline
metric's, and for multiple choice one column per accuracy: ``acc``, ``acc_norm``, …), and the
``manifest.json`` written after them: without it the results are an unfinished eval's and are
refused. Items are
joined on (task, item); per task we report the
paired difference with its SE, z and 95% interval, McNemar counts for 0/1 scores, and how many
questions would be needed to detect the observed gap (α 0.05, power 0.8). A generative task's row
also says what the gain is made of, format or content, and with -n K in both runs gives the
pass@k curves of both (eval/split.py).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from llmctl.artifacts.manifest import MANIFEST, has_manifest
from llmctl.errors import UsageError
from llmctl.eval.metrics import is_binary, mcnemar_counts, mcnemar_var, questions_needed
from llmctl.eval.split import gain_split, load_counts, paired, pass_curves

REQUIRED_COLUMNS = ("task", "item", "score")


def load_samples(results_dir: str | Path, metric: str | None = None) -> tuple[dict[str, dict[int, float]], dict[str, str | None]]:
    """({task: {item: score}}, {task: the metric those scores are}) from a results directory.

    A task's scores are its headline metric's (the `score` column; results.json names the metric,
    None for results written before it did), or, with `metric`, that per-item column for the tasks
    that have it (multiple choice keeps one per normalization: acc, acc_norm, …). UsageError naming
    what is wrong."""
    import pyarrow.parquet as pq

    d = Path(results_dir)
    for name in ("results.json", "samples.parquet"):
        if not (d / name).is_file():
            raise UsageError(f"{d}: not an eval results directory (no {name})")
    if not has_manifest(d):  # written last: without it the files are an eval that did not finish
        raise UsageError(f"{d}: an unfinished eval (results without its {MANIFEST}); run the eval again to finish it")
    try:
        results = json.loads((d / "results.json").read_text(encoding="utf-8"))
        table = pq.read_table(d / "samples.parquet")
    except (OSError, ValueError) as e:
        raise UsageError(f"{d}: unreadable results ({e})") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
    if missing:
        raise UsageError(f"{d / 'samples.parquet'}: missing column(s) {', '.join(missing)}")
    tasks = results.get("tasks", {}) if isinstance(results, dict) else {}
    names = list(REQUIRED_COLUMNS) + ([metric] if metric in table.column_names and metric not in REQUIRED_COLUMNS else [])
    cols = table.select(names).to_pydict()
    rows: dict[str, list[tuple[int, float, float | None]]] = {}
    for k, (task, item, score) in enumerate(zip(cols["task"], cols["item"], cols["score"])):
        rows.setdefault(str(task), []).append((int(item), score, cols[metric][k] if metric in cols else None))
    out: dict[str, dict[int, float]] = {}
    named: dict[str, str | None] = {}
    for task, task_rows in rows.items():
        use = metric is not None and all(v is not None for _, _, v in task_rows)  # the task has that column
        named[task] = metric if use else (tasks.get(task) or {}).get("headline")
        items = out.setdefault(task, {})
        for item, score, value in task_rows:
            if item in items:
                raise UsageError(f"{d / 'samples.parquet'}: task {task!r} item {item} appears twice")
            items[item] = float(value if use else score)
    return out, named


def compare_task(task: str, a: dict[int, float], b: dict[int, float], metric: str | None = None) -> dict:
    """One row of the comparison: the paired statistics over items scored in both runs."""
    common = sorted(a.keys() & b.keys())
    if len(common) < 2:
        raise UsageError(f"task {task!r}: {len(common)} item(s) scored in both runs; need at least 2")
    sa, sb = [a[i] for i in common], [b[i] for i in common]
    gap = paired(sa, sb)  # n, mean_a, mean_b, diff, se, z, ci_low, ci_high
    binary = is_binary(sa) and is_binary(sb)
    var_d = mcnemar_var(sa, sb) if binary else statistics.variance([x - y for x, y in zip(sa, sb)])
    counts = mcnemar_counts(sa, sb) if binary else dict.fromkeys(("a_only", "b_only", "both", "neither"))
    return {
        "task": task,
        "metric": metric,
        "n": gap["n"],
        "only_a": len(a.keys() - b.keys()),
        "only_b": len(b.keys() - a.keys()),
        **{k: gap[k] for k in ("mean_a", "mean_b", "diff", "se", "z", "ci_low", "ci_high")},
        "binary": binary,
        **counts,
        "var_d": var_d,
        "questions_needed": questions_needed(var_d, gap["diff"]) if gap["diff"] != 0 else None,
    }


def compare_results(dir_a: str | Path, dir_b: str | Path, metric: str | None = None) -> dict:
    """Compare run A against run B task by task (differences are A - B).

    Each task is compared on its headline metric, which must be the same in both runs (one run
    scored with --norm per_char and the other with --norm none would pair acc_norm with acc), or,
    with `metric`, on that per-item column for the tasks that have it in both runs.

    Returns {"a": str, "b": str, "tasks": [row, ...]} with rows sorted by task, each
    {task, metric, n, only_a, only_b, mean_a, mean_b, diff, se, z, ci_low, ci_high, binary,
    a_only, b_only, both, neither, var_d, questions_needed}:
    metric names the scores compared (None for results that do not say); n items scored in both
    runs (means, diff and SE are over these), only_a / only_b items scored in one run only
    (reported, not compared); McNemar counts (a_only = A right and B wrong, …) are None for
    non-binary scores; var_d is the per-item Var(D) (McNemar form for 0/1 scores, sample variance
    otherwise); questions_needed is None when the observed gap is 0. A generative task's row adds
    `split` (eval/split.gain_split: format, content and strict_given_format, each paired A − B with
    its interval and z; None for results without format counts) and `pass_at_k`
    (eval/split.pass_curves; None unless both runs sampled K > 1 per item); other tasks' are None.
    Tasks present in only one run raise UsageError."""
    (sa, ma), (sb, mb) = load_samples(dir_a, metric), load_samples(dir_b, metric)
    if sa.keys() != sb.keys():
        only_a, only_b = sorted(sa.keys() - sb.keys()), sorted(sb.keys() - sa.keys())
        raise UsageError(f"runs cover different tasks: only in A {only_a}, only in B {only_b}")
    if not sa:
        raise UsageError(f"{dir_a}: samples.parquet has no rows")
    if metric is not None and metric not in ma.values():
        raise UsageError(f"--metric {metric}: no task of {dir_a} has per-item {metric} scores")
    for t in sorted(sa):
        if ma[t] and mb[t] and ma[t] != mb[t]:
            raise UsageError(f"task {t}: A is scored by {ma[t]}, B by {mb[t]}; pick one with --metric (e.g. --metric {ma[t]})")
    rows = [compare_task(t, sa[t], sb[t], ma[t] or mb[t]) for t in sorted(sa)]
    ca, cb = load_counts(dir_a), load_counts(dir_b)
    for row in rows:
        t = row["task"]
        both = t in ca and t in cb
        row["split"] = gain_split(ca[t], cb[t]) if both else None
        row["pass_at_k"] = pass_curves(ca[t], cb[t]) if both else None
    return {"a": str(dir_a), "b": str(dir_b), "tasks": rows}
