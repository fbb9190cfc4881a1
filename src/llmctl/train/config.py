"""`llmctl train`'s settings: the TrainConfig dataclass, and how a preset, `--set` overrides and
explicit flags combine into it and the model's ModelConfig."""

from __future__ import annotations

from dataclasses import dataclass

from llmctl.errors import UsageError
from llmctl.model.config import ModelConfig
from llmctl.model.lora import LoraConfig
from llmctl.model.recompute import check_mode
from llmctl.torchrt.device import DTYPES


SCHEDULES = ("wsd", "cosine", "linear", "decay")
ON_SPIKE = ("flag", "skip-batch", "rewind")
OPTIMIZERS = ("adamw", "muon")


@dataclass
class TrainConfig:
    seq_len: int = 256
    batch_tokens: int = 8192  # global batch in tokens, all ranks together
    micro_batch: int = 16  # sequences per forward pass on one rank
    max_tokens: int = 2_000_000  # the run's length; schedules are laid out over it
    max_steps: int | None = None  # stop early after this many steps (the schedule is unchanged)
    max_epochs: float | None = None  # cap on each source's epochs; may cut max_tokens (train/pretrain.py)
    lr: float = 3e-3
    warmup_tokens: int | None = None  # linear warmup length; None: warmup_frac of max_tokens
    warmup_frac: float = 0.1
    schedule: str = "wsd"  # wsd | cosine | linear | decay (a WSD decay branch: cooldown over the whole run)
    cooldown_frac: float = 0.2  # wsd: decay over the last 20% (spec §A5: 10-20%)
    cooldown: str = "linear"  # wsd cooldown shape: linear | sqrt (1 − √)
    final_lr_frac: float = 0.0  # wsd/cosine floor as a fraction of peak (cosine: 0 means 10%)
    optimizer: str = "adamw"  # adamw | muon: Muon on the hidden matrices, AdamW on the rest (torchrt/muon.py)
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0
    z_loss: float = 0.0  # spec §A3: 1e-4 at scale
    dtype: str = "float32"  # float32 | bfloat16 (autocast; master weights stay fp32)
    seed: int = 0
    eval_every: int = 100  # steps between validation passes (0: only at the end)
    eval_windows: int = 64  # validation windows of seq_len per pass
    checkpoint_every: int = 500
    branch_steps: list[int] | None = None  # checkpoints also at these steps, never pruned (plan ladder's decay branches)
    keep_checkpoints: int = 3
    max_bad_steps: int = 5  # non-finite steps in a row before the run aborts
    spike_window: int = 50  # loss spike: z-score against the last spike_window finite losses
    spike_zscore: float = 6.0
    on_spike: str = "flag"  # flag | skip-batch | rewind: what a flagged spike does (train/spikes.py)
    max_rewinds: int = 3  # rewind: rewinds in a row without getting past the spike before the run stops
    rewind_skip: int = 1  # rewind: data steps skipped, ending at the one that spiked
    ema_decay: float | None = None  # D of the weights' moving average (train/ema.py); None: off
    recompute: str = "none"  # activation recomputation: none | selective | block (model/recompute.py)
    compile: bool = False
    fsdp: bool = False
    peak_flops: float | None = None  # FLOP/s of one device for MFU (default: table or measured)
    device: str = "auto"  # auto | cpu | cuda
    threads: int | None = None  # torch intra-op threads (CPU)
    init_optimizer: bool = False  # with --init: also the checkpoint's AdamW state (moments, step counts)
    lora: LoraConfig | None = None  # --lora-*: adapters on the --init model, base frozen (model/lora.py)

    def __post_init__(self):
        if isinstance(self.lora, dict):  # a preset's [train.lora] table, or config.json read back
            self.lora = LoraConfig.from_dict(self.lora, "train.lora")

    def check(self) -> None:
        if self.dtype not in DTYPES:
            raise UsageError(f"train: dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.schedule not in SCHEDULES:
            raise UsageError(f"train: schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if self.cooldown not in ("linear", "sqrt"):
            raise UsageError(f"train: cooldown must be linear or sqrt, got {self.cooldown!r}")
        if self.optimizer not in OPTIMIZERS:
            raise UsageError(f"train: optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.optimizer == "muon":
            for on, what in ((self.fsdp, "--fsdp (a rank holds a shard of each matrix; Newton-Schulz needs it whole: use DDP)"),
                             (self.lora is not None, "--lora-rank (the adapters are trained with AdamW)")):
                if on:
                    raise UsageError(f"train: --optimizer muon does not go with {what}")
        if self.on_spike not in ON_SPIKE:
            raise UsageError(f"train: on_spike must be one of {', '.join(ON_SPIKE)}, got {self.on_spike!r}")
        if self.ema_decay is not None and not 0 < self.ema_decay < 1:
            raise UsageError(f"train: ema_decay must lie in (0, 1), got {self.ema_decay}")
        check_mode(self.recompute, "train: recompute")
        for name in ("seq_len", "batch_tokens", "micro_batch", "max_tokens"):
            if getattr(self, name) <= 0:
                raise UsageError(f"train: {name} must be positive")
        if self.lora is not None:
            self.check_lora()
        if self.batch_tokens % self.seq_len:
            raise UsageError(f"train: batch_tokens ({self.batch_tokens}) must be a multiple of seq_len ({self.seq_len})")


    def check_lora(self) -> None:
        """What LoRA training does not combine with, one line each."""
        self.lora.check()
        for on, what in ((self.ema_decay is not None, "--ema-decay (average the adapters of a merged export instead)"),
                         (self.fsdp, "--fsdp (the frozen base replicates; DDP shares the adapters' gradients)"),
                         (self.init_optimizer, "--init-optimizer (the base run's AdamW state is for all its weights)")):
            if on:
                raise UsageError(f"train: --lora-rank does not go with {what}")
        if self.lora.dropout > 0 and self.recompute != "none":
            raise UsageError("train: --lora-dropout with --recompute: recomputation does not replay dropout's random mask")
        if self.lora.base_dtype == "bfloat16" and self.dtype != "bfloat16":
            raise UsageError("train: a bfloat16 LoRA base needs --dtype bfloat16 (autocast)")


def parse_sets(sets: list[str]) -> tuple[dict, dict]:
    """`--set model.n_layers=8 --set train.lr=1e-3` → (model overrides, train overrides); values
    are TOML scalars (numbers, true/false, quoted or bare strings)."""
    import tomllib

    model, train = {}, {}
    for item in sets:
        key, sep, raw = item.partition("=")
        table, dot, name = key.strip().partition(".")
        if not sep or not dot or table not in ("model", "train"):
            raise UsageError(f"--set {item!r}: expected model.KEY=VALUE or train.KEY=VALUE")
        try:
            value = tomllib.loads(f"v = {raw.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw.strip()
        (model if table == "model" else train)[name] = value
    return model, train


def load_run_config(config: str | None, train_flags: dict, sets: list[str] = ()) -> tuple[ModelConfig, TrainConfig]:
    """A train preset ([model] and [train] tables), then --set overrides, then explicit flags; each
    value type- and range-checked by build_config, naming the flag, `--set KEY` or the file."""
    from llmctl.bounds import check_fits
    from llmctl.config import build_config, find_config, read_toml

    if config:
        path = find_config("train", config)
        unknown = sorted(set(read_toml(path)) - {"model", "train", "data"})
        if unknown:
            raise UsageError(f"{path}: unknown table(s) {', '.join(unknown)} (expected [model], [train] and [[data]])")
    model_sets, train_sets = parse_sets(list(sets))
    model_cfg = build_config(ModelConfig, "train", config, table="model", sets=model_sets)
    # fp32 weights, their gradients and AdamW's two moments: 16 bytes a parameter, before activations
    check_fits(f"the model's {model_cfg.n_params():,} parameters (weights, gradients and AdamW state)", 16 * model_cfg.n_params())
    return model_cfg, build_config(TrainConfig, "train", config, train_flags, table="train", sets=train_sets)
