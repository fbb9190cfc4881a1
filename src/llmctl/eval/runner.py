"""`llmctl eval CKPT --task KIND:PATH … -o RESULTS`: score a checkpoint, with error bars.

Writes RESULTS/results.json (every score with n, standard error and a 95% interval, and the full
reporting line of spec 001-data-eval §A11/§F: task, prompt format, shots, normalization, decoding
settings, seed, llmctl version), RESULTS/samples.parquet (one row per item, so two runs can be
compared paired: `llmctl eval compare A B`) and a manifest.

Multiple-choice accuracies carry lm-evaluation-harness's names, so the two tools' tables read
alike: `acc` (sum of log-probs), `acc_norm` (per character), and ours `acc_per_token`, `acc_pmi`.
A generative answer is read two ways (tasks/answers.GenScoring): `acc` by the task family's rule
alone (strict: GSM8K's '#### n', MATH's \\boxed{}), `acc_flexible` by lm-evaluation-harness's
flexible-extract (the last number), and `well_formed` is the share the strict rule finds an answer
in; with -n K, pass@k of both. Each task names its `headline` metric (multiple choice: the one
`--norm` picks; generative: the strict `acc`; loss: `bits_per_byte`); each item's `score` in
samples.parquet is that metric's; a generative item's row also counts, of its K samples, the
strict answers right (`correct`), the flexible ones (`correct_flexible`) and the well-formed ones
(`well_formed`), so `eval compare` can split a gain into format and content.

The manifest is written last and lists both files with their sha256: a results.json without it is
an eval that did not finish, which no reader takes for results (`eval compare`, `report`). Run
again into its own OUT (artifacts/rerun.py), a killed eval starts over, clearing what it left, and a
finished one is a no-op.
"""

from __future__ import annotations

import functools
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from llmctl import __version__
from llmctl.artifacts.atomic import atomic_path, write_text
from llmctl.artifacts.checkpoint import WEIGHTS
from llmctl.bounds import within_context
from llmctl.artifacts.manifest import Manifest, input_ref, output_entry, read_manifest, write_manifest
from llmctl.artifacts.rerun import check_out, claim_out, run_identity, running
from llmctl.artifacts.tokens import TokenDataset
from llmctl.errors import UsageError
from llmctl.eval.loss import evaluate_loss, summarize, token_byte_lengths
from llmctl.eval.metrics import majority_vote, pass_at_k, summarize_scores
from llmctl.eval.score import METRIC_OF_NORM, argmax_first, encode_pair, normalized_scores, score_items
from llmctl.eval.tasks import TaskSpec, gen_extract, gen_prompt, gen_stop, load_items, prompt_format
from llmctl.model.generate import Engine, EngineConfig, SamplingParams
from llmctl.model.load import load_model
from llmctl.tokenizer.vocab import Vocab
from llmctl.runtime.progress import Progress
from llmctl.tasks import GenScoring, MCItem, chat_messages, fewshot_prefix
from llmctl.tasks.answers import LM_EVAL_FLEXIBLE
from llmctl.torchrt.alloc import keep_freed_memory
from llmctl.torchrt.device import pick_device
from llmctl.torchrt import rundir

NORMS = ("none", "per_char", "per_token", "pmi")  # acc, acc_norm (the harness's two) first
PMI_CONTEXT = "Answer:"  # ln P(o | "Answer:") is what pmi subtracts (§A10)
EVAL_RESULTS = ("results.json", "samples.parquet", "manifest.json")  # what eval writes into OUT


@dataclass
class EvalConfig:
    shots: int = 0
    seed: int = 0
    limit: int | None = None  # first N items of each task
    norm: str = "per_char"  # the normalization of the headline mc accuracy (per_char: acc_norm)
    pmi: bool = False  # also score pmi: one more pass, every choice after "Answer:" (on when norm = pmi)
    batch_tokens: int = 4096  # tokens per scoring forward pass
    samples: int = 1  # generations per generative item
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 256
    extract: str | None = None  # the strict answer rule (acc): after_hash | last_number | boxed; None: the task family's
    pass_k: list[int] = field(default_factory=lambda: [1])
    batch_size: int = 256  # sequences decoding at once at most (the engine's max_rows; its KV budget may hold fewer)
    device: str = "auto"
    weights: str = "auto"  # the checkpoint's EMA weights where it has them (auto), ema or raw

    def check(self) -> None:
        if self.weights not in WEIGHTS:
            raise UsageError(f"--weights must be one of {', '.join(WEIGHTS)}, got {self.weights!r}")
        if self.norm not in NORMS:
            raise UsageError(f"--norm must be one of {', '.join(NORMS)}")
        if self.extract not in (None, "after_hash", "last_number", "boxed"):
            raise UsageError("--extract must be after_hash, last_number or boxed")
        if self.samples < 1 or any(k < 1 or k > self.samples for k in self.pass_k):
            raise UsageError(f"--pass-k values must lie in 1..--samples ({self.samples})")
        if self.temperature == 0 and self.samples > 1:
            raise UsageError("greedy decoding gives the same answer every time: use --temperature > 0 with --samples > 1")


class Evaluator:
    def __init__(self, checkpoint: str, cfg: EvalConfig, progress: Progress | None = None):
        cfg.check()
        self.cfg, self.progress = cfg, progress or Progress()
        self.model, self.ckpt = load_model(checkpoint, pick_device(cfg.device), cfg.weights)
        context = self.model.cfg.max_seq_len
        cfg.max_new_tokens = within_context("--max-new-tokens", cfg.max_new_tokens, context, EvalConfig.max_new_tokens)
        within_context("--shots", cfg.shots, context)  # every shot takes at least one token of it
        keep_freed_memory(self.device)  # on CPU each scoring batch reuses the last one's memory instead of faulting in fresh pages
        if self.ckpt.tokenizer_file is None:
            raise UsageError(f"{self.ckpt.path} has no tokenizer.json: cannot turn task text into tokens")
        self.vocab = Vocab(self.ckpt.path)
        self.doc_start = self.vocab.doc_start  # a scored context starts here (BOS, or the EOS before a document)
        self.chat = self.vocab.require_chat() if self.ckpt.trainer_state.get("chat") else None
        self.encode, self.decode = self.vocab.encode, self.vocab.decode

    # -- tasks -------------------------------------------------------------------------------

    def run_task(self, spec: TaskSpec) -> tuple[dict, list[dict]]:
        if spec.kind == "loss":
            return self._loss(spec)
        items = load_items(spec, self.cfg.limit)
        if isinstance(items[0], MCItem):
            return self._multiple_choice(spec, items)
        return self._generative(spec, items)

    def _loss(self, spec: TaskSpec) -> tuple[dict, list[dict]]:
        data = TokenDataset(spec.path, verify=True)  # every shard checked against its sha256 before scoring
        seq_len = self.model.cfg.max_seq_len
        token_bytes = token_byte_lengths(self.ckpt.tokenizer_file, self.model.cfg.padded_vocab)
        self.progress.start(None, description=spec.name)
        sums = evaluate_loss(self.model, data, seq_len, token_bytes, device=self.device, keep_windows=True)
        self.progress.finish()
        s = summarize(sums)
        windows = sums.pop("windows")
        bpw = [nats / (math.log(2) * b) for nats, b in windows if b]
        metrics = {"bits_per_byte": {**summarize_scores(bpw), "mean": s["bits_per_byte"], "pooled": True},
                   "loss": {"value": s["loss"], "n": s["tokens"]}, "perplexity": {"value": s["perplexity"], "n": s["tokens"]}}
        reporting = {"windows": len(windows), "seq_len": seq_len, "tokens": s["tokens"], "bytes": s["bytes"]}
        samples = [{"task": spec.name, "item": i, "score": v} for i, v in enumerate(bpw)]
        return {"kind": "loss", "file": spec.path, "n": len(bpw), "headline": "bits_per_byte", "metrics": metrics,
                "reporting": reporting}, samples

    def _multiple_choice(self, spec: TaskSpec, items: list[MCItem]) -> tuple[dict, list[dict]]:
        c = self.cfg
        requests, uncond = [], []
        # an item's choices share their context: encode each distinct text once (the lists are only read)
        encode = functools.lru_cache(maxsize=8192)(self.encode)
        for i, item in enumerate(items):
            prefix = fewshot_prefix(items, i, c.shots, c.seed)
            requests.append([encode_pair(encode, prefix + ctx, cont, self.doc_start, self.vocab.add_bos) for ctx, cont in item.pairs])
            uncond.append([encode_pair(encode, PMI_CONTEXT, cont, self.doc_start, self.vocab.add_bos) for _, cont in item.pairs])  # pmi's baseline
        with_pmi = c.pmi or c.norm == "pmi"
        self.progress.start(len(items) * (2 if with_pmi else 1), description=spec.name)
        scored = score_items(self.model, requests, c.batch_tokens, on_batch=self.progress.advance)
        base = score_items(self.model, uncond, c.batch_tokens, on_batch=self.progress.advance) if with_pmi else None
        self.progress.finish()
        norms = NORMS if with_pmi else NORMS[:3]
        headline = METRIC_OF_NORM[c.norm]
        samples, per_metric = [], {METRIC_OF_NORM[n]: [] for n in norms}
        for i, (item, res) in enumerate(zip(items, scored)):
            uncond_lp = [lp0 for lp0, _ in base[i]] if base else [0.0] * len(res)
            values = normalized_scores([lp for lp, _ in res], [n for _, n in res],
                                       [len(cont) for _, cont in item.pairs], uncond_lp)
            row = {"task": spec.name, "item": i, "label": item.label}
            for norm in norms:  # per item, each accuracy and the choice it picked, under the metric's name
                metric, pred = METRIC_OF_NORM[norm], argmax_first(values[norm])
                row[f"pred_{metric}"] = pred
                row[metric] = float(pred == item.label)
                per_metric[metric].append(row[metric])
            row["score"] = row[headline]  # what `eval compare` pairs
            row["logprobs"] = json.dumps([round(lp, 6) for lp, _ in res])
            samples.append(row)
        metrics = {m: summarize_scores(v) for m, v in per_metric.items()}
        argmax = {"none": "ln P(o|x)", "per_token": "ln P(o|x) / tokens(o)", "per_char": "ln P(o|x) / chars(o)",
                  "pmi": f'ln P(o|x) - ln P(o|"{PMI_CONTEXT}")'}
        reporting = {"formulation": "cloze" if spec.kind != "mmlu" else "multiple-choice letters",
                     "shots": c.shots, "seed": c.seed, "normalization": c.norm,
                     "definitions": {METRIC_OF_NORM[n]: f"share of items where argmax_o {argmax[n]} is the gold choice" for n in norms}}
        return {"kind": spec.kind, "file": spec.path, "n": len(items), "headline": headline, "metrics": metrics,
                "reporting": reporting}, samples

    def _generative(self, spec: TaskSpec, items) -> tuple[dict, list[dict]]:
        c = self.cfg
        extract = c.extract or gen_extract(spec.kind)
        scoring = GenScoring(extract=extract)  # strict: the family's rule (or --extract); flexible: lm-eval's
        params = SamplingParams(max_new_tokens=c.max_new_tokens, temperature=c.temperature, top_k=c.top_k,
                                top_p=c.top_p, seed=c.seed, stop=gen_stop(spec.kind))
        engine = Engine.for_vocab(self.model, self.vocab, chat=self.chat is not None, config=EngineConfig(max_rows=c.batch_size))
        if self.chat is not None:  # a chat checkpoint answers in the assistant turn and ends it with its turn end
            params.stop = ()
            prompts = [self.chat.prompt_ids(chat_messages(items, i, c.shots, c.seed)) for i in range(len(items))]
        else:
            prompts = [self.vocab.prompt_ids(gen_prompt(spec.kind, item, fewshot_prefix(items, i, c.shots, c.seed)))
                       for i, item in enumerate(items)]
        # every item at once: the engine batches them continuously, an item's samples share its prefill
        self.progress.start(len(items) * c.samples, description=spec.name)
        outputs = engine.generate([p for p in prompts for _ in range(c.samples)], params, on_done=self.progress.advance)
        self.progress.finish()
        rows, truncated = [], 0
        for i, item in enumerate(items):
            gens = outputs[i * c.samples : (i + 1) * c.samples]
            truncated += sum(g.truncated for g in gens)
            rows.append(_gen_row(spec.name, i, item.target, [g.text for g in gens], scoring) | {"finish": gens[0].finish})
        metrics = _gen_metrics(rows, c.samples, c.pass_k)
        plain = prompt_format(spec.kind)
        reporting = {"prompt_format": f"chat template {self.chat.name}: user turn = the question" if self.chat else plain,
                     "shots": c.shots, "seed": c.seed, "decoding": params.describe(), "samples_per_item": c.samples,
                     "answer_extraction": {
                         "acc": f"strict: {extract} alone, canonical numbers",
                         "acc_flexible": f"lm-eval's gsm8k flexible-extract: the last match of {LM_EVAL_FLEXIBLE.pattern}, canonical",
                         "well_formed": f"share of generations in which {extract} finds an answer"},
                     "truncated_generations": truncated}
        return {"kind": spec.kind, "file": spec.path, "n": len(items), "headline": "acc", "metrics": metrics,
                "reporting": reporting}, rows

    @property
    def device(self):
        return next(self.model.parameters()).device


def _gen_row(task: str, item: int, target: str, texts: list[str], scoring: GenScoring) -> dict:
    """One generative item's samples.parquet row: per-sample counts (of K = len(texts)) of strict
    answers right, flexible answers right and well-formed generations; the first sample's answers
    and text. `score` (what `eval compare` pairs) is the strict share."""
    strict = [scoring.strict(t) for t in texts]
    flexible = [scoring.flexible(t) for t in texts]
    correct = sum(a == target for a in strict)
    vote, _ = majority_vote(strict)
    return {"task": task, "item": item, "score": correct / len(texts), "target": target, "prediction": strict[0],
            "prediction_flexible": flexible[0], "correct": correct, "correct_flexible": sum(a == target for a in flexible),
            "well_formed": sum(a is not None for a in strict), "majority_correct": vote == target, "samples": len(texts),
            "completion": texts[0]}


def _gen_metrics(rows: list[dict], k_samples: int, pass_k: list[int]) -> dict:
    """acc (strict, the headline), acc_flexible and well_formed, each the mean over items of its
    per-item share of K samples; with K > 1, pass@k of both readings and the strict maj@K."""
    kk = k_samples if k_samples > 1 else None
    metrics = {name: summarize_scores([r[col] / k_samples for r in rows], k_samples=kk)
               for name, col in (("acc", "correct"), ("acc_flexible", "correct_flexible"), ("well_formed", "well_formed"))}
    if k_samples > 1:
        for suffix, col in (("", "correct"), ("_flexible", "correct_flexible")):
            metrics.update({f"pass@{k}{suffix}": summarize_scores([pass_at_k(k_samples, r[col], k) for r in rows]) for k in pass_k})
        metrics[f"maj@{k_samples}"] = summarize_scores([float(r["majority_correct"]) for r in rows])
    return metrics


def run_eval(checkpoint: str, tasks: list[TaskSpec], out: Path, cfg: EvalConfig,
             progress: Progress | None = None, overwrite: bool = False) -> Manifest:
    if not tasks:
        raise UsageError("no --task given (e.g. --task mc:examples/tasks/cloze.jsonl)")
    with rundir.lock(out, "an eval results folder"):
        return _run_eval(checkpoint, tasks, out, cfg, progress, overwrite)


def _run_eval(checkpoint: str, tasks: list[TaskSpec], out: Path, cfg: EvalConfig, progress: Progress | None,
              overwrite: bool) -> Manifest:
    check_out(out, overwrite, EVAL_RESULTS)  # a wrong -o fails before the model loads
    seen: set[str] = set()
    for spec in tasks:
        if spec.name in seen:
            raise UsageError(f"task {spec.name} given twice")
        seen.add(spec.name)
    started = time.perf_counter()
    ev = Evaluator(checkpoint, cfg, progress)
    refs = [input_ref(ev.ckpt.path)] + [input_ref(t.path) for t in tasks]  # hashed once: the run identity's and the manifest's
    ident = run_identity("eval", {"config": asdict(cfg), "tasks": [t.name for t in tasks]}, refs)
    if claim_out(out, ident, overwrite, EVAL_RESULTS):
        ev.progress.log(f"eval: {out} already holds this eval's finished results; nothing to do")
        return read_manifest(out)
    with running(out):
        return _score(ev, tasks, out, cfg, refs, started)


def _score(ev: Evaluator, tasks: list[TaskSpec], out: Path, cfg: EvalConfig, refs: list[dict], started: float) -> Manifest:
    results, samples = {}, []
    torch.manual_seed(cfg.seed)
    for spec in tasks:
        results[spec.name], rows = ev.run_task(spec)
        samples += rows
    doc = {"checkpoint": str(ev.ckpt.path), "step": ev.ckpt.trainer_state.get("step"),
           "weights": ev.ckpt.weights,  # raw (model.safetensors) or ema (ema.safetensors)
           "llmctl_version": __version__,
           "config": asdict(cfg), "tasks": results}
    # results.json and samples.parquet are in place before the manifest, which names them: until it
    # is written they are an unfinished eval's, which a re-run clears and no reader takes
    write_text(out / "results.json", json.dumps(doc, indent=2, default=float) + "\n")
    # every task's columns: from_pylist alone would take the first row's keys (a loss task's three)
    # and drop the multiple-choice and generative columns of the tasks after it
    names = list(dict.fromkeys(k for row in samples for k in row))
    with atomic_path(out / "samples.parquet") as tmp:
        pq.write_table(pa.Table.from_pydict({k: [row.get(k) for row in samples] for k in names}), tmp)
    counts = {name: {k: round(v.get("mean", v.get("value", 0.0)), 6) for k, v in r["metrics"].items()} for name, r in results.items()}
    m = Manifest(kind="eval", stage="eval", config=asdict(cfg), inputs=refs,
                 outputs=[output_entry(out / "results.json", None, out), output_entry(out / "samples.parquet", len(samples), out)],
                 counts=counts, wall_seconds=round(time.perf_counter() - started, 3))
    write_manifest(out, m)
    return m
