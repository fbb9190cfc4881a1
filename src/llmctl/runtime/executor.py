"""The local executor: map a per-shard task function over tasks with a pool of processes.

- Results come back in task order (`on_result` is called for task i only after 0..i-1), so a
  caller can stream shard after shard while later ones are still running.
- An exception inside a task is captured as that task's error and the others go on; a worker
  that dies outright (killed, out of memory) fails the run, since its shard state is unknown.
- Workers report progress through a queue; the parent forwards it to one `Progress`, so the
  user sees one bar for all workers.
- `workers=1` runs in this process: no pickling, easy to debug, same results.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_mod
import traceback
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from llmctl.errors import StageFailed
from llmctl.runtime.progress import Progress


@dataclass(frozen=True)
class Task:
    index: int  # position in the full task list; names the output shard
    name: str  # e.g. "part-00003"
    payload: Any  # stage-specific and picklable: a file path, a byte range ...
    weight: int = 1  # progress units this task accounts for (bytes, rows)


@dataclass
class TaskResult:
    index: int
    name: str
    stats: dict | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


# fn(task, report) -> stats; report(n) advances the shared progress by n units.
TaskFn = Callable[[Task, Callable[[int], None]], dict]


def default_workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


_worker_queue = None


def _init_worker(q) -> None:
    global _worker_queue
    _worker_queue = q


def _report_to_queue(n: int) -> None:
    _worker_queue.put(n)


def _call(fn: TaskFn, task: Task, report: Callable[[int], None]) -> TaskResult:
    try:
        return TaskResult(task.index, task.name, stats=fn(task, report))
    except Exception as e:  # a task's failure is data about that shard, not the end of the run
        tb = traceback.extract_tb(e.__traceback__)
        where = f" at {tb[-1].filename}:{tb[-1].lineno}" if tb else ""
        return TaskResult(task.index, task.name, error=f"{type(e).__name__}: {e}{where}")


def _call_in_worker(fn: TaskFn, task: Task) -> TaskResult:
    return _call(fn, task, _report_to_queue)


def run_tasks(
    fn: TaskFn,
    tasks: list[Task],
    *,
    workers: int | None = None,
    progress: Progress | None = None,
    on_result: Callable[[TaskResult], None] | None = None,
) -> list[TaskResult]:
    """Run `fn` over `tasks`; return one TaskResult per task, in task order."""
    progress = progress or Progress()
    workers = max(1, min(workers or default_workers(), len(tasks) or 1))
    results: dict[int, TaskResult] = {}
    order = [t.index for t in tasks]
    emitted = 0

    def collect(r: TaskResult) -> None:
        nonlocal emitted
        results[r.index] = r
        while emitted < len(order) and order[emitted] in results:
            if on_result is not None:
                on_result(results[order[emitted]])
            emitted += 1

    if workers == 1:
        for t in tasks:
            collect(_call(fn, t, progress.advance))
        return [results[i] for i in order]

    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    q = ctx.Queue()

    def drain() -> None:
        while True:
            try:
                progress.advance(q.get_nowait())
            except queue_mod.Empty:
                return

    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker, initargs=(q,)) as pool:
        futures = {pool.submit(_call_in_worker, fn, t): t for t in tasks}
        pending = set(futures)
        try:
            while pending:
                done, pending = wait(pending, timeout=0.1, return_when=FIRST_COMPLETED)
                drain()
                for f in sorted(done, key=lambda f: futures[f].index):
                    collect(f.result())
        except BrokenProcessPool as e:
            running = sorted(futures[f].name for f in pending)
            for f in pending:
                f.cancel()
            raise StageFailed(
                "a worker process died (killed or out of memory) while running "
                f"{', '.join(running[:5]) or 'a shard'}; finished shards are kept, re-run to resume"
            ) from e
        drain()
    return [results[i] for i in order]
