"""decontam: find (and remove or flag) training documents that share word n-grams with eval items.

Spec 001-data-eval §A12. The method is GPT-3's: a training document is contaminated by an eval
task when it contains one of the task's word 13-grams (`ngram`; Llama 3 used 8). The report says,
per task, how many eval items appear in the training data and their share (report.py), the
figure Tülu 3 thresholds (`threshold`). What is compared, and how it is hashed and looked up, is
index.py; how eval records become passages, against.py (and the task families, llmctl.tasks).

How it runs
- The eval n-grams are hashed once into an index (index.py), saved to a temporary .npz that each
  worker loads once.
- The docs are scanned one input file per task through the usual sharded driver (workers,
  resume, `-o -`, --keep-rejected), every phase inside one `executor_scope` of the run's
  options. `mode = "remove"` drops contaminated docs (reason `decontam.<task>`, the first task in
  --against order; rejected rows also get `contaminated_tasks`); `mode = "flag"` keeps every doc
  and adds `contaminated` (bool) and `contaminated_tasks` (list of task names).
- `report_only` writes no docs: OUT holds the manifest and decontam.json (kind
  `decontam-report`). Otherwise decontam.json is written next to the docs (it is not a docs part
  and is not listed in `outputs`). The full report (with the indices of the contaminated items,
  for a clean-subset evaluation) also goes to `report_path` when given.

The per-shard figures travel in the manifest counts (`_items`, `_ngrams`: item / n-gram number ->
documents), so a resumed run or an Arrow-stream output still produces the whole report; they are
folded into `counts.tasks` and dropped before the final manifest is written.
"""

from __future__ import annotations

import json
import sys
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from llmctl.artifacts.atomic import write_text
from llmctl.artifacts.docs import STDIO, DocsSource
from llmctl.artifacts.docs_shard import ShardInput, ShardOutput, with_fields
from llmctl.artifacts.manifest import Manifest, file_sha256, input_ref, output_entry, write_manifest
from llmctl.data.decontam.against import EvalTask, resolve_task_files
from llmctl.data.decontam.config import MODES, DecontamConfig
from llmctl.data.decontam.index import EvalIndex, build_index, match_docs
from llmctl.data.decontam.report import build_report, task_summary
from llmctl.errors import UsageError
from llmctl.runtime.executor import Task
from llmctl.runtime.options import RunOptions
from llmctl.runtime.progress import Progress
from llmctl.runtime.sharded import run_sharded
from llmctl.runtime.stage import StageRun, stage_run

STAGE = "decontam"
REPORT_KIND = "decontam-report"
REPORT_FILE = "decontam.json"
# ---------------------------------------------------------------------------------------------
# One shard

_INDEX_CACHE: dict[str, EvalIndex] = {}


def _index(path: str) -> EvalIndex:
    if path not in _INDEX_CACHE:
        _INDEX_CACHE.clear()
        _INDEX_CACHE[path] = EvalIndex.load(path)
    return _INDEX_CACHE[path]


def _with_column(batch: pa.RecordBatch, name: str, values: pa.Array) -> pa.RecordBatch:
    names = batch.schema.names
    if name in names:
        cols = [values if n == name else batch.column(n) for n in names]
        return pa.RecordBatch.from_arrays(cols, names=names)
    return pa.RecordBatch.from_arrays(list(batch.columns) + [values], names=names + [name])


TASKS_TYPE = pa.list_(pa.string())


@dataclass
class _ShardFn:
    cfg: DecontamConfig
    index_path: str
    task_names: list[str]

    def __call__(self, task: Task, out: Path, report) -> dict:
        return decontam_shard(task, out, report, self.cfg, _index(self.index_path), self.task_names)


def decontam_shard(task: Task, out: Path, report, cfg: DecontamConfig, index: EvalIndex, names: list[str]) -> dict:
    inp = ShardInput(DocsSource(**task.payload))
    writing = not cfg.report_only
    flag = cfg.mode == "flag"
    if inp.schema is None:  # the file does not open: nothing to write, the damage is counted
        return inp.stats([], {"in": 0, **({"out": 0} if writing else {}), "contaminated": 0})
    schema = with_fields(inp.schema, [("contaminated", pa.bool_()), ("contaminated_tasks", TASKS_TYPE)]) if flag else inp.schema
    rejected_fields = [("contaminated_tasks", TASKS_TYPE)] if cfg.keep_rejected and not flag else None
    n_in = n_out = n_hit = chars_in = chars_hit = 0
    by_task: dict[str, dict] = {}
    rejected: dict[str, int] = {}
    item_docs: dict[str, int] = {}
    gram_docs: dict[str, int] = {}
    # report_only writes no docs: no shard, and only the text column is read
    with ShardOutput(out, task.name, schema, rejected_fields) if writing else nullcontext() as shard:
        for batch in inp.batches(columns=None if writing else []):
            texts = batch.column("text").to_pylist()
            gram_doc, gram_key, item_doc, item = match_docs(index, texts)
            # per doc: the tasks it is contaminated by, in --against order
            doc_tasks: dict[int, list[str]] = {}
            for d, t in sorted(set(zip(item_doc.tolist(), index.item_task[item].tolist()))):
                doc_tasks.setdefault(d, []).append(names[t])
            for k in item.tolist():
                item_docs[str(k)] = item_docs.get(str(k), 0) + 1
            for k in gram_key.tolist():
                gram_docs[str(k)] = gram_docs.get(str(k), 0) + 1
            for d, ts in doc_tasks.items():
                for t in ts:
                    by_task.setdefault(t, {"docs_hit": 0})["docs_hit"] += 1
                chars_hit += len(texts[d] or "")
            lens = [len(t or "") for t in texts]
            n_in += batch.num_rows
            chars_in += sum(lens)
            n_hit += len(doc_tasks)
            contaminated = np.zeros(batch.num_rows, bool)
            contaminated[list(doc_tasks)] = True
            if writing:
                gone_rows = None  # the removed rows, for rejected/
                if flag:
                    lists = pa.array([doc_tasks.get(i, []) for i in range(batch.num_rows)], TASKS_TYPE)
                    kept = _with_column(_with_column(batch, "contaminated", pa.array(contaminated)), "contaminated_tasks", lists)
                else:
                    kept = batch.filter(pa.array(~contaminated))
                    if len(doc_tasks):
                        for ts in doc_tasks.values():
                            rejected[f"decontam.{ts[0]}"] = rejected.get(f"decontam.{ts[0]}", 0) + 1
                        if shard.keeps_rejected:
                            gone = sorted(doc_tasks)
                            gone_rows = batch.take(pa.array(gone, pa.int64()))
                            gone_rows = _with_column(gone_rows, "reason", pa.array([f"decontam.{doc_tasks[d][0]}" for d in gone], pa.string()))
                            gone_rows = _with_column(gone_rows, "contaminated_tasks", pa.array([doc_tasks[d] for d in gone], TASKS_TYPE))
                shard.write(kept, gone_rows)
                n_out += kept.num_rows
            report(batch.num_rows)
    counts = {"in": n_in, **({"out": n_out} if writing else {}), "contaminated": n_hit, "chars_in": chars_in, "chars_contaminated": chars_hit, "tasks": by_task, "_items": item_docs, "_ngrams": gram_docs}
    if writing and not flag:
        counts["rejected"] = rejected
    return inp.stats(shard.outputs if writing else [], counts)


# ---------------------------------------------------------------------------------------------
# The stage


def _docs_sources(run: StageRun, inputs: list[str]) -> tuple[list[DocsSource], list[dict]]:
    try:
        return run.read_inputs(inputs, spool="stdin")
    except UsageError as e:
        if "no 'text' column" in str(e):
            raise UsageError(f"{e}; if this is a task file, give each one with --against (or quote a glob: --against 'dir/*.jsonl')") from e
        raise


def run_decontam(
    inputs: list[str],
    out: str | None,
    cfg: DecontamConfig,
    task_files: list[str],
    opts: RunOptions | None = None,
    progress: Progress | None = None,
    report_path: str | None = None,
    stdout=None,
) -> Manifest:
    """Check docs against eval task files; write the clean (or flagged) docs to `out` and the
    report (see module docstring). `out` may be None with report_only (nothing written but
    `report_path`), or `-`: the docs as an Arrow stream, or with report_only the report JSON.
    `opts` says how it runs (workers, shard slice, --strict, executor); every phase runs inside
    one `executor_scope(opts)`."""
    cfg.check()
    opts = opts or RunOptions()
    progress = progress or Progress()
    if out is None and not cfg.report_only:
        raise UsageError("give the output with -o OUT (or use --report-only)")
    with stage_run(opts, "llmctl-decontam-") as run:
        named = resolve_task_files(task_files)
        tasks = [EvalTask.load(name, path) for name, path in named]
        _, refs = _docs_sources(run, inputs)
        index = build_index(tasks, cfg.ngram, cfg.min_overlap)
        index_path = run.tmp / "index.npz"
        index.save(index_path)
        config = asdict(cfg)
        config["tasks"] = {t.name: {"file": str(Path(t.path).resolve()), "sha256": file_sha256(t.path)} for t in tasks}
        tasks_list = run.tasks()
        report_only_dir = cfg.report_only and (out is None or out == STDIO)
        target = str(run.tmp / "report") if report_only_dir else out
        refs = refs + [{**input_ref(t.path), "task": t.name} for t in tasks]
        manifest = run_sharded(
            stage=STAGE,
            kind=REPORT_KIND if cfg.report_only else "docs",
            out=target,
            tasks=tasks_list,
            fn=_ShardFn(cfg, str(index_path), [t.name for t in tasks]),
            config=config,
            inputs=refs,
            opts=opts,
            progress=progress,
            stdout=stdout,
            unit="docs",
        )
        streaming = target == STDIO
        complete = streaming or (Path(target) / "manifest.json").exists()
        report = build_report(cfg, tasks, index, manifest.counts)
        for k in ("_items", "_ngrams"):
            manifest.counts.pop(k, None)
        manifest.counts["tasks"] = task_summary(report)
        if not complete:  # a --shard-index slice: the report waits for the job that finishes last
            return manifest
        text = json.dumps(report, indent=2, ensure_ascii=False) + "\n"
        if report_path:
            write_text(report_path, text)
        if cfg.report_only and out == STDIO:
            (stdout or sys.stdout).write(text)
            (stdout or sys.stdout).flush()
        if not streaming:
            write_text(Path(target) / REPORT_FILE, text)
            if cfg.report_only:
                manifest.outputs = [output_entry(Path(target) / REPORT_FILE, sum(len(t["contaminated_items"]) for t in report["tasks"].values()), Path(target))]
            write_manifest(target, manifest)
        return manifest


__all__ = ["DecontamConfig", "run_decontam", "decontam_shard", "STAGE", "REPORT_KIND", "REPORT_FILE", "MODES"]
