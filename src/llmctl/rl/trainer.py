"""`llmctl rl CKPT --prompts FILE -o RUN`: group-relative policy optimization on checkable answers.

One step (spec 002-rl loop order): draw prompts → generate G completions each (temperature 1) →
verify → advantages within each group → (dynamic sampling: drop zero-variance groups, draw more
prompts) → old log-probs recomputed by the trainer → μ passes of the clipped surrogate (plus a KL
term to a frozen reference when asked) with one optimizer step per pass → log, checkpoint.
The prompt order is a pure function of (seed, position) and sampling is seeded by (seed, step), so
a resumed run repeats the uninterrupted one.
"""

from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F

from llmctl import __version__
from llmctl.artifacts import checkpoint as ckpt_io
from llmctl.artifacts.manifest import Manifest, input_ref, write_manifest
from llmctl.errors import UsageError
from llmctl.eval.metrics import summarize_scores
from llmctl.model.generate import SamplingParams
from llmctl.rl.grpo import ADV_STD, KL, LOSS_AGG, advantages, aggregate, clipped_surrogate, kl_estimate
from llmctl.rl.rollout import Prompter, Sample, sample_groups, sequence_batch
from llmctl.train.optim import make_optimizer
from llmctl.train.trainer import truncate_metrics


@dataclass
class RLConfig:
    steps: int = 50
    prompts_per_step: int = 8
    group_size: int = 8  # G
    max_new_tokens: int = 128
    temperature: float = 1.0  # sampling temperature; log-probs are taken at the same temperature
    top_p: float = 1.0
    lr: float = 1e-5
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.99  # small batches (§A4: 0.99+ below ~128 sequences)
    grad_clip: float = 1.0
    adv_std: str = "group"  # group | group-bessel | batch | none (Dr. GRPO)
    clip_low: float = 0.2
    clip_high: float = 0.28  # DAPO clip-higher
    loss_agg: str = "seq-mean-token-mean"  # GRPO; token-mean (DAPO); seq-sum-const (Dr. GRPO)
    kl: str = "none"  # none | k2 | k3 (no KL from a rule reward, §A7)
    kl_coef: float = 0.0
    epochs: int = 1  # μ: passes over each batch
    dynamic_sampling: bool = True  # drop groups whose rewards are all equal, draw more prompts
    max_draws: int = 4  # prompt batches drawn per step at most while filling it
    truncated: str = "mask"  # mask | zero
    verifier: str = "math"
    format_reward: float = 0.0
    micro_batch: int = 16  # sequences per training forward pass
    gen_batch: int = 64  # sequences per generation batch
    eval_every: int = 10
    eval_limit: int = 100
    checkpoint_every: int = 25
    keep_checkpoints: int = 2
    seed: int = 0
    device: str = "auto"

    def check(self) -> None:
        for name, allowed in (("adv_std", ADV_STD), ("loss_agg", LOSS_AGG), ("kl", KL), ("truncated", ("mask", "zero"))):
            if getattr(self, name) not in allowed:
                raise UsageError(f"rl: {name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if self.group_size < 2:
            raise UsageError("rl: group_size must be at least 2 (advantages are relative to the group)")
        if self.temperature <= 0:
            raise UsageError("rl: temperature must be > 0 (GRPO needs different samples per group)")
        if self.kl != "none" and self.kl_coef <= 0:
            raise UsageError("rl: --kl needs --kl-coef > 0")


class RLTrainer:
    def __init__(self, init: str, prompts_file: str, out: Path, cfg: RLConfig, eval_file: str | None = None,
                 resume: bool = False, overwrite: bool = False, on_step: Callable[[dict], None] | None = None,
                 on_log: Callable[[str], None] | None = None):
        from llmctl.rl.rewards import load_prompts, make_verifier
        from llmctl.train.distributed import pick_device

        cfg.check()
        self.cfg, self.out = cfg, Path(out)
        self.on_step, self.on_log = on_step or (lambda r: None), on_log or (lambda m: None)
        self.ckpt_root = self.out / "checkpoints"
        self._prepare_out(resume, overwrite)
        source = self.ckpt_root if resume else init
        self.device = pick_device(cfg.device)
        self.model, ck = ckpt_io.load_model(source, self.device)
        self.init_ckpt = ckpt_io.resolve_checkpoint(init)
        if ck.tokenizer_file is None:
            raise UsageError(f"{ck.path} has no tokenizer.json")
        self.tokenizer_file = ck.tokenizer_file
        self.chat = bool(ck.trainer_state.get("chat"))
        self.state = ck.trainer_state if resume else {"step": 0, "prompt_position": 0, "chat": self.chat}
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(self.tokenizer_file))
        eos = tok.token_to_id("<|endoftext|>")
        self.prompter = Prompter(self.tokenizer_file, self.chat, lambda s: tok.encode(s, add_special_tokens=False).ids,
                                 lambda ids: tok.decode(ids, skip_special_tokens=False), 0 if eos is None else eos)
        self.prompts = load_prompts(prompts_file)
        self.eval_prompts = load_prompts(eval_file)[: cfg.eval_limit] if eval_file else None
        self.prompts_file, self.eval_file = prompts_file, eval_file
        self.verifier = make_verifier(cfg.verifier, format_reward=cfg.format_reward)
        self.reference = None
        if cfg.kl != "none":
            self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.model.train()
        self.opt = make_optimizer(self.model, cfg.lr, cfg.weight_decay, (cfg.beta1, cfg.beta2), 1e-8, fused=True)
        if self.device.type == "cpu":
            from llmctl.train.alloc import keep_freed_memory

            keep_freed_memory()
        if resume and (opt_state := ck.optimizer_state()) is not None:
            self.opt.load_state_dict(opt_state)

    def _prepare_out(self, resume: bool, overwrite: bool) -> None:
        if resume:
            if not ckpt_io.list_checkpoints(self.ckpt_root):
                raise UsageError(f"--resume: {self.ckpt_root} holds no checkpoint")
            return
        if self.out.exists() and any(self.out.iterdir()):
            if not overwrite:
                raise UsageError(f"{self.out} is not empty: pass --resume to continue it or --overwrite to start over")
            import shutil

            shutil.rmtree(self.out)
        self.out.mkdir(parents=True, exist_ok=True)

    # -- prompts -----------------------------------------------------------------------------

    def _prompt_indices(self, position: int, count: int) -> list[int]:
        """Prompts at positions position..position+count of the (seed, epoch)-shuffled order."""
        n = len(self.prompts)
        out = []
        for p in range(position, position + count):
            epoch, k = divmod(p, n)
            out.append(int(np.random.default_rng([self.cfg.seed, epoch]).permutation(n)[k]))
        return out

    # -- one step ----------------------------------------------------------------------------

    def _collect(self, step: int) -> tuple[list[list[Sample]], dict, list[list[Sample]]]:
        """(groups to train on, rollout statistics, every group sampled this step)."""
        c = self.cfg
        params = SamplingParams(max_new_tokens=c.max_new_tokens, temperature=c.temperature, top_p=c.top_p,
                                seed=c.seed * 1_000_003 + step, stop=self.prompter.stop)
        engine = self.prompter.engine(self.model, c.gen_batch)
        kept, drawn, zero_var, all_groups = [], 0, 0, []
        self.model.eval()
        for _ in range(c.max_draws if c.dynamic_sampling else 1):
            idx = self._prompt_indices(self.state["prompt_position"], c.prompts_per_step)
            self.state["prompt_position"] += len(idx)
            params.seed += 7919  # fresh samples for each extra draw
            groups = sample_groups(engine, self.prompter, self.prompts, idx, c.group_size, params, self.verifier, c.truncated)
            drawn += len(groups)
            for g in groups:
                rewards = [s.reward for s in g if not s.masked]
                flat = len(rewards) < 2 or max(rewards) == min(rewards)
                zero_var += flat
                all_groups.append(g)
                if not (c.dynamic_sampling and flat):
                    kept.append(g)
            if not c.dynamic_sampling or len(kept) >= c.prompts_per_step:
                break
        kept = kept[: c.prompts_per_step]
        samples = [s for g in all_groups for s in g]
        info = {"groups_drawn": drawn, "zero_variance_share": zero_var / max(1, drawn),
                "reward_mean": float(np.mean([s.reward for s in samples])), "reward_std": float(np.std([s.reward for s in samples])),
                "accuracy": float(np.mean([bool(s.correct) for s in samples])),
                "response_length": float(np.mean([len(s.completion_ids) for s in samples])),
                "truncation_rate": float(np.mean([s.truncated for s in samples])),
                "masked_share": float(np.mean([s.masked for s in samples]))}
        return kept, info, all_groups

    def _set_advantages(self, groups: list[list[Sample]]) -> None:
        if not groups:
            return
        rewards = torch.tensor([[s.reward for s in g] for g in groups], dtype=torch.float64)
        valid = torch.tensor([[not s.masked for s in g] for g in groups])
        # masked samples do not enter the group statistics: give them the group mean of the rest
        means = torch.stack([r[v].mean() if v.any() else torch.tensor(0.0, dtype=torch.float64) for r, v in zip(rewards, valid)])
        filled = torch.where(valid, rewards, means[:, None])
        adv = advantages(filled, self.cfg.adv_std)
        for g, a in zip(groups, adv.tolist()):
            for s, v in zip(g, a):
                s.advantage = 0.0 if s.masked else v

    def _logps(self, model, samples: list[Sample]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        inputs, targets, mask = sequence_batch(samples)
        # the policy being optimized is the one that sampled: softmax(z / T), as TRL and verl do
        logits = model(inputs.to(self.device)).float() / self.cfg.temperature
        logp_all = F.log_softmax(logits, -1)
        logp = logp_all.gather(-1, targets.clamp_min(0).to(self.device)[..., None])[..., 0]
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        return logp, mask.to(self.device), entropy

    def _train(self, groups: list[list[Sample]]) -> dict:
        c = self.cfg
        samples = [s for g in groups for s in g if not s.masked]
        if not samples:
            return {"updates": 0}
        with torch.no_grad():
            # with one pass the policy that sampled is the one being trained: π_old = π (detached), so
            # the extra forward is skipped (TRL does the same); with μ > 1 it must be kept
            old = [self._logps(self.model, samples[i : i + c.micro_batch])[0]
                   for i in range(0, len(samples), c.micro_batch)] if c.epochs > 1 else None
            ref = [self._logps(self.reference, samples[i : i + c.micro_batch])[0] for i in range(0, len(samples), c.micro_batch)] if self.reference else None
        n_tokens = sum(len(s.completion_ids) for s in samples)
        stats = {"clip_frac": 0.0, "ratio_gt2": 0.0, "kl_ref": 0.0, "entropy": 0.0, "grad_norm": 0.0}
        self.model.train()
        for _ in range(c.epochs):
            for b, i in enumerate(range(0, len(samples), c.micro_batch)):
                part = samples[i : i + c.micro_batch]
                logp, mask, entropy = self._logps(self.model, part)
                adv = torch.tensor([s.advantage for s in part], device=self.device)[:, None]
                old_logp = old[b] if old is not None else logp.detach()
                objective, zero_grad, ratio = clipped_surrogate(logp, old_logp, adv, c.clip_low, c.clip_high)
                per_token = -objective
                if ref is not None:
                    kl = kl_estimate(logp, ref[b], c.kl)
                    per_token = per_token + c.kl_coef * kl
                    stats["kl_ref"] += float((kl * mask).sum()) / n_tokens / c.epochs
                loss = aggregate(per_token, mask, c.loss_agg, len(samples), n_tokens, c.max_new_tokens)
                loss.backward()
                stats["clip_frac"] += float((zero_grad * mask).sum()) / n_tokens / c.epochs
                stats["ratio_gt2"] += float(((ratio > 2) * mask).sum()) / n_tokens / c.epochs
                stats["entropy"] += float((entropy.detach() * mask).sum()) / n_tokens / c.epochs
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), c.grad_clip)
            stats["grad_norm"] = float(norm)
            if torch.isfinite(norm):
                self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        stats["updates"] = c.epochs
        stats["trained_samples"], stats["trained_tokens"] = len(samples), n_tokens
        return stats

    @torch.no_grad()
    def evaluate(self) -> dict | None:
        if not self.eval_prompts:
            return None
        self.model.eval()
        engine = self.prompter.engine(self.model, self.cfg.gen_batch)
        params = SamplingParams(max_new_tokens=self.cfg.max_new_tokens, stop=self.prompter.stop)
        gens = engine.generate([self.prompter.ids(p["prompt"]) for p in self.eval_prompts], params)
        scores = [float(bool(self.verifier.verify(g.text, p["reference"]).correct)) for g, p in zip(gens, self.eval_prompts)]
        return summarize_scores(scores)

    # -- the loop ----------------------------------------------------------------------------

    def run(self) -> Manifest:
        c = self.cfg
        started = time.perf_counter()
        (self.out / "config.json").write_text(json.dumps({"rl": asdict(c), "init": str(self.init_ckpt), "prompts": self.prompts_file,
                                                          "eval": self.eval_file, "chat": self.chat, "llmctl_version": __version__}, indent=2) + "\n")
        (self.out / "rollouts").mkdir(exist_ok=True)
        path = self.out / "metrics.jsonl"
        truncate_metrics(path, self.state["step"])
        metrics = open(path, "a")
        if self.state["step"] == 0 and self.eval_prompts:
            ev = self.evaluate()
            metrics.write(json.dumps({"step": 0, "eval": ev}) + "\n")
            self.on_log(f"step 0: held-out accuracy {ev['mean']:.3f} [{ev['ci_low']:.3f}, {ev['ci_high']:.3f}] (n={ev['n']})")
        last_eval = None
        while self.state["step"] < c.steps:
            step = self.state["step"]
            t0 = time.perf_counter()
            groups, info, all_groups = self._collect(step)
            t1 = time.perf_counter()
            self._set_advantages(groups)
            t2 = time.perf_counter()
            stats = self._train(groups)
            t3 = time.perf_counter()
            self.state["step"] += 1
            gen_tokens = sum(len(s.completion_ids) for g in all_groups for s in g)
            rec = {"step": self.state["step"], **{k: round(v, 6) if isinstance(v, float) else v for k, v in {**info, **stats}.items()},
                   "groups_trained": len(groups), "generate_s": round(t1 - t0, 3), "score_s": round(t2 - t1, 3),
                   "train_s": round(t3 - t2, 3), "tokens_per_s": round(gen_tokens / max(1e-9, t3 - t0), 1)}
            self._write_rollouts(all_groups, self.state["step"])
            if self.eval_prompts and c.eval_every and (self.state["step"] % c.eval_every == 0 or self.state["step"] == c.steps):
                rec["eval"] = last_eval = self.evaluate()
            metrics.write(json.dumps(rec) + "\n")
            metrics.flush()
            self.on_step(rec)
            if self.state["step"] % c.checkpoint_every == 0 or self.state["step"] == c.steps:
                self._checkpoint()
        metrics.close()
        counts = {"steps": self.state["step"], "prompts_drawn": self.state["prompt_position"]}
        if last_eval:
            counts.update({"eval_accuracy": round(last_eval["mean"], 6), "eval_ci_low": round(last_eval["ci_low"], 6),
                           "eval_ci_high": round(last_eval["ci_high"], 6), "eval_n": last_eval["n"]})
        inputs = [input_ref(self.init_ckpt.parent.parent if self.init_ckpt.parent.name == "checkpoints" else self.init_ckpt),
                  input_ref(self.prompts_file)]
        m = Manifest(kind="run", stage="rl", config=asdict(c), inputs=inputs, counts=counts,
                     wall_seconds=round(time.perf_counter() - started, 3))
        write_manifest(self.out, m)
        return m

    def _write_rollouts(self, groups: list[list[Sample]], step: int) -> None:
        rows = [{"step": step, "prompt_index": s.prompt_index, "prompt": self.prompts[s.prompt_index]["prompt"],
                 "completion": s.text, "reward": s.reward, "correct": s.correct, "advantage": s.advantage,
                 "length": len(s.completion_ids), "truncated": s.truncated, "masked": s.masked} for g in groups for s in g]
        pq.write_table(pa.Table.from_pylist(rows), self.out / "rollouts" / f"step-{step:06d}.parquet")

    def _checkpoint(self) -> None:
        # sampling is seeded by (seed, step) and prompts by (seed, position): no RNG state to carry
        state = {**self.state, "seed": self.cfg.seed}
        ckpt_io.save_checkpoint(self.ckpt_root, self.state["step"], self.model.cfg, self.model.state_dict(), state,
                                optimizer_state=self.opt.state_dict(), tokenizer_file=self.tokenizer_file,
                                keep_last=self.cfg.keep_checkpoints)


def run_rl(init: str, prompts: str, out: Path, cfg: RLConfig, **kw) -> Manifest:
    return RLTrainer(init, prompts, out, cfg, **kw).run()
