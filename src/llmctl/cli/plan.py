"""`llmctl plan`: the arithmetic of a training run (parameters, FLOPs, time, cost, memory)
before any hardware is booked (its default command), and `plan fit`: the scaling law of a ladder
of finished runs."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from llmctl.bounds import check_flags
from llmctl.cli import render
from llmctl.cli.options import DefaultCommandGroup, Json, Quiet, flags
from llmctl.cli.plan_ladder import ladder
from llmctl.cli.console import print_json, table
from llmctl.errors import UsageError


class PlanGroup(DefaultCommandGroup):
    """`llmctl plan` alone is the planner too, which then names what it needs (one line, exit 2)."""

    def parse_args(self, ctx, args):
        return super().parse_args(ctx, args or ["run"])


app = typer.Typer()
plan_app = typer.Typer(
    cls=PlanGroup,
    help="The arithmetic of a run before you book the cluster (`llmctl plan --model PRESET ...`), and "
    "`fit RUN...`: the scaling law L = E + A/N^alpha + B/D^beta of a ladder of finished runs.",
)
app.add_typer(plan_app, name="plan")


@plan_app.command("run")
def plan(
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Train preset: a name under stages/train/ (tiny, small, gpt2-124m, fineweb-0.5b) or a .toml with model and train tables; the train table gives the seq_len, micro_batch, batch_tokens and max_tokens (D) defaults.")] = None,
    hf_config: Annotated[Optional[str], typer.Option("--hf-config", help="A Hugging Face config.json instead: llama, mistral, qwen2/3, olmo2, gpt2, or MoE (mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek_v2/v3).")] = None,
    tokens: Annotated[Optional[float], typer.Option("--tokens", "-D", help="Training tokens D (e.g. 10e9). Default: the preset's max_tokens, else compute-optimal for the model.")] = None,
    flops: Annotated[Optional[float], typer.Option("--flops", "-C", help="Compute budget C in FLOPs instead of --tokens (D = C / FLOPs per token).")] = None,
    days: Annotated[Optional[float], typer.Option("--days", help="Budget as a reservation instead: C = GPUs x peak x MFU x days x ETTR.")] = None,
    gpus: Annotated[int, typer.Option("--gpus", "-p", help="Number of GPUs (all data parallel).")] = 1,
    gpu: Annotated[str, typer.Option("--gpu", help="Accelerator key from the hardware table (h100, h200, a100, b200, mi300x, l4, t4, ...; see --list-gpus).")] = "h100",
    mfu: Annotated[float, typer.Option("--mfu", help="Model FLOPs utilization against the dense BF16 peak (planning band 0.35-0.45).")] = 0.4,
    seq_len: Annotated[Optional[int], typer.Option("--seq-len", "-s", help="Sequence length (default: the preset's seq_len, else the model's context).")] = None,
    micro_batch: Annotated[Optional[int], typer.Option("--micro-batch", help="Sequences per GPU per forward pass, for activation memory (default: preset, else 1).")] = None,
    batch_tokens: Annotated[Optional[int], typer.Option("--batch-tokens", help="Global batch in tokens, for steps and step time (default: preset).")] = None,
    recipe: Annotated[str, typer.Option("--recipe", help="Model-state recipe: bf16-adamw (16 B/param), bf16-adamw-fp32grad (20), fp32-adamw (16), adamw-8bit (10), sgd-momentum (12), bf16-muon (12), fp32-muon (12), adafactor (8), deepseek-v3 (12).")] = "bf16-adamw",
    zero: Annotated[int, typer.Option("--zero", min=0, max=3, help="ZeRO stage 0-3: shard optimizer states (1), + gradients (2), + weights (3) over the GPUs.")] = 0,
    recompute: Annotated[str, typer.Option("--recompute", help="Activation recomputation, as `train --recompute`: none, selective (matmul outputs kept; norms, SwiGLU and the attention core recomputed) or block (block inputs only); or the guide's finer rows norms / swiglu (fused kernels; not train modes).")] = "none",
    fused_loss: Annotated[bool, typer.Option("--fused-loss", help="Fused cross-entropy: no materialized logits in the memory estimate.")] = False,
    price: Annotated[float, typer.Option("--price", help="Price per GPU-hour in dollars (default 2, illustrative).")] = 2.0,
    mttf: Annotated[Optional[float], typer.Option("--mttf", help="Job mean time to failure in hours (default: from --failure-rate and the node count).")] = None,
    failure_rate: Annotated[float, typer.Option("--failure-rate", help="Failures per 1,000 node-days when --mttf is not given (Llama 3: 3.79).")] = 3.79,
    gpus_per_node: Annotated[int, typer.Option("--gpus-per-node", help="GPUs per node, for the node count behind the MTTF.")] = 8,
    ckpt_write_s: Annotated[float, typer.Option("--ckpt-write-s", help="Seconds training stalls per checkpoint (delta in Young's interval; default 30, illustrative).")] = 30.0,
    restart_s: Annotated[float, typer.Option("--restart-s", help="Seconds lost per failure to restart (default 600, illustrative).")] = 600.0,
    ettr: Annotated[Optional[float], typer.Option("--ettr", help="Effective training time ratio for --days and wall time (default: estimated from MTTF and checkpoint cadence).")] = None,
    chinchilla_constants: Annotated[str, typer.Option("--chinchilla-constants", help="Scaling-law constants: besiroglu (refit, default), original (Chinchilla as printed) or unrounded.")] = "besiroglu",
    attention: Annotated[str, typer.Option("--attention", help="Attention FLOPs counting: causal ((s+1)/2, default), full (s, PaLM/nanoGPT) or none (6N).")] = "causal",
    count_input_embedding: Annotated[bool, typer.Option("--count-embedding", help="Count the input embedding table (and learned positions) in 6N; it does no matmul, so off by default.")] = False,
    gpu_hours: Annotated[Optional[float], typer.Option("--gpu-hours", help="GPU-hours a run reported: also print the utilization they imply.")] = None,
    hardware_file: Annotated[Optional[str], typer.Option("--hardware-file", help="TOML file of extra accelerators, same keys as the built-in table (llmctl/torchrt/hardware.toml).")] = None,
    list_gpus: Annotated[bool, typer.Option("--list-gpus", help="Print the hardware table and exit.")] = False,
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """The arithmetic of a run before you book the cluster: parameters, FLOPs, time, cost, memory
    per GPU, KV cache, Chinchilla sizing and checkpoint interval."""
    from llmctl.plan import load_hf_config, load_preset, load_table
    from llmctl.plan import plan as make_plan
    from llmctl.cli.plan_tables import HARDWARE_HEADERS, hardware_rows
    from llmctl.cli.plan_tables import render as plan_tables

    _, as_json = flags(quiet, json_)
    check_flags("plan", tokens=tokens, flops=flops, days=days, gpus=gpus, mfu=mfu, seq_len=seq_len, micro_batch=micro_batch,
                batch_tokens=batch_tokens, zero=zero, price=price, mttf=mttf, failure_rate=failure_rate, gpus_per_node=gpus_per_node,
                ckpt_write_s=ckpt_write_s, restart_s=restart_s, ettr=ettr, gpu_hours=gpu_hours)
    if list_gpus:
        hw_table = load_table(hardware_file)
        if as_json:
            print_json({k: h.summary() for k, h in hw_table.items()})
        else:
            render.hardware_list(hardware_rows(hw_table), HARDWARE_HEADERS)
        return
    if (model is None) == (hf_config is None):
        raise UsageError("give one of --model PRESET|TOML or --hf-config config.json")
    if model is not None:
        arch, train_cfg = load_preset(model)
    else:
        arch, train_cfg = load_hf_config(hf_config), {}
    r = make_plan(
        arch, train=train_cfg, tokens=tokens, flops=flops, days=days, gpus=gpus, gpu=gpu, hardware_file=hardware_file,
        mfu=mfu, seq_len=seq_len, micro_batch=micro_batch, batch_tokens=batch_tokens, recipe=recipe, zero=zero,
        price=price, mttf_hours=mttf, failure_rate=failure_rate, gpus_per_node=gpus_per_node, ckpt_write_s=ckpt_write_s,
        restart_s=restart_s, ettr=ettr, constants=chinchilla_constants, attention=attention,
        count_input_embedding=count_input_embedding, recompute=recompute, fused_loss=fused_loss, reported_gpu_hours=gpu_hours,
    )
    if as_json:
        print_json(r)
        return
    out = render.stdout()
    for t in plan_tables(r):
        out.print(t)


@plan_app.command("fit")
def fit(
    runs: Annotated[list[str], typer.Argument(help="Finished `llmctl train` run directories (trained with --val): the ladder.", show_default=False)],
    output: Annotated[Optional[str], typer.Option("--output", "-o", help="Directory for fit.json and the plots isoflop.png and ladder.png.")] = None,
    budget: Annotated[Optional[float], typer.Option("--budget", "-C", help="Compute budget in FLOPs for N_opt and D_opt (default: the largest run's).")] = None,
    holdout: Annotated[Optional[str], typer.Option("--holdout", help="A run kept out of the fit: its loss predicted next to the measured one.")] = None,
    bootstrap: Annotated[int, typer.Option("--bootstrap", help="Bootstrap rounds over the runs for the 95% intervals (0: none).")] = 200,
    target: Annotated[str, typer.Option("--target", help="What is fitted: loss (final validation nats/token) or bpb (bits per byte, comparable across tokenizers).")] = "loss",
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """Fit L = E + A/N^alpha + B/D^beta to a ladder of runs, two ways: IsoFLOP parabolas with a power law
    through their minima, and Hoffmann et al.'s Huber fit of the parametric form (L-BFGS from a grid, a
    convergence check, bootstrap intervals over runs). Runs that cannot be points are listed with why."""
    from pathlib import Path

    from llmctl.plan.ladder_runs import fit_runs

    quiet, as_json = flags(quiet, json_)
    check_flags("plan fit", budget=budget, bootstrap=bootstrap)
    r = fit_runs(runs, target=target, budget=budget, holdout=holdout, rounds=bootstrap,
                 out=Path(output) if output is not None else None)
    if as_json:
        print_json(r)
        return
    if quiet:
        return
    out = render.stdout()
    for t in fit_tables(r):
        out.print(t)
    for w in r["warnings"]:  # on stderr, after the tables they qualify
        render.plain(f"warning: {w}", soft_wrap=True)


plan_app.command("ladder")(ladder)  # cli/plan_ladder.py


def _g(x) -> str:
    """4 significant digits (the guide: keep at least 3)."""
    return "-" if x is None else f"{x:.4g}"


def fit_tables(r: dict) -> list:
    """The tables `plan fit` prints: the law with its intervals, the IsoFLOP budgets, the held-out
    run and the excluded ones, each laid out for 80 columns."""
    p, ci, b = r["parametric"], r["bootstrap"]["intervals"], r["budget"]
    interval = lambda k: f"{_g(ci[k]['lo'])} – {_g(ci[k]['hi'])}" if k in ci else "-"  # noqa: E731
    rows = [(k, _g(p[k]), interval(k)) for k in ("E", "A", "B", "alpha", "beta")]
    rows += [("a = beta/(alpha+beta)", _g(p["a"]), ""), ("b = alpha/(alpha+beta)", _g(p["b"]), ""),
             (f"N_opt at C = {_g(b['flops'])}", _g(b["n_opt"]), interval("n_opt")),
             (f"D_opt at C = {_g(b['flops'])}", _g(b["d_opt"]), interval("d_opt")),
             ("D_opt / N_opt", _g(b["tokens_per_param"]), ""), (f"L at (N_opt, D_opt), {r['unit']}", _g(b["loss"]), "")]
    rounds = r["bootstrap"]["rounds"]
    tables = [table(f"L = E + A/N^alpha + B/D^beta, {len(r['runs'])} runs, {r['unit']} (Huber fit; 95% bootstrap, {rounds} rounds)",
                    rows, ("", "fit", "interval"), numeric=(1, 2))]
    check = [("starts at the best objective", f"{p['at_best']} of {p['starts']}"),
             ("their parameters agree", "yes" if p["agree"] else f"no (spread {p['spread']:.3g})"),
             ("objective (sum of Huber)", _g(p["objective"]))]
    tables.append(table("convergence", check, ("", ""), numeric=(1,)))
    iso = r["isoflop"]
    brows = [(_g(g["flops"]), g["runs"], _g(g["n_opt"]), _g(g["d_opt"]), _g(g["loss_opt"]), "used" if g["used"] else g["why"])
             for g in iso["budgets"]]
    title = (f"IsoFLOP: N_opt ~ C^{_g(iso['a'])}, D_opt ~ C^{_g(iso['b'])}" if iso["a"] is not None
             else f"IsoFLOP: no power law ({iso['why']})")
    tables.append(table(title, brows, ("C", "runs", "N_opt", "D_opt", "min L", "budget"), numeric=(0, 1, 2, 3, 4)))
    if b["isoflop"] is not None:
        tables.append(table(f"IsoFLOP at C = {_g(b['flops'])}", [("N_opt", _g(b["isoflop"][0])), ("D_opt", _g(b["isoflop"][1]))],
                            ("", ""), numeric=(1,)))
    if (h := r["holdout"]) is not None:
        tables.append(table(f"held out: {h['path']}", [("N, D", f"{h['n_params']:,}, {h['tokens']:,}"), ("measured", _g(h["measured"])),
                                                         ("predicted", _g(h["predicted"])),
                                                         ("error", f"{h['error']:+.4g} ({100 * h['relative_error']:+.3g}%)")],
                            ("", ""), numeric=(1,)))
    if r["excluded"]:
        tables.append(table("excluded runs", [(e["path"], e["reason"]) for e in r["excluded"]], ("run", "why")))
    if r["files"]:
        tables.append(table("wrote", [(f,) for f in r["files"]], ("",)))
    return tables
