"""`llmctl dpo` and `llmctl train-rm`: training on preference pairs ({prompt, chosen, rejected})
from a checkpoint: direct preference optimization (train/dpo.py) and a Bradley–Terry reward
model (train/reward_model.py). Both run the training loop, so --resume, torchrun, checkpoints and
the manifest work as in `llmctl train`."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer

from llmctl.bounds import check_flags
from llmctl.cli import render
from llmctl.cli.options import Json, Overwrite, Quiet, flags
from llmctl.errors import UsageError

app = typer.Typer()

Ckpt = Annotated[str, typer.Argument(help="The checkpoint to start from (run dir, checkpoints/ or step dir): its architecture, tokenizer and chat template.")]
Pairs = Annotated[str, typer.Option("--pairs", help="JSONL(.gz) or Parquet of {prompt, chosen, rejected}: strings, or message lists (TRL's conversational format, UltraFeedback's whole conversations); an optional numeric margin.")]
Output = Annotated[str, typer.Option("--output", "-o", help="Run directory: config.json, metrics.jsonl, checkpoints/, manifest.json.")]
ValFraction = Annotated[float, typer.Option("--val-fraction", help="Share of the pairs held out (seeded) for validation: loss, reward margin, preference accuracy.")]
Epochs = Annotated[float, typer.Option("--epochs", help="Passes over the training pairs; the run's length and schedule follow.")]
BatchPairs = Annotated[Optional[int], typer.Option("--batch-pairs", help="Pairs per optimizer step, all ranks together (the preset's batch_tokens / seq_len).")]
Resume = Annotated[bool, typer.Option("--resume", help="Continue from the run's latest checkpoint (same batches, same losses).")]
MaxSteps = Annotated[Optional[int], typer.Option("--max-steps", help="Stop after this many steps (schedule unchanged).")]
Lr = Annotated[Optional[float], typer.Option("--lr", help="Peak learning rate.")]
MicroBatch = Annotated[Optional[int], typer.Option("--micro-batch", help="Pairs per forward pass (both sides: twice as many rows); gradient accumulation makes up the rest.")]
SeqLen = Annotated[Optional[int], typer.Option("--seq-len", help="Longest prompt + completion in tokens; longer pairs are skipped and counted.")]
Dtype = Annotated[Optional[str], typer.Option("--dtype", help="float32, or bfloat16 autocast with fp32 master weights.")]
Seed = Annotated[Optional[int], typer.Option("--seed", help="Held-out draw and pair order.")]
EvalEvery = Annotated[Optional[int], typer.Option("--eval-every", help="Steps between validation passes.")]
CheckpointEvery = Annotated[Optional[int], typer.Option("--checkpoint-every", help="Steps between checkpoints (one is always written at the end and on SIGTERM/SIGINT).")]
Device = Annotated[Optional[str], typer.Option("--device", help="auto, cpu or cuda.")]
Threads = Annotated[Optional[int], typer.Option("--threads", help="Torch CPU threads.")]
Weights = Annotated[str, typer.Option("--weights", help="Which weights of CKPT start the run: auto (its EMA where it has one), ema or raw.")]
Sets = Annotated[Optional[list[str]], typer.Option("--set", help="Override a preset's train keys: train.weight_decay=0.0 (repeatable).")]


def _config(config: str, sets: list[str], batch_pairs: int | None, **flags_):
    from llmctl.train.config import load_run_config

    if any(x.strip().startswith("model.") for x in sets):
        raise UsageError("the checkpoint fixes the architecture; --set model.* cannot change it")
    _, cfg = load_run_config(config, {k: v for k, v in flags_.items()}, sets)
    return replace(cfg, batch_tokens=batch_pairs * cfg.seq_len) if batch_pairs else cfg


def _run(stage, output: str, quiet: bool, json_: bool, **kw) -> None:
    if not output:
        raise UsageError("missing option --output/-o")
    quiet, as_json = flags(quiet, json_)
    rank0 = int(os.environ.get("RANK", "0")) == 0  # under torchrun: one status, one summary
    status = render.TrainStatus(quiet or not rank0)
    try:
        m = stage(out=Path(output), on_step=status.step, on_log=status.log, **kw)
    finally:
        status.finish()
    if rank0:
        render.report(m, output, quiet, as_json, rate_key="steps")


@app.command()
def dpo(
    checkpoint: Ckpt,
    pairs: Pairs = "",
    output: Output = "",
    config: Annotated[str, typer.Option("--config", "-c", help="Preset under stages/train/ (dpo-tiny) or a .toml with a train table.")] = "dpo-tiny",
    loss: Annotated[str, typer.Option("--loss", help="sigmoid (DPO), ipo (IPO: squared, length-averaged) or simpo (SimPO: reference-free, length-averaged, margin --gamma).")] = "sigmoid",
    beta: Annotated[Optional[float], typer.Option("--beta", help="Strength of the preference term; default: the loss's paper value (0.1 sigmoid and ipo, 2.0 simpo).")] = None,
    gamma: Annotated[Optional[float], typer.Option("--gamma", help="SimPO's target reward margin (default 0.5 · beta).")] = None,
    val_fraction: ValFraction = 0.0, epochs: Epochs = 1.0, batch_pairs: BatchPairs = None, resume: Resume = False,
    max_steps: MaxSteps = None, lr: Lr = None, micro_batch: MicroBatch = None, seq_len: SeqLen = None, dtype: Dtype = None,
    seed: Seed = None, eval_every: EvalEvery = None, checkpoint_every: CheckpointEvery = None, device: Device = None,
    threads: Threads = None, weights: Weights = "auto", set_: Sets = None,
    overwrite: Overwrite = False, quiet: Quiet = False, json_: Json = False,
) -> None:
    """Direct preference optimization from CKPT on preference pairs, against CKPT frozen as the reference
    (its log-probs computed once and cached in the run): loss on the completions' tokens only, through the
    checkpoint's chat template; logs reward margin, preference accuracy, chosen/rejected log-probs, implicit KL."""
    from llmctl.train.dpo import DPOSettings, run_dpo

    if not pairs:
        raise UsageError("dpo: missing option --pairs")
    check_flags("pairs", val_fraction=val_fraction, beta=beta, gamma=gamma, epochs=epochs, batch_pairs=batch_pairs)
    cfg = _config(config, set_ or [], batch_pairs, max_steps=max_steps, lr=lr, micro_batch=micro_batch, seq_len=seq_len,
                  dtype=dtype, seed=seed, eval_every=eval_every, checkpoint_every=checkpoint_every, device=device, threads=threads)
    _run(run_dpo, output, quiet, json_, pairs=Path(pairs), init=Path(checkpoint), cfg=cfg,
         settings=DPOSettings(loss, beta, gamma), val_fraction=val_fraction, epochs=epochs, weights=weights,
         resume=resume, overwrite=overwrite)


@app.command("train-rm")
def train_rm(
    checkpoint: Ckpt,
    pairs: Pairs = "",
    output: Output = "",
    config: Annotated[str, typer.Option("--config", "-c", help="Preset under stages/train/ (rm-tiny) or a .toml with a train table.")] = "rm-tiny",
    val_fraction: ValFraction = 0.1, epochs: Epochs = 1.0, batch_pairs: BatchPairs = None, resume: Resume = False,
    max_steps: MaxSteps = None, lr: Lr = None, micro_batch: MicroBatch = None, seq_len: SeqLen = None, dtype: Dtype = None,
    seed: Seed = None, eval_every: EvalEvery = None, checkpoint_every: CheckpointEvery = None, device: Device = None,
    threads: Threads = None, weights: Weights = "auto", set_: Sets = None,
    overwrite: Overwrite = False, quiet: Quiet = False, json_: Json = False,
) -> None:
    """Train a Bradley–Terry reward model from CKPT on preference pairs: a scalar head on the last token of
    prompt + completion, loss −log σ(r_chosen − r_rejected − margin); held-out pair accuracy in the manifest.
    The checkpoint scores completions (`rl --reward-model`, train/reward_model.load_reward_model)."""
    from llmctl.train.reward_model import run_train_rm

    if not pairs:
        raise UsageError("train-rm: missing option --pairs")
    check_flags("pairs", val_fraction=val_fraction, epochs=epochs, batch_pairs=batch_pairs)
    cfg = _config(config, set_ or [], batch_pairs, max_steps=max_steps, lr=lr, micro_batch=micro_batch, seq_len=seq_len,
                  dtype=dtype, seed=seed, eval_every=eval_every, checkpoint_every=checkpoint_every, device=device, threads=threads)
    _run(run_train_rm, output, quiet, json_, pairs=Path(pairs), init=Path(checkpoint), cfg=cfg,
         val_fraction=val_fraction, epochs=epochs, weights=weights, resume=resume, overwrite=overwrite)
