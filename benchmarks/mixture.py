"""train mixtures (issue 21, "Measure"): how exactly a mixture draws its weights, and what it
costs next to one source.

    .venv/bin/python benchmarks/mixture.py [--steps 10000] [--train-steps 40] [--repeat 0] [--loop-steps 8]

Synthetic tokens artifacts (uniform random ids, one tokenizer identity, documents of 50-1,000
tokens) stand in for three sources of 3M, 1M and 0.25M tokens, in the `tiny` preset's shape
(32 sequences of 256 per step):

1. sampling accuracy: the slots of --steps steps of a 0.6/0.3/0.1 mixture (train/mixture.py),
   tokens per source ÷ all tokens against the weights (target: within 1%, relative), beside the
   same count for i.i.d. draws (np.random.choice, the usual way); then the same mix with
   max_epochs 2 on the small source: its epochs exactly 2, the others' as the arithmetic says.
2. loader overhead, batch assembly only: `micro_batches` of a step (both micro-batches, tensors
   made) for the 3-source mix, for the one-source mixture over the big source, and for the
   single-source loader before mixtures (train/loader.py PackedBatches); rounds of 500 steps
   interleaved, the order reversed every other round, the median of each side's mean step time
   (target: mixed ≤ 1.02× single).
3. inside real training steps: the trainer's step (PretrainData.batch, forward + backward per
   micro-batch, clip, fused AdamW) on one `tiny` model, the batch alternately from one source and
   from the mix, step by step (A B, B A, …: a shared machine's load hits both alike); the median
   of the step-by-step ratios (target: mixed ≤ 1.02× single). With --repeat N, also whole `run_train` runs of the `tiny`
   preset in this process, --loop-steps steps each, alternated N times; the median
   `step_seconds` of steps 2.. per run, the best run per side (noisy on a shared machine).

The tables go to stdout and into benchmarks/RESULTS.md (## mixture).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import cpu_name, write_results  # noqa: E402  (benchmarks/common.py)

import numpy as np  # noqa: E402

SEQ, BATCH = 256, 32  # the tiny preset's shape
VOCAB = 4096
SIZES = {"web": 3_000_000, "code": 1_000_000, "math": 250_000}
WEIGHTS = {"web": 0.6, "code": 0.3, "math": 0.1}


def make_source(path: Path, n_tokens: int, seed: int) -> Path:
    """A tokens artifact of random ids with a kept `dup` column (1-8), like `tokenize --keep-column dup`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from llmctl.artifacts.manifest import Manifest, file_sha256, write_manifest
    from llmctl.artifacts.tokens import token_dtype, write_shard

    rng = np.random.default_rng(seed)
    path.mkdir(parents=True)
    dtype = token_dtype(VOCAB)
    lengths = []
    while sum(lengths) < n_tokens:
        lengths.append(int(rng.integers(50, 1000)))
    ids = rng.integers(16, VOCAB, sum(lengths), dtype=np.int64).astype(dtype)
    docs = np.split(ids, np.cumsum(lengths)[:-1])
    n_docs, n_tok = write_shard(path / "tokens-00000.bin", path / "tokens-00000.idx", docs, 0, dtype)
    pq.write_table(pa.table({"dup": rng.integers(1, 9, n_docs)}), path / "tokens-00000.meta.parquet")
    outputs = [{"file": f, "rows": r, "bytes": (path / f).stat().st_size, "sha256": file_sha256(path / f)}
               for f, r in (("tokens-00000.bin", n_tok), ("tokens-00000.idx", n_docs), ("tokens-00000.meta.parquet", n_docs))]
    write_manifest(path, Manifest(kind="tokens", stage="tokenize", outputs=outputs, counts={"docs": n_docs, "tokens": n_tok},
                                  config={"dtype": dtype.str, "vocab_size": VOCAB, "eos_id": 0, "keep_columns": ["dup"]}))
    return path


def accuracy(paths: dict, steps: int) -> dict:
    from llmctl.artifacts.tokens import TokenDataset
    from llmctl.train.mixture import MixedBatches, SourceWindows

    names = list(SIZES)
    ws = [SourceWindows(TokenDataset(paths[n]), SEQ, 0, i, n) for i, n in enumerate(names)]
    weights = [WEIGHTS[n] for n in names]
    n = steps * BATCH
    out = {"slots": n, "windows": {nm: w.n_windows for nm, w in zip(names, ws)}}
    t0 = time.perf_counter()
    mb = MixedBatches(ws, weights, [None] * 3, BATCH, 0)
    src, _ = mb.slots(0, n)
    out["plan_seconds"] = time.perf_counter() - t0
    got = np.bincount(src, minlength=3)
    iid = np.bincount(np.random.default_rng(0).choice(3, n, p=weights), minlength=3)
    out["mix"] = {nm: {"share": got[i] / n, "err": got[i] / n / weights[i] - 1, "iid_share": iid[i] / n,
                       "iid_err": iid[i] / n / weights[i] - 1, "epochs": got[i] / ws[i].n_windows,
                       "predicted": weights[i] * n / ws[i].n_windows}
                  for i, nm in enumerate(names)}
    per_step = np.stack([np.bincount(src[s * BATCH:(s + 1) * BATCH], minlength=3) for s in range(steps)])
    out["per_step_range"] = {nm: (int(per_step[:, i].min()), int(per_step[:, i].max())) for i, nm in enumerate(names)}
    # the small source capped at 2 epochs: it stops there, the others share what it leaves 2:1
    caps = [None, None, 2 * ws[2].n_windows]
    mb = MixedBatches(ws, weights, caps, BATCH, 0)
    src, _ = mb.slots(0, n)
    got = np.bincount(src, minlength=3)
    cap_slot = mb.last_draw(2, caps[2])
    before = np.bincount(src[: cap_slot + 1], minlength=3)
    rest = n - cap_slot - 1
    out["capped"] = {
        "cap_step": cap_slot // BATCH + 1,
        "epochs": {nm: got[i] / ws[i].n_windows for i, nm in enumerate(names)},
        "predicted": {names[0]: (before[0] + rest * 2 / 3) / ws[0].n_windows, names[1]: (before[1] + rest / 3) / ws[1].n_windows,
                      names[2]: 2.0},
        "share_after": {names[0]: (got[0] - before[0]) / rest, names[1]: (got[1] - before[1]) / rest},
    }
    return out


def assembly(paths: dict, rounds: int, steps_per_round: int) -> dict:
    import torch

    from llmctl.artifacts.tokens import TokenDataset
    from llmctl.train.loader import PackedBatches
    from llmctl.train.mixture import MixedBatches, SourceWindows, Upsample

    torch.set_num_threads(1)
    names = list(SIZES)
    ds = {n: TokenDataset(paths[n]) for n in names}
    up = Upsample.parse({"column": "dup", "buckets": [[1, 1], [4, 2], [8, 3]]}, "bench")
    sides = {
        "single (PackedBatches, before mixtures)": PackedBatches(ds["web"], SEQ, 0),
        "single (one-source mixture)": MixedBatches([SourceWindows(ds["web"], SEQ, 0, 0)], [1.0], [None], BATCH, 0),
        "mixed, 3 sources 0.6/0.3/0.1": MixedBatches([SourceWindows(ds[n], SEQ, 0, i) for i, n in enumerate(names)],
                                                     [WEIGHTS[n] for n in names], [None] * 3, BATCH, 0),
        "mixed, 3 sources, math capped at 2 epochs and upsampled by dup": MixedBatches(
            [SourceWindows(ds[n], SEQ, 0, i, n, up if n == "math" else None) for i, n in enumerate(names)],
            [WEIGHTS[n] for n in names], [None, None, 2 * SourceWindows(ds["math"], SEQ, 0, 2, "math", up).n_windows], BATCH, 0),
    }
    times: dict[str, list[float]] = {k: [] for k in sides}
    order = list(sides)
    step0 = 0
    for r in range(rounds + 1):  # round 0 warms up
        for name in (order if r % 2 else order[::-1]):
            loader = sides[name]
            t0 = time.perf_counter()
            for s in range(step0, step0 + steps_per_round):
                for _ in loader.micro_batches(s, BATCH, 16):
                    pass
            dt = (time.perf_counter() - t0) / steps_per_round
            if r:
                times[name].append(dt)
        step0 += steps_per_round  # each round draws new steps (the mixture's chunks included)
    return {k: statistics.median(v) for k, v in times.items()} | {"_all": times}


def busy_seconds() -> float:
    """CPU seconds all cores have spent busy since boot (every process on the machine)."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def interleaved_steps(paths: dict, steps: int) -> dict:
    """The trainer's step (batch from the data source, forward + backward per micro-batch, clip,
    fused AdamW, zero_grad) on one `tiny` model, its batch alternately from the one-source data and
    from the mix, A B B A …: load from other processes hits both sides alike."""
    import torch

    from llmctl.model.transformer import Transformer
    from llmctl.torchrt.alloc import keep_freed_memory
    from llmctl.torchrt.distributed import Dist
    from llmctl.torchrt.optim import make_optimizer
    from llmctl.train.config import load_run_config
    from llmctl.train.mixture import DataSource
    from llmctl.train.pretrain import PretrainData

    model_cfg, cfg = load_run_config("tiny", {"device": "cpu", "threads": 2})
    torch.set_num_threads(2)
    keep_freed_memory(torch.device("cpu"))
    sides = {"single": PretrainData([DataSource("web", paths["web"])], None, cfg),
             "mixed": PretrainData([DataSource(n, paths[n], WEIGHTS[n]) for n in SIZES], None, cfg, mixture=True)}
    torch.manual_seed(0)
    model = Transformer(model_cfg)
    opt = make_optimizer(model, cfg.lr, cfg.weight_decay, (cfg.beta1, cfg.beta2), cfg.eps, fused=True)
    params = list(model.parameters())
    batch_seqs = cfg.batch_tokens // cfg.seq_len
    d = Dist()
    times: dict[str, list[float]] = {k: [] for k in sides}
    batch_times: dict[str, list[float]] = {k: [] for k in sides}
    others: list[float] = []
    warm = 2
    for i in range(warm + steps):
        for side in (("single", "mixed") if i % 2 == 0 else ("mixed", "single")):
            b0, c0 = busy_seconds(), time.process_time()
            t0 = time.perf_counter()
            micro, weights, _ = sides[side].batch(i, batch_seqs, cfg.micro_batch, d)
            t1 = time.perf_counter()
            for (x, y), w in zip(micro, weights):
                loss, _ = model(x, y)
                (loss * w).backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip, foreach=True)
            opt.step()
            opt.zero_grad(set_to_none=True)
            t2 = time.perf_counter()
            if i >= warm:
                times[side].append(t2 - t0)
                batch_times[side].append(t1 - t0)
                others.append(max(0.0, (busy_seconds() - b0) - (time.process_time() - c0)) / (t2 - t0) / len(os.sched_getaffinity(0)))
    return {"step": {k: statistics.median(v) for k, v in times.items()}, "batch": {k: statistics.median(v) for k, v in batch_times.items()},
            "ratios": [m / s for s, m in zip(times["single"], times["mixed"])], "others": statistics.median(others),
            "params": model_cfg.n_params(), "steps": steps}


def real_steps(paths: dict, repeat: int, loop_steps: int, tmp: str) -> dict:
    from llmctl.train.config import load_run_config
    from llmctl.train.mixture import DataSource
    from llmctl.train.trainer import run_train

    model_cfg, cfg = load_run_config("tiny", {"max_steps": loop_steps, "eval_every": 0, "checkpoint_every": 10**6,
                                              "device": "cpu", "threads": 2})
    mix = [DataSource(n, paths[n], WEIGHTS[n]) for n in SIZES]
    runs: dict[str, list[float]] = {"single": [], "mixed": []}
    for r in range(repeat):
        for side in (("single", "mixed") if r % 2 == 0 else ("mixed", "single")):
            out = Path(tmp, f"run-{side}-{r}")
            run_train(paths["web"] if side == "single" else mix, out, model_cfg, cfg)
            recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
            secs = [x["step_seconds"] for x in recs if "step_seconds" in x][1:]
            runs[side].append(statistics.median(secs))
            print(f"  {side} run {r}: median step {runs[side][-1]:.4f} s", file=sys.stderr, flush=True)
    return {"single": min(runs["single"]), "mixed": min(runs["mixed"]), "runs": runs, "params": model_cfg.n_params()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=10_000, help="steps of the accuracy study")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds of batch assembly")
    ap.add_argument("--round-steps", type=int, default=500, help="steps per side per round")
    ap.add_argument("--train-steps", type=int, default=40, help="interleaved training steps per side")
    ap.add_argument("--repeat", type=int, default=0, help="whole run_train runs per side, alternated (0: skip; on a shared machine a run that loses a core is slower throughout, so the interleaved steps are the measure)")
    ap.add_argument("--loop-steps", type=int, default=8, help="steps per run_train run")
    ap.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = ap.parse_args()
    started = time.perf_counter()
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="llmctl-bench-mixture-") as tmp:
        paths = {n: make_source(Path(tmp, n), size, i) for i, (n, size) in enumerate(SIZES.items())}
        print("accuracy", file=sys.stderr)
        acc = accuracy(paths, args.steps)
        print("batch assembly", file=sys.stderr)
        asm = assembly(paths, args.rounds, args.round_steps)
        print("interleaved training steps", file=sys.stderr)
        inter = interleaved_steps(paths, args.train_steps)
        print("run_train", file=sys.stderr)
        real = real_steps(paths, args.repeat, args.loop_steps, tmp) if args.repeat else None
    load1 = os.getloadavg()[0]
    import torch

    from llmctl import __version__

    cmd = "`.venv/bin/python benchmarks/mixture.py" + (" " + " ".join(sys.argv[1:]) if sys.argv[1:] else "") + "`"
    lines = [
        "## mixture", "",
        f"{cmd} — {datetime.date.today()}, `nproc` = {len(os.sched_getaffinity(0))} ({cpu_name()}), torch {torch.__version__}, "
        f"llmctl {__version__}; 1-min load average {load0:.2f} before / {load1:.2f} after; {time.perf_counter() - started:.0f} s in all.",
        "",
        f"Synthetic tokens artifacts (random ids, documents of 50-1,000 tokens): web {SIZES['web']:,}, code {SIZES['code']:,}, "
        f"math {SIZES['math']:,} tokens; the `tiny` preset's shape, {BATCH} × {SEQ} tokens a step. "
        "Sampling: `train/mixture.py` (cumulative largest-remainder blocks of whole batches, shuffled inside; caps as phases).",
        "",
        f"**Sampling accuracy**, {args.steps:,} steps = {acc['slots']:,} sequences of 0.6/0.3/0.1 "
        f"(the plan and the slots computed in {acc['plan_seconds'] * 1000:.0f} ms):",
        "",
        "| source | weight | share drawn | error (relative) | i.i.d. draws' share | i.i.d. error | sequences per step (min-max) | epochs | w·D/U |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    worst = 0.0
    for n, m in acc["mix"].items():
        worst = max(worst, abs(m["err"]))
        lo, hi = acc["per_step_range"][n]
        lines.append(f"| {n} | {WEIGHTS[n]} | {m['share']:.6f} | {m['err']:+.4%} | {m['iid_share']:.6f} | {m['iid_err']:+.3%} | "
                     f"{lo}-{hi} | {m['epochs']:.4f} | {m['predicted']:.4f} |")
    lines += ["", f"Target: every share within 1% of its weight — worst {worst:.4%}: **{'met' if worst <= 0.01 else 'missed'}**.", ""]
    c = acc["capped"]
    lines += [f"Same mix with `max_epochs = 2` on math: it stops at step {c['cap_step']:,}; epochs per source drawn vs "
              "the arithmetic (math: its cap; web and code: their draws before the cap plus 2/3 and 1/3 of the rest):", "",
              "| source | epochs drawn | configured / arithmetic | share of the slots after the cap |", "|---|---|---|---|"]
    for n in SIZES:
        after = f"{c['share_after'][n]:.6f}" if n in c["share_after"] else "—"
        lines.append(f"| {n} | {c['epochs'][n]:.6f} | {c['predicted'][n]:.6f} | {after} |")
    single = asm["single (PackedBatches, before mixtures)"]
    one = asm["single (one-source mixture)"]
    mixed = asm["mixed, 3 sources 0.6/0.3/0.1"]
    lines += ["", f"**Batch assembly only**: `micro_batches(step, {BATCH}, 16)` consumed (2 micro-batches of 16 × {SEQ + 1} "
              f"tokens as tensors), 1 torch thread; {args.rounds} interleaved rounds of {args.round_steps} new steps per side; "
              "median of the rounds' mean step time.", "",
              "| side | µs per step | ÷ PackedBatches | ÷ one-source mixture |", "|---|---|---|---|"]
    for k, v in asm.items():
        if k.startswith("_"):
            continue
        lines.append(f"| {k} | {v * 1e6:.1f} | {v / single:.3f}× | {v / one:.3f}× |")
    lines += ["", f"Target: mixed ≤ 1.02× single. Against the loader single-source runs used before mixtures: **{mixed / single:.3f}×**, "
              f"**{'met' if mixed / single <= 1.02 else 'missed'}**. Against today's single-source path (the one-source mixture, "
              f"which writes windows straight into the batch and slices cached chunks): **{mixed / one:.3f}×**, "
              f"**{'met' if mixed / one <= 1.02 else 'missed'}** ({(mixed - one) * 1e6:+.1f} µs a step: the chunk arithmetic — "
              "apportionment, shuffle, per-source draw order — and windows read from three files instead of one)."]
    st, bt = inter["step"], inter["batch"]
    r = statistics.median(inter["ratios"])  # paired: each mixed step ÷ the single step next to it
    lines += ["", f"**Inside real training steps**: the trainer's step on one `tiny` model ({inter['params']:,} parameters, float32, "
              f"2 threads, fused AdamW, freed memory kept): the batch from `PretrainData.batch` (one source, web / the mix), forward + "
              f"backward per micro-batch, clip, step; {inter['steps']} steps per side after 2 warm-up, the sides alternated step by step "
              f"(A B, B A, …); medians. Other processes used a median {inter['others']:.0%} of the cores meanwhile.", "",
              "| side | step s (median) | of which the batch, µs |", "|---|---|---|",
              f"| one source (web) | {st['single']:.4f} | {bt['single'] * 1e6:.0f} |",
              f"| 3-source mix | {st['mixed']:.4f} | {bt['mixed'] * 1e6:.0f} |",
              "", f"Mixed ÷ single, the median of the step-by-step ratios (each mixed step ÷ the single step beside it): **{r:.3f}×** "
              f"(ratio of the medians {st['mixed'] / st['single']:.3f}×) — target ≤ 1.02×: **{'met' if r <= 1.02 else 'missed'}**; the "
              f"batch is {bt['mixed'] / st['mixed']:.3%} of a mixed step, and what the mix adds to it "
              f"({(bt['mixed'] - bt['single']) * 1e6:+.0f} µs) {(bt['mixed'] - bt['single']) / st['single']:+.4%} of a step."]
    if real:
        rr = real["mixed"] / real["single"]
        lines += ["", f"And whole `run_train` runs (preset `tiny`, {args.loop_steps} steps, {args.repeat} runs per side alternated; "
                  "median `step_seconds` of steps 2.. per run, the best run per side, as a run that shared its cores is slower "
                  f"throughout): single {real['single']:.4f} s, mixed {real['mixed']:.4f} s, **{rr:.3f}×**. Per run: single "
                  f"{', '.join(f'{x:.3f}' for x in real['runs']['single'])}; mixed {', '.join(f'{x:.3f}' for x in real['runs']['mixed'])}."]
    section = "\n".join(lines) + "\n"
    print(section)
    if not args.no_write:
        write_results("mixture", section)


if __name__ == "__main__":
    main()
