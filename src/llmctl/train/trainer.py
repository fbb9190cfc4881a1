"""`llmctl train`: the training loop, over a BatchSource — token windows for pretraining
(train/pretrain.py) or packed conversations for SFT (train/sft.py).

One step: the global batch (batch_tokens) is split across ranks, then into micro-batches whose
gradients accumulate, each weighted by the source so that the sum is the global batch's gradient;
the pre-clip global gradient norm is logged and clipped to grad_clip; a non-finite loss or norm
skips the step (max_bad_steps in a row aborts); AdamW steps at the learning rate of the schedule,
which is a function of tokens seen; with --ema-decay the moving average of the weights follows
(train/ema.py). The batch at each step is a pure function of (seed, data index), and the data
index of a step is `data_index(state, step)`, so a resumed run replays exactly the batches an
uninterrupted run would have seen, and on CPU its losses are bitwise the same. SIGTERM/SIGINT
checkpoint at the end of the step and stop.

Loss spikes. A step whose loss lies spike_zscore standard deviations above the recent window is
flagged, and --on-spike flag | skip-batch | rewind says whether its update is taken, skipped, or the
run goes back to its last checkpoint and skips the data that spiked: train/spikes.py (SpikePolicy
decides; the loop carries out, _rewind restores the checkpoint).

The run directory (torchrt/rundir.py; docs/design.md §2) holds config.json (resolved),
metrics.jsonl (one object per step, plus "val" records), checkpoints/ and, when the run
completes, manifest.json.
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
from typing import Callable, Protocol, Sequence

import numpy as np
import torch

from llmctl import __version__
from llmctl.artifacts import checkpoint as ckpt_io
from llmctl.artifacts.manifest import Manifest, input_identity
from llmctl.errors import Interrupted, StageFailed, UsageError
from llmctl.model.config import ModelConfig
from llmctl.model.load import apply_weights, load_checkpoint, model_config
from llmctl.model.transformer import Transformer
from llmctl.torchrt import distributed
from llmctl.torchrt.alloc import keep_freed_memory
from llmctl.torchrt.device import DTYPES, autocast
from llmctl.torchrt.distributed import Dist
from llmctl.torchrt.mfu import mfu, peak_flops
from llmctl.torchrt.optim import describe_groups, lr_at, make_optimizer, set_lr
from llmctl.torchrt import rundir
from llmctl.torchrt.rundir import RunDir
from llmctl.train.config import TrainConfig
from llmctl.train import lora as lora_run
from llmctl.train.ema import EMA
from llmctl.train.mixture import DataSource
from llmctl.train.pretrain import PretrainData
from llmctl.train.spikes import SpikePolicy


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
    val_ema: dict | None = None  # the same validation of the EMA weights (--ema-decay)


class BatchSource(Protocol):
    """What the loop needs from its data. A batch is a tuple of CPU tensors; the loop moves it to
    the device and runs `loss` on it under autocast. Optional, read with getattr: `run_files` (its
    own entries in OUT), `build_model(cfg)` and `init_tensors(model, tensors)` (another model than
    the Transformer, and what it adds to an --init checkpoint's weights), `stage` (the manifest's)."""

    vocab_size: int
    tokenizer_file: Path | None  # copied into every checkpoint
    init: Path | None  # a checkpoint whose weights start the run (else the seeded initialization)
    has_val: bool

    def describe(self) -> dict:
        """config.json's entries about the data."""

    def start(self, padded_vocab: int) -> None:
        """Once, when the loop starts: open the batches, compute baselines (logged)."""

    def batch(self, step: int, batch_seqs: int, micro: int, dist: Dist) -> tuple[list[tuple], list[float], float | None]:
        """This rank's micro-batches of data index `step` (the trainer's data_index of the optimizer
        step: the same number unless a rewind skipped data), the weight of each one's loss (the weighted sum
        over micro-batches, summed over ranks / world, is the global batch's loss), and the global
        count of loss tokens where the loss is a masked token sum (else None)."""

    def loss(self, model, batch: tuple, z_loss: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(loss to backpropagate, before its weight; its cross-entropy; the max logit)."""

    def validate(self, model, dist: Dist, micro: int, limit: int, autocast) -> dict:
        """Held-out numbers of the whole validation set (summed over ranks)."""

    def step_record(self, step: int) -> dict:
        """Entries added to metrics.jsonl's record of `step` (just done), e.g. tokens per source."""

    def checkpoint_state(self) -> dict:
        """Entries added to each checkpoint's trainer_state.json."""

    def manifest(self, val: dict | None) -> tuple[dict, list[dict], dict]:
        """What the manifest adds: (config entries, inputs, counts), given the last validation."""


def data_index(state: dict, step: int) -> int:
    """The data index of optimizer step `step` (0-based): the argument the batch source's batch()
    gets. Steps walk the data indices in order, passing over the ones in state["skipped_data"]
    (sorted; data steps a rewind skipped). The one place that maps steps to data."""
    d = step
    for skipped in state.get("skipped_data", ()):
        if skipped > d:
            break
        d += 1
    return d


def _rng_state() -> str:
    return base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()


def _set_rng_state(s: str) -> None:
    torch.set_rng_state(torch.from_numpy(np.frombuffer(base64.b64decode(s), dtype=np.uint8).copy()))


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
    def __init__(self, source: BatchSource, out: Path, model_cfg: ModelConfig, cfg: TrainConfig,
                 resume: bool = False, overwrite: bool = False,
                 on_step: Callable[[StepStats], None] | None = None, on_log: Callable[[str], None] | None = None):
        cfg.check()
        if cfg.lora is not None and source.init is None:  # LoRA (train/lora.py)
            raise UsageError("train: --lora-rank adapts a trained model: give --init CKPT")
        self.source, self.cfg = source, cfg
        self.on_step, self.on_log = on_step or (lambda s: None), on_log or (lambda m: None)
        vocab = source.vocab_size
        if source.init is not None and vocab > model_cfg.padded_vocab:
            raise UsageError(f"--init: the tokenizer's {vocab} ids do not fit the model's {model_cfg.padded_vocab}")
        if model_cfg.vocab_size != vocab and source.init is None:
            model_cfg = ModelConfig.from_dict({**model_cfg.to_dict(), "vocab_size": vocab})
        if cfg.seq_len > model_cfg.max_seq_len:
            model_cfg = ModelConfig.from_dict({**model_cfg.to_dict(), "max_seq_len": cfg.seq_len})
        self.model_cfg = model_cfg
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.dist = distributed.init(cfg.device)
        keep_freed_memory(self.dist.device)
        self.batch_seqs = cfg.batch_tokens // cfg.seq_len
        if self.batch_seqs % self.dist.world:
            raise UsageError(f"train: {self.batch_seqs} sequences per batch do not split over {self.dist.world} ranks")
        self.total_steps = math.ceil(cfg.max_tokens / cfg.batch_tokens)
        # a source's own files in OUT (dpo's cached reference log-probs) are the run's: --overwrite removes them
        self.run_dir = RunDir(out, self.dist, entries=rundir.TRAINING_RUN + tuple(getattr(source, "run_files", ())))
        # what a resumed run must share with the one it continues: the architecture and the data
        self.inputs = [input_identity(r) for r in source.manifest(None)[1]]
        self.run_dir.prepare(resume, overwrite, expect={"model": self.model_cfg.to_dict(), "inputs": self.inputs})
        self.amp = autocast(self.dist.device, cfg.dtype)

    # -- set-up ------------------------------------------------------------------------------

    def _build(self):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        torch.manual_seed(self.cfg.seed)  # same initial weights on every rank (spec §A3: DP seeds)
        build = getattr(self.source, "build_model", Transformer)  # train-rm's: a scalar head on the decoder
        model = build(self.model_cfg).to(self.dist.device).set_recompute(self.cfg.recompute)
        state = {"step": 0, "tokens": 0, "skipped_steps": 0}
        ck = load_checkpoint(self.run_dir.checkpoints, merged=False) if self.run_dir.has_checkpoint() else None
        init = None
        if ck is not None:
            if self.cfg.lora is not None or ck.lora is not None:  # LoRA: base + adapters (train/lora.py)
                self.lora_base, self.cfg.lora = lora_run.resume(model, ck, self.source.init, self.cfg.lora, self.on_log)
            else:
                apply_weights(model, ck.tensors, ck.path)
            state = ck.trainer_state
            if "rng" in state:
                _set_rng_state(state["rng"])
        elif self.source.init is not None:  # fine-tuning or midtraining a checkpoint: its EMA weights where it has them
            # training on with its optimizer state continues the raw weights those moments belong to
            weights = "raw" if self.cfg.init_optimizer else getattr(self.source, "init_weights", "auto")
            init = load_checkpoint(self.source.init, weights)
            # what the source's model adds to the checkpoint's (a reward head) comes from init_tensors
            tensors = self.source.init_tensors(model, init.tensors) if hasattr(self.source, "init_tensors") else init.tensors
            apply_weights(model, tensors, init.path)
            self.on_log(f"initialized from {init.path}" + (" (its EMA weights)" if init.weights == "ema" else ""))
            if self.cfg.lora is not None:
                self.lora_base = lora_run.start(model, init, self.cfg.lora, self.on_log)
        self.ema = self._build_ema(model, ck, state)
        model = distributed.wrap(model, self.dist, self.cfg.fsdp)
        if self.ema is not None and self.cfg.fsdp:
            self.ema.model = distributed.wrap(self.ema.model, self.dist, True)  # sharded like the weights it follows
        # fused AdamW: one kernel over all parameters (transformers' Trainer default too); FSDP's
        # DTensors take the default implementation
        opt = make_optimizer(model, self.cfg.lr, self.cfg.weight_decay, (self.cfg.beta1, self.cfg.beta2), self.cfg.eps,
                             fused=not self.cfg.fsdp, optimizer=self.cfg.optimizer)
        self.optimizer_groups = describe_groups(opt)
        carried = ck if ck is not None else (init if self.cfg.init_optimizer else None)
        if carried is not None and (optim_state := carried.optimizer_state()) is not None:
            try:
                set_optimizer_state_dict(self._unwrapped(model), opt, optim_state,
                                         options=StateDictOptions(full_state_dict=True))
            except (ValueError, KeyError, RuntimeError) as e:
                raise UsageError(f"{carried.path}: optimizer state does not fit this model ({e})") from e
            if ck is not None:
                self.on_log(f"resumed from {ck.path.name}: step {state['step']}, {state['tokens']:,} tokens")
            else:
                self.on_log(f"optimizer state (AdamW moments and step counts) from {carried.path}")
        elif carried is not None and ck is None:
            raise UsageError(f"--init-optimizer: {carried.path} has no optimizer.pt")
        if self.cfg.compile:
            model = torch.compile(model)
        return model, opt, state

    def _build_ema(self, model, ck, state: dict) -> EMA | None:
        """The moving average (--ema-decay): a checkpoint's ema.safetensors, else the weights now."""
        if self.cfg.ema_decay is None:
            return None
        tensors = ck.ema_tensors() if ck is not None else None
        if ck is not None and tensors is None:
            self.on_log(f"{ck.path.name} has no EMA: the average starts from its weights")
        updates = state.get("ema_updates", 0) if tensors is not None else 0
        where = ck.path / ckpt_io.EMA_FILE if tensors is not None else ckpt_io.EMA_FILE
        return EMA(self.cfg.ema_decay, model, tensors, updates, where=where)

    def _unwrapped(self, model):
        """The module whose parameter names checkpoints use (DDP's wrapper removed; FSDP2 keeps names)."""
        model = getattr(model, "_orig_mod", model)  # torch.compile
        return model if self.cfg.fsdp else distributed.unwrap(model)

    # -- the loop ----------------------------------------------------------------------------

    def lr(self, tokens_end: int) -> float:
        c = self.cfg
        # a decay branch starts at the rate its stable-phase checkpoint left off: no warmup by default
        default_warmup = 0.0 if c.schedule == "decay" else c.warmup_frac * c.max_tokens
        warmup = c.warmup_tokens if c.warmup_tokens is not None else default_warmup
        return lr_at(tokens_end, peak=c.lr, total=c.max_tokens, warmup=warmup, schedule=c.schedule,
                     cooldown_frac=c.cooldown_frac, cooldown=c.cooldown, final_frac=c.final_lr_frac)

    def run(self) -> Manifest:
        c, d = self.cfg, self.dist
        started = time.perf_counter()
        model, opt, state = self._build()
        self.run_dir.write_json("config.json", {
            "model": self.model_cfg.to_dict(), "train": asdict(c), **self.source.describe(), "inputs": self.inputs, "world_size": d.world,
            "n_params": self.model_cfg.n_params(), "llmctl_version": __version__})
        self.source.start(self.model_cfg.padded_vocab)
        flops_per_token = self.model_cfg.flops_per_token(c.seq_len)
        peak, peak_source = peak_flops(d.device, DTYPES[c.dtype], c.peak_flops)
        params = [p for p in model.parameters()]
        spikes = SpikePolicy(c, state.get("recent_losses", ()))
        last_val, last_val_ema = None, None
        last_step = min(self.total_steps, c.max_steps or self.total_steps)
        self.on_log(
            f"{self.model_cfg.n_params():,} parameters; {self.total_steps} steps of {c.batch_tokens:,} tokens "
            f"({self.batch_seqs} × {c.seq_len}, micro {c.micro_batch}, {d.world} rank(s)); "
            f"peak {peak / 1e9 if peak else float('nan'):.1f} GFLOP/s ({peak_source})"
            + (f"; recompute {c.recompute}" if c.recompute != "none" else "")
            + (f"; EMA of the weights, decay {c.ema_decay:g}" if c.ema_decay is not None else ""))
        if c.on_spike == "rewind" and not self.run_dir.has_checkpoint():
            self._checkpoint(model, opt, state, spikes.recent)  # where a rewind before the first periodic checkpoint goes
        metrics = self.run_dir.metrics(state["step"])
        try:
            with _StopFlag() as stop:
                while state["step"] < last_step:
                    step = state["step"]
                    t0 = time.perf_counter()
                    lr = set_lr(opt, self.lr(state["tokens"] + c.batch_tokens))
                    data_step = data_index(state, step)
                    ce, max_logit, loss_tokens = self._accumulate(model, data_step)
                    grad_norm = torch.nn.utils.clip_grad_norm_(params, c.grad_clip, foreach=True)
                    ce, = distributed.all_reduce_sum([ce], d)
                    ce /= d.world
                    action = spikes.observe(ce, math.isfinite(ce) and bool(torch.isfinite(grad_norm)))
                    if action.rewind:
                        opt.zero_grad(set_to_none=True)
                        model, opt, state, event = self._rewind(state, step, action.z, ce)
                        params = [p for p in model.parameters()]
                        spikes.restart(state.get("recent_losses", ()))
                        metrics.close()
                        metrics = self.run_dir.metrics(state["step"])  # the steps past the checkpoint run again
                        metrics.log({"step": state["step"], "tokens": state["tokens"], "rewind": event})
                        continue
                    if action.apply:
                        opt.step()
                        if self.ema is not None:
                            self.ema.update(params)
                    else:
                        state[action.counter] = state.get(action.counter, 0) + 1
                    opt.zero_grad(set_to_none=True)
                    if d.device.type == "cuda":
                        torch.cuda.synchronize(d.device)
                    dt = time.perf_counter() - t0
                    state["step"] += 1
                    state["tokens"] += c.batch_tokens
                    spikes.stepped(state, step)
                    tps = c.batch_tokens / dt
                    rec = {
                        "step": state["step"], "tokens": state["tokens"], "loss": ce, "lr": lr,
                        "grad_norm": float(grad_norm), "clipped": bool(float(grad_norm) > c.grad_clip),
                        "tokens_per_s": round(tps, 1),
                        "mfu": round(mfu(tps, flops_per_token, d.world, peak), 5) if peak else None,
                        "max_logit": max_logit, "step_seconds": round(dt, 4),
                    }
                    if data_step != step:
                        rec["data_step"] = data_step  # rewinds skipped data before this step
                    if loss_tokens is not None:  # the loss is per loss token (SFT: assistant tokens); how many
                        rec["loss_tokens"] = int(loss_tokens)
                    rec.update(self.source.step_record(state["step"]))
                    rec.update(action.marks())
                    val = val_ema = None
                    if self.source.has_val and (state["step"] == last_step or (c.eval_every and state["step"] % c.eval_every == 0)):
                        val, val_ema = last_val, last_val_ema = self._validate(model)
                    metrics.log(rec)
                    if val:
                        metrics.log({"step": state["step"], "tokens": state["tokens"], "val": val,
                                     **({"val_ema": val_ema} if val_ema else {})})
                    self.on_step(StepStats(state["step"], self.total_steps, state["tokens"], ce, lr, tps, rec["mfu"], val, val_ema))
                    spikes.check(state["step"])
                    stopping = distributed.broadcast_flag(stop.signum is not None, d)
                    if (stopping or state["step"] == last_step or state["step"] % c.checkpoint_every == 0
                            or state["step"] in (c.branch_steps or ())):
                        self._checkpoint(model, opt, state, spikes.recent)
                    if stopping:
                        raise Interrupted(stop.signum or signal.SIGTERM,
                                          f"stopped by signal at step {state['step']}; checkpoint saved, continue with --resume")
        finally:
            metrics.close()
        return self._manifest(state, last_val, last_val_ema, time.perf_counter() - started)

    def _rewind(self, state: dict, step: int, z: float, ce: float):
        """--on-spike rewind at 0-based step `step`: the data window to skip is added to the run's
        skipped data, then the model, optimizer, EMA and state are those of the last checkpoint
        (as --resume builds them), with the rewind history — skipped_data, rewinds, rewind_streak,
        rewind_step — carried over from the run it interrupts rather than taken from the checkpoint.
        Returns (model, optimizer, state, the event for metrics.jsonl)."""
        c = self.cfg
        streak = state.get("rewind_streak", 0) + 1
        if streak > c.max_rewinds:
            raise StageFailed(
                f"train: the loss spiked again at step {step + 1} (z {z}) after {c.max_rewinds} rewind(s) in a row "
                f"that did not get past step {state['rewind_step'] + 1}; the spike follows the model state, not one "
                "batch: lower --lr, check the data, or raise --set train.max_rewinds")
        ck = ckpt_io.open_checkpoint(self.run_dir.checkpoints)
        ck_path, ck_step = ck.path, int(ck.trainer_state["step"])
        window = [data_index(state, k) for k in range(max(ck_step, step - c.rewind_skip + 1), step + 1)]
        history = {"skipped_data": sorted(set(state.get("skipped_data", ())) | set(window)),
                   "rewinds": state.get("rewinds", 0) + 1, "rewind_streak": streak, "rewind_step": step}
        self.on_log(f"loss spike at step {step + 1} (loss {ce:.4f}, z {z}): rewinding to {ck_path.name}, "
                    f"skipping data step(s) {', '.join(map(str, window))}")
        model, opt, new_state = self._build()
        new_state.update(history)
        event = {"spike_step": step + 1, "loss": ce, "z": z, "to_step": ck_step, "skipped_data": window,
                 "rewinds": history["rewinds"]}
        return model, opt, new_state, event

    def _accumulate(self, model, data_step: int) -> tuple[float, float, float | None]:
        """Forward/backward over this rank's micro-batches of data index `data_step`; returns
        (weighted CE, max logit, global loss-token count or None). The CE is this rank's share: its
        sum over ranks / world is the global batch's."""
        d = self.dist
        micro, weights, loss_tokens = self.source.batch(data_step, self.batch_seqs, self.cfg.micro_batch, d)
        ce_sum, max_logit = 0.0, -math.inf
        model.train()
        for i, (batch, weight) in enumerate(zip(micro, weights)):
            batch = tuple(t.to(d.device, non_blocking=True) for t in batch)
            sync = nullcontext() if (i == len(micro) - 1 or not hasattr(model, "no_sync")) else model.no_sync()
            with sync:
                with self.amp:
                    loss, ce, top = self.source.loss(model, batch, self.cfg.z_loss)
                (loss * weight).backward()
            ce_sum += float(ce) * weight
            max_logit = max(max_logit, float(top))
        return ce_sum, max_logit, loss_tokens

    def _validate(self, model) -> tuple[dict, dict | None]:
        """Held-out numbers of the weights and, with --ema-decay, of their moving average (else None)."""
        c, d = self.cfg, self.dist
        val = self.source.validate(self._unwrapped(model), d, c.micro_batch, c.eval_windows, self.amp)
        val_ema = None
        if self.ema is not None:
            val_ema = self.source.validate(self.ema.model, d, c.micro_batch, c.eval_windows, self.amp)
            if hasattr(self.ema.model, "reshard"):  # FSDP2 leaves a root it ran forward unsharded
                self.ema.model.reshard()
        return val, val_ema

    def _checkpoint(self, model, opt, state: dict, recent: deque) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict

        # Full (unsharded) tensors on CPU: the same files whether the run was DDP, FSDP or single.
        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        if opt.state:
            model_state, optim_state = get_state_dict(self._unwrapped(model), opt, options=opts)
        else:  # before the first step (rewind's step-0 checkpoint): get_state_dict would give AdamW a step
            model_state, optim_state = get_model_state_dict(self._unwrapped(model), options=opts), None
        ema_state = get_model_state_dict(self.ema.model, options=opts) if self.ema is not None else None
        c = self.cfg
        model_state, lora_json = lora_run.checkpoint_parts(c.lora, getattr(self, "lora_base", None), model_state)
        trainer_state = {**state, "rng": _rng_state(), "seed": c.seed, "lr": self.lr(state["tokens"]),
                         "schedule": c.schedule, "max_tokens": c.max_tokens,
                         "data_position": {"next_sequence": data_index(state, state["step"]) * self.batch_seqs},
                         "recent_losses": list(recent),  # the spike detector's window
                         **({"ema_decay": c.ema_decay, "ema_updates": self.ema.updates} if self.ema is not None else {}),
                         **self.source.checkpoint_state()}
        self.run_dir.checkpoint(state["step"], self.model_cfg, model_state, trainer_state, optimizer_state=optim_state,
                                tokenizer_file=self.source.tokenizer_file, keep_last=c.keep_checkpoints, keep_steps=c.branch_steps or (),
                                ema_state=ema_state, extra_json={"lora.json": lora_json} if lora_json else None)

    def _manifest(self, state: dict, val: dict | None, val_ema: dict | None, wall: float) -> Manifest:
        config, inputs, counts = self.source.manifest(val)
        counts = {"steps": state["step"], "tokens": state["tokens"], "skipped_steps": state["skipped_steps"], **counts}
        for key in ("spike_skipped_steps", "rewinds"):
            if state.get(key):
                counts[key] = state[key]
        if state.get("skipped_data"):
            counts["skipped_data_steps"] = len(state["skipped_data"])
        counts.update({f"val_ema_{k}": v for k, v in (val_ema or {}).items()})
        config = {"model": self.model_cfg.to_dict(), "train": asdict(self.cfg), **config,
                  "optimizer_groups": getattr(self, "optimizer_groups", None)}
        return self.run_dir.finish(Manifest(kind="run", stage=getattr(self.source, "stage", "train"), config=config, inputs=inputs, outputs=[],
                                            counts=counts, wall_seconds=round(wall, 3)))


def fit(source: BatchSource, out: Path, model_cfg: ModelConfig, cfg: TrainConfig, **kw) -> Manifest:
    """Train on `source` (under torchrun: in its process group, torn down after the run)."""
    with rundir.lock(out):
        trainer = Trainer(source, out, model_cfg, cfg, **kw)
        with distributed.session(trainer.dist):
            return trainer.run()


def run_train(tokens: Path | Sequence[DataSource], out: Path, model_cfg: ModelConfig, cfg: TrainConfig,
              val: Path | None = None, on_log: Callable[[str], None] | None = None, budget_from: str | None = None,
              init: Path | None = None, **kw) -> Manifest:
    """`llmctl train TOKENS` (one tokens artifact) or `--data`/`[[data]]` (a mixture of sources,
    train/mixture.py): pretraining, validated on `val` (and each source's own `val`) when given.
    `budget_from` names where max_tokens came from when the user did not pick it (a preset), for
    the epochs warning. The budget may be cut by max_epochs (PretrainData says so). With `init`,
    continued from a checkpoint (midtraining): its architecture, its weights, and with
    cfg.init_optimizer its AdamW state, under this run's own schedule."""
    cfg.check()
    mixture = not isinstance(tokens, (str, Path))
    sources = list(tokens) if mixture else [DataSource(Path(tokens).name, Path(tokens))]
    offset = 0
    if init is not None:
        init, model_cfg, offset = init_checkpoint(init, sources, cfg)
    elif cfg.init_optimizer:
        raise UsageError("--init-optimizer needs --init CKPT")
    log = on_log or (lambda m: None)
    if offset:
        log(f"--init continues its run's data: {sources[0].path} from step {offset} on, the batches it would have seen next")
    source = PretrainData(sources, val, cfg, log, mixture=mixture, budget_from=budget_from, init=init, offset=offset)
    return fit(source, out, model_cfg, source.cfg, on_log=on_log, **kw)


def init_checkpoint(init: Path, sources: Sequence[DataSource], cfg: TrainConfig) -> tuple[Path, ModelConfig, int]:
    """(checkpoint dir, its architecture, data offset in steps) for continuing on `sources`, which
    must be tokenized with the checkpoint's tokenizer (one line naming both when not). When the
    checkpoint's run trained on this very tokens artifact alone, with this seed and batch shape,
    the offset is its step: continued pretraining picks up the data order where the parent
    stopped, rather than repeating its first batches (and, with --init-optimizer and a matching
    schedule, equals the parent trained on in one run). On other data (a new mixture) it starts at 0."""
    from llmctl.artifacts.manifest import file_sha256, input_identity, input_ref

    ck = ckpt_io.open_checkpoint(init)  # its metadata: the weights are read once, when the model is built
    path = ck.path
    tokens = sources[0].path  # the sources share one tokenizer (PretrainData checks)
    theirs, ours = Path(tokens) / "tokenizer.json", ck.tokenizer_file
    if ours is None or not theirs.is_file() or file_sha256(theirs) != file_sha256(ours):
        raise UsageError(f"--init {path}: its tokenizer is not the one {tokens} was tokenized with "
                         f"({ours or 'none in the checkpoint'} vs {theirs}); tokenize the data with the checkpoint's")
    parent = path.parent.parent / "config.json"  # run/checkpoints/step-N -> run/config.json
    try:
        prev = json.loads(parent.read_text()) if parent.is_file() else {}
    except (OSError, json.JSONDecodeError):
        prev = {}
    same_data = len(sources) == 1 and (prev.get("inputs") or [None])[0] == input_identity(input_ref(tokens)) \
        and len(prev.get("data") or []) == 1
    same_order = all((prev.get("train") or {}).get(k) == getattr(cfg, k) for k in ("seed", "seq_len", "batch_tokens"))
    offset = int(ck.trainer_state.get("step", 0)) if same_data and same_order else 0
    return path, model_config(ck), offset
