"""Rollouts: G sampled completions per prompt from the shared generation engine, scored by a
verifier, and the file each step's rollouts are written to (RolloutWriter).

A completion cut at max_new_tokens is `truncated`; by default it is masked out of the loss (DAPO's
overlong filtering, spec 001-posttrain-rl §A5: "masked truncation"), with `--truncated zero` it
keeps reward 0. A verifier's infrastructure failure is also masked, never scored 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from llmctl.artifacts.atomic import atomic_path
from llmctl.errors import UsageError
from llmctl.model.generate import Engine, EngineConfig, Generation, SamplingParams, row_seed
from llmctl.tasks.base import Family
from llmctl.torchrt import distributed


@dataclass
class Sample:
    prompt_index: int
    group: int
    prompt_ids: list[int]
    completion_ids: list[int]  # what is trained on: the generated ids, plus the end id when the model stopped
    text: str
    reward: float
    correct: bool | None
    masked: bool  # out of the loss: truncated (mask mode) or unverifiable
    truncated: bool
    # the engine's log p of each completion id as it sampled it (log softmax(z / T), Generation.policy_logprobs):
    # what the trainer's own log-probs are compared with (the rollout/trainer gap, --is-correction)
    rollout_logprobs: list[float]
    advantage: float = 0.0
    verifier_reward: float = 0.0  # the verifier's part of `reward`
    rm_score: float | None = None  # the reward model's score (rl --reward-model), before its coefficient
    # the reward against the prompt's own reference; `reward` differs from it only in a control run
    # (rl --control: a random reward, or the verdict against another prompt's reference)
    real_reward: float = 0.0


class Prompter:
    """How a prompt becomes ids: the chat template for chat (SFT/RL or imported instruct)
    checkpoints; else the plain prompt of the task family that read the prompts (`families`, one
    per prompt, tasks/registry.read_prompts), whose stop strings then end a generation too: GSM8K's
    "Question: …\\nAnswer:" for {prompt | question, answer} records, MATH's "Problem: …\\nAnswer:"
    for MATH's. Generation always stops at the vocabulary's stop ids. A plain prompt needs one
    family: prompts read by several (named by `source`, their file) are refused."""

    def __init__(self, vocab, chat: bool, families: Sequence[Family], source: str = "the prompt file"):
        self.vocab, self.chat = vocab, chat
        self.template = vocab.require_chat() if chat else None
        self.family = None if chat else _one_family(families, source)
        self.stop = () if chat else self.family.stop

    def ids(self, prompt: str) -> list[int]:
        if self.template is not None:
            return self.template.prompt_ids([{"role": "user", "content": prompt}])
        return self.vocab.prompt_ids(self.family.rl_plain_prompt(prompt))

    def engine(self, model, config: EngineConfig) -> Engine:
        return Engine.for_vocab(model, self.vocab, self.chat, config)


def _one_family(families: Sequence[Family], source: str) -> Family:
    by_name = {f.name: f for f in families}
    if len(by_name) != 1:
        raise UsageError(f"rl: {source} holds prompts of {len(by_name)} task families ({', '.join(by_name)}); a checkpoint "
                         "without a chat template is given its family's plain prompt and stop strings, so one family per file")
    return next(iter(by_name.values()))


def sample_groups(engine: Engine, prompter: Prompter, prompts: list[dict], indices: list[int], G: int,
                  params: SamplingParams, verifier, truncated: str, seeds: list[int] | None = None,
                  scorer=None, coefs: tuple[float, float] = (1.0, 1.0),
                  scored_against: list | None = None) -> list[list[Sample]]:
    """One group of G samples for each prompt in `indices` (prompts[i] = {prompt, reference}).
    With a reward model's `scorer` (train/reward_model.py RewardScorer), reward = coefs[0] · the
    verifier's reward + coefs[1] · the RM's score of (prompt, completion text).

    `scored_against` (rl --control shuffled-answers): the reference each prompt's reward is verified
    against instead of its own (scored_against[i] for prompts[i]); `correct` and `real_reward` stay
    the verdict against its own, so accuracy is still the real one.

    With `seeds` (one per prompt) sample j of prompt k draws from its own generator, seeded by
    (seeds[k], j): the group is the same whichever other prompts share the generation batch."""
    ids = [prompter.ids(prompts[i]["prompt"]) for i in indices]
    rows = None if seeds is None else [row_seed(s, j) for s in seeds for j in range(G)]
    gens: list[Generation] = engine.generate([p for p in ids for _ in range(G)], params, seeds=rows)
    scores = None
    if scorer is not None:
        scores = scorer.score([prompts[i]["prompt"] for i in indices for _ in range(G)], [gen.text for gen in gens])
    groups = []
    for g, i in enumerate(indices):
        group = []
        for j, gen in enumerate(gens[g * G : (g + 1) * G]):
            verdict = verifier.verify(gen.text, prompts[i]["reference"])
            paid = verdict if scored_against is None else verifier.verify(gen.text, scored_against[i])
            is_trunc = gen.truncated
            masked = verdict.masked or paid.masked or (is_trunc and truncated == "mask")
            rm = None if scores is None else float(scores[g * G + j])
            zeroed = is_trunc and truncated == "zero"
            completion = gen.ids + ([gen.stop_id] if gen.finish == "eos" else [])
            group.append(Sample(i, g, gen.prompt_ids, completion, gen.text, _reward(paid, rm, coefs, zeroed), verdict.correct,
                                masked, is_trunc, list(gen.policy_logprobs), verifier_reward=float(paid.reward), rm_score=rm,
                                real_reward=_reward(verdict, rm, coefs, zeroed)))
        groups.append(group)
    return groups


def _reward(verdict, rm: float | None, coefs: tuple[float, float], zeroed: bool) -> float:
    """coefs[0] · the verdict's reward + coefs[1] · the RM's score; 0 for a truncated sample under --truncated zero."""
    if zeroed:
        return 0.0
    return coefs[0] * float(verdict.reward) + (coefs[1] * rm if rm is not None else 0.0)


def sequence_batch(samples: list[Sample], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (inputs, targets, response mask, rollout log-probs) for a list of samples:
    targets are the next tokens, -100 outside the completion; the mask is 1 where a completion token
    is predicted; the rollout log-probs (the engine's, float32) sit where their tokens are targets,
    0 elsewhere."""
    seqs = [s.prompt_ids + s.completion_ids for s in samples]
    width = max(len(s) for s in seqs) - 1
    inputs = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    targets = torch.full((len(seqs), width), -100, dtype=torch.long)
    rollout = torch.zeros((len(seqs), width), dtype=torch.float32)
    for r, (s, seq) in enumerate(zip(samples, seqs)):
        if len(s.rollout_logprobs) != len(s.completion_ids):
            raise ValueError(f"rl: a sample has {len(s.rollout_logprobs)} rollout log-probs for {len(s.completion_ids)} "
                             "completion ids (the engine's policy_logprobs must align with them)")
        inputs[r, : len(seq) - 1] = torch.tensor(seq[:-1])
        start = len(s.prompt_ids) - 1  # logits at this position predict the first completion token
        targets[r, start : len(seq) - 1] = torch.tensor(seq[start + 1 :])
        rollout[r, start : len(seq) - 1] = torch.tensor(s.rollout_logprobs, dtype=torch.float32)
    return inputs, targets, (targets != -100).float(), rollout


class RolloutWriter:
    """rollouts/step-N.parquet: one row per sample of the step (its prompt, completion, reward,
    verdict, advantage, length, truncated, masked; in a control run also `real_reward`, the reward
    against its own reference that `reward` stands in for), written by rank 0 alone."""

    def __init__(self, directory: Path, prompts: list[dict], dist: distributed.Dist, control: bool = False):
        self.directory, self.prompts, self.dist, self.control = directory, prompts, dist, control

    def write(self, sampled: list[tuple[tuple[int, int], list[Sample]]], step: int) -> None:
        """One file for the step on rank 0: every rank's groups, in (draw, slot) order as one process writes them."""
        rows = [(key, [{"step": step, "prompt_index": s.prompt_index, "prompt": self.prompts[s.prompt_index]["prompt"],
                        "completion": s.text, "reward": s.reward, "correct": s.correct, "advantage": s.advantage,
                        "length": len(s.completion_ids), "truncated": s.truncated, "masked": s.masked,
                        **({"verifier_reward": s.verifier_reward, "rm_score": s.rm_score} if s.rm_score is not None else {}),
                        **({"real_reward": s.real_reward} if self.control else {})}
                       for s in g])
                for key, g in sampled]
        gathered = distributed.gather_objects(rows, self.dist)
        if gathered is None:
            return
        ordered = sorted((item for part in gathered for item in part), key=lambda kv: kv[0])
        table = pa.Table.from_pylist([r for _, group in ordered for r in group])
        with atomic_path(self.directory / f"step-{step:06d}.parquet") as tmp:
            pq.write_table(table, tmp)
