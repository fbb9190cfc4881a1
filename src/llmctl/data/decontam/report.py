"""The decontam report: per eval task, how many of its items appear in the training data and their
share — the figure that decides whether to report a clean-subset score, and the one Tülu 3
thresholds (a training set overlapping more than 2% of an eval's items is dropped: `threshold`) —
with the docs hit, the n-grams matched, and the contaminated items themselves (index in the task
file, line, docs, coverage) for a clean-subset evaluation.

The per-shard figures travel in the manifest counts (`_items`, `_ngrams`: item / n-gram number ->
documents), so a resumed run or an Arrow-stream output still produces the whole report.
"""

from __future__ import annotations

import numpy as np

from llmctl.data.decontam.against import EvalTask
from llmctl.data.decontam.config import DecontamConfig
from llmctl.data.decontam.index import EvalIndex


def build_report(cfg: DecontamConfig, tasks: list[EvalTask], index: EvalIndex, counts: dict) -> dict:
    """Per task: items, contaminated items and their share, docs hit, n-grams and matched ones;
    and the list of contaminated items (0-based index in the task file, line, docs, coverage)."""
    item_docs = {int(k): v for k, v in counts.get("_items", {}).items()}
    matched = np.array(sorted(int(k) for k in counts.get("_ngrams", {})), dtype=np.int64)
    # distinct matched grams per item (the corpus-wide coverage Llama 3 thresholds)
    n_items = len(index.item_task)
    if len(matched):
        lo, hi = index.key_ptr[matched], index.key_ptr[matched + 1]
        n = hi - lo
        its = index.key_items[np.repeat(lo, n) + np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)]
        item_matched = np.bincount(its, minlength=n_items)
    else:
        item_matched = np.zeros(n_items, np.int64)
    # grams and matched grams per task (a gram shared by two tasks counts for each)
    key_task = index.item_task[index.key_items]  # per (key, item) pair
    key_of_pair = np.repeat(np.arange(len(index.keys)), np.diff(index.key_ptr))
    task_grams = {t: len(np.unique(key_of_pair[key_task == t])) for t in range(len(tasks))}
    matched_set = np.zeros(len(index.keys), bool)
    matched_set[matched] = True
    task_matched = {t: len(np.unique(key_of_pair[(key_task == t) & matched_set[key_of_pair]])) for t in range(len(tasks))}
    docs_by_task = counts.get("tasks", {})
    out: dict[str, dict] = {}
    first = 0
    for t_no, task in enumerate(tasks):
        n = len(task.passages)
        rows = []
        for i in range(n):
            g = first + i
            if g in item_docs:
                grams = int(index.item_grams[g])
                rows.append({"index": i, "line": task.lines[i], "docs": item_docs[g], "ngrams": grams, "ngrams_matched": int(item_matched[g]), "coverage": round(int(item_matched[g]) / grams, 4) if grams else 0.0})
        share = len(rows) / n if n else 0.0
        out[task.name] = {
            "file": task.path,
            "items": n,
            "items_contaminated": len(rows),
            "share": round(share, 6),
            "over_threshold": share > cfg.threshold,
            "docs_hit": docs_by_task.get(task.name, {}).get("docs_hit", 0),
            "ngrams": task_grams[t_no],
            "ngrams_matched": task_matched[t_no],
            "short_items": int(index.item_short[first : first + n].sum()),
            "empty_items": int((index.item_grams[first : first + n] == 0).sum()),
            "contaminated_items": rows,
        }
        first += n
    return {
        "method": f"word {cfg.ngram}-gram overlap (GPT-3 style); a doc is contaminated by an item when it shares >= min(min_overlap, the item's n-grams) of them",
        "ngram": cfg.ngram,
        "min_overlap": cfg.min_overlap,
        "threshold": cfg.threshold,
        "mode": "report-only" if cfg.report_only else cfg.mode,
        "normalization": "lowercase, accents and punctuation stripped, digits kept",
        "docs": {k: counts.get(k, 0) for k in ("in", "out", "contaminated", "chars_in", "chars_contaminated")},
        "tasks": out,
    }


def task_summary(report: dict) -> dict:
    """The per-task figures without the item lists (what goes into the manifest counts)."""
    return {name: {k: v for k, v in t.items() if k not in ("contaminated_items", "file")} for name, t in report["tasks"].items()}


__all__ = ["build_report", "task_summary"]
