"""A scaling ladder: the training runs a scaling-law fit needs, laid out as the field guide's
scaling chapter recommends, written as a Makefile (`llmctl plan ladder`).

The grid is model sizes x compute budgets. Each size is the base preset with another width and
depth (heads of the preset's head dimension, the preset's KV-head ratio, d_ff at the preset's
d_ff/d_model rounded to 64). For each budget C a size trains on D = C / C_token tokens (C_token:
model/flops.py, attention included; N counts every parameter, head and embedding too: the guide,
"count total parameters including the head, and all FLOPs"). A (size, budget) pair is kept when
its tokens per parameter lie in [min_tpp, max_tpp]: every budget then has several sizes, so
several D/N (off-diagonal designs won 97.3% of held-out comparisons), and `bracketed` says whether
a budget's sizes sit on both sides of its Chinchilla optimum (Besiroglu et al. 2024's constants),
as an IsoFLOP parabola needs.

Runs of one size share one WSD run (Hägele et al. 2024, "Scaling Laws and Compute-Optimal
Training beyond Fixed Training Durations"): the size's largest budget is a whole WSD run, and
each smaller budget is a decay branch from that run's checkpoint at the start of its own
cooldown (`--init CKPT --init-optimizer --schedule decay`), so the stable phase is trained once.
Every run of the ladder uses the same warmup (in tokens) so a branch equals the whole run it
stands for up to its cooldown. Token counts are whole steps and so is each cooldown; the WSD run
keeps a checkpoint at each branch point (`train.branch_steps`).
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field, replace

from llmctl.errors import UsageError
from llmctl.model.config import ModelConfig
from llmctl.plan.arithmetic import compute_optimal, get_constants

MIN_TPP, MAX_TPP = 2.0, 200.0  # tokens per parameter kept: the guide's ladders span ~2-3 decades of D/N
CONSTANTS = "besiroglu"  # the guide's default Chinchilla constants


@dataclass(frozen=True)
class Size:
    name: str
    model: ModelConfig

    @property
    def n_params(self) -> int:
        return self.model.n_params()


@dataclass
class Run:
    name: str
    size: Size
    budget: float  # FLOPs asked for
    tokens: int  # whole steps
    parent: str | None = None  # the WSD run this one branches from
    branch_step: int | None = None  # the parent's checkpoint it starts from
    flops: float = 0.0  # what the run's tokens actually cost

    @property
    def tokens_per_param(self) -> float:
        return self.tokens / self.size.n_params


@dataclass
class Ladder:
    sizes: list[Size]
    budgets: list[float]
    runs: list[Run]
    seq_len: int
    batch_tokens: int
    warmup_tokens: int
    cooldown_frac: float
    bracketed: dict[float, bool] = field(default_factory=dict)  # budget -> its optimum lies among its sizes
    optimum: dict[float, float] = field(default_factory=dict)  # budget -> Chinchilla N_opt


def parse_size(text: str) -> tuple[int, int]:
    """'192x4' -> (d_model 192, 4 layers)."""
    try:
        d, layers = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise UsageError(f"--size must be D_MODELxLAYERS (e.g. 192x4), got {text!r}") from None
    if d < 1 or layers < 1:
        raise UsageError(f"--size {text}: width and depth must be at least 1")
    return d, layers


def scaled(base: ModelConfig, d_model: int, n_layers: int) -> ModelConfig:
    """The base architecture at another width and depth (module docstring)."""
    head_dim = base.head_dim
    if d_model % head_dim:
        raise UsageError(f"--size {d_model}x{n_layers}: the width must be a multiple of the preset's head dimension {head_dim}")
    heads = d_model // head_dim
    kv = max(1, round(heads * base.n_kv_heads / base.n_heads))
    while heads % kv:
        kv -= 1
    d_ff = max(64, round(base.d_ff / base.d_model * d_model / 64) * 64)
    return replace(base, d_model=d_model, n_layers=n_layers, n_heads=heads, n_kv_heads=kv, d_ff=d_ff, head_dim=head_dim)


def whole_steps(tokens: float, quantum: int) -> int:
    return max(quantum, int(round(tokens / quantum)) * quantum)


def build_ladder(base: ModelConfig, sizes: list[tuple[int, int]], budgets: list[float], *, seq_len: int, batch_tokens: int,
                 cooldown_frac: float = 0.2, warmup_frac: float = 0.1, min_tpp: float = MIN_TPP, max_tpp: float = MAX_TPP) -> Ladder:
    if len(sizes) < 2 or len(budgets) < 1:
        raise UsageError("a ladder needs at least 2 --size values and 1 --budget")
    if not 0 < cooldown_frac < 1:
        raise UsageError(f"the cooldown fraction must be in (0, 1), got {cooldown_frac}")
    c = get_constants(CONSTANTS)
    shapes = [Size(f"d{d}-l{n}", scaled(base, d, n)) for d, n in sorted(set(sizes), key=lambda s: scaled(base, *s).n_params())]
    # branch points must be whole steps and land on checkpoints: tokens are multiples of a quantum
    # whose cooldown share is whole steps too
    quantum = batch_tokens * (1000 // math.gcd(round(cooldown_frac * 1000), 1000))  # 0.2: 5 steps
    runs: list[Run] = []
    for size in shapes:
        fpt = size.model.flops_per_token(seq_len)
        for budget in sorted(budgets):
            tokens = whole_steps(budget / fpt, quantum)
            if min_tpp <= tokens / size.n_params <= max_tpp:
                runs.append(Run(f"{size.name}-c{budget:.2e}".replace("+", ""), size, budget, tokens, flops=tokens * fpt))
    if not runs:
        raise UsageError(f"no --size trains {min_tpp:g}-{max_tpp:g} tokens per parameter at these --budget values: "
                         "raise the budgets, shrink the sizes or widen --min-tpp/--max-tpp")
    warmup = whole_steps(warmup_frac * min(r.tokens for r in runs), batch_tokens) if warmup_frac > 0 else 0
    for size in shapes:  # the largest budget of a size is its WSD run; the others branch from it
        own = sorted((r for r in runs if r.size is size), key=lambda r: r.tokens)
        for r in own[:-1]:
            if r.tokens == own[-1].tokens:
                raise UsageError(f"{r.name} and {own[-1].name} round to the same tokens: space the budgets further apart")
            r.parent = own[-1].name
            r.branch_step = round((1 - cooldown_frac) * r.tokens) // batch_tokens
    ladder = Ladder(shapes, sorted(budgets), runs, seq_len, batch_tokens, warmup, cooldown_frac)
    for b in ladder.budgets:
        n_opt, _ = compute_optimal(b, c)
        ladder.optimum[b] = n_opt
        ns = [r.size.n_params for r in runs if r.budget == b]
        ladder.bracketed[b] = bool(ns) and min(ns) < n_opt < max(ns)
    return ladder


def commands(ladder: Ladder, tokens: str, val: str | None, preset: str, out: str, extra: list[str]) -> dict[str, list[str]]:
    """Each run's `llmctl train` command (argv after `llmctl`)."""
    by_name = {r.name: r for r in ladder.runs}
    cmds = {}
    for r in ladder.runs:
        m = r.size.model
        argv = ["train", tokens, *(["--val", val] if val else []), "-o", f"{out}/{r.name}", "--config", preset,
                "--set", f"model.d_model={m.d_model}", "--set", f"model.n_layers={m.n_layers}", "--set", f"model.n_heads={m.n_heads}",
                "--set", f"model.n_kv_heads={m.n_kv_heads}", "--set", f"model.d_ff={m.d_ff}", "--seq-len", str(ladder.seq_len),
                "--batch-tokens", str(ladder.batch_tokens), "--max-tokens", str(r.tokens)]
        if r.parent is None:
            branches = sorted(b.branch_step for b in ladder.runs if b.parent == r.name)
            argv += ["--set", f"train.warmup_tokens={ladder.warmup_tokens}", "--set", f"train.cooldown_frac={ladder.cooldown_frac}"]
            argv += ["--set", f"train.branch_steps=[{','.join(map(str, branches))}]"] if branches else []
        else:
            parent = by_name[r.parent]
            branch_tokens = r.tokens - r.branch_step * ladder.batch_tokens
            argv = _without_model_sets(argv)
            argv[argv.index("--max-tokens") + 1] = str(branch_tokens)
            argv += ["--init", f"{out}/{parent.name}/checkpoints/step-{r.branch_step:06d}", "--init-optimizer", "--schedule", "decay"]
        cmds[r.name] = argv + list(extra)
    return cmds


def _without_model_sets(argv: list[str]) -> list[str]:
    """--init fixes the architecture: a branch takes no --set model.*."""
    out, skip = [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a == "--set" and i + 1 < len(argv) and argv[i + 1].startswith("model."):
            skip = True
            continue
        out.append(a)
    return out


def makefile(ladder: Ladder, cmds: dict[str, list[str]], out: str, llmctl: str = "llmctl") -> str:
    """A Makefile: a target per run (a branch depends on its WSD run), `all`, and `fit`."""
    lines = ["# Written by `llmctl plan ladder`: `make -f THIS -j1 all`, then `make -f THIS fit`.",
             f"# {len(ladder.runs)} runs; sizes {', '.join(f'{s.name} ({s.n_params:,} params)' for s in ladder.sizes)}.",
             "LLMCTL ?= " + llmctl, "", ".PHONY: all fit", ""]
    targets = {r.name: f"{out}/{r.name}/manifest.json" for r in ladder.runs}
    lines.append("all: " + " ".join(targets.values()))
    lines.append("")
    for r in ladder.runs:
        dep = f" {targets[r.parent]}" if r.parent else ""
        lines.append(f"{targets[r.name]}:{dep}")
        lines.append("\t$(LLMCTL) " + " ".join(shlex.quote(a) for a in cmds[r.name]) + " --overwrite")
        lines.append("")
    lines.append("fit: all")
    lines.append(f"\t$(LLMCTL) plan fit {' '.join(f'{out}/{r.name}' for r in ladder.runs)} -o {out}/fit")
    return "\n".join(lines) + "\n"


__all__ = ["Ladder", "Run", "Size", "build_ladder", "commands", "makefile", "parse_size", "scaled"]
