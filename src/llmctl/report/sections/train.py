"""train: pretraining, midtraining (--init from a run, on tokens) and SFT runs, each from its manifest,
config.json and metrics.jsonl: the configuration, parameters, tokens, FLOPs, wall time, MFU, the loss
and validation bits-per-byte curves (train/plots.py, with the unigram floor the run recorded), and
the steps it skipped or flagged as spikes.

FLOPs are the planner's arithmetic (plan/arithmetic.py, spec 001-compute-appendix §B3–B4):
C = C_token · D with C_token = 6·N_matmul + 12·L·h·d_h·(s+1)/2 at the run's sequence length
(model/flops.py, the formula of the trainer's MFU) and D the tokens the run processed. MFU is the
median of the per-step MFU the trainer logged."""

from __future__ import annotations

import statistics

from llmctl.model.config import ModelConfig
from llmctl.model.flops import training_flops_per_token
from llmctl.plan import arithmetic
from llmctl.plan.arch import from_model_config
from llmctl.report.collect import Artifact, Lineage
from llmctl.report.page import Figure, Section, Table
from llmctl.report.sections.common import Images, per_artifact, read_json
from llmctl.train.plots import plot_run, read_metrics

CURVES = ("loss.png", "bits_per_byte.png")


def role(a: Artifact) -> str:
    """pretraining, midtraining (started from another run's weights) or SFT."""
    if "sft" in a.manifest.config:
        return "SFT"
    return "midtraining" if any(r.get("kind") == "run" for r in a.manifest.inputs) else "pretraining"


def training_flops(model: dict, seq_len: int, tokens: int) -> tuple[float, float]:
    """(FLOPs per token, total training FLOPs) of a run: the planner's formulas on its architecture."""
    arch = from_model_config(ModelConfig.from_dict(model), "run", "config.json")
    per_token = training_flops_per_token(arch.n_matmul, arch.n_layers, arch.attn_dim, seq_len, "causal")
    return per_token, arithmetic.training_flops(per_token, tokens)


def sections(lineage: Lineage, images: Images) -> list[Section]:
    return per_artifact(lineage.stage("train"), "train", images, _fill)


def _fill(a: Artifact, s: Section, images: Images) -> None:
    m, c = a.manifest, a.manifest.counts
    kind = role(a)
    s.title = f"train ({kind}): {a.path.name}"
    run_cfg = read_json(a.path / "config.json")
    model, train = m.config.get("model", {}), m.config.get("train", {})
    tokens = c.get("tokens")
    per_token = flops = None
    if model and train.get("seq_len") and tokens:
        per_token, flops = training_flops(model, train["seq_len"], tokens)
    steps, vals = read_metrics(a.path) if (a.path / "metrics.jsonl").is_file() else ([], [])
    mfus = [r["mfu"] for r in steps if isinstance(r.get("mfu"), (int, float))]
    tps = [r["tokens_per_s"] for r in steps if isinstance(r.get("tokens_per_s"), (int, float))]
    s.facts = {
        "role": kind,
        "started from": run_cfg.get("init"),
        "parameters": run_cfg.get("n_params") or (ModelConfig.from_dict(model).n_params() if model else None),
        "layers × d_model": f"{model.get('n_layers')} × {model.get('d_model')}" if model else None,
        "heads (kv heads)": f"{model.get('n_heads')} ({model.get('n_kv_heads')})" if model else None,
        "vocabulary": model.get("vocab_size"),
        "sequence length": train.get("seq_len"),
        "batch (tokens)": train.get("batch_tokens"),
        "peak learning rate": train.get("lr"),
        "schedule": train.get("schedule"),
        "precision": train.get("dtype"),
        "ranks": run_cfg.get("world_size"),
        "steps": c.get("steps"),
        "tokens": tokens,
        "FLOPs per token": per_token,
        "training FLOPs": flops,
        "wall seconds": m.wall_seconds,
        "MFU (median over steps)": round(statistics.median(mfus), 5) if mfus else None,
        "tokens / s (median over steps)": round(statistics.median(tps), 1) if tps else None,
        "final validation loss": c.get("val_loss"),
        "final validation bits / byte": c.get("val_bits_per_byte"),
        "unigram floor (bits / byte)": c.get("val_unigram_bits_per_byte"),
        "skipped steps (non-finite)": c.get("skipped_steps"),
        "spike-skipped steps": c.get("spike_skipped_steps", 0),
        "rewinds": c.get("rewinds", 0),
    }
    if "sft" in m.config:
        s.facts.update({"conversations": c.get("conversations"), "truncated conversations": c.get("truncated")})
    s.facts = {k: v for k, v in s.facts.items() if v is not None}
    if steps or vals:
        folder = images.folder(s.key)
        for path in plot_run(a.path, folder, only=CURVES):
            s.figures.append(Figure(images.rel(path), "training and validation loss" if path.name == "loss.png" else
                                    "validation bits per byte" + (" with the unigram floor" if c.get("val_unigram_bits_per_byte") else "")))
    if vals:
        s.tables.append(Table(["step", "tokens", "validation loss", "bits / byte"],
                              [[v["step"], v["tokens"], v["val"].get("loss"), v["val"].get("bits_per_byte")] for v in vals],
                              "validation"))
    spikes = [[r["step"], r.get("loss"), r["spike"], bool(r.get("spike_skipped"))] for r in steps if "spike" in r]
    skipped = [[r["step"], r.get("loss"), None, True] for r in steps if r.get("skipped")]
    if spikes or skipped:
        s.tables.append(Table(["step", "loss", "spike z", "update skipped"], sorted(spikes + skipped), "loss spikes and skipped steps"))
    else:
        s.notes.append("No loss spikes and no skipped steps in metrics.jsonl.")
    rewinds = [r["rewind"] for r in steps if "rewind" in r]
    if rewinds:
        s.tables.append(Table(["spike at step", "loss", "z", "back to step"], [[e.get("spike_step"), e.get("loss"), e.get("z"), e.get("to_step")] for e in rewinds],
                              "rewinds (--on-spike rewind)"))
