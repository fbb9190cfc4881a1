"""`llmctl train-rm` side by side with TRL's RewardTrainer, on CPU, fp32 (issue 32, "Measure").

    PYTHONPATH=src .venv-bench/bin/python benchmarks/reward_model.py [--steps 32] [--threads 1,2]

The model and tokenizer of benchmarks/dpo.py (a random 4-layer model of sft-tiny's shape,
exported with `llmctl export`); 160 conversational pairs whose chosen answer is a grammatical
sentence and rejected one the same words shuffled, 32 of them held out (llmctl's seeded draw,
the same pairs on both sides). Both: Bradley–Terry loss on a scalar head over the last token
(TRL: LlamaForSequenceClassification, num_labels 1, its `score` head set to llmctl's seeded
initial head), 8 pairs a step, AdamW lr 3e-4 constant, β (0.9, 0.95), eps 1e-8, no weight decay,
clip 1.0, fp32; TRL reads the training pairs in llmctl's order (a sequential sampler over the
pairs llmctl draws). Compared: the loss, accuracy and margin of the first batch (the same
weights) and the held-out pair accuracy and loss after --steps steps; seconds per step (median of
steps 2..N). Each side in its own child process with T torch threads. The section goes to
benchmarks/RESULTS.md (## reward model).
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
from dpo import SEED, sentence, setup  # noqa: E402  (benchmarks/dpo.py: the same model and tokenizer)

LR, BATCH, N_PAIRS, VAL_FRACTION, SEQ_LEN = 3e-4, 8, 160, 0.2, 128


def rm_pairs(path: Path) -> None:
    rng = random.Random(7)
    recs = []
    for _ in range(N_PAIRS):
        s, _ = sentence(rng)
        good = " ".join(sentence(rng)[0] for _ in range(2))
        words = good.split()
        rng.shuffle(words)
        recs.append({"prompt": [{"role": "user", "content": f"Write two sentences like this one. {s}"}],
                     "chosen": [{"role": "assistant", "content": good}],
                     "rejected": [{"role": "assistant", "content": " ".join(words)}]})
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


def split(n: int, steps: int) -> tuple[list[int], list[int]]:
    """(the training pair indices in llmctl's draw order for `steps` steps, the held-out indices)."""
    from llmctl.train.pairs import PairOrder, held_out

    held = held_out(n, VAL_FRACTION, SEED)
    train = [i for i in range(n) if i not in held]
    order = PairOrder(len(train), SEED).order.consecutive(0, steps * BATCH)
    return [train[int(i)] for i in order], sorted(held)


def child_llmctl(inputs: dict, steps: int, threads: int, out: Path) -> dict:
    from llmctl.train.config import TrainConfig
    from llmctl.train.reward_model import run_train_rm

    cfg = TrainConfig(seq_len=SEQ_LEN, batch_tokens=BATCH * SEQ_LEN, micro_batch=BATCH, lr=LR, warmup_tokens=0,
                      cooldown_frac=0.0, schedule="wsd", weight_decay=0.0, beta1=0.9, beta2=0.95, eps=1e-8, grad_clip=1.0,
                      seed=SEED, max_steps=steps, eval_every=0, eval_windows=10_000, checkpoint_every=10_000,
                      threads=threads, device="cpu")
    m = run_train_rm(Path(inputs["rm_pairs"]), Path(inputs["ck"]), out, cfg, val_fraction=VAL_FRACTION, epochs=100,
                     overwrite=True)
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    recs = [r for r in recs if "val" not in r]
    return {"first": {k: recs[0][k] for k in ("loss", "pref_accuracy", "reward_margin")},
            "val_accuracy": m.counts["val_pref_accuracy"], "val_loss": m.counts["val_loss"],
            "step_s": [r["step_seconds"] for r in recs]}


def child_trl(inputs: dict, steps: int, threads: int, out: Path) -> dict:
    import time

    import torch
    from datasets import Dataset
    from torch.utils.data import SequentialSampler
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, TrainerCallback
    from trl import RewardConfig, RewardTrainer

    from llmctl.model.config import ModelConfig
    from llmctl.model.reward import RewardModel

    torch.set_num_threads(threads)
    recs = [json.loads(x) for x in Path(inputs["rm_pairs"]).read_text().splitlines()]
    order, held = split(len(recs), steps)
    keep = ("prompt", "chosen", "rejected")
    train = Dataset.from_list([{k: recs[i][k] for k in keep} for i in order])
    val = Dataset.from_list([{k: recs[i][k] for k in keep} for i in held])
    tok = AutoTokenizer.from_pretrained(inputs["hf"])
    model = AutoModelForSequenceClassification.from_pretrained(inputs["hf"], num_labels=1, dtype=torch.float32)
    cfg = ModelConfig.from_dict(json.loads((Path(inputs["ck"]) / "step-000000" / "config.json").read_text()))
    torch.manual_seed(SEED)  # llmctl's trainer seeds, then builds the model: its initial head
    with torch.no_grad():
        model.score.weight.copy_(RewardModel(cfg).score.weight)
    args = RewardConfig(**trl_args(out, steps, BATCH, LR, SEED, tok.pad_token), per_device_eval_batch_size=BATCH,
                        center_rewards_coefficient=None)
    seen: list[dict] = []
    times: list[float] = []

    class Sequential(RewardTrainer):
        def _get_train_sampler(self, *a, **k):
            return SequentialSampler(self.train_dataset)

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            if self.model.training:
                m = self._metrics["train"]
                seen.append({"loss": float(loss if not return_outputs else loss[0]),
                             "pref_accuracy": m["accuracy"][-1], "reward_margin": m["margin"][-1]})
            return loss

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            times.append(-time.perf_counter())

        def on_step_end(self, *a, **k):
            times[-1] += time.perf_counter()

    trainer = Sequential(model=model, args=args, train_dataset=train, eval_dataset=val, processing_class=tok,
                         callbacks=[Timer()])
    trainer.train()
    ev = trainer.evaluate()
    return {"first": seen[0], "val_accuracy": ev["eval_accuracy"], "val_loss": ev["eval_loss"], "step_s": times}


def run_child(side: str, inputs: dict, steps: int, threads: int, work: Path) -> dict:
    return common_run_child(__file__, side, inputs, steps, threads, work / f"rm-{side}-{threads}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--child")
    ap.add_argument("--inputs")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.child:
        import torch

        torch.set_num_threads(int(a.threads))
        inputs = json.loads(a.inputs)
        fn = child_llmctl if a.child == "llmctl" else child_trl
        print("RESULT " + json.dumps(fn(inputs, a.steps, int(a.threads), Path(a.out))))
        return
    threads = [int(t) for t in a.threads.split(",")]
    started = datetime.datetime.now()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        sys.path.insert(0, str(REPO / "src"))
        inputs = setup(work)
        rm_pairs(work / "rm_pairs.jsonl")
        inputs["rm_pairs"] = str(work / "rm_pairs.jsonl")
        runs = {(side, t): run_child(side, inputs, a.steps, t, work) for t in threads for side in ("llmctl", "trl")}
    print(json.dumps({f"{k[0]}/{k[1]}": v for k, v in runs.items()})[:2000])
    write_results("reward model", report(runs, threads, a, started))


def report(runs: dict, threads: list[int], a, started) -> str:
    ours, theirs = runs[("llmctl", threads[0])], runs[("trl", threads[0])]
    rows = [f"| first batch | {k} | {ours['first'][k]:.6f} | {theirs['first'][k]:.6f} | {abs(ours['first'][k] - theirs['first'][k]):.1e} |"
            for k in ("loss", "pref_accuracy", "reward_margin")]
    n_val = round(VAL_FRACTION * N_PAIRS)
    rows += [f"| after {a.steps} steps, {n_val} held-out pairs | {k} | {ours[k]:.4f} | {theirs[k]:.4f} | {abs(ours[k] - theirs[k]):.1e} |"
             for k in ("val_accuracy", "val_loss")]
    speed = []
    for t in threads:
        o = statistics.median(runs[("llmctl", t)]["step_s"][1:])
        tr = statistics.median(runs[("trl", t)]["step_s"][1:])
        speed.append(f"| {t} | {o:.4f} | {tr:.4f} | {tr / o:.2f}x |")
    # one held-out pair is 1/n_val of accuracy; the binomial standard error at 50% is 0.5/sqrt(n_val)
    noise = 0.5 / n_val ** 0.5
    return "\n".join([
        "## reward model", "",
        f"`PYTHONPATH=src .venv-bench/bin/python benchmarks/reward_model.py --steps {a.steps} --threads {a.threads}`"
        f" — {started:%Y-%m-%d}, {cpu_name()}, `nproc` = {os.cpu_count()}, 1-min load {os.getloadavg()[0]:.2f} after; TRL 1.16, fp32.",
        f"benchmarks/dpo.py's model (exported with `llmctl export`; TRL: LlamaForSequenceClassification with llmctl's initial "
        f"head); {N_PAIRS} conversational pairs (grammatical vs the same words shuffled), {n_val} held out by llmctl's "
        f"seeded draw on both sides; Bradley–Terry loss, {BATCH} pairs a step, AdamW lr {LR:g} constant, β (0.9, 0.95), "
        "no weight decay, clip 1.0; TRL reads the training pairs in llmctl's order.", "",
        "| when | metric | llmctl | TRL RewardTrainer | abs diff |", "|---|---|---|---|---|", *rows, "",
        f"Target: the first batch's loss within 1e-4; held-out accuracy within noise (one standard error at 50% over "
        f"{n_val} pairs: {noise:.3f}).", "",
        f"Seconds per step (median of steps 2..{a.steps}):", "",
        "| threads | llmctl s/step | TRL s/step | TRL / llmctl |", "|---|---|---|---|", *speed, ""])


if __name__ == "__main__":
    main()
