"""The range of every numeric setting, in one table (docs/design.md §3: a bad value is a usage
error, one line, before any work starts).

`config.build_config` applies it to each value a TOML file, `--set` or a flag gives a config
dataclass, so a preset is held to the same ranges as the command line; the commands that take
their numbers as plain flags (plan, generate, inspect, serve, SFT's split) apply it with `check_flags`.
A message names where the value came from (the flag, `--set train.lr`, or the file and key)
and the range: `--checkpoint-every must be >= 1, got 0`.

Whatever its range, a number is finite and an integer fits int64 (`number_problem`); a ceiling
says why it is there (`Bound.why`). Two ceilings are known only later and have their own checks:
a size that multiplies into one allocation against the machine's memory (`check_fits`), and a
generation budget against the model's context length once its checkpoint is open (`within_context`).

The table is keyed by the config class's name (or the command's, for plain flags), so this
module imports none of them; a key missing from the table is not range-checked (text, choices
and flags, which their configs' `check()` validate). 0 stays allowed where it means something
("0 = off", "0: only at the end"), as each entry's comment says.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from llmctl.errors import UsageError

INT64_MAX = 2**63 - 1  # torch and numpy take their integers (seeds, sizes, counts) as int64


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, as a container or `taskset` sets it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class Bound:
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False  # lo itself is out of range
    hi_open: bool = False
    flag: str | None = None  # the flag, when it is not --KEY-WITH-DASHES
    why: str | None = None  # what the ceiling is, said in the error ("the cores this process may use")

    def problem(self, v: float) -> str | None:
        """Why `v` is out of range ("must be >= 1"), or None when it is in. A ceiling with a
        reason says only that side, with the reason: "must be at most 4 (the cores …)"."""
        low = self.lo is not None and (v < self.lo or (self.lo_open and v == self.lo))
        high = self.hi is not None and (v > self.hi or (self.hi_open and v == self.hi))
        if not (low or high):
            return None
        if high and self.why:
            return f"must be {'below' if self.hi_open else 'at most'} {_num(self.hi)} ({self.why})"
        if low and self.why:
            return f"must be {'>' if self.lo_open else '>='} {_num(self.lo)}"
        return f"must be {self.describe()}"

    def admits(self, v: float) -> bool:
        return number_problem(v) is None and self.problem(v) is None

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


def number_problem(v) -> str | None:
    """What every number must be whatever its setting: finite (a nan or inf learning rate trains
    a model of NaNs), and an integer that fits int64, the width torch and numpy take (a seed of
    2^70 is an OverflowError inside torch.manual_seed)."""
    if isinstance(v, float) and not math.isfinite(v):
        return "must be finite"
    if isinstance(v, int) and not -INT64_MAX - 1 <= v <= INT64_MAX:
        return "must be at most 2^63-1 (a 64-bit integer)" if v > 0 else "must be at least -2^63 (a 64-bit integer)"
    return None


def at_least(n: int, flag: str | None = None) -> Bound:
    return Bound(lo=n, flag=flag)


def at_most(lo: float, hi: float, why: str, lo_open: bool = False) -> Bound:
    return Bound(lo=lo, hi=hi, lo_open=lo_open, why=why)


POSITIVE = Bound(lo=0, lo_open=True)  # a rate, a size in real units: above 0
COUNT = at_least(1)  # a number of things that must happen at least once
NONNEG = at_least(0)  # 0 allowed: the entry says what 0 means
SEED = at_least(0)  # numpy's generators refuse negative seeds; int64 (number_problem) caps it
SHARE = Bound(0, 1)  # a probability or a fraction, ends included
SHARE_BELOW_1 = Bound(0, 1, hi_open=True)  # a held-out fraction (1 would leave nothing to train on)
MASS = Bound(0, 1, lo_open=True)  # top-p, MFU: 0 would keep nothing
BETA = Bound(0, 1, hi_open=True)  # Adam's betas
# A learning rate above 10 is a typo, not a setting: AdamW moves each weight by about lr a step
# (weights start near 0.02), and fastText documents 0.1-1.0; 1e30 or inf only trains NaNs.
LR = at_most(0, 10, "a learning rate above 10 only diverges", lo_open=True)
# Torch and fastText start one OS thread per unit asked (torch.set_num_threads(10^8) is a SIGSEGV);
# more threads than cores only contend.
THREADS = at_most(1, usable_cores(), "the cores this process may use")
# Words per shingle: FineWeb dedups on 5, Llama 3 decontaminates on 8, GPT-3 on 13. Past an item's
# length every n matches whole items only, so 1000 is far beyond any use and still cheap.
NGRAM = at_most(1, 1000, "an n-gram past 1000 words only matches whole documents")
# tiktoken and the token shards index ids as uint32; the largest released vocabularies are ~256k,
# and the BPE trainer (a Rust panic at 10^12) sizes its tables by the vocabulary.
VOCAB = at_most(1, 2**24, "2^24: the largest released vocabularies hold about 2^18 tokens")
# setitimer takes a time_t of microseconds (1e12 s overflows it); 0 already means no limit.
TIMEOUT = at_most(0, 86_400, "a day a page; 0 means no limit")
# one task per key family, band and partition, each scanning the signatures: 10^9 never finishes
PARTITIONS = at_most(1, 4096, "more only adds tasks that each scan every signature")
# A plan for more accelerators than any cluster holds (the largest are ~10^5) is a typo.
GPUS = at_most(1, 10**7, "more accelerators than any cluster holds")

BOUNDS: dict[str, dict[str, Bound]] = {
    "CatConfig": {"limit": at_least(0, flag="-n"), "rows_per_part": COUNT},
    "SampleConfig": {"n": at_least(1, flag="-n"), "seed": SEED},  # an empty sample is a typo: head -n 0 gives the schema
    "WarcCutConfig": {"n": at_least(1, flag="-n")},  # sample --warc: response records
    "ExtractConfig": {"lang_threshold": SHARE, "max_bytes": COUNT, "timeout": TIMEOUT},  # timeout 0: no limit
    "DedupConfig": {"ngram": NGRAM, "bands": COUNT, "rows": COUNT, "seed": SEED, "max_line_count": COUNT, "partitions": PARTITIONS,
                    "min_len": COUNT, "n_sentences": COUNT, "min_doc_words": NONNEG, "clusters": NONNEG,  # clusters 0: one per 1,000 docs
                    "eps": Bound(0, 1, lo_open=True, hi_open=True)},  # eps 0 finds nothing, 1 joins everything
    "DecontamConfig": {"ngram": NGRAM, "min_overlap": COUNT, "threshold": SHARE},
    "EmbedConfig": {"batch_size": COUNT},  # past the reader's 8,192-row batches it changes nothing: a forward never holds more
    "TokenizeConfig": {"val_fraction": SHARE_BELOW_1, "seed": SEED, "batch_docs": COUNT},
    "TrainTokenizerConfig": {"vocab_size": VOCAB, "max_chars": COUNT, "seed": SEED, "reserved": NONNEG, "min_frequency": COUNT},
    "TrainClassifierConfig": {"dim": COUNT, "lr": LR, "epoch": COUNT, "word_ngrams": COUNT, "min_count": COUNT, "bucket": COUNT,
                              "thread": THREADS, "holdout": SHARE_BELOW_1, "seed": SEED, "max_docs": COUNT},
    "TrainRegressionConfig": {"threshold": Bound(0, 5), "holdout": SHARE_BELOW_1, "seed": SEED, "max_docs": COUNT,  # 0-5: the rubric
                              "batch_size": COUNT, "ridge": NONNEG},
    # Sizes a downloaded config.json gives too: ceilings far above any release (Llama 3.1 405B: 126 layers, d 16,384,
    # d_ff 53,248, 128 heads of 128; vocabularies to 262,144; contexts to 10M) and low enough that no tensor of the
    # model overflows torch's 64-bit storage size (model/config.py checks the whole against the machine's memory)
    "ModelConfig": {"vocab_size": VOCAB, "n_layers": Bound(1, 1 << 12), "d_model": Bound(1, 1 << 17),
                    "n_heads": Bound(1, 1 << 12), "n_kv_heads": Bound(1, 1 << 12), "head_dim": Bound(1, 1 << 12),
                    "d_ff": Bound(1, 1 << 20), "max_seq_len": Bound(1, 1 << 24), "rope_base": POSITIVE, "norm_eps": POSITIVE,
                    "init_std": at_most(0, 1, "weights start near 0.02; past 1 the first forward overflows", lo_open=True)},
    "TrainConfig": {
        "seq_len": COUNT, "batch_tokens": COUNT, "micro_batch": COUNT, "max_tokens": COUNT, "max_steps": COUNT,
        "lr": LR, "warmup_tokens": NONNEG, "warmup_frac": SHARE, "cooldown_frac": SHARE, "final_lr_frac": SHARE,
        "weight_decay": NONNEG, "beta1": BETA, "beta2": BETA, "eps": POSITIVE, "grad_clip": POSITIVE, "z_loss": NONNEG,
        "seed": SEED, "eval_every": NONNEG,  # 0: validate only at the end
        "eval_windows": COUNT, "checkpoint_every": COUNT, "keep_checkpoints": COUNT, "max_bad_steps": COUNT,
        "spike_window": at_least(2), "spike_zscore": POSITIVE, "peak_flops": POSITIVE, "threads": THREADS,
        "max_epochs": POSITIVE,  # a fraction of an epoch is a cap too
        "max_rewinds": COUNT, "rewind_skip": COUNT,
        "ema_decay": Bound(0, 1, lo_open=True, hi_open=True),  # 0 would be no average, 1 a frozen one
    },
    # LoRA (model/lora.py): a rank past 4,096 is wider than the matrices it adapts in any released model
    "LoraConfig": {"rank": at_most(1, 4096, "a rank past the widths it adapts is no longer low-rank"),
                   "alpha": POSITIVE, "dropout": SHARE_BELOW_1},
    "DataSource": {"weight": POSITIVE, "max_epochs": POSITIVE},  # a train mixture's [[data]] / --data source
    "sft": {"val_fraction": SHARE_BELOW_1},  # train --sft's held-out share
    # dpo, train-rm (simpo's gamma: any finite margin)
    "pairs": {"val_fraction": SHARE_BELOW_1, "beta": POSITIVE, "epochs": POSITIVE, "batch_pairs": COUNT},
    "EvalConfig": {"shots": NONNEG, "seed": SEED, "limit": COUNT, "batch_tokens": COUNT, "samples": COUNT,
                   "temperature": NONNEG,  # 0: greedy
                   "top_k": NONNEG,  # 0: off
                   "top_p": MASS, "max_new_tokens": COUNT, "pass_k": COUNT, "batch_size": COUNT},
    # annotate (eval/annotate.py): a score range past 100 is not a rubric, and the histogram keeps a count per score
    "AnnotateConfig": {"max_chars": NONNEG,  # 0: never cut
                       "max_tokens": COUNT, "min_score": at_most(0, 100, "a rubric's scale, counted per score"),
                       "max_score": at_most(1, 100, "a rubric's scale, counted per score"),
                       "concurrency": at_most(1, 4096, "each request in flight holds a connection"),
                       "retries": at_most(0, 100, "past 100 tries a server that does not answer is down"),
                       "backoff": at_most(0, 60, "the longest wait between tries is 60 s"),  # 0: retry at once
                       "timeout": at_most(0, 86_400, "a day a request", lo_open=True), "batch_size": COUNT},
    "RLConfig": {
        "steps": COUNT, "prompts_per_step": COUNT, "group_size": at_least(2),  # advantages compare a group's samples
        "max_new_tokens": COUNT, "temperature": POSITIVE, "top_p": MASS, "lr": LR, "warmup_steps": NONNEG,
        "weight_decay": NONNEG, "beta1": BETA, "beta2": BETA, "eps": POSITIVE, "grad_clip": POSITIVE,
        "clip_low": SHARE,  # the ratio is kept above 1 - clip_low, which past 1 is below 0
        "clip_high": NONNEG, "kl_coef": at_most(0, 100, "a correct answer earns 1: 100 times that on the KL pins the policy"), "epochs": COUNT, "max_draws": COUNT,
        "micro_batch": COUNT, "gen_batch": COUNT, "eval_every": NONNEG,  # 0: evaluate only at the end
        "eval_limit": COUNT, "headroom_limit": NONNEG,  # 0: no headroom pass
        "checkpoint_every": COUNT, "keep_checkpoints": COUNT, "seed": SEED,
        # a negative one is a penalty for the form; past ±1 the form would outweigh a correct answer (1)
        "format_reward": Bound(-1, 1),
        "reward_model_coef": NONNEG, "verifier_coef": NONNEG,  # rl --reward-model: the reward's two weights
        # the importance weights' cap: below 1 it would cut the tokens whose two log-probs agree (ratio 1); no
        # ceiling, a weight's log-ratio is clamped at ±20 before exp (rl/grpo.py, verl's SAFETY_BOUND)
        "is_cap": at_least(1),
    },
    "BestOfNConfig": {"n": at_least(2, flag="-n"), "max_new_tokens": COUNT, "temperature": POSITIVE, "top_p": MASS,
                      "reward_model_coef": NONNEG, "verifier_coef": NONNEG, "limit": COUNT, "gen_batch": COUNT, "seed": SEED,
                      "format_reward": Bound(-1, 1)},
    "generate": {"n": at_least(1, flag="-n"), "max_new_tokens": COUNT, "temperature": NONNEG,
                 "top_k": NONNEG, "top_p": MASS, "seed": SEED},
    "inspect": {"samples": NONNEG},
    # a TCP port is 16 bits; 0 asks the system for a free one (the "serving" line names it)
    "serve": {"port": at_most(0, 65_535, "a TCP port is a 16-bit number; 0 picks a free one"), "max_rows": COUNT,
              "kv_tokens": NONNEG},
    # the fields of an OpenAI API request to `llmctl serve` (serve/protocol.py); sampling as generate's
    "serve request": {"n": at_most(1, 128, "each sample is a row of the batch; past 128 one request crowds out the rest"),
                      "prompts": at_most(1, 128, "each prompt is a request of its own; send more in more requests"),
                      "max_tokens": COUNT, "temperature": NONNEG, "top_k": NONNEG, "top_p": MASS, "seed": SEED},
    # a bin is a bar in a PNG a few thousand pixels wide: past 10,000 they are not drawn apart
    "filter stats": {"bins": at_most(2, 10_000, "more bins than a plot can draw apart")},
    "RunOptions": {"workers": COUNT, "shard_index": NONNEG, "num_shards": COUNT, "cpus_per_task": POSITIVE},
    "plan": {"tokens": POSITIVE, "flops": POSITIVE, "days": POSITIVE, "gpus": GPUS, "mfu": MASS, "seq_len": COUNT,
             "micro_batch": COUNT, "batch_tokens": COUNT, "zero": Bound(0, 3), "price": NONNEG, "mttf": POSITIVE,
             "failure_rate": NONNEG, "gpus_per_node": GPUS, "ckpt_write_s": NONNEG, "restart_s": NONNEG, "ettr": MASS,
             "gpu_hours": POSITIVE},
    "plan ladder": {"budget": POSITIVE, "min_tpp": POSITIVE, "max_tpp": POSITIVE},
    # each bootstrap round is a full refit (~40 ms for 30 runs): 10^5 rounds is over an hour; 0: no intervals
    "plan fit": {"budget": POSITIVE, "bootstrap": at_most(0, 100_000, "each round is a full refit of the law")},
}


def flag_of(table: str, key: str) -> str:
    """The command-line flag that sets `key` (for messages)."""
    b = BOUNDS.get(table, {}).get(key)
    return b.flag if b is not None and b.flag else "--" + key.replace("_", "-")


def check_value(table: str, key: str, value, where: str) -> None:
    """Raise a one-line UsageError when `value` (or an item of a list value, or a value nested in
    a table) is not a finite number of int64 width, or out of `key`'s range; `where` names its
    source: a flag, `--set train.lr`, or `FILE: [train] lr`."""
    if value is None:
        return
    b = BOUNDS.get(table, {}).get(key)
    for v in _numbers(value):
        why = number_problem(v) or (b.problem(v) if b is not None else None)
        if why:
            raise UsageError(f"{where} {why}, got {v}")


def _numbers(value):
    """The numbers in a value: itself, the items of a list, the values of a table (a filter step's
    parameters), recursively; booleans are not numbers here."""
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _numbers(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _numbers(v)


def check_flags(table: str, **values) -> None:
    """Range-check flags given straight to a command (None: not given)."""
    for key, value in values.items():
        check_value(table, key, value, flag_of(table, key))


def within_context(where: str, value: int, context: int, default: int | None = None) -> int:
    """`value` (a generation budget, a count of few-shot examples) checked against the model's
    context length, known only once its checkpoint is open: generating past it extends RoPE
    beyond what the model was trained on and sizes the KV cache by the value (10^6 new tokens
    never finishes). A value asked for above it is one line; the command's own default, when it
    is the one above, is cut to it."""
    if value <= context:
        return value
    if default is not None and value == default:
        return context
    raise UsageError(f"{where} must be at most the context length {context} of the model, got {value}")


def machine_memory() -> int:
    """Bytes of memory this process can have: the physical memory, or its cgroup's limit below it."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: no ceiling known
        return 1 << 62
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                limit = f.read().strip()
        except OSError:
            continue
        if limit.isdigit():
            total = min(total, int(limit))
    return total


def check_fits(what: str, nbytes: int) -> None:
    """Sizes that multiply into an allocation (a model's dimensions, fastText's table) are checked
    against the machine before it is asked for: past its memory the allocation is an OOM kill or
    an abort inside C++, not an error a user can read."""
    have = machine_memory()
    if nbytes > have:
        raise UsageError(f"{what} need {nbytes / 2**30:,.1f} GiB, more than the {have / 2**30:,.1f} GiB of memory of this machine")
