"""`RLConfig`: the settings of an rl run (the `rl` presets under stages/rl/, the command's flags) and
their validation, and the one place the run's generation settings come from (`sampling`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llmctl.artifacts import checkpoint as ckpt_io
from llmctl.errors import UsageError
from llmctl.model.generate import GEN_DTYPES, EngineConfig, SamplingParams
from llmctl.model.lora import LoraConfig
from llmctl.model.recompute import check_mode
from llmctl.rl.controls import CONTROLS
from llmctl.rl.grpo import ADV_ESTIMATORS, ADV_STD, IS_CAP, IS_CORRECTIONS, KL, LOSS_AGG, RATIO_LEVELS

SCHEDULES = ("constant", "linear", "cosine")


@dataclass
class RLConfig:
    steps: int = 50
    prompts_per_step: int = 8  # the global batch: all ranks together under torchrun
    group_size: int = 8  # G
    max_new_tokens: int = 128
    temperature: float = 1.0  # sampling temperature; log-probs are taken at the same temperature
    top_p: float = 1.0
    lr: float = 1e-5
    # the rate's shape over the run (TRL: warmup_ratio, lr_scheduler_type). An SFT model annealed to
    # lr 0 loses points when Adam restarts at a high rate, even on gold answers (RESULTS.md, rl held-out)
    warmup_steps: int = 0  # linear warmup from 0 to lr over the first steps
    schedule: str = "constant"  # constant | linear (to 0, TRL's default) | cosine (to 10%)
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.99  # small batches (§A4: 0.99+ below ~128 sequences)
    eps: float = 1e-8
    grad_clip: float = 1.0
    adv_estimator: str = "grpo"  # grpo: centered, scaled by --adv-std | rloo: leave-one-out baseline, no scale
    adv_std: str = "group"  # group | group-bessel | batch | none (Dr. GRPO); grpo only, rloo ignores it
    clip_low: float = 0.2
    clip_high: float = 0.28  # DAPO clip-higher
    ratio_level: str = "token"  # token (PPO/GRPO) | sequence (GSPO: the length-normalized sequence ratio)
    loss_agg: str = "seq-mean-token-mean"  # GRPO; token-mean (DAPO); seq-sum-const (Dr. GRPO)
    kl: str = "none"  # none | k2 | k3 (no KL from a rule reward, §A7)
    kl_coef: float = 0.0
    epochs: int = 1  # μ: passes over each batch
    # rollout correction: the engine's log-probs of the sampled tokens against the trainer's (their gap is
    # always logged); tis weighs each token's policy-gradient term by min(π_old/π_rollout, is_cap), mis by
    # the ratio or 0 above the cap (rl/grpo.py importance_weights; TRL and verl do it for vLLM rollouts)
    is_correction: str = "none"  # none | tis | mis
    is_cap: float = IS_CAP
    dynamic_sampling: bool = True  # drop groups whose rewards are all equal, draw more prompts
    max_draws: int = 4  # prompt batches drawn per step at most while filling it
    truncated: str = "mask"  # mask | zero
    verifier: str = "math"
    format_reward: float = 0.0
    # a `train-rm` checkpoint whose score is added to the reward: reward = verifier_coef · the
    # verifier's reward + reward_model_coef · the RM's score (verifier_coef 0: the RM alone; the
    # verifier still decides `correct`, logged as accuracy); both parts are logged apart
    reward_model: str | None = None
    reward_model_coef: float = 1.0
    verifier_coef: float = 1.0
    # a control run (rl/controls.py): none | random-reward (each sample's reward a seeded Bernoulli draw
    # at the real reward's running mean) | shuffled-answers (each prompt scored against another's reference)
    control: str = "none"
    # python verifier: run the code even on a host that lacks one of the sandbox's protections
    # (Landlock, seccomp, Linux); without it such a host refuses the run at start-up
    unsafe_sandbox: bool = False
    micro_batch: int = 16  # sequences per training forward pass
    recompute: str = "none"  # activation recomputation in the training forwards: none | selective | block
    weights: str = "auto"  # which weights of the starting checkpoint: auto (its EMA where it has one) | ema | raw
    gen_batch: int = 256  # sequences decoding at once at most (the engine's max_rows; its KV budget may hold fewer)
    gen_dtype: str = "auto"  # the rollout engine's weights: auto (the model's on CPU, bfloat16 on a GPU) | float32 | bfloat16
    eval_every: int = 10
    eval_limit: int = 100
    headroom_limit: int = 100  # held-out prompts sampled G times before step 0 (pass@1, pass@G, maj@G); 0: off
    checkpoint_every: int = 25
    keep_checkpoints: int = 2
    seed: int = 0
    device: str = "auto"
    lora: LoraConfig | None = None  # --lora-*: train adapters on the start model, base frozen (model/lora.py)

    def __post_init__(self):
        if isinstance(self.lora, dict):  # a preset's [lora] table, or config.json read back
            self.lora = LoraConfig.from_dict(self.lora, "rl lora")

    def check(self) -> None:
        for name, allowed in (("adv_estimator", ADV_ESTIMATORS), ("adv_std", ADV_STD), ("loss_agg", LOSS_AGG), ("kl", KL),
                              ("truncated", ("mask", "zero")), ("schedule", SCHEDULES), ("ratio_level", RATIO_LEVELS),
                              ("is_correction", IS_CORRECTIONS), ("control", CONTROLS)):
            if getattr(self, name) not in allowed:
                raise UsageError(f"rl: {name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if self.group_size < 2:
            raise UsageError("rl: group_size must be at least 2 (advantages are relative to the group)")
        if self.temperature <= 0:
            raise UsageError("rl: temperature must be > 0 (GRPO needs different samples per group)")
        if self.is_cap < 1:
            raise UsageError(f"rl: is_cap must be >= 1 (a lower cap cuts tokens both sides agree on, ratio 1), got {self.is_cap}")
        if self.kl != "none" and self.kl_coef <= 0:
            raise UsageError("rl: --kl needs --kl-coef > 0")
        if self.reward_model is None and self.verifier_coef == 0:
            raise UsageError("rl: verifier_coef 0 (--verifier-coef 0) leaves no reward without --reward-model RM")
        if self.control == "random-reward" and self.reward_model is not None:
            raise UsageError("rl: --control random-reward draws 0/1 rewards at the verifier's reward rate; a reward model's "
                             "score has no such rate: run it without --reward-model")
        if self.headroom_limit < 0:
            raise UsageError(f"rl: headroom_limit must be >= 0 (0 turns the headroom off), got {self.headroom_limit}")
        check_mode(self.recompute, "rl: recompute")
        if self.lora is not None:
            self.lora.check()
            if self.lora.dropout > 0 and self.recompute != "none":
                raise UsageError("rl: --lora-dropout with --recompute: recomputation does not replay dropout's random mask")
        if self.gen_dtype not in GEN_DTYPES:
            raise UsageError(f"rl: gen_dtype must be one of {', '.join(GEN_DTYPES)}, got {self.gen_dtype!r}")
        if self.weights not in ckpt_io.WEIGHTS:
            raise UsageError(f"rl: weights must be one of {', '.join(ckpt_io.WEIGHTS)}, got {self.weights!r}")

    def engine_config(self) -> EngineConfig:
        return EngineConfig(max_rows=self.gen_batch, dtype=self.gen_dtype)

    def sampling(self, stop: Sequence[str], greedy: bool = False) -> SamplingParams:
        """Generation settings: the rollouts' (and the headroom's) temperature and top-p, or greedy
        decoding for held-out accuracy; `stop`: the prompter's stop strings."""
        if greedy:
            return SamplingParams(max_new_tokens=self.max_new_tokens, stop=stop)
        return SamplingParams(max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p, stop=stop)
