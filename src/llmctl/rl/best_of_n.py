"""`llmctl best-of-n`: rejection sampling — n samples a prompt, scored, the best kept.

The post-training recipes of Llama 3, Tülu 3 and OLMo 2 put it between SFT and preference tuning:
sample n completions per prompt from the policy, score them (a verifier on checkable answers, a
reward model, or both, with rl's own reward: verifier_coef · verifier + reward_model_coef · RM),
keep the best as new SFT data and the best against the worst as preference pairs. Two sources:

- a policy checkpoint and prompts (the files `rl --prompts` reads): n samples per prompt from
  the shared generation engine (rl/rollout.py's `sample_groups`), each from its own generator
  seeded by (seed, prompt, sample), so the output does not depend on the batch size;
- `--from-rollouts RUN`: the samples an `llmctl rl` run already scored (rollouts/step-*.parquet),
  grouped by prompt over every step — no model, no sampling.

OUT holds `sft.jsonl` (one `{"messages": [user, assistant]}` conversation per kept completion:
the best of each prompt, the first sampled among equals; with `min_reward`, every completion at
or above it), `pairs.jsonl` (`{"prompt", "chosen", "rejected", "chosen_reward",
"rejected_reward"}`: the best and the worst of each prompt whose rewards differ — what `llmctl
dpo` and `llmctl train-rm` read) and the manifest, whose counts say what the selection bought:
the mean reward of all samples against that of the kept ones, pass@1 against best-of-n accuracy.
A completion cut at max_new_tokens, or one the verifier could not score (masked), is never kept
nor paired.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from llmctl.artifacts.atomic import write_text
from llmctl.artifacts.manifest import Manifest, input_ref, output_entry, read_manifest, write_manifest
from llmctl.artifacts.rerun import claim_out, run_identity, running
from llmctl.artifacts.lock import output_lock
from llmctl.artifacts import checkpoint as ckpt_io
from llmctl.bounds import within_context
from llmctl.errors import UsageError
from llmctl.runtime.progress import Progress

SFT_FILE, PAIRS_FILE = "sft.jsonl", "pairs.jsonl"


@dataclass
class BestOfNConfig:
    n: int = 8  # samples per prompt
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    verifier: str = "math"
    format_reward: float = 0.0
    reward_model: str | None = None  # a train-rm checkpoint, scoring every sample
    reward_model_coef: float = 1.0
    verifier_coef: float = 1.0
    min_reward: float | None = None  # keep every completion at or above it (else the best one)
    limit: int | None = None  # the first N prompts only
    gen_batch: int = 256  # sequences decoding at once at most (the engine's max_rows)
    weights: str = "auto"  # which weights of the checkpoint: auto | ema | raw
    seed: int = 0
    device: str = "auto"

    def check(self) -> None:
        if self.n < 2:
            raise UsageError("best-of-n: -n must be at least 2 (one sample has nothing to be best of)")
        if self.temperature <= 0:
            raise UsageError("best-of-n: --temperature must be > 0 (greedy decoding gives n copies of one sample)")
        if self.reward_model is None and self.verifier_coef == 0:
            raise UsageError("best-of-n: --verifier-coef 0 leaves no score without --reward-model RM")
        if self.weights not in ckpt_io.WEIGHTS:
            raise UsageError(f"best-of-n: weights must be one of {', '.join(ckpt_io.WEIGHTS)}, got {self.weights!r}")


@dataclass
class Scored:
    prompt: str
    completion: str
    reward: float
    correct: bool | None
    usable: bool  # neither truncated nor unscorable


def select(groups: list[list[Scored]], min_reward: float | None) -> tuple[list[Scored], list[tuple[Scored, Scored]]]:
    """The kept completions (the best of each group, or all at or above min_reward) and the
    (best, worst) pairs of the groups whose usable rewards differ."""
    kept, pairs = [], []
    for group in groups:
        usable = [s for s in group if s.usable]
        if not usable:
            continue
        best = max(usable, key=lambda s: s.reward)  # max/min take the first among equals: the first sampled
        worst = min(usable, key=lambda s: s.reward)
        if min_reward is None:
            kept.append(best)
        else:
            kept += [s for s in usable if s.reward >= min_reward]
        if best.reward > worst.reward:
            pairs.append((best, worst))
    return kept, pairs


def sample_policy(checkpoint: str, prompts_file: str, cfg: BestOfNConfig, progress: Progress) -> list[list[Scored]]:
    """n scored samples for each prompt of the file, from the checkpoint."""
    from llmctl.model.load import load_model
    from llmctl.model.generate import EngineConfig, SamplingParams
    from llmctl.rl.rewards import make_verifier
    from llmctl.rl.rollout import Prompter, row_seed, sample_groups
    from llmctl.tasks import read_prompts
    from llmctl.tokenizer.vocab import Vocab
    from llmctl.torchrt.device import pick_device

    options = {"unsafe_sandbox": False} if cfg.verifier == "python" else {}
    verifier = make_verifier(cfg.verifier, format_reward=cfg.format_reward, **options)
    if (line := verifier.check()) is not None:
        progress.log(line)
    context = ckpt_io.open_checkpoint(checkpoint).config_json.get("max_seq_len")
    if isinstance(context, int) and not isinstance(context, bool):
        cfg.max_new_tokens = within_context("--max-new-tokens", cfg.max_new_tokens, context, BestOfNConfig.max_new_tokens)
    device = pick_device(cfg.device)
    model, ck = load_model(checkpoint, device, cfg.weights)
    if ck.tokenizer_file is None:
        raise UsageError(f"{ck.path} has no tokenizer.json")
    prompts, families = read_prompts(prompts_file)
    prompts = prompts[: cfg.limit] if cfg.limit else prompts
    prompter = Prompter(Vocab(ck.path), bool(ck.trainer_state.get("chat")), families, prompts_file)
    scorer = None
    if cfg.reward_model:
        from llmctl.train.reward_model import load_reward_model

        scorer = load_reward_model(cfg.reward_model, device)
    params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
                            stop=prompter.stop)
    engine = prompter.engine(model, EngineConfig(max_rows=cfg.gen_batch))
    per_batch = max(1, cfg.gen_batch // cfg.n)
    groups: list[list[Scored]] = []
    progress.start(len(prompts), "prompts", f"best-of-{cfg.n}")
    for lo in range(0, len(prompts), per_batch):
        indices = list(range(lo, min(lo + per_batch, len(prompts))))
        sampled = sample_groups(engine, prompter, prompts, indices, cfg.n, params, verifier, "mask",
                                seeds=[row_seed(cfg.seed, i) for i in indices], scorer=scorer,
                                coefs=(cfg.verifier_coef, cfg.reward_model_coef))
        groups += [[Scored(prompts[s.prompt_index]["prompt"], s.text, s.reward, s.correct, not s.masked) for s in g]
                   for g in sampled]
        progress.advance(len(indices))
    progress.finish()
    return groups


def read_rollouts(run: Path) -> list[list[Scored]]:
    """The scored samples of an rl run, one group per prompt (in order of first appearance). A control
    run's (rl --control) are scored by their `real_reward`, against their own references, not by the
    random or stand-in reward it trained on."""
    import pyarrow.parquet as pq

    files = sorted((run / "rollouts").glob("step-*.parquet"))
    if not files:
        raise UsageError(f"--from-rollouts: {run} has no rollouts/step-*.parquet (an `llmctl rl` run's output)")
    groups: dict[str, list[Scored]] = {}
    for f in files:
        try:
            score = "real_reward" if "real_reward" in pq.read_schema(f).names else "reward"
            rows = pq.read_table(f, columns=["prompt", "completion", score, "correct", "truncated", "masked"]).to_pylist()
        except Exception as e:  # noqa: BLE001 - pyarrow raises many kinds for a damaged or foreign file
            raise UsageError(f"--from-rollouts: {f} is not an rl rollouts file ({type(e).__name__}: {e})") from e
        for r in rows:
            usable = not (r["truncated"] or r["masked"])
            groups.setdefault(r["prompt"], []).append(Scored(r["prompt"], r["completion"], float(r[score]), r["correct"], usable))
    return list(groups.values())


def run_best_of_n(out: Path, cfg: BestOfNConfig, checkpoint: str | None = None, prompts: str | None = None,
                  from_rollouts: str | None = None, overwrite: bool = False, progress: Progress | None = None) -> Manifest:
    """Sample (or read rollouts), select, write OUT (see the module doc). A re-run over its own
    finished OUT is a no-op; over its own unfinished one it starts over (artifacts/rerun.py)."""
    cfg.check()
    if (from_rollouts is None) == (checkpoint is None or prompts is None):
        raise UsageError("best-of-n: give a checkpoint and --prompts, or --from-rollouts RUN")
    progress = progress or Progress()
    t0 = time.perf_counter()
    refs = [input_ref(str(s)) for s in ([from_rollouts] if from_rollouts else [checkpoint, prompts])]
    config = {k: v for k, v in asdict(cfg).items() if k != "device"}  # where it ran is not what it made
    with output_lock(out):
        if claim_out(out, run_identity("best-of-n", config, refs), overwrite, own=(SFT_FILE, PAIRS_FILE)):
            progress.log(f"best-of-n: {out} already holds this run's finished output; nothing to do")
            return read_manifest(out)
        with running(out):
            groups = read_rollouts(Path(from_rollouts)) if from_rollouts else sample_policy(checkpoint, prompts, cfg, progress)
            kept, pairs = select(groups, cfg.min_reward)
            sft = "".join(json.dumps({"messages": [{"role": "user", "content": s.prompt},
                                                   {"role": "assistant", "content": s.completion}]}) + "\n" for s in kept)
            pair_lines = "".join(json.dumps({"prompt": b.prompt, "chosen": b.completion, "rejected": w.completion,
                                             "chosen_reward": b.reward, "rejected_reward": w.reward}) + "\n"
                                 for b, w in pairs)
            write_text(out / SFT_FILE, sft)
            write_text(out / PAIRS_FILE, pair_lines)
            manifest = Manifest(kind="samples", stage="best-of-n", config=config, inputs=refs,
                                outputs=[output_entry(out / SFT_FILE, len(kept), out), output_entry(out / PAIRS_FILE, len(pairs), out)],
                                counts=_counts(groups, kept, pairs), wall_seconds=round(time.perf_counter() - t0, 3))
            write_manifest(out, manifest)  # last: it says the files above are whole
    return manifest


def _counts(groups: list[list[Scored]], kept: list[Scored], pairs: list) -> dict:
    samples = [s for g in groups for s in g]
    usable = [s for s in samples if s.usable]
    mean = lambda xs: round(sum(xs) / len(xs), 6) if xs else None  # noqa: E731
    counts = {"prompts": len(groups), "samples": len(samples), "unusable": len(samples) - len(usable),
              "kept": len(kept), "pairs": len(pairs), "reward_mean": mean([s.reward for s in usable]),
              "kept_reward_mean": mean([s.reward for s in kept])}
    checked = [g for g in groups if any(s.correct is not None for s in g) and any(s.usable for s in g)]
    if checked:  # what the verifier says: one sample's accuracy (a cut one counts as wrong) against the kept one's
        counts["pass_at_1"] = mean([float(bool(s.correct) and s.usable) for g in checked for s in g])
        counts["best_of_n_accuracy"] = mean([float(bool(max((s for s in g if s.usable), key=lambda s: s.reward).correct))
                                             for g in checked])
    return counts
