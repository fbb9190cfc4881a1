"""`llmctl plan`: the arithmetic of a training run (parameters, FLOPs, time, cost, memory)
before any hardware is booked."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from llmctl.bounds import check_flags
from llmctl.cli import render
from llmctl.cli.options import Json, Quiet, flags
from llmctl.cli.console import print_json
from llmctl.errors import UsageError

app = typer.Typer()


@app.command()
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
    recipe: Annotated[str, typer.Option("--recipe", help="Model-state recipe: bf16-adamw (16 B/param), bf16-adamw-fp32grad (20), fp32-adamw (16), adamw-8bit (10), sgd-momentum (12), adafactor (8), deepseek-v3 (12).")] = "bf16-adamw",
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
