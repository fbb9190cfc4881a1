"""`llmctl dpo` side by side with TRL's DPOTrainer, on CPU, fp32 (issue 32, "Measure").

    PYTHONPATH=src .venv-bench/bin/python benchmarks/dpo.py [--steps 5] [--threads 1,2] [--repeat 2]

One run, the same inputs for both sides: a 4-layer model of the demo's SFT architecture (sft-tiny:
d 192, 6 heads, 2 KV heads, d_ff 512) with a 1,000-token BPE and llmctl's chat tokens, random
weights, saved as an llmctl checkpoint and exported (`llmctl export`, a LlamaForCausalLM); 64
conversational pairs ({prompt, chosen, rejected} message lists: name the subject of a sentence,
the rejected answer names another) in one JSONL file. Both: sigmoid loss, β 0.1, 8 pairs a step
(micro-batch 8, no accumulation), AdamW lr 1e-4 constant (no warmup), β (0.9, 0.95), eps 1e-8,
no weight decay, grad clip 1.0, fp32, no held-out pairs; TRL reads the pairs in llmctl's order
(its sampler replaced by a sequential one over the pairs llmctl's (seed, step) order draws), its
reference is the model's frozen copy (precompute_ref_log_probs off: its default) or, in the
`TRL precomputed` row, computed once before training like llmctl's. Each side's metrics at step 1
(the same first batch) and step 5 are compared: loss, reward margin, preference accuracy, chosen
and rejected log-probs. Seconds per step: the median over steps 2..N (llmctl: step_seconds of
metrics.jsonl; TRL: a callback from on_step_begin to on_step_end), with T torch threads, each side
in its own child process, repeated --repeat times interleaved (llmctl, TRL, TRL precomputed, …);
llmctl's one-off reference pass is reported apart. The section goes to benchmarks/RESULTS.md (## dpo).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, cpu_name, trl_args, write_results  # noqa: E402
from common import run_child as common_run_child  # noqa: E402

SUBJECTS = ["the miller", "a farmer", "the old bridge", "my sister", "the river", "our market"]
VERBS = ["carries", "watches", "builds", "sells", "remembers", "crosses"]
OBJECTS = ["grain to town", "the stone wall", "twelve baskets", "the morning bread", "a red boat"]
BETA, LR, BATCH, N_PAIRS, SEQ_LEN, SEED = 0.1, 1e-4, 8, 64, 128, 0
COMPARED = [("loss", "loss"), ("reward_margin", "rewards/margins"), ("pref_accuracy", "rewards/accuracies"),
            ("chosen_logps", "logps/chosen"), ("rejected_logps", "logps/rejected")]


def sentence(rng: random.Random) -> tuple[str, str]:
    s = rng.choice(SUBJECTS)
    return f"{s.capitalize()} {rng.choice(VERBS)} {rng.choice(OBJECTS)}.", s


def setup(d: Path) -> dict:
    """The checkpoint, its export and the pairs file, built once under `d`."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch

    from llmctl.artifacts.checkpoint import save_checkpoint
    from llmctl.data.tokenize import train_tokenizer
    from llmctl.model.config import ModelConfig
    from llmctl.model.hf_export import export_hf
    from llmctl.model.transformer import Transformer
    from llmctl.tokenizer import bpe

    rng = random.Random(0)
    pq.write_table(pa.table({"text": [" ".join(sentence(rng)[0] for _ in range(12)) for _ in range(400)]}), d / "docs.parquet")
    train_tokenizer([str(d / "docs.parquet")], str(d / "tok"), bpe.TrainTokenizerConfig(vocab_size=1000))
    cfg = ModelConfig(vocab_size=1000, n_layers=4, d_model=192, n_heads=6, n_kv_heads=2, d_ff=512, max_seq_len=256)
    torch.manual_seed(SEED)
    save_checkpoint(d / "ck", 0, cfg, Transformer(cfg).state_dict(), {"step": 0, "chat": True},
                    tokenizer_file=d / "tok" / "tokenizer.json")
    export_hf(d / "ck", d / "hf")
    recs = []
    for _ in range(N_PAIRS):
        s, subject = sentence(rng)
        wrong = rng.choice([x for x in SUBJECTS if x != subject])
        recs.append({"prompt": [{"role": "user", "content": f"Name the subject of this sentence. {s}"}],
                     "chosen": [{"role": "assistant", "content": f"The subject is {subject}. {sentence(rng)[0]}"}],
                     "rejected": [{"role": "assistant", "content": f"The subject is {wrong}. {sentence(rng)[0]}"}],
                     "margin": 0.0})
    (d / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return {"ck": str(d / "ck"), "hf": str(d / "hf"), "pairs": str(d / "pairs.jsonl")}


def train_config(steps: int, threads: int):
    from llmctl.train.config import TrainConfig

    return TrainConfig(seq_len=SEQ_LEN, batch_tokens=BATCH * SEQ_LEN, micro_batch=BATCH, lr=LR, warmup_tokens=0,
                       cooldown_frac=0.0, schedule="wsd", weight_decay=0.0, beta1=0.9, beta2=0.95, eps=1e-8,
                       grad_clip=1.0, seed=SEED, max_steps=steps, eval_every=0, checkpoint_every=10_000,
                       threads=threads, device="cpu")


def llmctl_order(n: int, count: int) -> list[int]:
    """The pair indices llmctl's (seed, step) order draws first (PairOrder over all pairs)."""
    from llmctl.train.pairs import PairOrder

    return [int(i) for i in PairOrder(n, SEED).order.consecutive(0, count)]


def child_llmctl(inputs: dict, steps: int, threads: int, out: Path) -> dict:
    import time

    from llmctl.train.dpo import DPOSettings, run_dpo

    t0 = time.perf_counter()
    run_dpo(Path(inputs["pairs"]), Path(inputs["ck"]), out, train_config(steps, threads), DPOSettings("sigmoid", BETA),
            epochs=100, overwrite=True)
    wall = time.perf_counter() - t0
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    recs = [r for r in recs if "val" not in r]
    return {"steps": [{k: r[k] for k, _ in COMPARED} for r in recs], "step_s": [r["step_seconds"] for r in recs],
            "wall": wall, "other_s": wall - sum(r["step_seconds"] for r in recs)}


def child_trl(inputs: dict, steps: int, threads: int, out: Path, precompute: bool) -> dict:
    import time

    import torch
    from datasets import Dataset
    from torch.utils.data import SequentialSampler
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    torch.set_num_threads(threads)
    recs = [json.loads(x) for x in Path(inputs["pairs"]).read_text().splitlines()]
    order = llmctl_order(len(recs), steps * BATCH)
    data = Dataset.from_list([{k: recs[i][k] for k in ("prompt", "chosen", "rejected")} for i in order])
    tok = AutoTokenizer.from_pretrained(inputs["hf"])
    model = AutoModelForCausalLM.from_pretrained(inputs["hf"], dtype=torch.float32)
    args = DPOConfig(**trl_args(out, steps, BATCH, LR, SEED, tok.pad_token), beta=BETA, loss_type=["sigmoid"],
                     precompute_ref_log_probs=precompute)
    seen: list[dict] = []
    times: list[float] = []

    class Sequential(DPOTrainer):
        def _get_train_sampler(self, *a, **k):
            return SequentialSampler(self.train_dataset)

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            m = self._metrics["train"]
            seen.append({"loss": float(loss if not return_outputs else loss[0]),
                         **{theirs: m[theirs][-1] for _, theirs in COMPARED[1:]}})
            return loss

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            times.append(-time.perf_counter())

        def on_step_end(self, *a, **k):
            times[-1] += time.perf_counter()

    t0 = time.perf_counter()
    trainer = Sequential(model=model, args=args, train_dataset=data, processing_class=tok, callbacks=[Timer()])
    trainer.train()
    wall = time.perf_counter() - t0
    return {"steps": [{ours: s[theirs] for ours, theirs in COMPARED} for s in seen], "step_s": times, "wall": wall,
            "other_s": wall - sum(times)}


def child_main(a) -> None:
    import torch

    torch.set_num_threads(a.threads)
    inputs = json.loads(a.inputs)
    out = Path(a.out)
    if a.side == "llmctl":
        res = child_llmctl(inputs, a.steps, a.threads, out)
    else:
        res = child_trl(inputs, a.steps, a.threads, out, precompute=a.side == "trl-pre")
    print("RESULT " + json.dumps(res))


def run_child(side: str, inputs: dict, steps: int, threads: int, work: Path) -> dict:
    return common_run_child(__file__, side, inputs, steps, threads, work / f"{side}-{threads}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--child")
    ap.add_argument("--inputs")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.child:
        a.side = a.child
        a.threads = int(a.threads)
        return child_main(a)
    threads = [int(t) for t in a.threads.split(",")]
    started = datetime.datetime.now()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        sys.path.insert(0, str(REPO / "src"))
        inputs = setup(work)
        runs: dict[tuple[str, int], list[dict]] = {}
        for t in threads:
            for _ in range(a.repeat):
                for side in ("llmctl", "trl", "trl-pre"):
                    runs.setdefault((side, t), []).append(run_child(side, inputs, a.steps, t, work))
    print(json.dumps({f"{k[0]}/{k[1]}": v for k, v in runs.items()})[:2000])
    write_results("dpo", report(runs, threads, a, started))


def report(runs: dict, threads: list[int], a, started) -> str:
    ours, theirs = runs[("llmctl", threads[0])][0], runs[("trl", threads[0])][0]
    pre = runs[("trl-pre", threads[0])][0]
    rows = []
    worst = 0.0
    for step in (1, a.steps):
        for k, _ in COMPARED:
            x, y, z = ours["steps"][step - 1][k], theirs["steps"][step - 1][k], pre["steps"][step - 1][k]
            d = max(abs(x - y), abs(x - z))
            worst = max(worst, d)
            rows.append(f"| {step} | {k} | {x:.6f} | {y:.6f} | {z:.6f} | {d:.1e} |")
    med = lambda r: statistics.median(s for run in r for s in run["step_s"][1:])  # noqa: E731
    speed = []
    for t in threads:
        o, tr, tp = med(runs[("llmctl", t)]), med(runs[("trl", t)]), med(runs[("trl-pre", t)])
        ref = statistics.median(r["other_s"] for r in runs[("llmctl", t)])
        speed.append(f"| {t} | {o:.4f} | {tr:.4f} | {tp:.4f} | {tr / o:.2f}x | {tp / o:.2f}x | {ref:.2f} |")
    load = os.getloadavg()[0]
    return "\n".join([
        "## dpo", "",
        f"`PYTHONPATH=src .venv-bench/bin/python benchmarks/dpo.py --steps {a.steps} --threads {a.threads} --repeat {a.repeat}`"
        f" — {started:%Y-%m-%d}, {cpu_name()}, `nproc` = {os.cpu_count()}, 1-min load {load:.2f} after; TRL 1.16, fp32.",
        f"A random 4-layer model of sft-tiny's shape (1,000-token BPE with llmctl's chat tokens), exported with `llmctl export`; "
        f"{N_PAIRS} conversational pairs; sigmoid loss, β {BETA}, {BATCH} pairs a step, AdamW lr {LR:g} constant, "
        "β (0.9, 0.95), no weight decay, clip 1.0; TRL reads the pairs in llmctl's order. Metrics of the same batches "
        "(step 1: the same weights; step 5: after 4 updates on each side):", "",
        "| step | metric | llmctl | TRL | TRL precomputed ref | max abs diff |", "|---|---|---|---|---|---|", *rows, "",
        f"Largest difference: {worst:.1e} (target ≤ 1e-4).", "",
        f"Seconds per step (median of steps 2..{a.steps} over {a.repeat} runs; TRL: DPOTrainer with the reference model "
        "run each step, its default, and with precompute_ref_log_probs; llmctl's one-off reference pass and set-up "
        "are the last column, outside the steps):", "",
        "| threads | llmctl s/step | TRL s/step | TRL precomputed s/step | TRL / llmctl | TRL precomputed / llmctl | llmctl outside steps, s |",
        "|---|---|---|---|---|---|---|", *speed, ""])


if __name__ == "__main__":
    main()
