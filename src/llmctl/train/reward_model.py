"""`llmctl train-rm CKPT --pairs FILE -o RM`: a Bradley–Terry reward model on preference pairs
(train/pairs.py), as a batch source of the training loop (train/trainer.py): checkpoints, bitwise
resume, torchrun, the manifest and the run lock are the loop's.

The model (model/reward.py) is the --init checkpoint's decoder with a scalar head on the
final-norm hidden state of the last token of prompt + completion (the completion's turn end),
rendered through the checkpoint's chat template. Loss per pair: −log σ(r_c − r_r − m), m the
record's `margin` (0 when absent; Llama 2's margin loss, Touvron et al. 2023), the
Bradley–Terry likelihood (InstructGPT, Ouyang et al. 2022). Metrics per step (metrics.jsonl; TRL
RewardTrainer's names in brackets): loss; pref_accuracy [accuracy], the share of pairs with
r_c > r_r; reward_margin [margin], the mean r_c − r_r; reward_chosen / reward_rejected [mean
rewards]. The held-out pairs' accuracy is validated during the run and is the manifest's
val_pref_accuracy.

The RM checkpoint is read back by `load_reward_model`, a RewardScorer whose score(prompts,
completions) gives one float per pair of a prompt (a string or messages) and a completion.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

from llmctl.errors import UsageError
from llmctl.model.reward import SCORE, RewardModel
from llmctl.train.pairs import PairData, PairOptions, encode_side, pair_rows, resolve_init
from llmctl.train.trainer import fit

STATS = ("reward_chosen", "reward_rejected", "pref_accuracy")


def bt_loss(r_chosen: torch.Tensor, r_rejected: torch.Tensor, margin: torch.Tensor | None = None) -> torch.Tensor:
    """Per-pair Bradley–Terry loss −log σ(r_c − r_r − m)."""
    d = r_chosen - r_rejected
    return -F.logsigmoid(d if margin is None else d - margin)


class RMData(PairData):
    """The pairs as the loop's batch source for a reward model."""

    stage = "train-rm"

    def __init__(self, opts: PairOptions, seq_len: int, seed: int, on_log=lambda m: None):
        super().__init__(opts, seq_len, seed, on_log)
        self._sums = [0.0] * (len(STATS) + 1)
        self._dist = None

    @staticmethod
    def build_model(cfg) -> RewardModel:
        return RewardModel(cfg)

    @staticmethod
    def init_tensors(model, tensors: dict) -> dict:
        """A language model's checkpoint starts the decoder; the head is the seeded one just built.
        An RM checkpoint given as --init keeps its own head."""
        return tensors if SCORE in tensors else {**tensors, SCORE: model.score.weight.detach().clone()}

    def checkpoint_state(self) -> dict:
        return {"reward_model": True, "chat_template": self.template.name}

    def _rows(self, idx):
        pairs = self.pairs_at(idx)
        x, _, last = pair_rows(pairs, self.template.pad_id, shift=False)
        return x, last, torch.tensor([p.margin for p in pairs], dtype=torch.float32)

    def batch(self, step: int, batch_seqs: int, micro: int, dist):
        """Micro-batches (inputs, last index, margin); each backpropagates its summed pair loss ·
        world / B_global, so the gradient is the global batch's mean."""
        self._dist, self._sums = dist, [0.0] * (len(STATS) + 1)
        out = [self._rows(idx) for idx in self.train_pairs(step, batch_seqs, micro, dist)]
        return out, [dist.world / batch_seqs] * len(out), None

    def pair_stats(self, model, batch):
        x, last, margin = batch
        b = x.shape[0] // 2
        r = model(x, last)
        losses = bt_loss(r[:b], r[b:], margin)
        with torch.no_grad():
            stats = {"reward_chosen": r[:b].sum(), "reward_rejected": r[b:].sum(),
                     "pref_accuracy": (r[:b] > r[b:]).float().sum()}
        return losses, stats, r.detach().abs().max()

    def loss(self, model, batch, z_loss: float):
        losses, stats, top = self.pair_stats(model, batch)
        self._sums = [a + v for a, v in zip(self._sums, [float(len(losses)), *(float(stats[k]) for k in STATS)])]
        total = losses.sum()
        return total, total.detach(), top

    STATS = STATS

    def val_batch(self, idx: list[int], dist, micro: int) -> tuple:
        return tuple(t.to(dist.device) for t in self._rows(idx))



def run_train_rm(pairs: Path, init: Path, out: Path, cfg, val_fraction: float = 0.0, epochs: float = 1.0,
                 weights: str = "auto", on_log=None, **kw):
    """`llmctl train-rm CKPT --pairs FILE -o RM`: `epochs` over the training pairs (cfg.max_tokens
    follows; cfg.max_steps may stop earlier). The trainer's other keywords pass through."""
    from llmctl.train.dpo import steps_for

    cfg.check()
    init, tokenizer, model_cfg = resolve_init(init, "train-rm")
    data = RMData(PairOptions(Path(pairs), init, tokenizer, val_fraction, weights), cfg.seq_len, cfg.seed,
                  on_log or (lambda m: None))
    cfg = replace(cfg, max_tokens=steps_for(epochs, len(data.train_idx), cfg) * cfg.batch_tokens)
    return fit(data, Path(out), model_cfg, cfg, on_log=on_log, **kw)


class RewardScorer:
    """A trained reward model as a function: score(prompts, completions) → one float each."""

    def __init__(self, model: RewardModel, template, path: Path, device: torch.device, micro: int = 16):
        self.model, self.template, self.path, self.device, self.micro = model, template, path, device, micro

    @torch.no_grad()
    def score(self, prompts: list, completions: list[str]) -> list[float]:
        """Rewards of each prompt (a string: one user message; or a message list ending with the
        user's turn) answered by its completion, rendered as in training (the last token read)."""
        if len(prompts) != len(completions):
            raise UsageError(f"score: {len(prompts)} prompts for {len(completions)} completions")
        out: list[float] = []
        for i in range(0, len(prompts), self.micro):
            rows = []
            for p, c in zip(prompts[i:i + self.micro], completions[i:i + self.micro]):
                prompt = [{"role": "user", "content": p}] if isinstance(p, str) else list(p)
                rows.append(encode_side(self.template, prompt, [{"role": "assistant", "content": c}])[0])
            width = max(len(r) for r in rows)
            x = torch.full((len(rows), width), self.template.pad_id, dtype=torch.long)
            for j, r in enumerate(rows):
                x[j, :len(r)] = torch.tensor(r)
            last = torch.tensor([len(r) - 1 for r in rows])
            out.extend(self.model(x.to(self.device), last.to(self.device)).tolist())
        return out


def load_reward_model(path: str | Path, device: str | torch.device = "cpu", weights: str = "auto") -> RewardScorer:
    """The reward model of a `train-rm` checkpoint (run dir, checkpoints/ or step dir)."""
    from llmctl.model.load import apply_weights, load_checkpoint
    from llmctl.tokenizer.vocab import Vocab

    ck = load_checkpoint(path, weights)
    if SCORE not in ck.tensors:
        raise UsageError(f"{ck.path}: not a reward model (no {SCORE}; train one with `llmctl train-rm`)")
    if ck.tokenizer_file is None:
        raise UsageError(f"{ck.path}: the checkpoint has no tokenizer.json")
    model = RewardModel(ck.config)
    apply_weights(model, ck.tensors, ck.path)
    device = torch.device(device)
    return RewardScorer(model.to(device).eval(), Vocab(ck.tokenizer_file).require_chat(), ck.path, device)
