"""`llmctl plan ladder`: the runs of a scaling-law fit, as a Makefile (plan/ladder.py)."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path
from typing import Annotated, Optional

import typer

from llmctl.bounds import check_flags
from llmctl.cli.console import err, print_json
from llmctl.cli.options import Json, Quiet, flags
from llmctl.errors import UsageError


def ladder(
    tokens: Annotated[str, typer.Argument(help="The train tokens artifact every run reads (its vocabulary sizes the models).")],
    output: Annotated[str, typer.Option("--output", "-o", help="The Makefile to write (`make -f FILE all`, then `make -f FILE fit`).")],
    size: Annotated[list[str], typer.Option("--size", help="A model size as D_MODELxLAYERS, e.g. 192x4 (repeatable, at least 2); heads, KV heads and d_ff follow the preset's ratios.")],
    budget: Annotated[list[float], typer.Option("--budget", help="A compute budget in training FLOPs (repeatable); each size trains D = budget / FLOPs-per-token tokens.")],
    val: Annotated[Optional[str], typer.Option("--val", help="Held-out tokens: the fit reads each run's final validation loss.")] = None,
    config: Annotated[str, typer.Option("--config", help="The base train preset (stages/train/) or a TOML path.")] = "tiny",
    runs: Annotated[str, typer.Option("--runs", help="Directory of the runs (one sub-directory a run).")] = "ladder",
    min_tpp: Annotated[float, typer.Option("--min-tpp", help="Keep a size at a budget only from this many tokens per parameter.")] = 2.0,
    max_tpp: Annotated[float, typer.Option("--max-tpp", help="... up to this many.")] = 200.0,
    train_args: Annotated[Optional[str], typer.Option("--train-args", help="More `llmctl train` flags for every run, quoted: '--optimizer muon --lr 2e-3'.")] = None,
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """Lay out a scaling ladder: sizes x budgets, each size's budgets as decay branches of one WSD run.

    Sizes on both sides of each budget's Chinchilla optimum and several tokens-per-parameter per budget, as the field guide's scaling chapter asks; the Makefile runs locally, and each line is a plain `llmctl train` for Slurm or torchrun."""
    from llmctl.artifacts.tokens import TokenDataset
    from llmctl.train.config import load_run_config
    from llmctl.plan.ladder import build_ladder, commands, makefile, parse_size

    check_flags("plan ladder", min_tpp=min_tpp, max_tpp=max_tpp)
    quiet, as_json = flags(quiet, json_)
    if min_tpp >= max_tpp:
        raise UsageError(f"--min-tpp {min_tpp:g} must be below --max-tpp {max_tpp:g}")
    for b in budget:
        check_flags("plan ladder", budget=b)
    model_cfg, train = load_run_config(config, {})  # the preset as `llmctl train --config` reads it
    base = dataclasses.replace(model_cfg, vocab_size=TokenDataset(Path(tokens)).vocab_size)  # as train replaces it
    lad = build_ladder(base, [parse_size(s) for s in size], budget, seq_len=train.seq_len, batch_tokens=train.batch_tokens,
                       cooldown_frac=train.cooldown_frac, warmup_frac=train.warmup_frac, min_tpp=min_tpp, max_tpp=max_tpp)
    extra = shlex.split(train_args or "")
    cmds = commands(lad, tokens, val, config, runs, extra)
    text = makefile(lad, cmds, runs)
    Path(output).write_text(text)
    rows = [{"run": r.name, "params": r.size.n_params, "tokens": r.tokens, "tokens_per_param": round(r.tokens_per_param, 2),
             "flops": r.flops, "branch_of": r.parent, "branch_step": r.branch_step} for r in lad.runs]
    unbracketed = [b for b, ok in lad.bracketed.items() if not ok]
    if as_json:
        print_json({"output": output, "runs": rows, "bracketed": {f"{b:.3g}": ok for b, ok in lad.bracketed.items()},
                    "optimal_params": {f"{b:.3g}": n for b, n in lad.optimum.items()}, "warmup_tokens": lad.warmup_tokens})
        return
    if not quiet:
        from rich.table import Table

        t = Table(title=f"plan ladder: {len(rows)} runs ({sum(r.parent is None for r in lad.runs)} WSD runs, the rest decay branches)")
        for col in ("run", "params", "tokens", "D/N", "FLOPs", "branch of"):
            t.add_column(col, justify="left" if col in ("run", "branch of") else "right")
        for r in rows:
            t.add_row(r["run"], f"{r['params']:,}", f"{r['tokens']:,}", f"{r['tokens_per_param']:.1f}", f"{r['flops']:.2e}",
                      f"{r['branch_of']} @ step {r['branch_step']}" if r["branch_of"] else "")
        err.print(t)
        err.print(f"wrote {output}: make -f {output} all, then make -f {output} fit")
    for b in unbracketed:
        err.print(f"warning: at {b:.3g} FLOPs the sizes kept do not bracket the Chinchilla optimum "
                  f"({lad.optimum[b]:,.0f} params, Besiroglu et al.'s constants): the IsoFLOP parabola needs sizes on both sides")
