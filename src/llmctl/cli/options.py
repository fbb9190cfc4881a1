"""What every command parses alike (docs/design.md §3): the global --quiet/--json, the shared
option types, the run-control flags of a sharded stage as one block, and the group that runs
its `run` command when no subcommand is named."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from typer.core import TyperGroup

if TYPE_CHECKING:
    from llmctl.runtime.options import RunOptions


@dataclasses.dataclass
class Globals:
    """--quiet/--json given before the command name (`llmctl --json cat …`); set by the root."""

    quiet: bool = False
    json: bool = False


G = Globals()


def flags(quiet: bool, json_: bool) -> tuple[bool, bool]:
    """(quiet, json): either given before or after the command name."""
    return G.quiet or quiet, G.json or json_


# Options that every command also accepts after its name (`llmctl cat a -o b --quiet`).
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar, no summary, no log lines.")]
Json = Annotated[bool, typer.Option("--json", help="Print a machine-readable summary (JSON) on stdout.")]
Out = Annotated[str, typer.Option("--output", "-o", help="Output artifact directory, or '-' for an Arrow stream on stdout.")]
Overwrite = Annotated[bool, typer.Option("--overwrite", help="Replace OUT if it exists instead of resuming into it.")]
DocsIn = Annotated[list[str], typer.Argument(help="Docs inputs: artifacts, Parquet/JSONL files or dirs, globs, or '-'.")]
Config = Annotated[Optional[str], typer.Option("--config", "-c", help="Stage config: a name under stages/<stage>/ or a .toml path. Flags override it.")]


def typed(ctx: typer.Context, **values: Any) -> dict[str, Any]:
    """`values` with None for each flag the user did not type. For commands whose --help shows
    real defaults: their flag defaults must not override the --config file."""
    unset = ("DEFAULT", "DEFAULT_MAP")
    return {k: None if ctx.get_parameter_source(k).name in unset else v for k, v in values.items()}


# ---------------------------------------------------------------------------------------------
# Run control: how a sharded stage runs, not what it computes (llmctl.runtime.options.RunOptions,
# which validates them).

Workers = Annotated[Optional[int], typer.Option("--workers", "-w", min=1, help="Worker processes (default: all cores).")]
ShardIndex = Annotated[int, typer.Option("--shard-index", min=0, help="Run only slice I of the work (Slurm arrays, indexed jobs).")]
NumShards = Annotated[int, typer.Option("--num-shards", min=1, help="Number of slices the work is cut into.")]
Strict = Annotated[bool, typer.Option("--strict", help="Fail (exit 1) on damaged input instead of skipping and counting it.")]
Executor = Annotated[str, typer.Option("--executor", help="Where the shard tasks run: local (process pool) or ray (Ray tasks; needs the ray extra of llmctl).")]
RayAddress = Annotated[Optional[str], typer.Option("--ray-address", help="With --executor ray: the cluster (HOST:PORT, ray://HOST:10001, auto). Default: $RAY_ADDRESS, else a Ray started for this run.")]
CpusPerTask = Annotated[Optional[float], typer.Option("--cpus-per-task", help="With --executor ray: CPUs reserved for each shard task (default 1).")]
MemoryPerTask = Annotated[Optional[str], typer.Option("--memory-per-task", help="With --executor ray: memory reserved for each shard task, in bytes or with K/M/G/T (e.g. 4G).")]

# RunOptions field -> (option type, default), in the order --help lists them.
RUN_FLAGS: dict[str, tuple[Any, Any]] = {
    "workers": (Workers, None),
    "shard_index": (ShardIndex, 0),
    "num_shards": (NumShards, 1),
    "overwrite": (Overwrite, False),
    "strict": (Strict, False),
    "executor": (Executor, "local"),
    "ray_address": (RayAddress, None),
    "cpus_per_task": (CpusPerTask, None),
    "memory_per_task": (MemoryPerTask, None),
}


@dataclasses.dataclass(frozen=True)
class RunFlags:
    """The run-control flags as typed. `options()` validates them; a command calls it after
    building its config, so a config error is reported first, as it always was."""

    values: dict[str, Any]

    def options(self) -> RunOptions:
        from llmctl.runtime.options import RunOptions

        return RunOptions(**self.values)


def run_control(*, omit: tuple[str, ...] = ()):
    """Decorator: the command's `run: RunFlags` parameter becomes the run-control flags (less
    `omit`, the ones the stage has no use for), at that place in its --help."""
    unknown = set(omit) - set(RUN_FLAGS)
    assert not unknown, f"no run-control flag {unknown}"
    names = [n for n in RUN_FLAGS if n not in omit]

    def decorate(command):
        params = []
        for p in inspect.signature(command, eval_str=True).parameters.values():
            if p.name == "run":
                params += [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, annotation=RUN_FLAGS[n][0], default=RUN_FLAGS[n][1]) for n in names]
            else:  # keyword-only: typer passes keywords, and a flag without a default may follow one with
                params.append(p.replace(kind=inspect.Parameter.KEYWORD_ONLY))

        @functools.wraps(command)
        def parsed(**kw):
            run = RunFlags({n: kw.pop(n) for n in names})
            return command(**kw, run=run)

        # typer reads the parameters from these
        parsed.__signature__ = inspect.Signature(params)
        parsed.__annotations__ = {p.name: p.annotation for p in params}
        return parsed

    return decorate


class DefaultCommandGroup(TyperGroup):
    """Runs the `run` subcommand when the first argument names no subcommand
    (`llmctl filter DOCS -o OUT` is `llmctl filter run DOCS -o OUT`)."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


# ---------------------------------------------------------------------------------------------
# LoRA (model/lora.py): the same four flags on every command that trains.

LoraRank = Annotated[Optional[int], typer.Option("--lora-rank", help="Train LoRA adapters of this rank on the --init model instead of all its weights (base frozen; checkpoints hold the adapters and the base's sha256).")]
LoraAlpha = Annotated[Optional[float], typer.Option("--lora-alpha", help="LoRA scale numerator: updates are scaled by alpha/rank (default: the rank, scale 1).")]
LoraDropout = Annotated[Optional[float], typer.Option("--lora-dropout", help="Dropout on the adapters' input (default 0).")]
LoraTargets = Annotated[Optional[str], typer.Option("--lora-targets", help="Projections to adapt, comma-separated among q,k,v,o,gate,up,down (default: all seven).")]


def lora_flags(rank: int | None, alpha: float | None, dropout: float | None, targets: str | None):
    """The LoraConfig the --lora-* flags ask for (validated), or None when --lora-rank is not given."""
    from llmctl.bounds import check_value
    from llmctl.errors import UsageError
    from llmctl.model.lora import LoraConfig

    for key, value in (("rank", rank), ("alpha", alpha), ("dropout", dropout)):  # each number first, by its flag
        check_value("LoraConfig", key, value, f"--lora-{key}")
    if rank is None:
        if alpha is not None or dropout is not None or targets is not None:
            raise UsageError("--lora-alpha, --lora-dropout and --lora-targets go with --lora-rank")
        return None
    given = {k: v for k, v in (("alpha", alpha), ("dropout", dropout), ("targets", targets)) if v is not None}
    return LoraConfig(rank=rank, **given).check()
