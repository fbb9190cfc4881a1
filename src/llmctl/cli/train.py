"""`llmctl train` (pretraining, and SFT with --sft), `export` / `import` to and from Hugging
Face, and `plot` of a run's curves."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from llmctl.bounds import check_flags
from llmctl.cli import render
from llmctl.cli.options import Json, LoraAlpha, LoraDropout, LoraRank, LoraTargets, Overwrite, Quiet, flags, lora_flags
from llmctl.errors import UsageError

app = typer.Typer()


@app.command()
def train(
    tokens: Annotated[Optional[str], typer.Argument(help="Tokens artifact to train on (`llmctl tokenize` output); omitted with --sft.")] = None,
    output: Annotated[str, typer.Option("--output", "-o", help="Run directory: config.json, metrics.jsonl, checkpoints/.")] = "",
    config: Annotated[Optional[str], typer.Option("--config", "-c", help="Preset under stages/train/ (tiny, small, gpt2-124m, fineweb-0.5b) or a .toml with model and train tables.")] = "tiny",
    sft: Annotated[Optional[str], typer.Option("--sft", help="Supervised fine-tuning on conversations (JSONL/Parquet: messages, GSM8K question/answer, or prompt/answer): loss on assistant tokens only, packed rows.")] = None,
    init: Annotated[Optional[str], typer.Option("--init", help="Start from this checkpoint (its architecture and tokenizer): SFT with --sft, else continued pretraining / midtraining on TOKENS, which must use the checkpoint's tokenizer.")] = None,
    init_optimizer: Annotated[Optional[bool], typer.Option("--init-optimizer/--no-init-optimizer", help="With --init: also take the checkpoint's AdamW state (moments and step counts), as training on would.")] = None,
    tokenizer: Annotated[Optional[str], typer.Option("--tokenizer", help="With --sft and no --init: tokenizer.json of the fresh model (needs the chat tokens).")] = None,
    val_fraction: Annotated[float, typer.Option("--val-fraction", help="With --sft: share of conversations held out for validation loss (seeded).")] = 0.0,
    data: Annotated[Optional[list[str]], typer.Option("--data", help="A mixture source NAME=TOKENS:WEIGHT (repeatable; weights are normalized); replaces the config's [[data]] tables. Not with a TOKENS argument.")] = None,
    val: Annotated[Optional[list[str]], typer.Option("--val", help="Held-out tokens artifact for validation loss and bits per byte; NAME=TOKENS validates mixture source NAME on its own (repeatable).")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the run's latest checkpoint (same batches, same losses).")] = False,
    max_tokens: Annotated[Optional[int], typer.Option("--max-tokens", help="Length of the run in tokens; the schedule spans it.")] = None,
    max_steps: Annotated[Optional[int], typer.Option("--max-steps", help="Stop after this many steps (schedule unchanged).")] = None,
    max_epochs: Annotated[Optional[float], typer.Option("--max-epochs", help="Draw at most this many epochs of each source; when every source is capped the run's length (and schedule) shrinks to fit.")] = None,
    lr: Annotated[Optional[float], typer.Option("--lr", help="Peak learning rate.")] = None,
    optimizer: Annotated[Optional[str], typer.Option("--optimizer", help="adamw (default), or muon: Muon on the hidden matrices (q, k, v, o, gate, up, down; each fused block orthogonalized alone), AdamW on embeddings, head and norms; its update is RMS-matched to AdamW's, so --lr and the weight decay carry over. Not with --fsdp or --lora-rank.")] = None,
    batch_tokens: Annotated[Optional[int], typer.Option("--batch-tokens", help="Global batch in tokens (all ranks).")] = None,
    micro_batch: Annotated[Optional[int], typer.Option("--micro-batch", help="Sequences per forward pass; gradient accumulation makes up the rest.")] = None,
    seq_len: Annotated[Optional[int], typer.Option("--seq-len", help="Tokens per training sequence.")] = None,
    schedule: Annotated[Optional[str], typer.Option("--schedule", help="wsd (warmup-stable-decay), cosine (to 10%), linear (to zero), or decay (a WSD decay branch: from a stable-phase --init checkpoint, the rate falls over the whole run; no warmup).")] = None,
    dtype: Annotated[Optional[str], typer.Option("--dtype", help="float32, or bfloat16 autocast with fp32 master weights.")] = None,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Initial weights and data order.")] = None,
    eval_every: Annotated[Optional[int], typer.Option("--eval-every", help="Steps between validation passes.")] = None,
    checkpoint_every: Annotated[Optional[int], typer.Option("--checkpoint-every", help="Steps between checkpoints (one is always written at the end and on SIGTERM/SIGINT).")] = None,
    compile_: Annotated[Optional[bool], typer.Option("--compile/--no-compile", help="torch.compile the model.")] = None,
    fsdp: Annotated[Optional[bool], typer.Option("--fsdp/--no-fsdp", help="Shard parameters with FSDP2 (under torchrun).")] = None,
    peak_flops: Annotated[Optional[float], typer.Option("--peak-flops", help="Dense peak FLOP/s of one device for MFU (default: GPU table, or a matmul benchmark on CPU).")] = None,
    device: Annotated[Optional[str], typer.Option("--device", help="auto, cpu or cuda.")] = None,
    threads: Annotated[Optional[int], typer.Option("--threads", help="Torch CPU threads.")] = None,
    recompute: Annotated[Optional[str], typer.Option("--recompute", help="Activation recomputation in the backward pass: none, selective (keep each block's matmul outputs, recompute norms, SwiGLU and the attention core) or block (keep only block inputs). Less memory, more time, the same results; `llmctl plan --recompute` predicts the memory.")] = None,
    ema_decay: Annotated[Optional[float], typer.Option("--ema-decay", help="Keep an exponential moving average of the weights with this decay, in (0, 1) (e.g. 0.999): validated beside them, saved as ema.safetensors; eval, generate, export and rl load it by default.")] = None,
    on_spike: Annotated[Optional[str], typer.Option("--on-spike", help="What a loss spike does: flag (log it), skip-batch (its update is not applied) or rewind (back to the last checkpoint, skipping the spiking data step).")] = None,
    weights: Annotated[str, typer.Option("--weights", help="With --sft --init: the checkpoint's auto (its EMA weights where it has them), ema or raw weights.")] = "auto",
    lora_rank: LoraRank = None,
    lora_alpha: LoraAlpha = None,
    lora_dropout: LoraDropout = None,
    lora_targets: LoraTargets = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override any preset key: model.n_layers=8, train.z_loss=1e-4 (repeatable).")] = None,
    overwrite: Overwrite = False,
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """Pretrain the Llama-style decoder on token shards, or fine-tune it on conversations with --sft;
    under torchrun the same command runs DDP."""
    from llmctl.train.config import load_run_config
    from llmctl.train.mixture import parse_data_flag
    from llmctl.train.trainer import run_train

    if not output:
        raise UsageError("train: missing option --output/-o")
    check_flags("sft", val_fraction=val_fraction)
    if tokens is not None and data:
        raise UsageError("train: give a TOKENS argument or --data sources, not both")
    if sft is not None and (tokens is not None or data):
        raise UsageError("train: give a tokens artifact (or --data), or --sft CHATS (not both)")
    if sft is None and (tokenizer or val_fraction):
        raise UsageError("train: --tokenizer and --val-fraction go with --sft")
    if weights != "auto" and not init:
        raise UsageError("train: --weights picks the weights of --init")
    if init and any(x.strip().startswith("model.") for x in set_ or []):
        raise UsageError("train: --init fixes the architecture; --set model.* cannot change it")

    quiet, as_json = flags(quiet, json_)
    overrides = dict(max_tokens=max_tokens, max_steps=max_steps, max_epochs=max_epochs, lr=lr, optimizer=optimizer, batch_tokens=batch_tokens, micro_batch=micro_batch,
                    seq_len=seq_len, schedule=schedule, dtype=dtype, seed=seed, eval_every=eval_every,
                    checkpoint_every=checkpoint_every, compile=compile_, fsdp=fsdp, peak_flops=peak_flops,
                    device=device, threads=threads, init_optimizer=init_optimizer, recompute=recompute, ema_decay=ema_decay,
                    on_spike=on_spike, lora=lora_flags(lora_rank, lora_alpha, lora_dropout, lora_targets))
    # train presets hold [model] and [train] tables; load_run_config applies build_config to each
    model_cfg, cfg = load_run_config(config, overrides, set_ or [])
    plain_val, source_vals = _split_val(val or [])
    sources = None
    if sft is None:
        sources = [parse_data_flag(d) for d in data] if data else _config_sources(config)
        if sources is None and tokens is None:
            raise UsageError("train: give a tokens artifact, --data NAME=TOKENS:WEIGHT, [[data]] tables in --config, or --sft CHATS")
        if tokens is not None:
            sources = None  # the positional artifact replaces the config's [[data]], as flags replace the file
        sources = _with_vals(sources, source_vals)
    elif source_vals:
        raise UsageError("train: --val NAME=TOKENS is for mixture sources; --sft holds out --val-fraction")
    rank0 = int(os.environ.get("RANK", "0")) == 0  # under torchrun: one status, one summary
    status = render.TrainStatus(quiet or not rank0)
    try:
        kw = dict(val=plain_val, resume=resume, overwrite=overwrite, on_step=status.step, on_log=status.log)
        if sft is not None:
            from llmctl.train.sft import run_sft

            m = run_sft(Path(sft), Path(output), model_cfg, cfg, init=Path(init) if init else None,
                        tokenizer=Path(tokenizer) if tokenizer else None, val_fraction=val_fraction, weights=weights, **kw)
        else:
            budget = _budget_from(config, max_tokens, set_ or [])
            m = run_train(sources if sources is not None else Path(tokens), Path(output), model_cfg, cfg, budget_from=budget,
                          init=Path(init) if init else None, **kw)
    finally:
        status.finish()
    if rank0:
        render.report(m, output, quiet, as_json, rate_key="tokens")


def _split_val(vals: list[str]) -> tuple[Path | None, dict[str, Path]]:
    """`--val TOKENS` (at most one) and `--val NAME=TOKENS` (one per mixture source)."""
    import re

    plain, named = [], {}
    for v in vals:
        m = re.match(r"^([A-Za-z0-9_-]+)=(.+)$", v)
        if m:
            if m.group(1) in named:
                raise UsageError(f"--val {m.group(1)}=…: given twice")
            named[m.group(1)] = Path(m.group(2))
        else:
            plain.append(Path(v))
    if len(plain) > 1:
        raise UsageError("train: one --val TOKENS (validate mixture sources with --val NAME=TOKENS)")
    return (plain[0] if plain else None), named


def _config_sources(config: str | None):
    """The [[data]] tables of the train config, if it has any."""
    from llmctl.config import find_config, read_toml
    from llmctl.train.mixture import sources_from_tables

    if not config:
        return None
    path = find_config("train", config)
    tables = read_toml(path).get("data")
    return None if tables is None else sources_from_tables(tables, str(path), path.parent)


def _with_vals(sources, vals: dict[str, Path]):
    """Each mixture source's own held-out set from --val NAME=TOKENS."""
    import dataclasses

    if not vals:
        return sources
    names = [s.name for s in sources or []]
    for name in vals:
        if name not in names:
            raise UsageError(f"--val {name}=…: no mixture source named {name!r}" + (f" (sources: {', '.join(names)})" if names else ""))
    return [dataclasses.replace(s, val=vals[s.name]) if s.name in vals else s for s in sources]


def _budget_from(config: str | None, max_tokens: int | None, sets: list[str]) -> str | None:
    """Where max_tokens came from when the user did not choose it: a preset, or llmctl's default."""
    from llmctl.config import find_config, read_toml

    if max_tokens is not None or any(x.split("=", 1)[0].strip() == "train.max_tokens" for x in sets):
        return None
    if config:
        path = find_config("train", config)
        if "max_tokens" in read_toml(path).get("train", {}):
            return f"the {config} preset" if path.suffix == ".toml" and config == path.stem else f"the config {path}"
    return "llmctl's default budget"


@app.command()
def export(
    checkpoint: Annotated[str, typer.Argument(help="A checkpoint: step dir, checkpoints/ dir or run dir (its latest).")],
    output: Annotated[str, typer.Option("--output", "-o", help="Directory for the Hugging Face model.")],
    weights: Annotated[str, typer.Option("--weights", help="auto (the EMA weights of a checkpoint trained with --ema-decay, else the raw ones), ema or raw.")] = "auto",
    merge: Annotated[bool, typer.Option("--merge", help="A LoRA checkpoint: fold the adapters into the base's weights and export the full model.")] = False,
    adapter: Annotated[bool, typer.Option("--adapter", help="A LoRA checkpoint: export only its adapters, as a PEFT adapter folder (adapter_config.json, adapter_model.safetensors) that peft.PeftModel.from_pretrained loads over the export of its base.")] = False,
    overwrite: Overwrite = False,
    quiet: Quiet = False,
) -> None:
    """Write a Hugging Face model directory that transformers and vLLM load as it is: config.json (Llama, Qwen2 or
    Qwen3 class, whichever computes the same), model.safetensors, tokenizer files with the chat template, and
    generation_config.json with the EOS ids (a chat model's turn end first)."""
    from llmctl.artifacts.checkpoint import resolve_checkpoint, weights_file
    from llmctl.model.hf_export import export_adapter, export_hf

    if merge and adapter:
        raise UsageError("export: --merge or --adapter, not both")
    if adapter:
        out = export_adapter(checkpoint, Path(output), overwrite=overwrite)
        if not flags(quiet, False)[0]:
            render.plain(f"exported the LoRA adapters to {out} (load with peft.PeftModel.from_pretrained over the export of the base)")
        return
    _, which = weights_file(resolve_checkpoint(checkpoint), weights)
    out = export_hf(checkpoint, Path(output), overwrite=overwrite, weights=weights, merge=merge)
    if not flags(quiet, False)[0]:
        render.plain(f"exported the {'EMA' if which == 'ema' else 'raw'} weights to {out} "
                     "(load with transformers.AutoModelForCausalLM.from_pretrained)")


@app.command("import")
def import_cmd(
    hf_dir: Annotated[str, typer.Argument(help="A Hugging Face model directory (Llama 2/3.x, SmolLM2, Mistral, Qwen2/2.5, Qwen3): config.json, model.safetensors (or shards with their index), tokenizer.json and the files beside it.")],
    output: Annotated[str, typer.Option("--output", "-o", help="Checkpoint directory (step-000000/ and latest); eval, generate, rl and train --init read it.")],
    chat: Annotated[Optional[bool], typer.Option("--chat/--no-chat", help="Prompt the model through its chat template in eval, generate and rl. Default: read from its files (chat when generation stops at the template's turn end, as instruct releases do).")] = None,
    overwrite: Overwrite = False,
    quiet: Quiet = False,
) -> None:
    """Bring in a released model as an llmctl checkpoint (the inverse of export), with its own tokenizer,
    EOS ids, BOS rule and chat template."""
    from llmctl.model.hf_import import import_hf

    path = import_hf(hf_dir, Path(output), chat=chat, overwrite=overwrite)
    if not flags(quiet, False)[0]:
        render.plain(f"imported to {path}")


@app.command()
def plot(
    run: Annotated[str, typer.Argument(help="A run directory (or its metrics.jsonl).")],
    output: Annotated[str, typer.Option("--output", "-o", help="Directory for the PNG files.")],
    quiet: Quiet = False,
) -> None:
    """PNG curves of a run: train/val loss, bits per byte, lr, gradient norm, tokens/s; for an rl run, reward, accuracy (held-out with intervals), entropy, length."""
    from llmctl.train.plots import plot_run

    written = plot_run(Path(run), Path(output))
    if not flags(quiet, False)[0]:
        render.plain("wrote " + ", ".join(str(p) for p in written), soft_wrap=True)
