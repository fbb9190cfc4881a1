"""Activation recomputation (`train --recompute none|selective|block`, issue 21): the memory a
training step keeps for its backward pass and the time the recomputation costs, measured against
what `llmctl plan --recompute` predicts.

    .venv/bin/python benchmarks/recompute.py [--preset small] [--repeat 3] [--threads 2]

Every mode runs in fresh child processes, one micro-batch of the preset (small: 8 × 512 tokens):

1. memory (`--child memory`). glibc is told to serve every block above 64 KiB with its own mmap and
   to unmap it on free (mallopt M_MMAP_THRESHOLD, M_TRIM_THRESHOLD), so the resident set follows the
   live tensors to the page. After a warm-up step (one sequence: thread pools, kernels), with the
   weight gradients already allocated (zeroed, not freed), the peak (VmHWM) is reset through
   /proc/self/clear_refs and one forward + backward runs. Read from VmRSS / VmHWM:
     blocks     RSS after the last block − RSS before the first (forward hooks; the first forward
                only, not the recomputation): what the blocks keep for the backward pass, the
                number `plan` predicts;
     forward    RSS after the loss − RSS before the forward: the blocks, the final norm and the
                head + loss (linear_ce keeps the logits' gradient, s·b·V in the matmul dtype);
     peak       VmHWM − RSS before the forward, over forward + backward: the activation share of
                the step's peak (recomputed blocks, gradients of activations, the loss chunks).
   The same in float32 (llmctl train's default on a CPU, and the comparison with plan) and under
   bfloat16 autocast (fp32 master weights, as on a GPU).
2. time (`--child time`): the step `llmctl train` runs — forward + loss, backward, clipping,
   fused AdamW, zero_grad — with its CPU allocator settings (train/alloc.py keep_freed_memory),
   1 warm-up step and --repeat timed ones, the median; and the child's peak RSS (ru_maxrss), the
   number a user's `time -v` shows. Children run mode by mode in rounds, the order reversed every
   other round.
3. plan: `llmctl.plan.plan(preset, recompute=mode, recipe=fp32-adamw | bf16-adamw)`: its
   `activations` plus, for none, `no_flash_attention_extra` (the CPU path materializes the T×T
   probabilities: model/transformer.py explicit_causal_attention; selective and block recompute
   them). Beside it, the inventory of what this model's autograd keeps per token and layer (why
   `none` sits above plan: see the note under the table).

The tables go to stdout and into benchmarks/RESULTS.md (## recompute).
"""

from __future__ import annotations

import os
import sys

CHILD = sys.argv[sys.argv.index("--child") + 1] if "--child" in sys.argv else None
if CHILD == "memory":  # before torch allocates anything: every large block its own mmap, unmapped on free
    import ctypes

    _libc = ctypes.CDLL("libc.so.6")
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # <malloc.h>
    assert _libc.mallopt(M_MMAP_THRESHOLD, 64 << 10) == 1 and _libc.mallopt(M_TRIM_THRESHOLD, 64 << 10) == 1

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from common import cpu_name, write_results  # noqa: E402  (benchmarks/common.py)

MODES = ("none", "selective", "block")
DTYPES = ("float32", "bfloat16")
MB = 1e6


def status(key: str) -> int:
    """VmRSS / VmHWM of this process, bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def build(preset: str, mode: str, micro: int | None):
    import torch

    from llmctl.model.transformer import Transformer
    from llmctl.train.config import load_run_config

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    mcfg, tcfg = load_run_config(preset, {})
    torch.manual_seed(0)
    model = Transformer(mcfg).set_recompute(mode)
    b, t = micro or tcfg.micro_batch, tcfg.seq_len
    x = torch.randint(0, mcfg.vocab_size, (b, t + 1), generator=torch.Generator().manual_seed(1))
    return model, mcfg, x


def child_memory(preset: str, mode: str, dtype: str, micro: int | None) -> dict:
    import torch

    from llmctl.torchrt.device import autocast

    model, _, x = build(preset, mode, micro)
    amp = autocast(torch.device("cpu"), dtype)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # allocated before the measurement: backward accumulates into them
    marks: dict[str, int] = {}
    model.layers[0].register_forward_pre_hook(lambda m, a: marks.setdefault("blocks_start", status("VmRSS")) and None)
    model.norm.register_forward_pre_hook(lambda m, a: marks.setdefault("blocks_end", status("VmRSS")) and None)
    with amp:  # warm-up, one sequence
        loss, _ = model(x[:1, :-1], x[:1, 1:])
    loss.backward()
    del loss
    marks.clear()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    before = status("VmRSS")
    t0 = time.perf_counter()
    with amp:
        loss, _ = model(x[:, :-1], x[:, 1:])
    after_forward = status("VmRSS")
    loss.backward()
    peak = status("VmHWM")
    return {"mode": mode, "dtype": dtype,
            "blocks": marks["blocks_end"] - marks["blocks_start"], "forward": after_forward - before,
            "peak": peak - before, "before": before, "seconds": time.perf_counter() - t0,
            "tokens": x.shape[0] * (x.shape[1] - 1)}


def child_time(preset: str, mode: str, dtype: str, micro: int | None, repeat: int) -> dict:
    import torch

    from llmctl.torchrt.alloc import keep_freed_memory
    from llmctl.torchrt.device import autocast
    from llmctl.torchrt.optim import make_optimizer

    keep_freed_memory("cpu")
    model, _, x = build(preset, mode, micro)
    amp = autocast(torch.device("cpu"), dtype)
    opt = make_optimizer(model, 1.5e-3, 0.1, (0.9, 0.95), 1e-8, fused=True)
    params = list(model.parameters())
    times, cpu, faults = [], [], []
    for i in range(repeat + 1):
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        with amp:
            loss, _ = model(x[:, :-1], x[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i:
            times.append(time.perf_counter() - t0)
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            cpu.append(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
            faults.append(r1.ru_minflt - r0.ru_minflt)
    return {"mode": mode, "dtype": dtype, "step": statistics.median(times), "steps": times, "cpus": cpu, "faults": faults,
            "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "loss": float(loss.detach()),
            "tokens": x.shape[0] * (x.shape[1] - 1)}


def run_child(args, what: str, mode: str, dtype: str) -> dict:
    cmd = [sys.executable, __file__, "--child", what, "--mode", mode, "--dtype", dtype, "--preset", args.preset,
           "--repeat", str(args.repeat)] + (["--micro-batch", str(args.micro_batch)] if args.micro_batch else [])
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "BENCH_THREADS": str(args.threads)})
    if p.returncode:
        sys.exit(f"child failed: {' '.join(cmd)}\n{p.stderr[-3000:]}")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    print(f"  {what:6s} {mode:9s} {dtype:8s} " + ", ".join(f"{k} {v / MB:,.1f} MB" if isinstance(v, int) and v > 1e5 else f"{k} {v}"
                                                        for k, v in r.items() if k not in ("mode", "dtype", "steps", "cpus", "faults")), file=sys.stderr)
    return r


def predictions(preset: str, micro: int | None) -> dict:
    """plan's activations (+ the T×T probabilities where they are kept) and this model's inventory,
    per (mode, dtype), bytes."""
    from llmctl.plan import arithmetic as ar
    from llmctl.plan.arch import load_preset
    from llmctl.plan.planner import plan
    from llmctl.train.config import load_run_config

    arch, train = load_preset(preset)
    mcfg, tcfg = load_run_config(preset, {})
    b, s, L = micro or tcfg.micro_batch, tcfg.seq_len, mcfg.n_layers
    d, q, kv, ff, h = mcfg.d_model, mcfg.n_heads * mcfg.head_dim, mcfg.n_kv_heads * mcfg.head_dim, mcfg.d_ff, mcfg.n_heads
    out = {}
    for dtype, recipe in (("float32", "fp32-adamw"), ("bfloat16", "bf16-adamw")):
        e = ar.activation_bytes_per_element(ar.get_recipe(recipe))
        for mode in MODES:
            mem = plan(arch, train=train, recipe=recipe, recompute=mode, micro_batch=b, tokens=1e6)["memory"]
            # what autograd keeps here, per token and layer (float32): llmctl's RMSNorm is unfused (it keeps
            # its input, x·r and the scaled output: 3d a norm, where plan's 4d counts a fused norm's 2d)
            elements = {"none": 6 * d + 2 * q + 2 * kv + 4 * ff + h * s, "selective": 2 * d + 2 * q + 2 * kv + 2 * ff,
                        "block": d}[mode]
            out[(mode, dtype)] = {"plan": mem["activations"] + mem["no_flash_attention_extra"],
                                  "plan_flash": mem["activations"], "inventory": elements * 4 * s * b * L if dtype == "float32" else None,
                                  "per_token_layer": mem["activation_bytes_per_token_layer"][mode], "e": e,
                                  "logits_grad": e * s * b * mcfg.padded_vocab}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--micro-batch", type=int, default=None, help="sequences per step (default: the preset's)")
    ap.add_argument("--repeat", type=int, default=3, help="timed steps per mode (after 1 warm-up)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads of each child (1: CPU time that a loaded "
                    "machine disturbs least; OpenMP's spinning threads inflate it when cores are taken)")
    ap.add_argument("--child", default=None)
    ap.add_argument("--mode", default="none")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--no-write", action="store_true", help="print, do not touch RESULTS.md")
    args = ap.parse_args()
    if args.child == "memory":
        print(json.dumps(child_memory(args.preset, args.mode, args.dtype, args.micro_batch)))
        return
    if args.child == "time":
        print(json.dumps(child_time(args.preset, args.mode, args.dtype, args.micro_batch, args.repeat)))
        return

    import torch

    started = time.perf_counter()
    load0 = os.getloadavg()[0]
    mem = {(m, dt): run_child(args, "memory", m, dt) for dt in DTYPES for m in MODES}
    tim: dict = {}
    for r in range(2):  # rounds, the order reversed every other round; each side's median of its steps
        for m in (MODES if r % 2 == 0 else MODES[::-1]):
            for dt in DTYPES:
                res = run_child(args, "time", m, dt)
                prev = tim.get((m, dt))
                if prev:
                    for k in ("steps", "cpus", "faults"):
                        res[k] = prev[k] + res[k]
                    res["step"] = statistics.median(res["steps"])
                    res["maxrss"] = max(res["maxrss"], prev["maxrss"])
                tim[(m, dt)] = res
    load1 = os.getloadavg()[0]
    pred = predictions(args.preset, args.micro_batch)
    tokens = mem[("none", "float32")]["tokens"]

    from llmctl.train.config import load_run_config

    mcfg, tcfg = load_run_config(args.preset, {})
    b = args.micro_batch or tcfg.micro_batch
    cmd = "`.venv/bin/python benchmarks/recompute.py" + (f" --preset {args.preset}" if args.preset != "small" else "") + \
          (f" --micro-batch {args.micro_batch}" if args.micro_batch else "") + (f" --repeat {args.repeat}" if args.repeat != 3 else "") + \
          (f" --threads {args.threads}" if args.threads != 2 else "") + "`"
    lines = [f"## recompute\n",
             f"{cmd} — {datetime.date.today()}, `nproc` = {os.cpu_count()} ({cpu_name()}), torch {torch.__version__} "
             f"({args.threads} thread{'s' if args.threads > 1 else ''} a child), 1-min load average {load0:.2f} before / {load1:.2f} after; {(time.perf_counter() - started) / 60:.1f} min.\n",
             f"Preset `{args.preset}`: {mcfg.n_params():,} parameters ({mcfg.n_layers} layers, d {mcfg.d_model}, "
             f"{mcfg.n_heads}/{mcfg.n_kv_heads} heads of {mcfg.head_dim}, SwiGLU {mcfg.d_ff}, vocab {mcfg.padded_vocab:,}); one micro-batch of "
             f"{b} × {tcfg.seq_len} = {tokens:,} tokens. Each mode in fresh child processes (benchmarks/recompute.py says how: "
             "glibc unmaps every freed block above 64 KiB in the memory children, so RSS follows the live tensors; the time children "
             "run `llmctl train`'s step with its allocator settings). MB = 10⁶ bytes.\n",
             "**Activation memory, measured and predicted** (`blocks`: RSS after the last block − before the first, the forward "
             "of one micro-batch; `plan`: `llmctl plan --model small --recompute MODE --recipe fp32-adamw|bf16-adamw "
             f"--micro-batch {b}`, activations, plus the T×T attention probabilities the CPU path keeps for none):\n",
             "| mode | dtype | **blocks, measured MB** | **plan MB** | measured ÷ plan | inventory MB | forward kept MB (+ head, loss) | peak of fwd + bwd MB |",
             "|---|---|---|---|---|---|---|---|"]
    for dt in DTYPES:
        for m in MODES:
            r, p = mem[(m, dt)], pred[(m, dt)]
            inv = f"{p['inventory'] / MB:,.1f}" if p["inventory"] is not None else "—"
            ratio = f"{r['blocks'] / p['plan']:.3f}" if dt == "float32" else "(not comparable)"
            lines.append(f"| {m} | {dt} | **{r['blocks'] / MB:,.1f}** | **{p['plan'] / MB:,.1f}** | {ratio} | {inv} | "
                         f"{r['forward'] / MB:,.1f} | {r['peak'] / MB:,.1f} |")
    none32 = pred[("none", "float32")]
    casts = 2 * mcfg.block_params() * mcfg.n_layers  # autocast's bf16 weight copies
    inputs = 4 * mcfg.d_model * tokens * mcfg.n_layers  # the blocks' fp32 inputs
    lines += ["",
              "**Step time and peak RSS** (the whole training step of one micro-batch: forward + loss, backward, clipping, fused "
              f"AdamW; {2 * args.repeat} timed steps per mode over 2 rounds of fresh children, the median; ru_maxrss of the time "
              "children, which also hold the weights, gradients, AdamW moments and the allocator's kept memory):\n",
              "| mode | dtype | step s (median) | tokens/s | **÷ none, time** | CPU s (median) | ÷ none, CPU | page faults / step | peak RSS MB | **÷ none, peak RSS** |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    med = statistics.median
    for dt in DTYPES:
        for m in MODES:
            t, t0 = tim[(m, dt)], tim[("none", dt)]
            lines.append(f"| {m} | {dt} | {t['step']:.2f} | {t['tokens'] / t['step']:,.0f} | **{t['step'] / t0['step']:.2f}×** | "
                         f"{med(t['cpus']):.2f} | {med(t['cpus']) / med(t0['cpus']):.2f}× | {med(t['faults']):,.0f} | "
                         f"{t['maxrss'] / MB:,.0f} | **{t['maxrss'] / t0['maxrss']:.2f}×** |")
    same = all(tim[(m, "float32")]["loss"] == tim[("none", "float32")]["loss"] for m in MODES)
    final = ", ".join(f"{m} {tim[(m, 'float32')]['loss']:.6f}" for m in MODES)
    lines += ["",
              f"Loss of the last timed step, float32: {final} — "
              f"{'identical' if same else 'NOT identical'} (tests/test_train_stability.py checks the loss and every gradient to 1e-6).",
              "",
              "**Reading the numbers.**",
              "",
              f"- plan predicts per token and layer: none {none32['per_token_layer']:,.0f} B + the probabilities "
              f"(4·h·s = {4 * mcfg.n_heads * tcfg.seq_len:,} B in fp32), selective {pred[('selective', 'float32')]['per_token_layer']:,.0f} B, "
              f"block {pred[('block', 'float32')]['per_token_layer']:,.0f} B (float32: plan's BF16 formulas at 4 bytes an element).",
              "- selective and block keep what plan counts, to the byte: selective the block input, the output projection's "
              "output, Q/K/V, the attention output and gate/up (2d + 2·h·d_h + 2·h_kv·d_h + 2·d_ff elements a token and layer); "
              "block the block input (d).",
              "- none keeps 2d elements a token and layer more than plan: plan's 4d counts a fused RMSNorm (its input and the "
              "next matmul's input), llmctl's RMSNorm is three autograd ops and also keeps x·rsqrt(mean x² + ε) — 6d for the two "
              f"norms. With that, the inventory column matches the measurement; plan is low by "
              f"{1 - none32['plan'] / mem[('none', 'float32')]['blocks']:.1%} for none.",
              f"- bfloat16 autocast is not plan's BF16 case (all 16-bit, flash attention, as on a GPU): the residual stream and "
              f"the norms stay fp32 here, and autocast caches bf16 copies of the block weights for the whole forward "
              f"({casts / MB:,.1f} MB if all are held). With block, the fp32 block inputs ({inputs / MB:,.1f} MB) and those "
              f"copies make {(inputs + casts) / MB:,.1f} MB of the {mem[('block', 'bfloat16')]['blocks'] / MB:,.1f} measured.",
              f"- the rest of the forward (forward kept − blocks) is the head and the loss: linear_ce keeps the logits' gradient, "
              f"s·b·V = {none32['logits_grad'] / MB:,.0f} MB in fp32, whatever the mode — with block it is most of what the step "
              "keeps. The peak adds the backward's working set (with block: one block recomputed at a time)."]
    section = "\n".join(lines) + "\n"
    print(section)
    if not args.no_write:
        write_results("recompute", section)


if __name__ == "__main__":
    main()
