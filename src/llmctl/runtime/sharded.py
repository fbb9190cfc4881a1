"""The sharded-stage driver: the conventions of docs/design.md §3 written once for every data stage.

A stage supplies a task list and a task function that writes its own output shard(s) into the
artifact directory; this module does the rest:

- resume: a finished shard leaves `.shards/NAME.json` (its stats) after its files were renamed
  into place, so a re-run into the same OUT skips it; `--overwrite` starts over;
- safety: OUT records what made its shards — the config and every input's identity (a manifest's
  or a file's sha256, a plain directory's listing) — and a run whose config or inputs differ stops
  with exit 2 naming what changed, so a resumed run never mixes two configs or two inputs; when
  the manifest is written, shard files it does not list are removed;
- one writer: the run holds OUT's lock (artifacts/lock.py) from the first check to the manifest;
- outside schedulers: `--shard-index/--num-shards` run a subset; the manifest is written by
  whichever job finds every shard finished; jobs of one array may start into OUT at once, so a
  job only clears the temporary files of its own shards;
- `--executor ray`: the same tasks run as Ray tasks (runtime/ray_executor.py); the driver still
  plans, and commits the manifest. The stage's `run_*` opens the run's one `executor_scope`
  before OUT is touched, and this driver runs inside it: it opens no scope of its own;
- `-o -`: shards are built in a temporary directory and streamed to stdout in order;
- a lazy task list (crawl-extract cutting stdin into windows): tasks are pulled as the pool has
  room, and the manifest's inputs may be a callable, asked once the input has been read;
- counts, outputs and errors of all shards are summed into the manifest.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from llmctl.artifacts.atomic import SHARDS_DIR, STDIO, check_overwrite, clear_dir, disk_error, entries, remove_stale_temps, write_text
from llmctl.artifacts.docs import unify_schemas
from llmctl.artifacts.docs_write import DocsSink
from llmctl.artifacts.lock import output_lock
from llmctl.artifacts.manifest import Manifest, error_place, output_entry, write_manifest
from llmctl.artifacts.rerun import run_identity
from llmctl.errors import StageFailed, UsageError
from llmctl.runtime.executor import Task, TaskResult, current_backend, run_tasks
from llmctl.runtime.options import RunOptions
from llmctl.runtime.progress import Progress
from llmctl.runtime.split import select_shard

RUN_FILE = "run.json"


# A stage's task function: (task, artifact_dir, report) -> stats, where stats is
#   {"outputs": [relative Parquet paths, or {"file", "rows"} for other files], "counts": {...},
#    "errors": [{...}]}
ShardFn = Callable[[Task, Path, Callable[[int], None]], dict]


@dataclass
class _ShardJob:
    """Picklable wrapper run in the worker: do the shard, then mark it done (durably)."""

    fn: ShardFn
    work_dir: Path

    def __call__(self, task: Task, report: Callable[[int], None]) -> dict:
        marker = self.work_dir / SHARDS_DIR / f"{task.name}.json"
        if marker.exists():  # a retry (Ray) of a shard committed before its worker died
            report(task.weight)
            return json.loads(marker.read_text(encoding="utf-8"))
        stats = self.fn(task, self.work_dir, report)
        stats["name"] = task.name
        if task.key is not None:
            stats["key"] = task.key
        stats["outputs"] = [_output(self.work_dir, f) for f in stats.get("outputs", [])]
        write_text(marker, json.dumps(stats, sort_keys=True))
        return stats


def _output(work: Path, f) -> dict:
    """An `outputs` entry: a Parquet file counts its own rows; other files say theirs ({file, rows})."""
    if isinstance(f, dict):
        return output_entry(work / f["file"], f.get("rows"), work)
    return output_entry(work / f, pq.ParquetFile(work / f).metadata.num_rows, work)


def _finished(work: Path, task: Task) -> bool:
    """Whether an earlier run finished this shard from the same input (see Task.key)."""
    marker = work / SHARDS_DIR / f"{task.name}.json"
    if not marker.exists():
        return False
    if task.key is not None and json.loads(marker.read_text(encoding="utf-8")).get("key") != task.key:
        raise UsageError(f"output {work} holds shard {task.name} made from other input bytes than this run reads; use --overwrite to start over")
    return True


def _what_changed(recorded: dict, ident: dict) -> str:
    if recorded.get("config") != ident["config"] or "inputs" not in recorded:
        return f"a different {recorded.get('stage', '?')} config"
    old, new = recorded["inputs"], ident["inputs"]
    if len(old) != len(new):
        return f"{len(old)} input(s), not these {len(new)}"
    for i, (a, b) in enumerate(zip(old, new), 1):
        if a != b:
            if a.get("path") == b.get("path") == STDIO:
                return f"other bytes on stdin (input {i} was sha256 {str(a.get('sha256'))[:12]}…, now {str(b.get('sha256'))[:12]}…)"
            how = "another input" if a.get("path") != b.get("path") else "the same path with other content"
            return f"{how}: input {i} was {a.get('path')}, now {b.get('path')}"
    return "other inputs"


def prepare_out(out: Path, stage: str, ident: dict, overwrite: bool, clean_temps: bool = True) -> None:
    """Check what made OUT's shards (or start it). `clean_temps=False` when other jobs may be
    writing into OUT at the same time (a slice of an array): their temporary files are live."""
    run_file = out / SHARDS_DIR / RUN_FILE
    if out.exists() and not out.is_dir():
        raise UsageError(f"output {out} exists and is not a directory")
    if out.exists() and overwrite:
        clear_dir(out)
    names = entries(out)
    starting = names == [SHARDS_DIR] and not run_file.exists()  # another job of the array is creating OUT right now
    if names and not starting:
        if not run_file.exists():
            check_overwrite(out, (SHARDS_DIR,))  # someone's files: --overwrite would not remove them either
            raise UsageError(f"output {out} is not empty and was not written by llmctl {stage}; use --overwrite")
        try:
            recorded = json.loads(run_file.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise UsageError(f"{run_file} is unreadable ({e}); use --overwrite to start over") from e
        if recorded.get("digest") != ident["digest"]:
            raise UsageError(f"output {out} holds shards made from {_what_changed(recorded, ident)}; "
                             "use --overwrite to start over, or another -o")
    (out / SHARDS_DIR).mkdir(parents=True, exist_ok=True)
    if clean_temps:
        remove_stale_temps(out)
    write_text(run_file, json.dumps(ident, sort_keys=True))  # atomic: array jobs read it concurrently


def remove_unlisted(out: Path, outputs: list[dict]) -> list[str]:
    """Delete shard files in OUT that the manifest does not list but are named like those it does
    (`part-00007.parquet` left by an earlier run over more input): only the listed ones are the
    artifact. Returns the names removed."""
    listed = {o["file"] for o in outputs}
    families = {(str(Path(f).parent), re.sub(r"\d+", "#", Path(f).name)) for f in listed}
    removed = []
    for p in sorted(out.rglob("*")):
        rel = str(p.relative_to(out))
        if p.is_file() and rel not in listed and not p.name.startswith(".") and SHARDS_DIR not in p.parts \
                and (str(Path(rel).parent), re.sub(r"\d+", "#", p.name)) in families:
            p.unlink()
            removed.append(rel)
    return removed


def remove_task_temps(out: Path, names: set[str]) -> None:
    """Delete the temporary files (`.NAME.ext.tmp-PID`) of these tasks' shards: what a killed
    attempt left; nothing else in OUT is touched, so other jobs' live temps survive."""
    if not names or not out.is_dir():
        return
    for p in out.rglob(".*.tmp-*"):
        if p.is_file() and p.name[1:].split(".tmp-")[0].split(".")[0] in names:
            p.unlink(missing_ok=True)


def sum_counts(into: dict, add: dict) -> dict:
    """Add nested count dicts: {"skipped": {"status": 3}} + {"skipped": {"status": 1}}."""
    for k, v in add.items():
        if isinstance(v, dict):
            sum_counts(into.setdefault(k, {}), v)
        else:
            into[k] = into.get(k, 0) + v
    return into


def run_sharded(
    *,
    stage: str,
    kind: str,
    out: str,
    tasks: list[Task] | Iterable[Task],
    fn: ShardFn,
    config: dict,
    inputs: list[dict] | Callable[[], list[dict]],
    opts: RunOptions,
    progress: Progress | None = None,
    stdout=None,
    schema=None,
    unit: str = "",
    finish: Callable[[Manifest], None] | None = None,
) -> Manifest:
    """Run a sharded stage into `out` (a directory, or `-` for an Arrow stream on stdout).

    `tasks` that is not a list is a lazy source (see run_tasks): it is read once, as the pool has
    room, and cannot be sliced among jobs. `finish(manifest)` runs once every shard is done and
    before the manifest is written: what a stage adds to a finished artifact (a file, counts over
    all shards) is in place before the manifest says the artifact is done, so a kill between the
    two leaves an unfinished artifact that a re-run finishes. Called inside the stage's
    `executor_scope(opts)`."""
    if opts.executor != "local" and current_backend() is None:  # a caller without its scope would quietly run here
        raise RuntimeError(f"run_sharded with executor {opts.executor!r} must run inside executor_scope(opts)")
    progress = progress or Progress()
    streaming = out == STDIO
    sliced = opts.num_shards > 1 and not streaming
    with output_lock(out, slice_=(opts.shard_index, opts.num_shards) if sliced else None, enabled=not streaming):
        return _run_sharded(stage, kind, out, tasks, fn, config, inputs, opts, progress, stdout, schema, unit, finish)


def _run_sharded(stage, kind, out, tasks, fn, config, inputs, opts, progress, stdout, schema, unit, finish) -> Manifest:
    t0 = time.perf_counter()
    # a stream read lazily is named by its bytes once read; its shards carry their own keys (Task.key)
    ident = run_identity(stage, config, [{"path": STDIO, "kind": "stream"}] if callable(inputs) else inputs)
    streaming = out == STDIO
    tmp = tempfile.TemporaryDirectory(prefix=f"llmctl-{stage}-") if streaming else None
    work = Path(tmp.name) if streaming else Path(out)
    try:
        lazy = not isinstance(tasks, list)
        sliced = opts.num_shards > 1 and not streaming
        if lazy and sliced:
            raise UsageError("--num-shards splits the work among jobs, but a stream is read by one job")
        prepare_out(work, stage, ident, opts.overwrite and not streaming, clean_temps=not sliced)
        if lazy:
            seen: list[Task] = []  # every task, for the manifest; without payloads, which may be large
            todo: list[Task] | Iterator[Task] = _unfinished(tasks, work, seen)
            tasks = seen
            progress.start(None, unit=unit, description=stage)
        else:
            mine = select_shard(tasks, opts.shard_index, opts.num_shards) if not streaming else tasks
            todo = [t for t in mine if not _finished(work, t)]
            if sliced:
                remove_task_temps(work, {t.name for t in todo})
            progress.start(sum(t.weight for t in todo), unit=unit, description=stage)
        sink = _StreamOut(work, stdout, schema) if streaming else None

        def on_result(r: TaskResult) -> None:
            for e in (r.stats or {}).get("errors", []):  # damage inside a shard, named for the user
                progress.log(f"{stage}: skipped damage in {error_place({'file': r.name, **e})}: {e.get('error')}")
            if sink:
                sink.emit(r)

        results = run_tasks(_ShardJob(fn, work), todo, workers=opts.workers, progress=progress, on_result=on_result)
        if results and current_backend() is not None:  # Ray retried any task whose worker died: clear
            remove_task_temps(work, {r.name for r in results})  # what the dead attempt left (none of ours runs now)
        progress.finish()
        if sink:
            sink.close()
        failed = [r for r in results if not r.ok]
        if failed and all(disk_error(r.error) for r in failed):  # the disk, not the data: one line says it
            raise disk_error(failed[0].error)
        for r in failed:
            progress.log(f"{stage}: shard {r.name} failed: {r.error}")
        manifest = _manifest(stage, kind, work, tasks, results, config, inputs() if callable(inputs) else inputs, time.perf_counter() - t0)
        if failed:  # the artifact is incomplete: no manifest, so nothing downstream takes it for done
            raise StageFailed(
                f"{len(failed)} of {len(results)} shard(s) failed, first {failed[0].name}: {failed[0].error}; "
                "finished shards are kept, re-run to retry the rest"
            )
        all_done = all((work / SHARDS_DIR / f"{t.name}.json").exists() for t in tasks)
        if finish is not None and (streaming or all_done):
            finish(manifest)
        if not streaming and all_done:
            for name in remove_unlisted(work, manifest.outputs):
                progress.log(f"{stage}: removed {name}, a shard of an earlier run that this manifest does not list")
            write_manifest(work, manifest)
        if opts.strict and manifest.counts.get("errors"):
            raise StageFailed(f"{manifest.counts['errors']} damaged input record(s) skipped (--strict)")
        return manifest
    finally:
        if tmp is not None:
            tmp.cleanup()


def _unfinished(tasks: Iterable[Task], work: Path, seen: list[Task]) -> Iterator[Task]:
    """The tasks of a lazy source still to run, noting each one in `seen` as it comes."""
    for t in tasks:
        seen.append(Task(t.index, t.name, None, t.weight, t.key))
        if not _finished(work, t):
            yield t


def _manifest(stage, kind, work: Path, tasks, results: list[TaskResult], config, inputs, wall) -> Manifest:
    counts: dict = {}
    outputs: list[dict] = []
    errors: list[dict] = []
    for t in tasks:
        marker = work / SHARDS_DIR / f"{t.name}.json"
        if marker.exists():
            stats = json.loads(marker.read_text(encoding="utf-8"))
            sum_counts(counts, stats.get("counts", {}))
            outputs.extend(stats["outputs"])
            errors.extend(stats.get("errors", []))
    for r in results:
        if not r.ok:
            errors.append({"shard": r.name, "error": r.error})
    counts["errors"] = counts.get("errors", 0) + sum(1 for r in results if not r.ok)
    counts["shards"] = len(tasks)
    return Manifest(
        kind=kind,
        stage=stage,
        config=config,
        command=list(sys.argv),
        inputs=inputs,
        outputs=outputs,
        counts=counts,
        errors=errors,
        wall_seconds=round(wall, 3),
    )


class _StreamOut:
    """Streams finished shards to stdout in task order, then deletes them."""

    def __init__(self, work: Path, stdout, schema=None):
        self.work = work
        self.stdout = stdout
        self.schema = schema  # written even when no shard has rows, so a reader downstream sees a valid empty stream
        self.sink: DocsSink | None = None

    def emit(self, r: TaskResult) -> None:
        if not r.ok:
            return
        for o in r.stats["outputs"]:
            if o["file"].startswith("rejected/"):
                continue
            path = self.work / o["file"]
            pf = pq.ParquetFile(path)
            if self.sink is None:
                self.sink = DocsSink(STDIO, pf.schema_arrow, stdout=self.stdout)
            elif not pf.schema_arrow.equals(self.sink.schema):
                unify_schemas([self.sink.schema, pf.schema_arrow])  # raises a clear error if impossible
            for b in pf.iter_batches():
                self.sink.write(b)
            path.unlink()

    def close(self) -> None:
        if self.sink is None and self.schema is not None:
            self.sink = DocsSink(STDIO, self.schema, stdout=self.stdout)
        if self.sink is not None:
            self.sink.close()
