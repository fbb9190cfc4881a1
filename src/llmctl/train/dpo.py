"""`llmctl dpo CKPT --pairs FILE`: direct preference optimization on {prompt, chosen, rejected}
pairs (train/pairs.py), as a batch source of the training loop (train/trainer.py), so checkpoints,
bitwise resume, torchrun, the manifest and the run lock are the loop's.

Log-probabilities. log π(y|x) is the sum of the completion's token log-probs (the assistant tokens
after the prompt, through the chat template); both sides of a pair go through one forward (2·B
rows, chosen then rejected). The reference π_ref is the --init checkpoint, frozen: its log-probs
of every pair are computed once, before the first step, and cached in the run directory
(ref_logps.json), which a resumed run reads instead of recomputing. (Under LoRA the reference is
the same weights: the base the adapters start on.)

Losses, with h = (log π(y_c) − log π_ref(y_c)) − (log π(y_r) − log π_ref(y_r)):
- sigmoid: −log σ(β·h) (Rafailov et al. 2023, "Direct Preference Optimization"; β = 0.1 there).
- ipo: (h − 1/(2β))², the log-probs averaged over each completion's tokens (Azar et al. 2023,
  "A General Theoretical Paradigm to Understand Learning from Human Preferences"; TRL averages too).
- simpo: −log σ(β·(ℓ_c − ℓ_r) − γ), ℓ the length-averaged log π, no reference (Meng et al. 2024,
  "SimPO: Simple Preference Optimization with a Reference-Free Reward"; β = 2.0, γ = 0.5·β there).

Metrics per step (metrics.jsonl; the TRL DPOTrainer names in brackets): loss; reward_chosen
[rewards/chosen] and reward_rejected [rewards/rejected], the implicit rewards β·(log π − log π_ref)
(SimPO: β·ℓ); reward_margin [rewards/margins], their difference; pref_accuracy
[rewards/accuracies], the share of pairs whose chosen reward is the higher; chosen_logps
[logps/chosen] and rejected_logps [logps/rejected], log π; implicit_kl (no TRL name), the mean
sequence log-ratio log π − log π_ref over both sides: how far the policy has moved from the
reference on the pairs' completions (a KL estimate only where the completions are its own samples).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from llmctl.errors import UsageError
from llmctl.torchrt import distributed
from llmctl.train.pairs import PairData, PairOptions, pair_rows, resolve_init
from llmctl.train.trainer import fit

LOSSES = ("sigmoid", "ipo", "simpo")
DEFAULT_BETA = {"sigmoid": 0.1, "ipo": 0.1, "simpo": 2.0}  # DPO, IPO (TRL's default τ), SimPO papers
SIMPO_GAMMA_RATIO = 0.5  # SimPO paper: γ/β = 0.5
REF_FILE = "ref_logps.json"
STATS = ("chosen_logps", "rejected_logps", "reward_chosen", "reward_rejected", "pref_accuracy", "implicit_kl")


@dataclass
class DPOSettings:
    loss: str = "sigmoid"
    beta: float | None = None  # None: the loss's paper value (DEFAULT_BETA)
    gamma: float | None = None  # simpo's target margin; None: SIMPO_GAMMA_RATIO · β

    def resolved(self) -> DPOSettings:
        if self.loss not in LOSSES:
            raise UsageError(f"dpo: --loss must be one of {', '.join(LOSSES)}, got {self.loss!r}")
        beta = DEFAULT_BETA[self.loss] if self.beta is None else self.beta
        if not (math.isfinite(beta) and beta > 0):
            raise UsageError(f"dpo: --beta must be a positive number, got {beta}")
        if self.gamma is not None and self.loss != "simpo":
            raise UsageError("dpo: --gamma is SimPO's margin; it goes with --loss simpo")
        gamma = (SIMPO_GAMMA_RATIO * beta if self.gamma is None else self.gamma) if self.loss == "simpo" else None
        if gamma is not None and not math.isfinite(gamma):
            raise UsageError(f"dpo: --gamma must be a finite number, got {gamma}")
        return DPOSettings(self.loss, beta, gamma)

    @property
    def uses_reference(self) -> bool:
        return self.loss != "simpo"

    @property
    def length_normalized(self) -> bool:
        return self.loss in ("ipo", "simpo")


def preference_loss(s: DPOSettings, chosen: torch.Tensor, rejected: torch.Tensor,
                    ref_chosen: torch.Tensor | None = None, ref_rejected: torch.Tensor | None = None):
    """(per-pair loss, chosen reward, rejected reward) from the policy's log-probs of each side
    (summed, or for ipo/simpo averaged over the completion's tokens) and the reference's (the
    same reduction; unused by simpo). `s` resolved (DPOSettings.resolved)."""
    if s.loss == "simpo":
        r_c, r_r = s.beta * chosen, s.beta * rejected
        return -F.logsigmoid(r_c - r_r - s.gamma), r_c, r_r
    r_c, r_r = s.beta * (chosen - ref_chosen), s.beta * (rejected - ref_rejected)
    h = (chosen - ref_chosen) - (rejected - ref_rejected)
    if s.loss == "ipo":
        return (h - 1 / (2 * s.beta)) ** 2, r_c, r_r
    return -F.logsigmoid(s.beta * h), r_c, r_r


def sequence_logps(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(Σ log p of the targets ≠ −100 per row, their count per row), in fp32."""
    nll = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-100, reduction="none")
    mask = targets != -100
    return -(nll.view_as(targets) * mask).sum(-1), mask.sum(-1)


class DPOData(PairData):
    """The pairs as the loop's batch source, with the frozen reference's cached log-probs."""

    stage = "dpo"
    run_files = (REF_FILE,)  # what --overwrite removes beside the loop's own entries

    def __init__(self, opts: PairOptions, settings: DPOSettings, seq_len: int, seed: int, dtype: str, out: Path,
                 vocab_rows: int, on_log=lambda m: None):
        super().__init__(opts, seq_len, seed, on_log)
        self.s, self.dtype, self.out, self.seq_len = settings.resolved(), dtype, Path(out), seq_len
        # log-probs over the model's vocabulary rows, not the padding rows past them (which export
        # leaves out: the same numbers as the exported model in transformers)
        self.logit_rows = vocab_rows
        self.ref: torch.Tensor | None = None  # (n pairs, 2) float64: reference Σ log p of chosen, rejected
        self._sums = [0.0] * (len(STATS) + 1)
        self._dist = None

    def settings(self) -> dict:
        return {"loss": self.s.loss, "beta": self.s.beta, **({"gamma": self.s.gamma} if self.s.loss == "simpo" else {})}

    def checkpoint_state(self) -> dict:
        return {"chat": True, "chat_template": self.template.name}  # eval, generate and rl read it

    # -- the reference ---------------------------------------------------------------------------

    def _ref_key(self) -> dict:
        from llmctl.artifacts.manifest import input_identity, input_ref

        return {"pairs": input_identity(input_ref(self.opts.pairs)), "init": str(self.opts.init),
                "weights": self.opts.weights, "seq_len": self.seq_len, "dtype": self.dtype, "n": len(self.all)}

    def reference(self, dist, micro: int) -> torch.Tensor:
        """The reference log-probs of every pair: from the run's cache when it is this run's, else
        computed (each rank its share, `micro` pairs a forward, summed) and cached by rank 0."""
        if self.ref is not None or not self.s.uses_reference:
            return self.ref
        path = self.out / REF_FILE
        key = self._ref_key()
        if path.is_file():
            try:
                doc = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                doc = {}
            if doc.get("key") == key and len(doc.get("logps", ())) == len(self.all):
                self.ref = torch.tensor(doc["logps"], dtype=torch.float64)
                self.on_log(f"reference log-probs of {len(self.all):,} pairs from {path}")
                return self.ref
        self.ref = reference_logps(self.opts.init, self.opts.weights, self.all.pairs, self.template.pad_id,
                                   dist, self.dtype, micro)
        if dist.is_main:
            from llmctl.artifacts.atomic import write_text

            write_text(path, json.dumps({"key": key, "logps": self.ref.tolist()}))
        self.on_log(f"reference log-probs of {len(self.all):,} pairs computed with {self.opts.init}, cached in {path}")
        return self.ref

    # -- the loop's side -------------------------------------------------------------------------

    def batch(self, step: int, batch_seqs: int, micro: int, dist):
        """Micro-batches (inputs, targets, reference log-probs (B, 2)); each backpropagates its
        summed pair loss · world / B_global, so the gradient is the global batch's mean."""
        ref = self.reference(dist, micro)
        self._dist, self._sums = dist, [0.0] * (len(STATS) + 1)
        out = []
        for idx in self.train_pairs(step, batch_seqs, micro, dist):
            x, y, _ = pair_rows(self.pairs_at(idx), self.template.pad_id)
            r = ref[idx] if ref is not None else torch.zeros(len(idx), 2, dtype=torch.float64)
            out.append((x, y, r))
        return out, [dist.world / batch_seqs] * len(out), None

    def pair_stats(self, model, batch) -> tuple[torch.Tensor, dict, torch.Tensor]:
        """(per-pair loss, summed statistics of STATS, the max logit) of one micro-batch."""
        x, y, ref = batch
        b = x.shape[0] // 2
        logits = model(x)[..., :self.logit_rows]
        sums, counts = sequence_logps(logits, y)
        ref = ref.to(sums.dtype)
        lp_c, lp_r, ref_c, ref_r = sums[:b], sums[b:], ref[:, 0], ref[:, 1]
        if self.s.length_normalized:
            n_c, n_r = counts[:b].clamp(min=1), counts[b:].clamp(min=1)
            lp_c, lp_r, ref_c, ref_r = lp_c / n_c, lp_r / n_r, ref_c / n_c, ref_r / n_r
        losses, r_c, r_r = preference_loss(self.s, lp_c, lp_r, ref_c, ref_r)
        with torch.no_grad():
            kl = ((sums[:b] - ref[:, 0]) + (sums[b:] - ref[:, 1])) / 2 if self.s.uses_reference else torch.zeros(b)
            stats = {"chosen_logps": sums[:b].sum(), "rejected_logps": sums[b:].sum(), "reward_chosen": r_c.sum(),
                     "reward_rejected": r_r.sum(), "pref_accuracy": (r_c > r_r).float().sum(), "implicit_kl": kl.sum()}
        return losses, stats, logits.detach().max()

    def loss(self, model, batch, z_loss: float):
        losses, stats, top = self.pair_stats(model, batch)
        values = [float(stats[k]) for k in STATS]
        self._sums = [a + v for a, v in zip(self._sums, [float(len(losses)), *values])]
        total = losses.sum()
        return total, total.detach(), top

    STATS = STATS

    def means(self, sums: list[float]) -> dict:
        m = super().means(sums)
        if not self.s.uses_reference:  # SimPO: no reference, no implicit KL
            m.pop("implicit_kl")
        return m

    def val_batch(self, idx: list[int], dist, micro: int) -> tuple:
        ref = self.reference(dist, micro)
        x, y, _ = pair_rows(self.pairs_at(idx), self.template.pad_id)
        r = ref[idx] if ref is not None else torch.zeros(len(idx), 2, dtype=torch.float64)
        return x.to(dist.device), y.to(dist.device), r.to(dist.device)


@torch.no_grad()
def reference_logps(init: Path, weights: str, pairs, pad_id: int, dist, dtype: str, micro: int = 16) -> torch.Tensor:
    """(n, 2) float64: Σ log π_ref of each pair's chosen and rejected completion under the frozen
    checkpoint `init`; each rank computes every world-th chunk, and the sum over ranks (zeros
    elsewhere, so exact) gives every rank the whole table."""
    from llmctl.model.load import apply_weights, load_checkpoint, model_config
    from llmctl.model.transformer import Transformer
    from llmctl.torchrt.device import autocast

    ck = load_checkpoint(init, weights)
    model = Transformer(model_config(ck))
    apply_weights(model, ck.tensors, ck.path)
    model.to(dist.device).eval()
    out = torch.zeros(len(pairs), 2, dtype=torch.float64)
    for k, start in enumerate(range(0, len(pairs), micro)):
        if k % dist.world != dist.rank:
            continue
        chunk = pairs[start:start + micro]
        x, y, _ = pair_rows(chunk, pad_id)
        with autocast(dist.device, dtype):
            sums, _ = sequence_logps(model(x.to(dist.device))[..., :model.cfg.vocab_size], y.to(dist.device))
        b = len(chunk)
        out[start:start + b, 0] = sums[:b].double().cpu()
        out[start:start + b, 1] = sums[b:].double().cpu()
    if dist.enabled:
        out = torch.tensor(distributed.all_reduce_sum(out.flatten().tolist(), dist), dtype=torch.float64).view(-1, 2)
    return out


def steps_for(epochs: float, n_pairs: int, cfg) -> int:
    """Optimizer steps for `epochs` passes over n_pairs at cfg's pairs per step (batch_tokens / seq_len)."""
    if not (math.isfinite(epochs) and epochs > 0):
        raise UsageError(f"--epochs must be a positive number, got {epochs}")
    return max(1, math.ceil(epochs * n_pairs / (cfg.batch_tokens // cfg.seq_len)))


def run_dpo(pairs: Path, init: Path, out: Path, cfg, settings: DPOSettings, val_fraction: float = 0.0,
            epochs: float = 1.0, weights: str = "auto", on_log=None, **kw):
    """`llmctl dpo CKPT --pairs FILE -o RUN`: the run's length is `epochs` over the training pairs
    (cfg.max_tokens is set from it; cfg.max_steps may stop it earlier). The trainer's other
    keywords (resume, overwrite, on_step) pass through."""
    cfg.check()
    settings = settings.resolved()  # a bad --loss or --beta before any work
    init, tokenizer, model_cfg = resolve_init(init, "dpo")
    log = on_log or (lambda m: None)
    data = DPOData(PairOptions(Path(pairs), init, tokenizer, val_fraction, weights), settings, cfg.seq_len, cfg.seed,
                   cfg.dtype, Path(out), model_cfg.vocab_size, log)
    cfg = replace(cfg, max_tokens=steps_for(epochs, len(data.train_idx), cfg) * cfg.batch_tokens)
    return fit(data, Path(out), model_cfg, cfg, on_log=on_log, **kw)
