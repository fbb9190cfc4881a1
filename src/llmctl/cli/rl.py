"""`llmctl rl`: GRPO-family reinforcement learning on verifiable rewards, with a live step line."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from llmctl.cli import render
from llmctl.cli.options import Config, Json, LoraAlpha, LoraDropout, LoraRank, LoraTargets, Overwrite, Quiet, flags, lora_flags

app = typer.Typer()


@app.command()
def rl(
    checkpoint: Annotated[str, typer.Argument(help="Starting checkpoint (an SFT model, a run dir, or an imported HF model).")],
    prompts: Annotated[str, typer.Option("--prompts", help="Prompts with checkable answers: {prompt, answer} JSONL/Parquet or GSM8K native.")],
    output: Annotated[str, typer.Option("--output", "-o", help="Run directory: config.json, metrics.jsonl, rollouts/, checkpoints/.")],
    config: Config = "arith",
    eval_prompts: Annotated[Optional[str], typer.Option("--eval", help="Held-out prompts: greedy accuracy with its interval every --eval-every steps.")] = None,
    headroom_limit: Annotated[Optional[int], typer.Option("--headroom-limit", help="Before step 0, G samples on this many --eval prompts: pass@1, pass@G, maj@G next to greedy (what RL can sharpen); 0: off.")] = None,
    steps: Annotated[Optional[int], typer.Option("--steps", help="Optimizer steps.")] = None,
    group_size: Annotated[Optional[int], typer.Option("--group-size", "-G", help="Samples per prompt.")] = None,
    prompts_per_step: Annotated[Optional[int], typer.Option("--prompts-per-step", help="Groups per step.")] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option("--max-new-tokens", help="Completion budget; longer samples are truncated.")] = None,
    temperature: Annotated[Optional[float], typer.Option("--temperature", help="Sampling temperature (the loss uses the same).")] = None,
    top_p: Annotated[Optional[float], typer.Option("--top-p", help="Nucleus sampling mass for rollouts.")] = None,
    format_reward: Annotated[Optional[float], typer.Option("--format-reward", help="Added when the answer has the expected form ('#### n', \\boxed{}).")] = None,
    lr: Annotated[Optional[float], typer.Option("--lr", help="Learning rate (the peak of --schedule).")] = None,
    warmup_steps: Annotated[Optional[int], typer.Option("--warmup-steps", help="Steps of linear warmup from 0 to --lr.")] = None,
    schedule: Annotated[Optional[str], typer.Option("--schedule", help="Rate after warmup: constant, linear (to 0) or cosine (to 10%).")] = None,
    adv_estimator: Annotated[Optional[str], typer.Option("--adv-estimator", help="Advantages: grpo (minus the group mean, scaled by --adv-std) or rloo (minus the mean of the group's other samples; no scale, --adv-std is ignored).")] = None,
    adv_std: Annotated[Optional[str], typer.Option("--adv-std", help="Advantage scale for --adv-estimator grpo: group (GRPO), group-bessel (verl), batch, none (Dr. GRPO).")] = None,
    clip_low: Annotated[Optional[float], typer.Option("--clip-low", help="ε_low of the ratio clip.")] = None,
    clip_high: Annotated[Optional[float], typer.Option("--clip-high", help="ε_high (DAPO clip-higher: 0.28).")] = None,
    ratio_level: Annotated[Optional[str], typer.Option("--ratio-level", help="Importance ratio: token (PPO/GRPO) or sequence (GSPO: the geometric mean of a response's token ratios, clipped per response; the paper clips at 3e-4 / 4e-4).")] = None,
    loss_agg: Annotated[Optional[str], typer.Option("--loss-agg", help="seq-mean-token-mean (GRPO), token-mean (DAPO), seq-sum-const (Dr. GRPO).")] = None,
    kl: Annotated[Optional[str], typer.Option("--kl", help="KL to the frozen start model: none, k2, k3.")] = None,
    kl_coef: Annotated[Optional[float], typer.Option("--kl-coef", help="Weight of the KL term.")] = None,
    epochs: Annotated[Optional[int], typer.Option("--epochs", help="μ: optimizer passes over each batch (old log-probs kept).")] = None,
    is_correction: Annotated[Optional[str], typer.Option("--is-correction", help="Rollout correction for the engine/trainer log-prob gap (logged each step as logprob_gap_mean/max): none, tis (each token's policy-gradient term times min(π_old/π_rollout, --is-cap): truncated IS) or mis (times the ratio, 0 above the cap: masked IS).")] = None,
    is_cap: Annotated[Optional[float], typer.Option("--is-cap", help="C of --is-correction (>= 1; default 2, verl's; TRL's is 3).")] = None,
    dynamic_sampling: Annotated[Optional[bool], typer.Option("--dynamic-sampling/--no-dynamic-sampling", help="Drop groups whose rewards are all equal and draw more prompts.")] = None,
    truncated: Annotated[Optional[str], typer.Option("--truncated", help="Samples cut at --max-new-tokens: mask (out of the loss) or zero (reward 0).")] = None,
    verifier: Annotated[Optional[str], typer.Option("--verifier", help="math, exact, regex or python (runs the code in a sandbox: Landlock, seccomp, rlimits, an unprivileged uid when root).")] = None,
    reward_model: Annotated[Optional[str], typer.Option("--reward-model", help="A `llmctl train-rm` checkpoint whose score of each sample is added to the verifier's reward (logged apart: rm_score_mean, verifier_reward_mean).")] = None,
    reward_model_coef: Annotated[Optional[float], typer.Option("--reward-model-coef", help="Weight of the reward model's score in the reward (default 1).")] = None,
    verifier_coef: Annotated[Optional[float], typer.Option("--verifier-coef", help="Weight of the verifier's reward (default 1; 0: the reward model alone, the verifier still measures accuracy).")] = None,
    control: Annotated[Optional[str], typer.Option("--control", help="A control run: none; random-reward (each sample's reward a seeded 0/1 draw at the real reward's running mean: the same compute with the answers' signal cut) or shuffled-answers (each prompt scored against another prompt's reference). Accuracy stays the real one.")] = None,
    unsafe_sandbox: Annotated[Optional[bool], typer.Option("--unsafe-sandbox", help="--verifier python on a host without Landlock or seccomp (or not Linux): run the code anyway, with what protection there is, instead of refusing.")] = None,
    recompute: Annotated[Optional[str], typer.Option("--recompute", help="Activation recomputation in the training forwards: none, selective or block (less memory, more time, the same results; see train --recompute).")] = None,
    gen_dtype: Annotated[Optional[str], typer.Option("--gen-dtype", help="The rollout engine's weights: auto (the model's own on CPU, bfloat16 on a GPU), float32 or bfloat16 (faster on CPUs with AMX; log-probs then differ from the trainer's: see logprob_gap_mean).")] = None,
    weights: Annotated[Optional[str], typer.Option("--weights", help="The starting checkpoint's auto (its EMA weights where it has them), ema or raw weights.")] = None,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Prompt order and sampling seed.")] = None,
    device: Annotated[Optional[str], typer.Option("--device", help="auto, cpu or cuda.")] = None,
    lora_rank: LoraRank = None,
    lora_alpha: LoraAlpha = None,
    lora_dropout: LoraDropout = None,
    lora_targets: LoraTargets = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the run's latest checkpoint.")] = False,
    overwrite: Overwrite = False,
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """GRPO (and Dr. GRPO / DAPO / RLOO / GSPO variants) on verifiable rewards, with the shared generation engine;
    under torchrun each rank samples its slice of every step's prompts and gradients are summed."""
    from llmctl.config import build_config
    from llmctl.rl.config import RLConfig
    from llmctl.rl.trainer import run_rl

    quiet, as_json = flags(quiet, json_)
    overrides = dict(steps=steps, group_size=group_size, prompts_per_step=prompts_per_step, max_new_tokens=max_new_tokens, lr=lr,
                     warmup_steps=warmup_steps, schedule=schedule, temperature=temperature, top_p=top_p, format_reward=format_reward,
                     adv_estimator=adv_estimator, adv_std=adv_std, clip_low=clip_low, clip_high=clip_high,
                     ratio_level=ratio_level, headroom_limit=headroom_limit, loss_agg=loss_agg, kl=kl, kl_coef=kl_coef,
                     epochs=epochs, is_correction=is_correction, is_cap=is_cap, dynamic_sampling=dynamic_sampling, truncated=truncated, verifier=verifier, control=control, unsafe_sandbox=unsafe_sandbox, seed=seed, device=device,
                     reward_model=reward_model, reward_model_coef=reward_model_coef, verifier_coef=verifier_coef,
                     recompute=recompute, gen_dtype=gen_dtype, weights=weights, lora=lora_flags(lora_rank, lora_alpha, lora_dropout, lora_targets))
    cfg = build_config(RLConfig, "rl", config, overrides)
    m = run_rl(checkpoint, prompts, Path(output), cfg, eval_file=eval_prompts, resume=resume, overwrite=overwrite,
               on_step=lambda rec: None if quiet else render.rl_step(rec, cfg.steps),
               on_log=lambda msg: None if quiet else render.plain(msg))
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun: one summary, rank 0's
        render.report(m, output, quiet, as_json, rate_key="steps")


@app.command("best-of-n")
def best_of_n(
    checkpoint: Annotated[Optional[str], typer.Argument(help="The policy to sample (an SFT model, a run dir, an imported HF model); not with --from-rollouts.")] = None,
    prompts: Annotated[Optional[str], typer.Option("--prompts", help="Prompts with checkable answers, as `rl --prompts` reads them.")] = None,
    output: Annotated[str, typer.Option("--output", "-o", help="Folder: sft.jsonl (the kept completions as chats), pairs.jsonl (best vs worst per prompt), manifest.json.")] = "",
    from_rollouts: Annotated[Optional[str], typer.Option("--from-rollouts", help="An `llmctl rl` run: select from the samples it already scored (rollouts/) instead of sampling.")] = None,
    n: Annotated[int, typer.Option("-n", help="Samples per prompt.")] = 8,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Completion budget; a cut sample is never kept.")] = 128,
    temperature: Annotated[float, typer.Option("--temperature", help="Sampling temperature (> 0).")] = 1.0,
    top_p: Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass.")] = 1.0,
    verifier: Annotated[str, typer.Option("--verifier", help="math, exact, regex or python: scores each sample as rl does.")] = "math",
    reward_model: Annotated[Optional[str], typer.Option("--reward-model", help="A `llmctl train-rm` checkpoint whose score is added to the verifier's.")] = None,
    reward_model_coef: Annotated[float, typer.Option("--reward-model-coef", help="Weight of the reward model's score.")] = 1.0,
    verifier_coef: Annotated[float, typer.Option("--verifier-coef", help="Weight of the verifier's reward (0: the reward model alone).")] = 1.0,
    min_reward: Annotated[Optional[float], typer.Option("--min-reward", help="Keep every completion scoring at least this (default: the best one of each prompt).")] = None,
    limit: Annotated[Optional[int], typer.Option("--limit", help="Only the first N prompts.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Sampling seed: each sample has its own generator from (seed, prompt, sample).")] = 0,
    device: Annotated[str, typer.Option("--device", help="auto, cpu or cuda.")] = "auto",
    overwrite: Overwrite = False,
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """Rejection sampling: n scored samples per prompt, the best kept as SFT chats, best against worst as
    DPO / reward-model pairs. A re-run over its own finished output does nothing."""
    from llmctl.bounds import check_flags
    from llmctl.cli.console import ConsoleProgress
    from llmctl.errors import UsageError
    from llmctl.rl.best_of_n import BestOfNConfig, run_best_of_n

    quiet, as_json = flags(quiet, json_)
    if not output:
        raise UsageError("best-of-n: -o OUT is required")
    check_flags("BestOfNConfig", n=n, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, limit=limit,
                reward_model_coef=reward_model_coef, verifier_coef=verifier_coef, seed=seed, min_reward=min_reward)
    cfg = BestOfNConfig(n=n, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, verifier=verifier,
                        reward_model=reward_model, reward_model_coef=reward_model_coef, verifier_coef=verifier_coef,
                        min_reward=min_reward, limit=limit, seed=seed, device=device)
    m = run_best_of_n(Path(output), cfg, checkpoint, prompts, from_rollouts, overwrite, ConsoleProgress(quiet))
    render.report(m, output, quiet, as_json)
