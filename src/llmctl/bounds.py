"""The range of every numeric setting, in one table (docs/design.md §3: a bad value is a usage
error, one line, before any work starts).

`config.build_config` applies it to each value a TOML file, `--set` or a flag gives a config
dataclass, so a preset is held to the same ranges as the command line; the commands that take
their numbers as plain flags (plan, generate, inspect, SFT's split) apply it with `check_flags`.
A message names where the value came from (the flag, `--set train.lr`, or the file and key)
and the range: `--checkpoint-every must be >= 1, got 0`.

The table is keyed by the config class's name (or the command's, for plain flags), so this
module imports none of them; a key missing from the table is not range-checked (text, choices
and flags, which their configs' `check()` validate). 0 stays allowed where it means something
("0 = off", "0: only at the end"), as each entry's comment says.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmctl.errors import UsageError


@dataclass(frozen=True)
class Bound:
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False  # lo itself is out of range
    hi_open: bool = False
    flag: str | None = None  # the flag, when it is not --KEY-WITH-DASHES

    def admits(self, v: float) -> bool:
        if isinstance(v, float) and math.isnan(v):
            return False
        if self.lo is not None and (v < self.lo or (self.lo_open and v == self.lo)):
            return False
        return not (self.hi is not None and (v > self.hi or (self.hi_open and v == self.hi)))

    def describe(self) -> str:
        if self.hi is None:
            return f"{'>' if self.lo_open else '>='} {_num(self.lo)}"
        if self.lo is None:
            return f"{'<' if self.hi_open else '<='} {_num(self.hi)}"
        if not (self.lo_open or self.hi_open):
            return f"between {_num(self.lo)} and {_num(self.hi)}"
        return f"in {'(' if self.lo_open else '['}{_num(self.lo)}, {_num(self.hi)}{')' if self.hi_open else ']'}"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def at_least(n: int, flag: str | None = None) -> Bound:
    return Bound(lo=n, flag=flag)


POSITIVE = Bound(lo=0, lo_open=True)  # a rate, a size in real units: above 0
COUNT = at_least(1)  # a number of things that must happen at least once
NONNEG = at_least(0)  # 0 allowed: the entry says what 0 means
SEED = at_least(0)  # numpy's generators refuse negative seeds
SHARE = Bound(0, 1)  # a probability or a fraction, ends included
SHARE_BELOW_1 = Bound(0, 1, hi_open=True)  # a held-out fraction (1 would leave nothing to train on)
MASS = Bound(0, 1, lo_open=True)  # top-p, MFU: 0 would keep nothing
BETA = Bound(0, 1, hi_open=True)  # Adam's betas

BOUNDS: dict[str, dict[str, Bound]] = {
    "CatConfig": {"limit": at_least(0, flag="-n"), "rows_per_part": COUNT},
    "ExtractConfig": {"lang_threshold": SHARE, "max_bytes": COUNT, "timeout": NONNEG},  # timeout 0: no limit
    "DedupConfig": {"ngram": COUNT, "bands": COUNT, "rows": COUNT, "seed": SEED, "max_line_count": COUNT, "partitions": COUNT},
    "DecontamConfig": {"ngram": COUNT, "min_overlap": COUNT, "threshold": SHARE},
    "TokenizeConfig": {"val_fraction": SHARE_BELOW_1, "seed": SEED, "batch_docs": COUNT},
    "TrainTokenizerConfig": {"vocab_size": COUNT, "max_chars": COUNT, "seed": SEED, "reserved": NONNEG, "min_frequency": COUNT},
    "TrainClassifierConfig": {"dim": COUNT, "lr": POSITIVE, "epoch": COUNT, "word_ngrams": COUNT, "min_count": COUNT, "bucket": COUNT,
                              "thread": COUNT, "holdout": SHARE_BELOW_1, "seed": SEED, "max_docs": COUNT},
    # Sizes a downloaded config.json gives too: ceilings far above any release (Llama 3.1 405B: 126 layers, d 16,384,
    # d_ff 53,248, 128 heads of 128; vocabularies to 262,144; contexts to 10M) and low enough that no tensor of the
    # model overflows torch's 64-bit storage size (model/config.py checks the whole against the machine's memory)
    "ModelConfig": {"vocab_size": Bound(1, 1 << 24), "n_layers": Bound(1, 1 << 12), "d_model": Bound(1, 1 << 17),
                    "n_heads": Bound(1, 1 << 12), "n_kv_heads": Bound(1, 1 << 12), "head_dim": Bound(1, 1 << 12),
                    "d_ff": Bound(1, 1 << 20), "max_seq_len": Bound(1, 1 << 24), "rope_base": POSITIVE, "norm_eps": POSITIVE,
                    "init_std": POSITIVE},
    "TrainConfig": {
        "seq_len": COUNT, "batch_tokens": COUNT, "micro_batch": COUNT, "max_tokens": COUNT, "max_steps": COUNT,
        "lr": POSITIVE, "warmup_tokens": NONNEG, "warmup_frac": SHARE, "cooldown_frac": SHARE, "final_lr_frac": SHARE,
        "weight_decay": NONNEG, "beta1": BETA, "beta2": BETA, "eps": POSITIVE, "grad_clip": POSITIVE, "z_loss": NONNEG,
        "seed": SEED, "eval_every": NONNEG,  # 0: validate only at the end
        "eval_windows": COUNT, "checkpoint_every": COUNT, "keep_checkpoints": COUNT, "max_bad_steps": COUNT,
        "spike_window": at_least(2), "spike_zscore": POSITIVE, "peak_flops": POSITIVE, "threads": COUNT,
        "max_epochs": POSITIVE,  # a fraction of an epoch is a cap too
        "max_rewinds": COUNT, "rewind_skip": COUNT,
        "ema_decay": Bound(0, 1, lo_open=True, hi_open=True),  # 0 would be no average, 1 a frozen one
    },
    "DataSource": {"weight": POSITIVE, "max_epochs": POSITIVE},  # a train mixture's [[data]] / --data source
    "sft": {"val_fraction": SHARE_BELOW_1},  # train --sft's held-out share
    "EvalConfig": {"shots": NONNEG, "seed": SEED, "limit": COUNT, "batch_tokens": COUNT, "samples": COUNT,
                   "temperature": NONNEG,  # 0: greedy
                   "top_k": NONNEG,  # 0: off
                   "top_p": MASS, "max_new_tokens": COUNT, "pass_k": COUNT, "batch_size": COUNT},
    "RLConfig": {
        "steps": COUNT, "prompts_per_step": COUNT, "group_size": at_least(2),  # advantages compare a group's samples
        "max_new_tokens": COUNT, "temperature": POSITIVE, "top_p": MASS, "lr": POSITIVE, "warmup_steps": NONNEG,
        "weight_decay": NONNEG, "beta1": BETA, "beta2": BETA, "eps": POSITIVE, "grad_clip": POSITIVE,
        "clip_low": NONNEG, "clip_high": NONNEG, "kl_coef": NONNEG, "epochs": COUNT, "max_draws": COUNT,
        "micro_batch": COUNT, "gen_batch": COUNT, "eval_every": NONNEG,  # 0: evaluate only at the end
        "eval_limit": COUNT, "headroom_limit": NONNEG,  # 0: no headroom pass
        "checkpoint_every": COUNT, "keep_checkpoints": COUNT, "seed": SEED,
        # format_reward: any number (a negative one is a penalty for the form)
    },
    "generate": {"n": at_least(1, flag="-n"), "max_new_tokens": COUNT, "temperature": NONNEG,
                 "top_k": NONNEG, "top_p": MASS, "seed": SEED},
    "inspect": {"samples": NONNEG},
    "plan": {"tokens": POSITIVE, "flops": POSITIVE, "days": POSITIVE, "gpus": COUNT, "mfu": MASS, "seq_len": COUNT,
             "micro_batch": COUNT, "batch_tokens": COUNT, "zero": Bound(0, 3), "price": NONNEG, "mttf": POSITIVE,
             "failure_rate": NONNEG, "gpus_per_node": COUNT, "ckpt_write_s": NONNEG, "restart_s": NONNEG, "ettr": MASS,
             "gpu_hours": POSITIVE},
}


def flag_of(table: str, key: str) -> str:
    """The command-line flag that sets `key` (for messages)."""
    b = BOUNDS.get(table, {}).get(key)
    return b.flag if b is not None and b.flag else "--" + key.replace("_", "-")


def check_value(table: str, key: str, value, where: str) -> None:
    """Raise a one-line UsageError when `value` (or an item of a list value) is out of `key`'s
    range; `where` names its source: a flag, `--set train.lr`, or `FILE: [train] lr`."""
    b = BOUNDS.get(table, {}).get(key)
    if b is None or value is None:
        return
    for v in value if isinstance(value, (list, tuple)) else [value]:
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not b.admits(v):
            raise UsageError(f"{where} must be {b.describe()}, got {v}")


def check_flags(table: str, **values) -> None:
    """Range-check flags given straight to a command (None: not given)."""
    for key, value in values.items():
        check_value(table, key, value, flag_of(table, key))
