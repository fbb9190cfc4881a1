"""RunOptions: the run-control settings every sharded stage takes (docs/design.md §3), validated
once, here, whether they come from the command line or from a library caller."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from llmctl.bounds import check_value, flag_of, usable_cores
from llmctl.errors import UsageError
from llmctl.runtime.executor import default_workers

EXECUTORS = ("local", "ray")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_bytes(value: str | int, flag: str = "--memory-per-task") -> int:
    """A byte count from `4G`, `512M`, `1.5GiB` or a plain number."""
    if isinstance(value, int):
        return value
    v = value.strip().upper().removesuffix("B").removesuffix("I")
    unit = v[-1:] if v[-1:] in _UNITS else ""
    try:
        return int(float(v[: len(v) - len(unit)]) * _UNITS[unit])
    except (ValueError, IndexError):
        raise UsageError(f"{flag} takes bytes or a size like 512M or 4G, not {value!r}") from None


@dataclass
class RunOptions:
    """How a stage runs, not what it computes: none of these change an artifact's bytes."""

    workers: int | None = None  # None: all cores
    shard_index: int = 0
    num_shards: int = 1
    overwrite: bool = False
    strict: bool = False
    executor: str = "local"  # local: a process pool here; ray: Ray tasks (see executor_scope)
    ray_address: str | None = None  # None: $RAY_ADDRESS, else a Ray started for the run
    cpus_per_task: float | None = None  # Ray resources reserved per task (None: 1)
    memory_per_task: int | str | None = None  # bytes, or a size like "4G"
    max_retries: int = 3  # Ray retries of a task whose worker died

    def __post_init__(self) -> None:
        for key in ("workers", "shard_index", "num_shards", "cpus_per_task"):
            check_value("RunOptions", key, getattr(self, key), flag_of("RunOptions", key))
        if not 0 <= self.shard_index < self.num_shards:
            raise UsageError(f"--shard-index {self.shard_index} must be below --num-shards {self.num_shards}")
        if self.executor not in EXECUTORS:
            raise UsageError(f"--executor must be one of {', '.join(EXECUTORS)}, not {self.executor!r}")
        ray_flags = [f for f, v in (("--ray-address", self.ray_address), ("--cpus-per-task", self.cpus_per_task),
                                    ("--memory-per-task", self.memory_per_task)) if v is not None]
        if ray_flags and self.executor != "ray":
            raise UsageError(f"{ray_flags[0]} needs --executor ray")
        if self.memory_per_task is not None:
            self.memory_per_task = parse_bytes(self.memory_per_task)
            if self.memory_per_task <= 0:
                raise UsageError("--memory-per-task must be above 0")


@contextmanager
def executor_scope(opts: RunOptions) -> Iterator[None]:
    """Run the block's run_tasks calls on `opts.executor`. A stage's `run_*` opens the one scope
    of the run around all its phases (one Ray connection for dedup's four), before OUT is touched;
    what it calls (runtime/sharded.py) runs inside it and opens none. "local" keeps whatever scope
    is already active."""
    if opts.executor == "local":
        yield
        return
    from llmctl.runtime.ray_executor import ray_session

    with ray_session(opts.ray_address, opts.cpus_per_task or 1.0, opts.memory_per_task, opts.max_retries):
        yield


def cores_per_task(opts: RunOptions, tasks: int) -> int:
    """The cores one task of a run may use for its own threads (torch's, for a stage that runs a
    model): a Ray task's CPUs; locally what its pool leaves each task (all of them for one file,
    one each when the files fill the workers)."""
    if opts.executor != "local":  # never more threads than the cores of the machine it lands on
        return max(1, min(int(opts.cpus_per_task or 1), usable_cores()))
    workers = min(opts.workers or default_workers(), usable_cores())
    return max(1, workers // max(1, min(workers, tasks)))
