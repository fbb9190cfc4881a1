"""The pretraining batch source: windows of a tokens artifact, or of a mixture of them
(train/mixture.py: weights, epoch caps, upsampling), validated on held-out tokens artifacts in
loss, perplexity and bits per byte, beside the unigram floor.

A single tokens artifact is the one-source mixture: its slot g is its g-th draw, in the seeded
epoch orders of train/loader.py, so its batches are byte for byte those of the loader before
mixtures existed (tests/test_mixture.py checks it against PackedBatches).

Before step 1 it says how many epochs of each source the run makes — n_ep,i = w_i·D/U_i (spec
001-data-eval §A6, the rule phi-4 states), computed exactly from the schedule's length and the
weights with the caps and the upsampling in — and warns past EPOCHS_WARN. With `max_epochs` on
every source the mixture holds a finite number of sequences and the run's budget (max_tokens,
which the schedule spans) is cut to it, in whole batches.

With `init` (a checkpoint) it is continued pretraining or midtraining: the run starts from those
weights, and its lineage names both parents, the data and the checkpoint's run.

Each micro-batch's mean token loss is weighted by its share of the rank's sequences, so the
accumulated gradient is the mean over the rank's batch whatever the micro-batch split.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from pathlib import Path
from typing import Callable, Sequence

from llmctl.artifacts.checkpoint import owner_artifact
from llmctl.artifacts.manifest import MANIFEST, artifact_file, file_sha256, input_ref
from llmctl.artifacts.tokens import TokenDataset
from llmctl.errors import UsageError
from llmctl.eval.loss import evaluate_loss, summarize, token_byte_lengths, unigram_bits_per_byte
from llmctl.torchrt import distributed
from llmctl.torchrt.distributed import Dist
from llmctl.train.config import TrainConfig
from llmctl.train.mixture import DataSource, MixedBatches, SourceWindows, check_sources

# Muennighoff et al. 2023, "Scaling Data-Constrained Language Models": up to ~4 epochs, repeated
# tokens are worth nearly as much as new ones; past that the returns diminish quickly (spec
# 001-data-eval §A7: "<= 4 epochs nearly free", the SmolLM2 code cap at ~4 epochs).
EPOCHS_WARN = 4.0


class PretrainData:
    def __init__(self, sources: Sequence[DataSource], val: Path | None, cfg: TrainConfig,
                 on_log: Callable[[str], None] = lambda m: None, mixture: bool = False, budget_from: str | None = None,
                 init: Path | None = None, offset: int = 0):
        self.init = init  # None: the seeded initialization
        self.offset = offset  # steps of this data a parent run (--init) already trained on
        check_sources(sources)
        self.specs, self.mixture, self.on_log = list(sources), mixture, on_log
        self.seq_len, self.seed = cfg.seq_len, cfg.seed
        # every shard checked against its sha256 before step 1
        self.datasets = [TokenDataset(s.path, verify=True) for s in self.specs]
        self.val = TokenDataset(val, verify=True) if val else None
        self.val_sources = {s.name: TokenDataset(s.val, verify=True) for s in self.specs if s.val}
        self._check_tokenizers()
        self.train = self.datasets[0]
        self.vocab_size = self.train.vocab_size
        self.tokenizer_file = self._tokenizer_file()
        self.has_val = self.val is not None or bool(self.val_sources)
        self.token_bytes = self.unigram_bpb = None
        self.windows = [SourceWindows(ds, cfg.seq_len, cfg.seed, i, s.name, s.upsample)
                        for i, (s, ds) in enumerate(zip(self.specs, self.datasets))]
        self.max_epochs = [s.max_epochs if s.max_epochs is not None else cfg.max_epochs for s in self.specs]
        caps = [self._cap(s, w, e) for s, w, e in zip(self.specs, self.windows, self.max_epochs)]
        self.batch_seqs = cfg.batch_tokens // cfg.seq_len
        self.loader = MixedBatches(self.windows, [s.weight for s in self.specs], caps, self.batch_seqs, cfg.seed)
        self.caps = caps
        self.cfg, self.notes = self._budget(cfg, budget_from)
        self.plan = self._plan()
        self.notes += self._summary(budget_from)
        self._step = 0

    # -- set-up ------------------------------------------------------------------------------

    def _name(self, i: int) -> str:
        return f"source {self.specs[i].name}" if self.mixture else "the data"

    def _cap(self, spec: DataSource, w: SourceWindows, max_epochs: float | None) -> int | None:
        if max_epochs is None:
            return None
        cap = math.floor(Fraction(repr(float(max_epochs))) * w.n_windows)
        if cap < 1:
            raise UsageError(f"train: max_epochs {max_epochs:g} of {spec.name} is less than one of its {w.n_windows} windows")
        return cap

    def _tokenizer_id(self, ds: TokenDataset) -> tuple:
        tj = ds.path / "tokenizer.json"
        sha = file_sha256(tj) if tj.is_file() else next(
            (r.get("sha256") for r in ds.manifest.inputs if str(r.get("path", "")).endswith(".json")), None)
        return ds.vocab_size, ds.eos_id, sha

    def _check_tokenizers(self) -> None:
        """Every source and held-out set must share one tokenizer (vocabulary, EOS, tokenizer.json)."""
        named = [(f"source {s.name}" if self.mixture else str(s.path), ds) for s, ds in zip(self.specs, self.datasets)]
        named += [(f"--val {s.name}={s.val}", self.val_sources[s.name]) for s in self.specs if s.val]
        if self.val is not None:
            named.append((f"--val {self.val.path}", self.val))
        first, ref = named[0][0], self._tokenizer_id(named[0][1])
        for name, ds in named[1:]:
            got = self._tokenizer_id(ds)
            if got != ref:
                what = (f"vocabulary {ref[0]} vs {got[0]}" if ref[0] != got[0] else f"EOS id {ref[1]} vs {got[1]}" if ref[1] != got[1]
                        else f"tokenizer.json sha256 {str(ref[2])[:12]}… vs {str(got[2])[:12]}…")
                raise UsageError(f"train: {first} and {name} were tokenized with different tokenizers ({what}); tokenize every source with one")

    def _tokenizer_file(self) -> Path | None:
        """The tokens artifact's own tokenizer.json (tokenize copies it in). The manifest's
        `config.tokenizer` records where it came from; it is followed only when it names a file
        inside the artifact, since a path elsewhere (`/etc/shadow`) would be read as the
        tokenizer and copied into every checkpoint."""
        own = self.train.path / "tokenizer.json"
        if own.is_file():
            return own
        named = self.train.manifest.config.get("tokenizer")
        if not named:
            return None
        where = f"{self.train.path / MANIFEST} config.tokenizer (the artifact has no tokenizer.json)"
        if not isinstance(named, str):
            raise UsageError(f"{where}: {named!r} is not a path")
        cand = artifact_file(self.train.path, named, where)
        return cand if cand.is_file() else None

    def _budget(self, cfg: TrainConfig, budget_from: str | None) -> tuple[TrainConfig, list[str]]:
        """max_tokens cut to what the capped sources hold (whole batches), when that is less."""
        total = self.loader.total_slots
        if total is None:
            return cfg, []
        steps = total // self.batch_seqs
        if steps < 1:
            raise UsageError(f"train: the sources' max_epochs hold {total:,} sequences, fewer than one batch of {self.batch_seqs}")
        tokens = steps * cfg.batch_tokens
        if tokens >= cfg.max_tokens:
            return cfg, []
        if self.mixture:
            why = f"every source is capped by max_epochs: the mixture holds {total * cfg.seq_len:,} tokens"
        else:
            why = f"max_epochs {self.max_epochs[0]:g} of {self.train.n_tokens:,} tokens"
        note = (f"{why}; the run trains {tokens:,} tokens ({steps:,} steps, whole batches) instead of "
                f"{cfg.max_tokens:,}{f' ({budget_from})' if budget_from else ''}, and the schedule spans them")
        return dataclasses.replace(cfg, max_tokens=tokens), [note]

    def _plan(self) -> list[dict]:
        """What config.json records per source: weight, sizes, and what the run draws from it."""
        steps = math.ceil(self.cfg.max_tokens / self.cfg.batch_tokens)
        n = steps * self.batch_seqs
        drawn = self.loader.drawn(n).tolist()
        num, den = self.loader.plan.num, self.loader.plan.den
        self.cap_events: list[tuple[int, str]] = []  # (slot, message) of each cap reached inside the run
        out = []
        for i, (s, w, d) in enumerate(zip(self.specs, self.windows, drawn)):
            e = {"name": s.name, "path": str(s.path), "weight": round(num[i] / den, 6), "max_epochs": self.max_epochs[i],
                 "tokens": w.n_tokens, "windows": w.n_windows, "sequences": d, "tokens_drawn": d * self.seq_len,
                 "epochs": round(d / w.n_windows, 4), "unique_epochs": round(d * self.seq_len / w.n_tokens, 4)}
            if s.upsample is not None:
                e.update(upsample=s.upsample.to_dict(), epoch_tokens=w.stream_tokens, upsampling=round(w.upsampling, 4))
            if self.caps[i] is not None and d == self.caps[i]:
                slot = self.loader.last_draw(i, self.caps[i])
                e["cap_step"] = slot // self.batch_seqs + 1
                if self.mixture:
                    self.cap_events.append((slot, self._cap_message(i, e["cap_step"])))
            out.append(e)
        return out

    def _cap_message(self, i: int, step: int) -> str:
        phase = next(p for p in self.loader.plan.phases if i in p.exhausted)
        nxt = next((p for p in self.loader.plan.phases if p.start == phase.end), None)
        rest = ", ".join(f"{s.name} {nxt.num[j] / nxt.den:.3f}" for j, s in enumerate(self.specs) if nxt and nxt.num[j])
        return (f"step {step}: source {self.specs[i].name} has drawn its {self.max_epochs[i]:g} epoch(s) "
                f"({self.caps[i] * self.seq_len:,} tokens) and stops; weights from here: {rest or 'none left'}")

    def _summary(self, budget_from: str | None) -> list[str]:
        lines, warnings = [], []
        for i, e in enumerate(self.plan):
            up = (f", upsampled ×{e['upsampling']:.2f} by {e['upsample']['column']} ({e['unique_epochs']:.2f}× its unique tokens)"
                  if "upsample" in e else "")
            cap = f"; max_epochs {e['max_epochs']:g}" + (f", reached at step {e['cap_step']:,}" if "cap_step" in e else "") \
                if e["max_epochs"] is not None else ""
            if self.mixture:
                lines.append(f"data {e['name']}: weight {e['weight']:.3f}, {e['tokens']:,} tokens; the run draws "
                             f"{e['tokens_drawn']:,} = {e['epochs']:.2f} epochs{up}{cap}")
            else:
                lines.append(f"data: {e['tokens']:,} tokens; the run draws {e['tokens_drawn']:,} = {e['epochs']:.2f} epochs{up}{cap}")
            epochs = max(e["epochs"], e["unique_epochs"])
            if epochs > EPOCHS_WARN:
                fixed = (f"; {budget_from} trains {self.cfg.max_tokens:,} tokens whatever the data: pass --max-tokens or --max-epochs"
                         if budget_from else "; lower --max-tokens or cap it with --max-epochs")
                if self.mixture:
                    fixed += " (or max_epochs in its [[data]] table)"
                warnings.append(f"warning: {self._name(i)} is seen {epochs:.1f} epochs ({e['tokens_drawn']:,} tokens drawn from "
                                f"{e['tokens']:,}); returns diminish past ~{EPOCHS_WARN:g} epochs (Muennighoff et al. 2023, "
                                f"Scaling Data-Constrained Language Models){fixed}")
        return lines + warnings

    # -- the BatchSource protocol --------------------------------------------------------------

    def describe(self) -> dict:
        out = {"tokens": None if self.mixture else str(self.train.path), "val": str(self.val.path) if self.val else None,
               "data": self.plan, "init": str(self.init) if self.init else None, "data_offset_steps": self.offset}
        if self.val_sources:
            out["val_sources"] = {k: str(v.path) for k, v in self.val_sources.items()}
        return out

    def start(self, padded_vocab: int) -> None:
        for line in self.notes:
            self.on_log(line)
        if self.tokenizer_file:
            self.token_bytes = token_byte_lengths(self.tokenizer_file, padded_vocab)
        if self.val is not None and self.token_bytes is not None and not self.mixture:
            # the floor a language model must clear: token frequencies alone (printed beside val bpb)
            self.unigram_bpb = unigram_bits_per_byte(self.train, self.val, self.token_bytes)
            self.on_log(f"unigram baseline on the validation tokens: {self.unigram_bpb:.4f} bits/byte")

    def batch(self, step: int, batch_seqs: int, micro: int, dist: Dist):
        step += self.offset  # a continued run's step s is its data's step offset + s
        first = step * batch_seqs
        for slot, message in self.cap_events:
            if first <= slot < first + batch_seqs:
                self.on_log(message)
        per_rank = batch_seqs // dist.world
        micro_batches = list(self.loader.micro_batches(step, batch_seqs, micro, dist.rank, dist.world))
        return micro_batches, [x.shape[0] / per_rank for x, _ in micro_batches], None

    def step_record(self, step: int) -> dict:
        """metrics.jsonl entries of the step just done: a mixture's tokens per source, cumulative."""
        self._step = step
        if not self.mixture:
            return {}
        drawn = self.loader.drawn(step * self.batch_seqs).tolist()
        return {"source_tokens": {s.name: d * self.seq_len for s, d in zip(self.specs, drawn)}}

    def loss(self, model, batch, z_loss: float):
        x, y = batch
        loss, stats = model(x, y, z_loss=z_loss)
        return loss, stats["ce"], stats["max_logit"]

    def _evaluate(self, model, ds: TokenDataset, dist: Dist, micro: int, limit: int, autocast) -> dict:
        sums = evaluate_loss(model, ds, self.seq_len, self.token_bytes, batch_size=micro, max_windows=limit,
                             device=dist.device, autocast=autocast, rank=dist.rank, world=dist.world)
        keys = sorted(sums)
        total = distributed.all_reduce_sum([float(sums[k]) for k in keys], dist)
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in summarize(dict(zip(keys, total))).items()}

    def validate(self, model, dist: Dist, micro: int, limit: int, autocast) -> dict:
        out = self._evaluate(model, self.val, dist, micro, limit, autocast) if self.val is not None else {}
        if self.val_sources:
            out["sources"] = {name: self._evaluate(model, ds, dist, micro, limit, autocast) for name, ds in self.val_sources.items()}
        return out

    def checkpoint_state(self) -> dict:
        if not self.mixture:
            return {}
        drawn = self.loader.drawn(self._step * self.batch_seqs).tolist()
        return {"source_sequences": {s.name: d for s, d in zip(self.specs, drawn)}}

    def manifest(self, val: dict | None) -> tuple[dict, list[dict], dict]:
        inputs = [input_ref(ds.path) for ds in self.datasets] + ([input_ref(self.val.path)] if self.val else [])
        inputs += [input_ref(ds.path) for ds in self.val_sources.values()]
        if self.init is not None:  # the second parent: the run (or import) the weights come from
            inputs.append(input_ref(owner_artifact(self.init)))
        counts = {f"val_{k}": v for k, v in (val or {}).items()}
        if self.offset:  # the --init weights already trained on this data's first batches: a decay branch's D adds them
            counts["init_tokens"] = self.offset * self.cfg.batch_tokens
        if self.unigram_bpb is not None:
            counts["val_unigram_bits_per_byte"] = round(self.unigram_bpb, 6)
        if self.mixture:
            drawn = self.loader.drawn(self._step * self.batch_seqs).tolist()
            counts["source_tokens"] = {s.name: d * self.seq_len for s, d in zip(self.specs, drawn)}
            counts["source_epochs"] = {s.name: round(d / w.n_windows, 4) for s, w, d in zip(self.specs, self.windows, drawn)}
        return {}, inputs, counts
