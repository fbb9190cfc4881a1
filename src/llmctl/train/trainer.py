"""`llmctl train`: pretrain the Llama-style decoder on a tokens artifact.

One step: the global batch (batch_tokens) is split across ranks, then into micro-batches whose
gradients accumulate; the pre-clip global gradient norm is logged and clipped to grad_clip; a
non-finite loss or norm skips the step (max_bad_steps in a row aborts); AdamW steps at the
learning rate of the schedule, which is a function of tokens seen. The batch at each step is a
pure function of (seed, step), so a resumed run replays exactly the batches an uninterrupted run
would have seen, and on CPU its losses are bitwise the same.

A run directory holds config.json (resolved), metrics.jsonl (one object per step, plus "val"
records), checkpoints/ (DESIGN §2) and, when the run completes, manifest.json.

With `sft` (train/sft.py) the same loop fine-tunes on packed conversations instead of token
windows: micro-batches carry a block-diagonal mask and restarted positions, the loss is the summed
assistant-token NLL over the global batch's assistant-token count, validation runs on held-out
conversations, and checkpoints are marked `"chat": true`.
"""

from __future__ import annotations

import base64
import json
import math
import signal
import time
from collections import deque
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from llmctl import __version__
from llmctl.artifacts import checkpoint as ckpt_io
from llmctl.artifacts.manifest import Manifest, input_ref, write_manifest
from llmctl.artifacts.tokens import TokenDataset
from llmctl.errors import Interrupted, StageFailed, UsageError
from llmctl.eval.loss import evaluate_loss, summarize, token_byte_lengths, unigram_bits_per_byte
from llmctl.model.config import ModelConfig
from llmctl.model.transformer import Transformer
from llmctl.torchrt import distributed
from llmctl.torchrt.alloc import keep_freed_memory
from llmctl.train.loader import PackedBatches
from llmctl.train.mfu import peak_flops
from llmctl.torchrt.optim import lr_at, make_optimizer, set_lr

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class TrainConfig:
    seq_len: int = 256
    batch_tokens: int = 8192  # global batch in tokens, all ranks together
    micro_batch: int = 16  # sequences per forward pass on one rank
    max_tokens: int = 2_000_000  # the run's length; schedules are laid out over it
    max_steps: int | None = None  # stop early after this many steps (the schedule is unchanged)
    lr: float = 3e-3
    warmup_tokens: int | None = None  # linear warmup length; None: warmup_frac of max_tokens
    warmup_frac: float = 0.1
    schedule: str = "wsd"  # wsd | cosine | linear
    cooldown_frac: float = 0.2  # wsd: decay over the last 20% (spec §A5: 10-20%)
    cooldown: str = "linear"  # wsd cooldown shape: linear | sqrt (1 − √)
    final_lr_frac: float = 0.0  # wsd/cosine floor as a fraction of peak (cosine: 0 means 10%)
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
    keep_checkpoints: int = 3
    max_bad_steps: int = 5  # non-finite steps in a row before the run aborts
    spike_window: int = 50  # loss spike: z-score against the last spike_window finite losses
    spike_zscore: float = 6.0
    compile: bool = False
    fsdp: bool = False
    peak_flops: float | None = None  # FLOP/s of one device for MFU (default: table or measured)
    device: str = "auto"  # auto | cpu | cuda
    threads: int | None = None  # torch intra-op threads (CPU)

    def check(self) -> None:
        if self.dtype not in DTYPES:
            raise UsageError(f"train: dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.schedule not in ("wsd", "cosine", "linear"):
            raise UsageError(f"train: schedule must be wsd, cosine or linear, got {self.schedule!r}")
        if self.cooldown not in ("linear", "sqrt"):
            raise UsageError(f"train: cooldown must be linear or sqrt, got {self.cooldown!r}")
        for name in ("seq_len", "batch_tokens", "micro_batch", "max_tokens"):
            if getattr(self, name) <= 0:
                raise UsageError(f"train: {name} must be positive")
        if self.batch_tokens % self.seq_len:
            raise UsageError(f"train: batch_tokens ({self.batch_tokens}) must be a multiple of seq_len ({self.seq_len})")


@dataclass
class StepStats:
    """What the progress callback receives after every step."""
    step: int
    total_steps: int
    tokens: int
    loss: float
    lr: float
    tokens_per_s: float
    mfu: float | None
    val: dict | None = None


def _rng_state() -> str:
    return base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()


def _set_rng_state(s: str) -> None:
    torch.set_rng_state(torch.from_numpy(np.frombuffer(base64.b64decode(s), dtype=np.uint8).copy()))


def truncate_metrics(path: Path, step: int) -> None:
    """On resume, drop a run's metrics records past the checkpoint: those steps are about to run again."""
    if not path.is_file():
        return
    keep = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
    path.write_text("".join(line + "\n" for line in keep))


class _StopFlag:
    """SIGTERM/SIGINT set a flag; the loop checkpoints at the end of the step and stops."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old = {}

    def __enter__(self):
        for s in (signal.SIGTERM, signal.SIGINT):
            self._old[s] = signal.signal(s, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:  # a second Ctrl-C: stop now
            raise KeyboardInterrupt
        self.signum = signum

    def __exit__(self, *exc) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)


class Trainer:
    def __init__(self, tokens: Path, out: Path, model_cfg: ModelConfig, cfg: TrainConfig,
                 val: Path | None = None, resume: bool = False, overwrite: bool = False,
                 on_step: Callable[[StepStats], None] | None = None,
                 on_log: Callable[[str], None] | None = None, sft=None):
        cfg.check()
        self.cfg, self.out = cfg, Path(out)
        self.on_step, self.on_log = on_step or (lambda s: None), on_log or (lambda m: None)
        self.sft = None  # SFTData in SFT mode (then `tokens` is the chats file)
        self.init = None  # SFT: a checkpoint whose weights start the run
        if sft is not None:
            from llmctl.train.sft import SFTData

            if val:
                raise UsageError("--sft holds out --val-fraction of the conversations; --val is for pretraining")
            self.sft, self.init = SFTData(sft, cfg.seq_len, cfg.seed, self.on_log), sft.init
            self.train_data = self.val_data = None
            vocab = self.sft.vocab_size
            if self.init is not None and vocab > model_cfg.padded_vocab:
                raise UsageError(f"--init: the tokenizer's {vocab} ids do not fit the model's {model_cfg.padded_vocab}")
        else:
            self.train_data = TokenDataset(tokens)
            self.val_data = TokenDataset(val) if val else None
            vocab = self.train_data.vocab_size
        if model_cfg.vocab_size != vocab and self.init is None:
            model_cfg = ModelConfig.from_dict({**model_cfg.to_dict(), "vocab_size": vocab})
        if cfg.seq_len > model_cfg.max_seq_len:
            model_cfg = ModelConfig.from_dict({**model_cfg.to_dict(), "max_seq_len": cfg.seq_len})
        self.model_cfg = model_cfg
        self.tokenizer_file = self.sft.opts.tokenizer if self.sft else self._tokenizer_file()
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.dist = distributed.init(cfg.device)
        keep_freed_memory(self.dist.device)
        self.batch_seqs = cfg.batch_tokens // cfg.seq_len
        if self.batch_seqs % self.dist.world:
            raise UsageError(f"train: {self.batch_seqs} sequences per batch do not split over {self.dist.world} ranks")
        self.total_steps = math.ceil(cfg.max_tokens / cfg.batch_tokens)
        self.ckpt_root = self.out / "checkpoints"
        self._prepare_out(resume, overwrite)
        self.amp = torch.autocast(self.dist.device.type, dtype=torch.bfloat16) if cfg.dtype == "bfloat16" else nullcontext()

    # -- set-up ------------------------------------------------------------------------------

    def _tokenizer_file(self) -> Path | None:
        for cand in (self.train_data.path / "tokenizer.json", self.train_data.manifest.config.get("tokenizer")):
            if cand and Path(cand).is_file():
                return Path(cand)
        return None

    def _prepare_out(self, resume: bool, overwrite: bool) -> None:
        saved = self.out / "config.json"
        if resume:
            if not ckpt_io.list_checkpoints(self.ckpt_root):
                raise UsageError(f"--resume: {self.ckpt_root} holds no checkpoint")
            if saved.is_file():
                prev = json.loads(saved.read_text())
                if prev.get("model") != self.model_cfg.to_dict():
                    raise UsageError(f"--resume: the model in {saved} differs from this command's")
            return
        if self.out.exists() and any(self.out.iterdir()):
            if not overwrite:
                raise UsageError(f"{self.out} is not empty: pass --resume to continue it or --overwrite to start over")
            if self.dist.is_main:
                import shutil

                for p in ("checkpoints", "metrics.jsonl", "manifest.json", "config.json"):
                    q = self.out / p
                    shutil.rmtree(q) if q.is_dir() else q.unlink(missing_ok=True)
        distributed.barrier(self.dist)

    def _build(self):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        torch.manual_seed(self.cfg.seed)  # same initial weights on every rank (spec §A3: DP seeds)
        model = Transformer(self.model_cfg).to(self.dist.device)
        state = {"step": 0, "tokens": 0, "skipped_steps": 0}
        ck = ckpt_io.load_checkpoint(self.ckpt_root) if (self.ckpt_root / ckpt_io.LATEST).is_file() else None
        if ck is not None:
            ckpt_io.load_weights(model, ck.tensors, ck.path)
            state = ck.trainer_state
            if "rng" in state:
                _set_rng_state(state["rng"])
        elif self.init is not None:  # SFT from a pretrained checkpoint
            init = ckpt_io.load_checkpoint(self.init)
            ckpt_io.load_weights(model, init.tensors, init.path)
            self.on_log(f"initialized from {init.path}")
        model = distributed.wrap(model, self.dist, self.cfg.fsdp)
        # fused AdamW: one kernel over all parameters (transformers' Trainer default too); FSDP's
        # DTensors take the default implementation
        opt = make_optimizer(model, self.cfg.lr, self.cfg.weight_decay, (self.cfg.beta1, self.cfg.beta2), self.cfg.eps,
                             fused=not self.cfg.fsdp)
        if ck is not None and (optim_state := ck.optimizer_state()) is not None:
            try:
                set_optimizer_state_dict(self._unwrapped(model), opt, optim_state,
                                         options=StateDictOptions(full_state_dict=True))
            except (ValueError, KeyError, RuntimeError) as e:
                raise UsageError(f"{ck.path}: optimizer state does not fit this model ({e})") from e
            self.on_log(f"resumed from {ck.path.name}: step {state['step']}, {state['tokens']:,} tokens")
        if self.cfg.compile:
            model = torch.compile(model)
        return model, opt, state

    def _unwrapped(self, model):
        """The module whose parameter names checkpoints use (DDP's wrapper removed; FSDP2 keeps names)."""
        model = getattr(model, "_orig_mod", model)  # torch.compile
        return model if self.cfg.fsdp else distributed.unwrap(model)

    # -- the loop ----------------------------------------------------------------------------

    def lr(self, tokens_end: int) -> float:
        c = self.cfg
        warmup = c.warmup_tokens if c.warmup_tokens is not None else c.warmup_frac * c.max_tokens
        return lr_at(tokens_end, peak=c.lr, total=c.max_tokens, warmup=warmup, schedule=c.schedule,
                     cooldown_frac=c.cooldown_frac, cooldown=c.cooldown, final_frac=c.final_lr_frac)

    def run(self) -> Manifest:
        c, d = self.cfg, self.dist
        started = time.perf_counter()
        model, opt, state = self._build()
        if d.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            truncate_metrics(self.out / "metrics.jsonl", state["step"])
            data = self.sft.describe() if self.sft else {
                "tokens": str(self.train_data.path), "val": str(self.val_data.path) if self.val_data else None}
            (self.out / "config.json").write_text(json.dumps({
                "model": self.model_cfg.to_dict(), "train": asdict(c), **data, "world_size": d.world,
                "n_params": self.model_cfg.n_params(), "llmctl_version": __version__}, indent=2) + "\n")
        loader = self.sft.batches(c.seed) if self.sft else PackedBatches(self.train_data, c.seq_len, c.seed)
        has_val = self.val_data is not None or (self.sft is not None and self.sft.val is not None)
        token_bytes = token_byte_lengths(self.tokenizer_file, self.model_cfg.padded_vocab) if self.tokenizer_file else None
        flops_per_token = self.model_cfg.flops_per_token(c.seq_len)
        self.unigram_bpb = None
        if self.val_data is not None and token_bytes is not None:
            # the floor a language model must clear: token frequencies alone (printed beside val bpb)
            self.unigram_bpb = unigram_bits_per_byte(self.train_data, self.val_data, token_bytes)
            self.on_log(f"unigram baseline on the validation tokens: {self.unigram_bpb:.4f} bits/byte")
        peak, peak_source = peak_flops(d.device, DTYPES[c.dtype], c.peak_flops)
        params = [p for p in model.parameters()]
        metrics = open(self.out / "metrics.jsonl", "a") if d.is_main else None
        recent: deque[float] = deque(maxlen=c.spike_window)
        bad_in_row, last_val = 0, None
        last_step = min(self.total_steps, c.max_steps or self.total_steps)
        self.on_log(
            f"{self.model_cfg.n_params():,} parameters; {self.total_steps} steps of {c.batch_tokens:,} tokens "
            f"({self.batch_seqs} × {c.seq_len}, micro {c.micro_batch}, {d.world} rank(s)); "
            f"peak {peak / 1e9 if peak else float('nan'):.1f} GFLOP/s ({peak_source})")
        stop = _StopFlag()
        with stop:
            while state["step"] < last_step:
                step = state["step"]
                t0 = time.perf_counter()
                lr = set_lr(opt, self.lr(state["tokens"] + c.batch_tokens))
                ce, max_logit, loss_tokens = self._accumulate(model, loader, step)
                grad_norm = torch.nn.utils.clip_grad_norm_(params, c.grad_clip, foreach=True)
                ce, = distributed.all_reduce_sum([ce], d)
                ce /= d.world
                finite = math.isfinite(ce) and bool(torch.isfinite(grad_norm))
                if finite:
                    opt.step()
                    bad_in_row = 0
                else:
                    state["skipped_steps"] += 1
                    bad_in_row += 1
                opt.zero_grad(set_to_none=True)
                if d.device.type == "cuda":
                    torch.cuda.synchronize(d.device)
                dt = time.perf_counter() - t0
                state["step"] += 1
                state["tokens"] += c.batch_tokens
                tps = c.batch_tokens / dt
                rec = {
                    "step": state["step"], "tokens": state["tokens"], "loss": ce, "lr": lr,
                    "grad_norm": float(grad_norm), "clipped": bool(float(grad_norm) > c.grad_clip),
                    "tokens_per_s": round(tps, 1),
                    "mfu": round(tps * flops_per_token / (d.world * peak), 5) if peak else None,
                    "max_logit": max_logit, "step_seconds": round(dt, 4),
                }
                if self.sft:  # loss is per assistant token; how many the step had
                    rec["loss_tokens"] = int(loss_tokens)
                if not finite:
                    rec["skipped"] = True
                elif len(recent) >= max(10, c.spike_window // 2):
                    mean, std = float(np.mean(recent)), float(np.std(recent))
                    if std > 0 and (ce - mean) / std > c.spike_zscore:
                        rec["spike"] = round((ce - mean) / std, 2)
                if finite:
                    recent.append(ce)
                val = None
                if has_val and (state["step"] == last_step or (c.eval_every and state["step"] % c.eval_every == 0)):
                    val = self._validate(model, token_bytes)
                    last_val = val
                if metrics:
                    metrics.write(json.dumps(rec) + "\n")
                    if val:
                        metrics.write(json.dumps({"step": state["step"], "tokens": state["tokens"], "val": val}) + "\n")
                    metrics.flush()
                self.on_step(StepStats(state["step"], self.total_steps, state["tokens"], ce, lr, tps, rec["mfu"], val))
                if bad_in_row >= c.max_bad_steps:
                    raise StageFailed(
                        f"train: {bad_in_row} steps in a row had a non-finite loss or gradient (last at step "
                        f"{state['step']}); lower --lr, check the data, or resume from an earlier checkpoint")
                stopping = distributed.broadcast_flag(stop.signum is not None, d)
                if stopping or state["step"] == last_step or state["step"] % c.checkpoint_every == 0:
                    self._checkpoint(model, opt, state)
                if stopping:
                    raise Interrupted(stop.signum or signal.SIGTERM,
                                      f"stopped by signal at step {state['step']}; checkpoint saved, continue with --resume")
        if metrics:
            metrics.close()
        return self._manifest(state, last_val, time.perf_counter() - started)

    def _accumulate(self, model, loader: PackedBatches, step: int) -> tuple[float, float, float | None]:
        """Forward/backward over this rank's micro-batches; returns (mean CE, max logit, global
        loss-token count in SFT mode). The CE is this rank's share: its sum over ranks / world is
        the global batch's."""
        c, d = self.cfg, self.dist
        per_rank = self.batch_seqs // d.world
        micro = list(loader.micro_batches(step, self.batch_seqs, c.micro_batch, d.rank, d.world))
        if self.sft:
            return self._accumulate_sft(model, micro)
        ce_sum, max_logit = 0.0, -math.inf
        model.train()
        for i, (x, y) in enumerate(micro):
            x, y = x.to(d.device, non_blocking=True), y.to(d.device, non_blocking=True)
            weight = x.shape[0] / per_rank  # micro-batches may differ in size: weight by share
            sync = nullcontext() if (i == len(micro) - 1 or not hasattr(model, "no_sync")) else model.no_sync()
            with sync:
                with self.amp:
                    loss, stats = model(x, y, z_loss=c.z_loss)
                (loss * weight).backward()
            ce_sum += float(stats["ce"]) * weight
            max_logit = max(max_logit, float(stats["max_logit"]))
        return ce_sum, max_logit, None

    def _accumulate_sft(self, model, micro: list) -> tuple[float, float, float]:
        """SFT: each micro-batch backpropagates summed NLL · world / Z, Z = the assistant-token
        count of the whole global batch (all-reduced), so the gradient is NLL_total / Z whatever
        the micro-batch split and rank count (spec 001-posttrain-rl §A1)."""
        from llmctl.train.sft import sft_loss

        c, d = self.cfg, self.dist
        local = float(sum(int((y != -100).sum()) for _, y, _, _ in micro))
        z, = distributed.all_reduce_sum([local], d)
        scale = d.world / max(z, 1.0)
        ce_sum, max_logit = 0.0, -math.inf
        model.train()
        for i, batch in enumerate(micro):
            x, y, seg, pos = (t.to(d.device, non_blocking=True) for t in batch)
            sync = nullcontext() if (i == len(micro) - 1 or not hasattr(model, "no_sync")) else model.no_sync()
            with sync:
                with self.amp:
                    loss, nll, top = sft_loss(model, x, y, seg, pos, scale, c.z_loss)
                loss.backward()
            ce_sum += float(nll) * scale
            max_logit = max(max_logit, float(top))
        return ce_sum, max_logit, z

    def _validate(self, model, token_bytes) -> dict:
        d = self.dist
        if self.sft:
            nll, n = self.sft.validate(self._unwrapped(model), self.cfg.micro_batch, d.device, self.amp,
                                       d.rank, d.world, max_rows=self.cfg.eval_windows)
            nll, n = distributed.all_reduce_sum([nll, n], d)
            loss = nll / max(n, 1.0)
            return {"loss": round(loss, 6), "perplexity": round(math.exp(min(loss, 50.0)), 4), "tokens": int(n)}
        sums = evaluate_loss(self._unwrapped(model), self.val_data, self.cfg.seq_len,
                             token_bytes, batch_size=self.cfg.micro_batch, max_windows=self.cfg.eval_windows,
                             device=d.device, autocast=self.amp, rank=d.rank, world=d.world)
        keys = sorted(sums)
        total = distributed.all_reduce_sum([float(sums[k]) for k in keys], d)
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in summarize(dict(zip(keys, total))).items()}

    def _checkpoint(self, model, opt, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        # Full (unsharded) tensors on CPU: the same files whether the run was DDP, FSDP or single.
        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_state, optim_state = get_state_dict(self._unwrapped(model), opt, options=opts)
        if self.dist.is_main:
            trainer_state = {**state, "rng": _rng_state(), "seed": self.cfg.seed, "lr": self.lr(state["tokens"]),
                             "schedule": self.cfg.schedule, "max_tokens": self.cfg.max_tokens,
                             "data_position": {"next_sequence": state["step"] * self.batch_seqs}}
            if self.sft:  # eval, generate and rl read this: the model speaks the chat template
                trainer_state.update(chat=True, chat_template=self.sft.template.name)
            ckpt_io.save_checkpoint(self.ckpt_root, state["step"], self.model_cfg, model_state, trainer_state,
                                    optimizer_state=optim_state, tokenizer_file=self.tokenizer_file, keep_last=self.cfg.keep_checkpoints)
        distributed.barrier(self.dist)

    def _manifest(self, state: dict, val: dict | None, wall: float) -> Manifest:
        if self.sft:
            inputs = self.sft.inputs()
        else:
            inputs = [input_ref(self.train_data.path)] + ([input_ref(self.val_data.path)] if self.val_data else [])
        counts = {"steps": state["step"], "tokens": state["tokens"], "skipped_steps": state["skipped_steps"]}
        if self.sft:
            counts.update(self.sft.counts())
        if val:
            counts.update({f"val_{k}": v for k, v in val.items()})
        if self.unigram_bpb is not None:
            counts["val_unigram_bits_per_byte"] = round(self.unigram_bpb, 6)
        config = {"model": self.model_cfg.to_dict(), "train": asdict(self.cfg)}
        if self.sft:
            config["sft"] = self.sft.describe()
        m = Manifest(kind="run", stage="train", config=config,
                     inputs=inputs, outputs=[], counts=counts, wall_seconds=round(wall, 3))
        if self.dist.is_main:
            write_manifest(self.out, m)
        return m


def run_train(tokens: Path, out: Path, model_cfg: ModelConfig, cfg: TrainConfig, **kw) -> Manifest:
    trainer = Trainer(tokens, out, model_cfg, cfg, **kw)
    with distributed.session(trainer.dist):
        return trainer.run()


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
    """A train preset ([model] and [train] tables), then --set overrides, then explicit flags."""
    from llmctl.config import build_config, find_config, read_toml

    model_values: dict = {}
    if config:
        path = find_config("train", config)
        data = read_toml(path)
        unknown = sorted(set(data) - {"model", "train"})
        if unknown:
            raise UsageError(f"{path}: unknown table(s) {', '.join(unknown)} (expected [model] and [train])")
        model_values = dict(data.get("model", {}))
    model_sets, train_sets = parse_sets(list(sets))
    model_values.update(model_sets)
    try:
        model_cfg = ModelConfig.from_dict(model_values)
    except TypeError as e:
        raise UsageError(f"model config: {e}") from e
    unknown = sorted(set(train_sets) - set(TrainConfig.__dataclass_fields__))
    if unknown:
        raise UsageError(f"--set: unknown train key(s) {', '.join(unknown)}")
    overrides = {**train_sets, **{k: v for k, v in train_flags.items() if v is not None}}
    return model_cfg, build_config(TrainConfig, "train", config, overrides, table="train")
