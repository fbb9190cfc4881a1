"""`llmctl rl CKPT --prompts FILE -o RUN`: group-relative policy optimization on checkable answers.

One step (spec 002-rl loop order): draw prompts → generate G completions each (temperature 1) →
verify → advantages within each group → (dynamic sampling: drop zero-variance groups, draw more
prompts) → old log-probs recomputed by the trainer → μ passes of the clipped surrogate (plus a KL
term to a frozen reference when asked) with one optimizer step per pass → log, checkpoint.
The prompt order is a pure function of (seed, position) and each sample draws from its own
generator seeded by (seed, step, prompt position, sample), so a resumed run repeats the
uninterrupted one.

Under torchrun (data parallel, gloo on CPU, NCCL on GPUs) every draw of prompts_per_step prompts is
cut into one contiguous slice per rank; each rank samples and scores its slice, then the per-sample
numbers (reward, correct, length, truncated, masked) are all-reduced so that every rank sees the
whole draw: dynamic sampling keeps the same groups, group advantages (and the batch std) and the
loss normalizers (sequences, tokens) are those of the global batch, and the metrics describe it.
Each rank backpropagates its own kept groups' share of the global loss; the gradients are summed
across ranks (torchrt.distributed.all_reduce_grads), so the update equals the one process would make
on the whole batch. Rank 0 gathers the rollouts into the same rollouts/step-N.parquet and alone
writes metrics.jsonl, checkpoints and the manifest (torchrt/rundir.py, the run directory train
keeps too); held-out evaluation is split across ranks.

A control run (--control, rl/controls.py) changes only the reward column of that table — a seeded
random reward at the real reward's running mean, or the verdict against another prompt's reference —
and keeps the real reward (`real_reward`) and accuracy against the prompts' own references beside it.

Held-out accuracy (greedy, every eval_every steps) and, before the first step of a fresh run,
the headroom (pass@1, pass@G and maj@G next to greedy accuracy) are rl/evaluate.py's.
"""

from __future__ import annotations

import copy
import time
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from llmctl import __version__
from llmctl.artifacts import checkpoint as ckpt_io
from llmctl.artifacts.manifest import Manifest, input_ref
from llmctl.bounds import within_context
from llmctl.errors import UsageError
from llmctl.model.load import base_identity, load_model
from llmctl.model.lora import LORA_FILE, adapters_off, attach, is_adapter
from llmctl.tokenizer.vocab import Vocab
from llmctl.rl.config import RLConfig
from llmctl.rl.controls import RunningMean, random_rewards, same_reference, shuffled_references
from llmctl.rl.evaluate import HeldOut
from llmctl.rl.grpo import (advantages, aggregate, clipped_surrogate, importance_weights, kl_estimate, per_token_loss,
                            rloo_advantages)
from llmctl.rl.rollout import Prompter, RolloutWriter, Sample, row_seed, sample_groups, sequence_batch
from llmctl.torchrt import distributed
from llmctl.torchrt.alloc import keep_freed_memory
from llmctl.torchrt.optim import lr_at, make_optimizer, set_lr
from llmctl.torchrt import rundir
from llmctl.torchrt.rundir import TRAINING_RUN, RunDir


# per-sample numbers every rank shares after each draw (rl/trainer.py's all-reduced table)
# real_reward: against the prompt's own reference (reward differs from it in a control run); judged: a
# verdict on correctness (`correct` is not None), so a wrong answer is judged and not correct
COLUMNS = ("reward", "correct", "length", "truncated", "masked", "verifier_reward", "rm_score", "real_reward", "judged")
REWARD, CORRECT, LENGTH, TRUNCATED, MASKED, VERIFIER_REWARD, RM_SCORE, REAL_REWARD, JUDGED = range(len(COLUMNS))


class RLTrainer:
    def __init__(self, init: str, prompts_file: str, out: Path, cfg: RLConfig, dist: distributed.Dist,
                 eval_file: str | None = None, resume: bool = False, overwrite: bool = False, on_step: Callable[[dict], None] | None = None,
                 on_log: Callable[[str], None] | None = None):
        from llmctl.rl.rewards import make_verifier
        from llmctl.tasks import read_prompts

        cfg.check()
        self.cfg, self.out = cfg, Path(out)
        self.dist = d = dist
        if cfg.prompts_per_step % d.world:
            raise UsageError(f"rl: --prompts-per-step {cfg.prompts_per_step} does not split over {d.world} ranks; "
                             f"use a multiple of {d.world} (it is the global batch, all ranks together)")
        quiet = lambda x: None  # noqa: E731  (progress is printed by rank 0 only)
        self.on_step = (on_step or quiet) if d.is_main else quiet
        self.on_log = (on_log or quiet) if d.is_main else quiet
        # Before anything is loaded or written: a verifier that cannot work here (the python
        # sandbox on a host without its protections) stops the run now, once, not per sample.
        options = {"unsafe_sandbox": cfg.unsafe_sandbox} if cfg.verifier == "python" else {}
        self.verifier = make_verifier(cfg.verifier, format_reward=cfg.format_reward, **options)
        if (line := self.verifier.check()) is not None:
            self.on_log(line)
        # the completion budget against the model's context, read before OUT is touched
        context = ckpt_io.open_checkpoint(init).config_json.get("max_seq_len")
        if isinstance(context, int) and not isinstance(context, bool):
            cfg.max_new_tokens = within_context("--max-new-tokens", cfg.max_new_tokens, context, RLConfig.max_new_tokens)
        self.run_dir = RunDir(self.out, d, entries=(*TRAINING_RUN, "rollouts"))
        self.run_dir.prepare(resume, overwrite)
        source = self.run_dir.checkpoints if resume else init
        self.device = d.device
        # a fresh run starts from the init checkpoint's EMA weights where it has them (cfg.weights); a
        # resumed one from its own last weights
        self.model, ck = load_model(source, self.device, "raw" if resume else cfg.weights,
                                    merge=not (resume and cfg.lora is not None))
        self.model.set_recompute(cfg.recompute)
        self.init_ckpt = ckpt_io.resolve_checkpoint(init)
        self.lora_base = self._lora(init, ck, resume) if cfg.lora is not None or (resume and ck.lora) else None
        self.init_weights = ck.weights if not resume else self._saved_init_weights()
        if not resume and ck.weights == "ema":
            self.on_log(f"starting from the EMA weights of {ck.path} (--weights raw for the others)")
        if ck.tokenizer_file is None:
            raise UsageError(f"{ck.path} has no tokenizer.json")
        self.tokenizer_file = ck.tokenizer_file
        self.chat = bool(ck.trainer_state.get("chat"))
        self.state = ck.trainer_state if resume else {"step": 0, "prompt_position": 0, "chat": self.chat}
        vocab = Vocab(ck.path)
        self.prompts, families = read_prompts(prompts_file)
        self.prompter = Prompter(vocab, self.chat, families, prompts_file)
        eval_prompts, eval_families = read_prompts(eval_file) if eval_file else ([], [])
        eval_prompts, eval_families = eval_prompts[: cfg.eval_limit], eval_families[: cfg.eval_limit]
        # held-out prompts are given in their own family's format, which need not be the training prompts'
        eval_prompter = Prompter(vocab, self.chat, eval_families, eval_file) if eval_prompts else None
        self.prompts_file, self.eval_file = prompts_file, eval_file
        self.rollouts = RolloutWriter(self.out / "rollouts", self.prompts, d, control=cfg.control != "none")
        self._control()
        self.reference = None
        if cfg.kl != "none":  # under LoRA the reference is the model with its adapters off: no second copy
            self.reference = self.model if cfg.lora else copy.deepcopy(self.model).eval().requires_grad_(False)
        self.model.train()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = make_optimizer(self.model, cfg.lr, cfg.weight_decay, (cfg.beta1, cfg.beta2), cfg.eps, fused=True)
        keep_freed_memory(self.device)
        if resume and (opt_state := ck.optimizer_state()) is not None:
            self.opt.load_state_dict(opt_state)
        self.held_out = HeldOut(self.model, eval_prompts, eval_prompter, self.verifier, cfg, d) if eval_prompts else None
        self.scorer = None
        if cfg.reward_model:  # rl --reward-model: a train-rm checkpoint scores every sample
            from llmctl.train.reward_model import load_reward_model

            self.scorer = load_reward_model(cfg.reward_model, self.device)
            self.on_log(f"reward: {cfg.verifier_coef:g} × the {cfg.verifier} verifier + {cfg.reward_model_coef:g} × "
                        f"the reward model {self.scorer.path}")

    def _control(self) -> None:
        """--control (rl/controls.py): the references prompts are scored against (shuffled-answers), or
        the real reward's running mean, kept in the trainer state so that a resumed run goes on from it."""
        c = self.cfg
        saved = self.state.get("control", "none") if self.state["step"] else c.control  # "none": a run from before controls
        if saved != c.control:  # a run is a control or not from its first step to its last
            raise UsageError(f"--resume: {self.out} is a run with control {saved}, not {c.control} (--control {saved})")
        self.state["control"] = c.control
        self.scored_against, self.running = None, None
        if c.control == "shuffled-answers":
            if len(self.prompts) < 2:
                raise UsageError(f"rl: --control shuffled-answers scores each prompt against another's reference; "
                                 f"{self.prompts_file} holds {len(self.prompts)} prompt")
            self.scored_against = [self.prompts[k]["reference"] for k in shuffled_references(len(self.prompts), c.seed)]
        elif c.control == "random-reward":
            self.running = RunningMean(self.state.setdefault("real_reward_running", {}))

    def _lora(self, init: str, ck, resume: bool) -> dict:
        """--lora-*: a fresh run attaches adapters to the (merged) start model; a resumed one has
        them from its checkpoint, on the base it recorded, which --init must still be. Returns the
        base's identity (lora.json of every checkpoint)."""
        c = self.cfg
        if not resume:
            identity = base_identity(init, ck.weights)
            attach(self.model, c.lora, torch.Generator(self.device).manual_seed(c.seed))  # A: seeded by the run
            self.on_log(f"LoRA r {c.lora.rank}, alpha {c.lora.alpha:g} on {','.join(c.lora.targets)}: "
                        f"{sum(p.numel() for p in self.model.parameters() if p.requires_grad):,} trainable parameters")
            return identity
        if ck.lora is None or c.lora is None or ck.lora.to_dict() != c.lora.to_dict():
            raise UsageError(f"--resume: the run's LoRA settings ({ck.lora.to_dict() if ck.lora else 'none'}, "
                             f"{ck.path}) are not the flags' ({c.lora.to_dict() if c.lora else 'none'})")
        given = base_identity(init, ck.lora_base["weights"])
        if given["sha256"] != ck.lora_base["sha256"]:
            raise UsageError(f"--resume: {init} is not the base this LoRA run adapts ({ck.lora_base['path']})")
        return ck.lora_base

    def _saved_init_weights(self) -> str | None:
        """Which weights of the init checkpoint the run being resumed started from (its config.json)."""
        import json

        saved = self.out / "config.json"
        return json.loads(saved.read_text()).get("init_weights") if saved.is_file() else None

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

    def _collect(self, step: int) -> tuple[list[tuple[int, list[Sample]]], np.ndarray, dict, list]:
        """Sample this rank's share of the step's prompts (dynamic sampling over the global draws).

        Returns (this rank's kept groups with their index in the global kept list, the kept groups'
        per-sample values of every rank (K, G, len(COLUMNS)), statistics of everything sampled this
        step on all ranks, this rank's sampled groups keyed by (draw, slot) for the rollouts file)."""
        c, d = self.cfg, self.dist
        P, G = c.prompts_per_step, c.group_size
        share = P // d.world
        lo = d.rank * share  # this rank's slots in every draw
        params = c.sampling(self.prompter.stop)
        engine = self.prompter.engine(self.model, c.engine_config())
        tables, mine, kept, zero_var, rate = [], {}, [], 0, None
        self.model.eval()
        for draw in range(c.max_draws if c.dynamic_sampling else 1):
            start = self.state["prompt_position"]
            self.state["prompt_position"] += P
            positions = range(start + lo, start + lo + share)
            idx = self._prompt_indices(positions.start, share)
            seeds = [row_seed(c.seed, step, p) for p in positions]  # a prompt's samples: the same on any rank
            groups = sample_groups(engine, self.prompter, self.prompts, idx, G, params, self.verifier, c.truncated, seeds,
                                   self.scorer, (c.verifier_coef, c.reward_model_coef), self.scored_against)
            table = np.zeros((P, G, len(COLUMNS)))
            for k, g in enumerate(groups):
                table[lo + k] = [[s.reward, bool(s.correct), len(s.completion_ids), s.truncated, s.masked,
                                  s.verifier_reward, s.rm_score or 0.0, s.real_reward, s.correct is not None] for s in g]
                mine[(draw, lo + k)] = g
            # every rank's numbers, exact (float64 sums of one value and zeros)
            table = np.array(distributed.all_reduce_sum(table.ravel().tolist(), d)).reshape(table.shape)
            if self.running is not None:  # --control random-reward: every rank draws the same from the same table
                rate = min(1.0, max(0.0, self.running.add(table[..., REAL_REWARD], table[..., MASKED] == 0)))
                table[..., REWARD] = random_rewards(rate, c.seed, step, range(start, start + P), G)
                for k, g in enumerate(groups):
                    for s, r in zip(g, table[lo + k, :, REWARD]):
                        s.reward = float(r)
            tables.append(table)
            for slot, row in enumerate(table):
                flat = _flat(row, REWARD)
                zero_var += flat
                if not (c.dynamic_sampling and flat):
                    kept.append((draw, slot))
            if not c.dynamic_sampling or len(kept) >= P:
                break
        kept = kept[:P]
        kept_table = np.stack([tables[dr][slot] for dr, slot in kept]) if kept else np.zeros((0, G, len(COLUMNS)))
        own = [(k, mine[key]) for k, key in enumerate(kept) if key in mine]
        drawn = len(tables) * P
        every = np.concatenate(tables).reshape(-1, len(COLUMNS))  # all samples, in (draw, slot, sample) order
        info = {"groups_drawn": drawn, "zero_variance_share": zero_var / max(1, drawn),
                "reward_mean": float(np.mean(every[:, REWARD])), "reward_std": float(np.std(every[:, REWARD])),
                "accuracy": float(np.mean(every[:, CORRECT])),
                "response_length": float(np.mean(every[:, LENGTH])),
                "truncation_rate": float(np.mean(every[:, TRUNCATED])),
                "masked_share": float(np.mean(every[:, MASKED])),
                "generated_tokens": int(every[:, LENGTH].sum())}
        # what the verdicts look like: mean lengths of correct and of wrong (judged, not correct) samples,
        # and the share of the trained groups in which the real reward (against the true references) is
        # flat — the trained reward never is under dynamic sampling, a control's may be
        correct, wrong = every[:, CORRECT] == 1, (every[:, JUDGED] == 1) & (every[:, CORRECT] == 0)
        info["length_correct"] = float(np.mean(every[correct, LENGTH])) if correct.any() else None
        info["length_wrong"] = float(np.mean(every[wrong, LENGTH])) if wrong.any() else None
        info["zero_variance_kept"] = float(np.mean([_flat(row, REAL_REWARD) for row in kept_table])) if len(kept_table) else None
        if c.control != "none":  # what was trained on (reward_mean) against what the real reward would have been
            info["real_reward_mean"] = float(np.mean(every[:, REAL_REWARD]))
        if rate is not None:  # the Bernoulli rate of the step's last draw
            info["random_reward_p"] = rate
        if self.scorer is not None:  # the reward's two parts, apart
            info["verifier_reward_mean"] = float(np.mean(every[:, VERIFIER_REWARD]))
            info["rm_score_mean"] = float(np.mean(every[:, RM_SCORE]))
        return own, kept_table, info, sorted(mine.items(), key=lambda kv: kv[0])

    def _set_advantages(self, own: list[tuple[int, list[Sample]]], kept_table: np.ndarray) -> None:
        """Advantages of the global kept groups (every rank computes all of them, the same way),
        written into this rank's samples."""
        if not len(kept_table):
            return
        rewards = torch.tensor(kept_table[..., REWARD], dtype=torch.float64)
        valid = torch.tensor(kept_table[..., MASKED] == 0)
        if self.cfg.adv_estimator == "rloo":
            self._write_advantages(own, rloo_advantages(rewards, valid).tolist())
            return
        # masked samples do not enter the group statistics: give them the group mean of the rest
        means = torch.stack([r[v].mean() if v.any() else torch.tensor(0.0, dtype=torch.float64) for r, v in zip(rewards, valid)])
        filled = torch.where(valid, rewards, means[:, None])
        self._write_advantages(own, advantages(filled, self.cfg.adv_std).tolist())

    @staticmethod
    def _write_advantages(own: list[tuple[int, list[Sample]]], adv: list[list[float]]) -> None:
        for k, g in own:
            for s, v in zip(g, adv[k]):
                s.advantage = 0.0 if s.masked else v

    def _logps(self, model, samples: list[Sample]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(log-probs of the completion tokens, response mask, entropy, the engine's log-probs of the same tokens)."""
        inputs, targets, mask, rollout = sequence_batch(samples)
        # the policy being optimized is the one that sampled: softmax(z / T), as TRL and verl do, over the
        # ids the engine samples from — the head's padding rows (model/config.py padded_vocab) are never
        # sampled, and their share of a softmax over all rows (~0.4% in test_rl.py's tiny model) showed as
        # a gap of ~4e-3 nats to the engine's log-probs
        logits = model(inputs.to(self.device))[..., : model.cfg.vocab_size].float() / self.cfg.temperature
        logp_all = F.log_softmax(logits, -1)
        logp = logp_all.gather(-1, targets.clamp_min(0).to(self.device)[..., None])[..., 0]
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        return logp, mask.to(self.device), entropy, rollout.to(self.device)

    def _train(self, own: list[tuple[int, list[Sample]]], kept_table: np.ndarray) -> dict:
        """μ optimizer steps on the kept groups. The normalizers of --loss-agg are the global batch's
        (sequences and tokens of all ranks), each rank backpropagates its samples' share of that
        loss, and the gradients are summed over ranks before clipping: the update of one process."""
        c, d = self.cfg, self.dist
        samples = [s for _, g in own for s in g if not s.masked]
        valid = kept_table[..., MASKED] == 0
        n_seqs, n_tokens = int(valid.sum()), int(kept_table[..., LENGTH][valid].sum())
        if not n_seqs:
            return {"updates": 0}
        with torch.no_grad():
            # with one pass the policy that sampled is the one being trained: π_old = π (detached), so
            # the extra forward is skipped (TRL does the same); with μ > 1 it must be kept
            old = [self._logps(self.model, samples[i : i + c.micro_batch])[0]
                   for i in range(0, len(samples), c.micro_batch)] if c.epochs > 1 else None
            with adapters_off(self.model) if self.reference is self.model else nullcontext():
                ref = [self._logps(self.reference, samples[i : i + c.micro_batch])[0]
                       for i in range(0, len(samples), c.micro_batch)] if self.reference else None
        stats = {"clip_frac": 0.0, "ratio_gt2": 0.0, "kl_ref": 0.0, "entropy": 0.0}
        gap = {"logprob_gap_mean": 0.0, "is_weight_mean": 0.0, "capped": 0.0}  # sums over the first pass, / n_tokens
        gap_max = 0.0
        grad_norm = 0.0
        lr = set_lr(self.opt, self.lr())
        self.model.train()
        for epoch in range(c.epochs):
            for b, i in enumerate(range(0, len(samples), c.micro_batch)):
                part = samples[i : i + c.micro_batch]
                logp, mask, entropy, rollout_logp = self._logps(self.model, part)
                adv = torch.tensor([s.advantage for s in part], device=self.device)[:, None]
                old_logp = old[b] if old is not None else logp.detach()
                # with --ratio-level sequence, zero_grad and ratio are the response's, at each of its tokens:
                # clip_frac is then the share of tokens whose response was clipped
                objective, zero_grad, ratio = clipped_surrogate(logp, old_logp, adv, c.clip_low, c.clip_high,
                                                                c.ratio_level, mask)
                # π_old is the policy that sampled, as the trainer computes it: its gap to the engine's log-probs,
                # and (--is-correction) the weights of the policy-gradient term. π_old is the same in every pass:
                # the gap is counted in the first
                weight, ws = importance_weights(old_logp, rollout_logp, c.is_correction, c.is_cap, mask)
                if epoch == 0:
                    gap["logprob_gap_mean"] += ws["gap_sum"] / n_tokens
                    gap["is_weight_mean"] += ws["weight_sum"] / n_tokens
                    gap["capped"] += ws["capped"] / n_tokens
                    gap_max = max(gap_max, ws["gap_max"])
                kl = kl_estimate(logp, ref[b], c.kl) if ref is not None else None
                if kl is not None:
                    stats["kl_ref"] += float((kl.detach() * mask).sum()) / n_tokens / c.epochs
                per_token = per_token_loss(objective, weight if c.is_correction != "none" else None, kl, c.kl_coef)
                loss = aggregate(per_token, mask, c.loss_agg, n_seqs, n_tokens, c.max_new_tokens)
                loss.backward()
                stats["clip_frac"] += float((zero_grad * mask).sum()) / n_tokens / c.epochs
                stats["ratio_gt2"] += float(((ratio > 2) * mask).sum()) / n_tokens / c.epochs
                stats["entropy"] += float((entropy.detach() * mask).sum()) / n_tokens / c.epochs
            distributed.all_reduce_grads(self.params, d)  # Σ over ranks of each rank's share = the batch gradient
            norm = torch.nn.utils.clip_grad_norm_(self.params, c.grad_clip)
            grad_norm = float(norm)
            if torch.isfinite(norm):
                self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        stats = dict(zip(stats, distributed.all_reduce_sum(list(stats.values()), d)))
        gap = dict(zip(gap, distributed.all_reduce_sum(list(gap.values()), d)))  # every rank's tokens: the batch's
        stats["logprob_gap_mean"] = gap["logprob_gap_mean"]
        stats["logprob_gap_max"] = distributed.all_reduce_max([gap_max], d)[0]
        if c.is_correction != "none":
            stats["is_weight_mean"] = gap["is_weight_mean"]
            stats["is_truncated_frac" if c.is_correction == "tis" else "is_masked_frac"] = gap["capped"]
        stats["grad_norm"], stats["lr"] = grad_norm, lr
        stats["updates"] = c.epochs
        stats["trained_samples"], stats["trained_tokens"] = n_seqs, n_tokens
        return stats

    def lr(self) -> float:
        """The rate of the step being taken (self.state["step"] counts the steps already done)."""
        c = self.cfg
        return lr_at(self.state["step"] + 1, peak=c.lr, total=c.steps, warmup=c.warmup_steps, schedule=c.schedule)

    # -- the loop ----------------------------------------------------------------------------

    def run(self) -> Manifest:
        c, d = self.cfg, self.dist
        started = time.perf_counter()
        self.run_dir.write_json("config.json", {
            "rl": asdict(c), "init": str(self.init_ckpt), "init_weights": self.init_weights,
            "prompts": self.prompts_file, "eval": self.eval_file,
            "chat": self.chat, "world_size": d.world, "llmctl_version": __version__})
        if d.is_main:
            self.rollouts.directory.mkdir(exist_ok=True)
        with self.run_dir.metrics(self.state["step"]) as metrics:
            last_eval = self._loop(metrics)
        counts = {"steps": self.state["step"], "prompts_drawn": self.state["prompt_position"]}
        if c.control != "none":  # a control run says so in its manifest (lineage nodes carry counts)
            counts["control"] = c.control
            if self.running is not None:
                counts["random_reward_p"] = round(self.running.mean(), 6)
            if self.scored_against is not None:  # prompts whose stand-in reference equals their own
                counts["shuffled_same_reference"] = sum(same_reference(ref, prompt["reference"])
                                                        for ref, prompt in zip(self.scored_against, self.prompts))
        if hr := self.state.get("headroom"):
            counts.update({f"headroom_{k}": v for k, v in hr.items() if k not in ("temperature", "top_p")})
        if last_eval:
            counts.update({"eval_accuracy": round(last_eval["mean"], 6), "eval_ci_low": round(last_eval["ci_low"], 6),
                           "eval_ci_high": round(last_eval["ci_high"], 6), "eval_n": last_eval["n"]})
        inputs = [input_ref(self.init_ckpt.parent.parent if self.init_ckpt.parent.name == "checkpoints" else self.init_ckpt),
                  input_ref(self.prompts_file)]
        return self.run_dir.finish(Manifest(kind="run", stage="rl", config=asdict(c), inputs=inputs,
                                            counts=counts, wall_seconds=round(time.perf_counter() - started, 3)))

    def _loop(self, metrics) -> dict | None:
        """The steps still to run (an evaluation first on a fresh run); returns the last evaluation."""
        c = self.cfg
        if self.state["step"] == 0 and self.held_out:
            rec = self.held_out.step_zero(self.on_log)
            if "headroom" in rec:
                self.state["headroom"] = rec["headroom"]  # kept in the checkpoints: a resumed run's manifest still has it
            metrics.log({**rec, **self._control_field()})
        last_eval = None
        while self.state["step"] < c.steps:
            step = self.state["step"]
            t0 = time.perf_counter()
            own, kept_table, info, sampled = self._collect(step)
            t1 = time.perf_counter()
            self._set_advantages(own, kept_table)
            t2 = time.perf_counter()
            stats = self._train(own, kept_table)
            t3 = time.perf_counter()
            self.state["step"] += 1
            gen_tokens = info.pop("generated_tokens")
            rec = {"step": self.state["step"], **self._control_field(), **{k: _logged(v) for k, v in {**info, **stats}.items()},
                   "groups_trained": len(kept_table), "generate_s": round(t1 - t0, 3), "score_s": round(t2 - t1, 3),
                   "train_s": round(t3 - t2, 3), "tokens_per_s": round(gen_tokens / max(1e-9, t3 - t0), 1)}
            self.rollouts.write(sampled, self.state["step"])
            if self.held_out and c.eval_every and (self.state["step"] % c.eval_every == 0 or self.state["step"] == c.steps):
                rec["eval"] = last_eval = self.held_out.evaluate()
            metrics.log(rec)
            self.on_step(rec)
            if self.state["step"] % c.checkpoint_every == 0 or self.state["step"] == c.steps:
                self._checkpoint()
        return last_eval

    def _control_field(self) -> dict:
        """{"control": name} on every metrics line of a control run; nothing in a real one."""
        return {"control": self.cfg.control} if self.cfg.control != "none" else {}

    def _checkpoint(self) -> None:
        # sampling is seeded by (seed, step, position) and prompts by (seed, position): no RNG state to carry
        state, extra = self.model.state_dict(), None
        if self.lora_base is not None:  # LoRA: the adapters alone, and the base they sit on
            state = {k: v for k, v in state.items() if is_adapter(k)}
            extra = {LORA_FILE: {"lora": self.cfg.lora.to_dict(), "base": self.lora_base}}
        self.run_dir.checkpoint(self.state["step"], self.model.cfg, state,
                                {**self.state, "seed": self.cfg.seed}, optimizer_state=self.opt.state_dict(),
                                tokenizer_file=self.tokenizer_file, keep_last=self.cfg.keep_checkpoints, extra_json=extra)


def _flat(row: np.ndarray, column: int) -> bool:
    """A group whose unmasked samples' values in `column` are all equal (or fewer than 2): no advantage."""
    values = row[row[:, MASKED] == 0, column]
    return bool(len(values) < 2 or values.max() == values.min())


def _logged(v):
    """A metric as metrics.jsonl holds it: a float to 6 decimals, or to 6 significant digits below 1e-3
    (the log-prob gap of an fp32 engine is ~1e-7, which 6 decimals would log as 0)."""
    if not isinstance(v, float):
        return v
    return float(f"{v:.6g}") if abs(v) < 1e-3 else round(v, 6)


def run_rl(init: str, prompts: str, out: Path, cfg: RLConfig, **kw) -> Manifest:
    """`llmctl rl` (under torchrun: in its process group, torn down after the run, or after the
    trainer's set-up fails)."""
    with rundir.lock(out):
        d = distributed.init(cfg.device)  # the run's one init; outside torchrun it only picks the device
        with distributed.session(d):
            return RLTrainer(init, prompts, out, cfg, d, **kw).run()
