"""`llmctl eval` (score a checkpoint on tasks, its default command; `compare` two results) and
`llmctl generate` (sample from a checkpoint with the same engine)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from llmctl.bounds import check_flags, within_context
from llmctl.cli import render
from llmctl.cli.options import Config, DefaultCommandGroup, Json, Overwrite, Quiet, flags, typed
from llmctl.cli.console import ConsoleProgress, print_json
from llmctl.eval.tasks import kinds

app = typer.Typer()  # generate
eval_app = typer.Typer(
    cls=DefaultCommandGroup,
    help="Measure a checkpoint: `llmctl eval CKPT --task KIND:PATH … -o RESULTS` (loss / bits per byte, "
    "multiple choice, generative), each score with n, standard error and a 95% interval; "
    "`compare A B` for the paired difference between two results.",
    no_args_is_help=True,
)

STAGE = "eval"


@eval_app.command("run")
def eval_run(
    ctx: typer.Context,
    checkpoint: Annotated[str, typer.Argument(help="Checkpoint: a step dir, or a run dir (its latest).")],
    output: Annotated[str, typer.Option("--output", "-o", help="Results directory: results.json, samples.parquet, manifest.json.")],
    task: Annotated[list[str], typer.Option("--task", "-t", help=f"KIND:PATH; KIND is loss (a tokens artifact) or a task family's kind: {', '.join(k for k in kinds() if k != 'loss')} (native files; mc is {{context, choices, label}}, gen is {{prompt, answer}}). Repeatable.")],
    config: Config = None,
    shots: Annotated[int, typer.Option("--shots", help="Solved examples before each item, drawn with --seed from the same file (never the item).")] = 0,
    seed: Annotated[int, typer.Option("--seed", help="Few-shot draw and sampling seed.")] = 0,
    limit: Annotated[Optional[int], typer.Option("--limit", help="Only the first N items of each task.")] = None,
    norm: Annotated[str, typer.Option("--norm", help="Which multiple-choice accuracy is the task's headline (results.json 'headline', each item's score, what `eval compare` pairs): none = acc (sum of log-probs: lm-eval's acc), per_char = acc_norm (÷ characters: lm-eval's acc_norm), per_token = acc_per_token, pmi = acc_pmi. acc, acc_norm and acc_per_token are always reported.")] = "per_char",
    pmi: Annotated[bool, typer.Option("--pmi", help="Also report acc_pmi (one more scoring pass: each choice after 'Answer:').")] = False,
    samples: Annotated[int, typer.Option("--samples", "-n", help="Generations per generative item (with --temperature > 0).")] = 1,
    temperature: Annotated[float, typer.Option("--temperature", help="0 = greedy.")] = 0.0,
    top_k: Annotated[int, typer.Option("--top-k", help="Keep the k most likely tokens (0 = off).")] = 0,
    top_p: Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass (1 = off).")] = 1.0,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Generation budget per answer; answers that hit it are counted as truncated.")] = 256,
    extract: Annotated[Optional[str], typer.Option("--extract", help="The strict answer rule (acc, well_formed): after_hash (GSM8K '####'), last_number, boxed. Default: the task family's (boxed for math, after_hash otherwise). acc_flexible is always lm-eval's flexible-extract (the last number).")] = None,
    pass_k: Annotated[Optional[list[int]], typer.Option("--pass-k", help="Report unbiased pass@k (k ≤ --samples). Repeatable.")] = None,
    batch_tokens: Annotated[int, typer.Option("--batch-tokens", help="Tokens per scoring forward pass.")] = 4096,
    device: Annotated[str, typer.Option("--device", help="auto, cpu or cuda.")] = "auto",
    weights: Annotated[str, typer.Option("--weights", help="auto (the EMA weights of a checkpoint trained with --ema-decay, else the raw ones), ema or raw; results.json says which.")] = "auto",
    overwrite: Overwrite = False,
    quiet: Quiet = False,
    json_: Json = False,
) -> None:
    """Score a checkpoint on tasks; every score comes with n, its standard error and a 95% interval.

    Run again into the same RESULTS, an interrupted eval starts over and a finished one does nothing (exit 0)."""
    from llmctl.config import build_config, preset
    from llmctl.eval.runner import EvalConfig, run_eval
    from llmctl.eval.tasks import parse_task

    quiet, as_json = flags(quiet, json_)
    # --help shows these flags' defaults (the values of stages/eval/default.toml): only the
    # flags actually typed override the config file
    overrides = typed(ctx, shots=shots, seed=seed, limit=limit, norm=norm, pmi=pmi, samples=samples, temperature=temperature,
                      top_k=top_k, top_p=top_p, max_new_tokens=max_new_tokens, extract=extract, pass_k=pass_k,
                      batch_tokens=batch_tokens, device=device, weights=weights)
    cfg = build_config(EvalConfig, STAGE, preset(STAGE, config), overrides)
    m = run_eval(checkpoint, [parse_task(t) for t in task], Path(output), cfg, ConsoleProgress(quiet), overwrite)
    results = json.loads((Path(output) / "results.json").read_text())
    if as_json:
        print_json(results)
    elif not quiet:
        render.eval_results(results, m.wall_seconds)


@eval_app.command("compare")
def eval_compare(
    a: Annotated[str, typer.Argument(help="Results directory A.")],
    b: Annotated[str, typer.Argument(help="Results directory B.")],
    metric: Annotated[Optional[str], typer.Option("--metric", help="Compare this per-item score (acc, acc_norm, acc_per_token, acc_pmi) on the tasks that have it, instead of each task's headline.")] = None,
    json_: Json = False,
) -> None:
    """Paired difference A − B per task: its SE, z, 95% interval, and the questions needed to detect it.

    Generative tasks: also A − B split into format (the well-formed share) and content (flexible accuracy; strict accuracy among well-formed answers), and with -n K in both runs the pass@k curves of both and where they cross."""
    from llmctl.eval.compare import compare_results

    r = compare_results(a, b, metric)
    if flags(False, json_)[1]:
        print_json(r)
    else:
        render.eval_compare(r, a, b)


GENERATE_NEW_TOKENS = 64


@app.command()
def generate(
    checkpoint: Annotated[str, typer.Argument(help="Checkpoint: a step dir, or a run dir (its latest).")],
    prompt: Annotated[list[str], typer.Option("--prompt", "-p", help="Prompt text (repeatable).")],
    n: Annotated[int, typer.Option("-n", help="Samples per prompt.")] = 1,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Tokens to generate at most (the default is cut to the model's context length).")] = GENERATE_NEW_TOKENS,
    temperature: Annotated[float, typer.Option("--temperature", help="0 = greedy (deterministic).")] = 0.0,
    top_k: Annotated[int, typer.Option("--top-k", help="0 = off.")] = 0,
    top_p: Annotated[float, typer.Option("--top-p", help="1 = off.")] = 1.0,
    seed: Annotated[int, typer.Option("--seed", help="Sampling seed.")] = 0,
    stop: Annotated[Optional[list[str]], typer.Option("--stop", help="Stop string (repeatable).")] = None,
    weights: Annotated[str, typer.Option("--weights", help="auto (the EMA weights of a checkpoint trained with --ema-decay, else the raw ones), ema or raw.")] = "auto",
    json_: Json = False,
) -> None:
    """Sample continuations of prompts with the KV-cache engine (the one eval and rl use)."""
    from llmctl.eval.runner import EvalConfig, Evaluator
    from llmctl.model.generate import Engine, SamplingParams

    check_flags("generate", n=n, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    ev = Evaluator(checkpoint, EvalConfig(weights=weights))  # only loads the model: no other eval setting applies
    max_new_tokens = within_context("--max-new-tokens", max_new_tokens, ev.model.cfg.max_seq_len, GENERATE_NEW_TOKENS)
    engine = Engine.for_vocab(ev.model, ev.vocab, chat=ev.chat is not None)
    if ev.chat is not None:  # SFT/RL checkpoints: each prompt is a user turn
        inputs = [ev.chat.prompt_ids([{"role": "user", "content": p}]) for p in prompt for _ in range(n)]
    else:
        inputs = [ev.vocab.prompt_ids(p) for p in prompt for _ in range(n)]
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, stop=stop or ())
    gens = engine.generate(inputs, params)
    prompts = [p for p in prompt for _ in range(n)]
    if flags(False, json_)[1]:
        print_json([{"prompt": p, "completion": g.text, "finish": g.finish, "tokens": len(g.ids), "weights": ev.ckpt.weights}
                    for p, g in zip(prompts, gens)])
    else:
        if ev.ckpt.weights == "ema":
            render.plain(f"{ev.ckpt.path}: the EMA weights (--weights raw for the others)")
        render.generations(prompts, gens, chat=ev.chat is not None)
