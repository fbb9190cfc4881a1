"""`--executor ray`: the stages' shard tasks as Ray tasks, behind run_tasks' interface.

The driver (the `llmctl` process) plans the tasks and commits the artifact; Ray only runs the
task function, which writes its shard under a temporary name, renames it into place and then
writes the shard's `.shards/NAME.json` marker (runtime/sharded.py). So:

- a worker that dies (killed, out of memory, its node lost) is retried by Ray (`max_retries`);
  the retry writes the same bytes under its own temporary name, or, when the shard had already
  been committed before the worker died, finds its marker and returns the recorded stats;
- a task's own exception is not retried: it is that shard's error, as with the local pool;
- a task that cannot be run at all (retries used up, the function cannot be loaded on the
  cluster) fails the run with StageFailed; finished shards stay, a re-run resumes.

Results come back to the driver in task order (`on_result`), as with the local pool. Progress
advances by each task's reported units when the task finishes (one step per shard, not per batch).

Paths: tasks run in the driver's working directory when it exists on the worker's machine, so
relative paths mean the same thing there; on a multi-node cluster inputs and OUT must be on a
filesystem every node sees at the same path. `LLMCTL_*` environment variables travel with the
task (e.g. LLMCTL_LANGID_MODEL).
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from llmctl.errors import StageFailed, UsageError
from llmctl.runtime.executor import InOrder, Task, TaskFn, TaskResult, call_task, use_backend
from llmctl.runtime.progress import Progress

INSTALL_HINT = "pip install 'llmctl[ray]'"


def import_ray():
    try:
        import ray
    except ImportError as e:
        raise UsageError(f"--executor ray needs Ray, which is not installed: {INSTALL_HINT}") from e
    return ray


def _run_remote(fn: TaskFn, task: Task, cwd: str, env: dict[str, str]) -> tuple[TaskResult, int]:
    """The body of every Ray task: run one task where the driver would, count its progress."""
    if cwd and os.path.isdir(cwd) and os.getcwd() != cwd:
        os.chdir(cwd)
    os.environ.update(env)
    done = 0

    def report(n: int) -> None:
        nonlocal done
        done += n

    return call_task(fn, task, report), done


def _failure(e: Exception) -> str:
    cause = getattr(e, "cause", None)  # RayTaskError: the exception raised on the worker
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {cause}"
    lines = [ln for ln in str(e).splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"


@dataclass
class RayBackend:
    """Runs run_tasks' tasks on the connected Ray cluster (see the module docstring)."""

    ray: Any
    cpus_per_task: float = 1.0
    memory_per_task: int | None = None
    max_retries: int = 3

    def slots(self) -> int:
        """Tasks the cluster can run at once with these resources (at least 1)."""
        cpus = self.ray.cluster_resources().get("CPU", 1.0)
        return max(1, int(cpus // self.cpus_per_task))

    def run(self, fn: TaskFn, tasks: list[Task], *, workers: int | None, progress: Progress, on_result: Callable[[TaskResult], None] | None) -> list[TaskResult]:
        ray = self.ray
        options: dict[str, Any] = {"num_cpus": self.cpus_per_task, "max_retries": self.max_retries, "retry_exceptions": False}
        if self.memory_per_task:
            options["memory"] = self.memory_per_task
        remote = ray.remote(_run_remote)
        fn_ref = ray.put(fn)  # shipped once, not once per task
        cwd = os.getcwd()
        env = {k: v for k, v in os.environ.items() if k.startswith("LLMCTL_")}
        # --workers caps the tasks in flight; by default twice what the cluster runs at once,
        # so the next task is queued on Ray when one finishes, without submitting 90,000 at once
        window = workers or 2 * self.slots()
        todo = deque(tasks)
        inflight: dict[Any, Task] = {}
        results = InOrder(tasks, on_result)
        try:
            while todo or inflight:
                while todo and len(inflight) < window:
                    t = todo.popleft()
                    inflight[remote.options(name=f"llmctl {t.name}", **options).remote(fn_ref, t, cwd, env)] = t
                done, _ = ray.wait(list(inflight), num_returns=1)
                for ref in done:
                    t = inflight.pop(ref)
                    try:
                        result, units = ray.get(ref)
                    except ray.exceptions.RayError as e:
                        raise StageFailed(
                            f"Ray could not run {t.name} (retried {self.max_retries} times): {_failure(e)}; "
                            "finished shards are kept, re-run to resume"
                        ) from e
                    progress.advance(units)
                    results.add(result)
        finally:
            for ref in inflight:  # an error or Ctrl-C: stop what is still running
                ray.cancel(ref, force=True)
        return results.all()


def _largest_node(ray) -> tuple[float, float]:
    """(CPUs, memory bytes) of the largest alive node: a task asking more could never start."""
    cpus = mem = 0.0
    for n in ray.nodes():
        if n.get("Alive"):
            cpus = max(cpus, n["Resources"].get("CPU", 0.0))
            mem = max(mem, n["Resources"].get("memory", 0.0))
    return cpus, mem


@contextmanager
def ray_session(address: str | None = None, cpus_per_task: float = 1.0, memory_per_task: int | None = None, max_retries: int = 3) -> Iterator[RayBackend]:
    """Connect to Ray (or reuse the connection this process already has) and run the block's
    run_tasks calls on it. `address`: a cluster (HOST:PORT, ray://HOST:10001, auto); default
    $RAY_ADDRESS, else a Ray started on this machine for the block and shut down after it."""
    ray = import_ray()  # the limits themselves were checked by RunOptions
    connected_here = False
    if not ray.is_initialized():
        target = address or os.environ.get("RAY_ADDRESS") or "local"
        kwargs: dict[str, Any] = {"address": target, "logging_level": logging.WARNING}
        if target == "local":  # a new Ray for this run only, never someone else's on this machine
            kwargs["include_dashboard"] = False
        try:
            ray.init(**kwargs)
        except (ConnectionError, ValueError, RuntimeError) as e:
            raise UsageError(f"cannot connect to Ray at {target}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
        connected_here = True
    try:
        cpus, mem = _largest_node(ray)
        if cpus and cpus_per_task > cpus:
            raise UsageError(f"--cpus-per-task {cpus_per_task:g} is more than the largest Ray node has ({cpus:g} CPUs)")
        if mem and memory_per_task and memory_per_task > mem:
            raise UsageError(f"--memory-per-task {memory_per_task} is more than the largest Ray node offers ({int(mem)} bytes)")
        backend = RayBackend(ray, cpus_per_task=cpus_per_task, memory_per_task=memory_per_task, max_retries=max_retries)
        with use_backend(backend):
            yield backend
    finally:
        if connected_here:
            ray.shutdown()
