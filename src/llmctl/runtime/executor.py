"""The local executor: map a per-shard task function over tasks with a pool of processes.

- Results come back in task order (`on_result` is called for task i only after 0..i-1), so a
  caller can stream shard after shard while later ones are still running.
- An exception inside a task is captured as that task's error and the others go on; a worker
  that dies outright (killed, out of memory) fails the run, since its shard state is unknown.
- Workers report progress through a queue; the parent forwards it to one `Progress`, so the
  user sees one bar for all workers.
- `workers=1` runs in this process: no pickling, easy to debug, same results.
- `tasks` may be a lazy iterator (a stream cut into batches as it is read): it is pulled in this
  process only while fewer than `max_in_flight` tasks are queued or running, so a producer that
  reads stdin never holds more than that many batches in memory.
- Workers die with this process (runtime/lifeline.py): a `kill -9` of the parent leaves no
  orphans computing shards nobody will collect.
- Inside `use_backend(b)` (runtime/ray_executor.py installs one for `--executor ray`), the same
  call hands the tasks to that backend instead; results, order and errors keep these semantics.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_mod
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Protocol

from llmctl.bounds import usable_cores
from llmctl.errors import StageFailed
from llmctl.runtime.lifeline import die_with_parent
from llmctl.runtime.progress import Progress


@dataclass(frozen=True)
class Task:
    index: int  # position in the full task list; names the output shard
    name: str  # e.g. "part-00003"
    payload: Any  # stage-specific and picklable: a file path, a byte range ...
    weight: int = 1  # progress units this task accounts for (bytes, rows)
    # What the shard is made of, when its name does not say (a window of a stream on stdin: its
    # offset and sha256), so a resumed run never reuses a shard made from other bytes.
    key: str | None = None


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
    return usable_cores()


_worker_queue = None


def _init_worker(q, parent_pid: int) -> None:
    die_with_parent(parent_pid)
    global _worker_queue
    _worker_queue = q


def _report_to_queue(n: int) -> None:
    _worker_queue.put(n)


def call_task(fn: TaskFn, task: Task, report: Callable[[int], None]) -> TaskResult:
    try:
        return TaskResult(task.index, task.name, stats=fn(task, report))
    except Exception as e:  # a task's failure is data about that shard, not the end of the run
        tb = traceback.extract_tb(e.__traceback__)
        where = f" at {tb[-1].filename}:{tb[-1].lineno}" if tb else ""
        return TaskResult(task.index, task.name, error=f"{type(e).__name__}: {e}{where}")


def _call_in_worker(fn: TaskFn, task: Task) -> TaskResult:
    return call_task(fn, task, _report_to_queue)


class Backend(Protocol):
    """Runs tasks somewhere else (a Ray cluster) with run_tasks' contract: one TaskResult per task,
    `on_result` in task order, a task's exception captured as its error, StageFailed when a task
    cannot be run at all."""

    def run(self, fn: TaskFn, tasks: list[Task], *, workers: int | None, progress: Progress, on_result: Callable[[TaskResult], None] | None) -> list[TaskResult]: ...


_backend: ContextVar[Backend | None] = ContextVar("llmctl_executor_backend", default=None)


@contextmanager
def use_backend(backend: Backend | None) -> Iterator[Backend | None]:
    """Within this block, run_tasks hands its tasks to `backend` (None: the local pool)."""
    token = _backend.set(backend)
    try:
        yield backend
    finally:
        _backend.reset(token)


def current_backend() -> Backend | None:
    """The backend run_tasks hands tasks to here (None: the local pool)."""
    return _backend.get()


class InOrder:
    """Collects results as they finish and calls `on_result` in task order. The order is the
    tasks given, plus any announced later with `expect` (a lazy task list)."""

    def __init__(self, tasks: list[Task], on_result: Callable[[TaskResult], None] | None):
        self.order = [t.index for t in tasks]
        self.on_result = on_result
        self.results: dict[int, TaskResult] = {}
        self.emitted = 0

    def expect(self, task: Task) -> None:
        self.order.append(task.index)

    def add(self, r: TaskResult) -> None:
        self.results[r.index] = r
        while self.emitted < len(self.order) and self.order[self.emitted] in self.results:
            if self.on_result is not None:
                self.on_result(self.results[self.order[self.emitted]])
            self.emitted += 1

    def all(self) -> list[TaskResult]:
        return [self.results[i] for i in self.order]


def run_tasks(
    fn: TaskFn,
    tasks: Iterable[Task],
    *,
    workers: int | None = None,
    progress: Progress | None = None,
    on_result: Callable[[TaskResult], None] | None = None,
    max_in_flight: int | None = None,
) -> list[TaskResult]:
    """Run `fn` over `tasks`; return one TaskResult per task, in task order.

    A list is run as it is; any other iterable is pulled lazily, here, keeping at most
    `max_in_flight` tasks (default twice the workers) submitted and unfinished."""
    progress = progress or Progress()
    backend = _backend.get()
    lazy = not isinstance(tasks, list)
    if backend is not None:
        tasks = list(tasks)  # a backend plans over the whole list; stages keep streams local
        if tasks:
            return backend.run(fn, tasks, workers=workers, progress=progress, on_result=on_result)
    # A pool process more than the cores only waits its turn (and --workers 100 on a stream forked
    # 100): the pool is capped by the cores, and a list's by its tasks. Outputs do not depend on it.
    workers = min(workers or default_workers(), default_workers())
    workers = max(1, workers if lazy else min(workers, len(tasks) or 1))
    results = InOrder([] if lazy else tasks, on_result)
    collect = results.add

    if workers == 1:
        for t in tasks:
            if lazy:
                results.expect(t)
            collect(call_task(fn, t, progress.advance))
        return results.all()

    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    q = ctx.Queue()
    cap = max(1, max_in_flight or 2 * workers) if lazy else len(tasks)  # a list is submitted at once
    source = iter(tasks)

    def drain() -> None:
        while True:
            try:
                progress.advance(q.get_nowait())
            except queue_mod.Empty:
                return

    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker, initargs=(q, os.getpid())) as pool:
        futures: dict = {}  # future -> (index, name); not the task, whose payload may be a large batch
        pending: set = set()
        more = True
        try:
            while True:
                while more and len(pending) < cap:
                    t = next(source, None)  # for a stream, this is where stdin is read
                    if t is None:
                        more = False
                        break
                    if lazy:
                        results.expect(t)
                    f = pool.submit(_call_in_worker, fn, t)
                    futures[f] = (t.index, t.name)
                    pending.add(f)
                if not pending:
                    break
                done, pending = wait(pending, timeout=0.1, return_when=FIRST_COMPLETED)
                drain()
                for f in sorted(done, key=lambda f: futures[f][0]):
                    collect(f.result())
                    del futures[f]
        except BrokenProcessPool as e:
            running = sorted(futures[f][1] for f in pending)
            for f in pending:
                f.cancel()
            raise StageFailed(
                "a worker process died (killed or out of memory) while running "
                f"{', '.join(running[:5]) or 'a shard'}; finished shards are kept, re-run to resume"
            ) from e
        except BaseException:  # the task source failed (unreadable stdin) or the user interrupted:
            for f in pending:  # do not wait for queued tasks before reporting it
                f.cancel()
            raise
    drain()  # after the pool has shut down: the workers' queue feeders flushed as they exited
    return results.all()
