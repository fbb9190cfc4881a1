"""The generation engine at serving speed (issue 33 "Measure"): tokens/s on the RL workload, peak KV
memory, and eval's generative tasks — the engine of this checkout against the static batcher it
replaces (commit d1115e8, TODAY below) and against transformers' `generate`.

    PYTHONPATH=src .venv/bin/python benchmarks/generate.py [--ckpt SFT] [--small CKPT] [--threads 1,2] [--repeat 2]

1. **Tokens/s.** Two workloads, the same 16 prompts (the first of examples/tasks/arithmetic-train.jsonl,
   rendered by the SFT checkpoint's chat template as rl renders them: rl/rollout.Prompter) × G = 8 = 128
   rows, temperature 1, no top-k / top-p, stop at the chat turn end:
     demo   the demo's SFT model (--ckpt, default out/demo/sft), max_new 64;
     small  a `small`-preset model (stages/train/small.toml: 6 layers, d 512; --small, or made here by
            `llmctl train DEMO_TOKENS --config small --max-steps 2 --batch-tokens 4096 --micro-batch 8`:
            two steps from the seeded init, so nearly random weights: it rarely writes the stop id
            and its rows run to max_new), max_new 256, the demo tokenizer (same ids).
   Sides, each in its own child process (`--child SIDE`), interleaved (new, today…, hf, new, …),
   --repeat times per torch thread count, all 128 rows given to one call:
     new       `Engine(model, …).generate(ids, params, seeds=…)` of this checkout (src/llmctl/model),
               its default EngineConfig (fp32 on CPU); `new-bf16` (not in the default --sides): the
               same with EngineConfig(dtype="bfloat16");
     today@B   the same call on `Engine(…, batch_size=B)` of d1115e8's src/llmctl/model/generate.py
               (read with `git show`, imported from its text at run time, on this checkout's
               Transformer and weights — so it also gets this checkout's decode attention, which
               runs a KV head's query heads as rows: if anything, today is flattered): B = 16 (eval's
               and `llmctl generate`'s default) and 64 (rl's `gen_batch`, the arith preset's too);
     hf        transformers `generate` on `llmctl export CKPT` (LlamaForCausalLM, fp32, sdpa), the
               same ids left-padded, do_sample, temperature 1, top_k 0, top_p 1, eos = the same stop
               ids, the head's padding rows suppressed.
   Timed: the `generate` call (model loaded, one 2-row 4-token warm-up call first, untimed). Tokens
   = sampled tokens, the stop token included (rl's completion_ids). new and today draw with the same
   per-row seeds (RowStreams), so their rows should match token for token: counted.
2. **Peak KV memory** at G = 16 (16 prompts × 16 = 256 rows), max_new 1,024, temperature 1, the demo
   model, lengths as sampled: the new engine's own `engine.stats["peak_kv_bytes"]` (blocks in use)
   and `kv_allocated_bytes` (the pool's storage, grown by doubling); today's
   allocation from d1115e8's KVCache shapes (its code runs each batch up to the allocation of its
   caches, then stops: KVCache(B, h_kv, padded prompt + max_new, d_h) × 2 × layers, which does not
   depend on what is sampled), at B = 16, 64 and all 256 rows at once.
3. **eval**, whole process (start-up, model load, generation, scoring, writing): `llmctl eval CKPT
   -t gsm8k:examples/tasks/arithmetic.jsonl --max-new-tokens 64` (the demo's eval-sft stage) greedy,
   and with `--samples 8 --temperature 0.7 --pass-k 1 --pass-k 8`, this checkout (PYTHONPATH=src)
   against d1115e8's (`git archive d1115e8 src stages | tar -x -C DIR`, PYTHONPATH=DIR/src, run from
   DIR), interleaved; the greedy completions must be the same.

The section goes to benchmarks/RESULTS.md (## generate) unless --no-write.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, cpu_name, run_child, timed, write_results  # noqa: E402  (benchmarks/common.py)

OLD_COMMIT = "d1115e8"  # main before issue 33: the static batcher
PROMPTS = REPO / "examples" / "tasks" / "arithmetic-train.jsonl"
EVAL_TASK = REPO / "examples" / "tasks" / "arithmetic.jsonl"
DEMO = REPO / "out" / "demo"
SEED = 0
TODAY_BATCHES = (16, 64)  # eval's EvalConfig.batch_size and `generate`'s default; rl's gen_batch (arith too)
WARMUP_ROWS, WARMUP_TOKENS = 2, 4


# ---------------------------------------------------------------------------------------------
# children: one side of a measurement, in its own process


def old_generate_module(path: str):
    """d1115e8's model/generate.py, imported from its text: it runs on this checkout's Transformer."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"llmctl_generate_{OLD_COMMIT}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


def row_seeds(n_prompts: int, G: int) -> list[int]:
    """rl's per-sample seeds (rl/rollout.row_seed of the prompt's and the sample's index)."""
    from llmctl.model.generate import row_seed

    return [row_seed(SEED, k, j) for k in range(n_prompts) for j in range(G)]


def llmctl_engine(side: str, inp: dict, model, vocab):
    """The side's engine over the prompts' vocabulary (the demo tokenizer for both models)."""
    if side.startswith("new"):
        from llmctl.model.generate import Engine, EngineConfig

        config = EngineConfig(dtype="bfloat16") if side == "new-bf16" else EngineConfig()
        return Engine(model, vocab.encode, vocab.decode, inp["stop_ids"], pad_id=inp["pad_id"], config=config), None
    old = old_generate_module(inp["old_generate"])
    batch = int(side.split("@")[1]) if "@" in side else inp["rows"]
    return old.Engine(model, vocab.encode, vocab.decode, inp["stop_ids"], pad_id=inp["pad_id"], batch_size=batch), old


def child(side: str, inp: dict, threads: int) -> dict:
    import resource

    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(SEED)
    t0 = time.perf_counter()
    if inp["task"] == "kv-today":
        return kv_today(inp)
    ids = inp["ids"]
    if side == "hf":
        run = hf_runner(inp)
    else:
        from llmctl.model.load import load_model
        from llmctl.tokenizer.vocab import Vocab

        model, _ = load_model(inp["ckpt"], "cpu")
        vocab = Vocab(inp["vocab"])
        engine, old = llmctl_engine(side, inp, model, vocab)
        if old is None:
            from llmctl.model.generate import SamplingParams
        else:
            SamplingParams = old.SamplingParams

        def run(rows, max_new, seeds):
            params = SamplingParams(max_new_tokens=max_new, temperature=inp["temperature"], seed=SEED)
            gens = engine.generate(rows, params, seeds=seeds)
            return [g.ids + ([g.stop_id] if g.finish == "eos" else []) for g in gens]
    load_s = time.perf_counter() - t0
    seeds = inp["seeds"]
    run(ids[:WARMUP_ROWS], WARMUP_TOKENS, seeds[:WARMUP_ROWS])
    t1 = time.perf_counter()
    out = run(ids, inp["max_new"], seeds)
    wall = time.perf_counter() - t1
    lengths = [len(o) for o in out]
    res = {"wall": wall, "tokens": sum(lengths), "rows": len(out), "lengths": lengths, "load_s": load_s,
           "ended": sum(bool(o) and o[-1] in inp["stop_ids"] for o in out),
           "digests": [hashlib.sha1(json.dumps(o).encode()).hexdigest()[:12] for o in out],
           "threads": torch.get_num_threads(), "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if side.startswith("new") and inp["task"] == "kv-new":
        res["stats"] = {k: v for k, v in getattr(engine, "stats", {}).items() if isinstance(v, (int, float))}
    return res


def hf_runner(inp: dict):
    """transformers' generate on the export: left-padded rows, sampling as llmctl samples."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(inp["hf"], dtype=torch.float32).eval()
    stop, pad = inp["stop_ids"], inp["pad_id"]
    padded_rows = list(range(inp["vocab_rows"], model.config.vocab_size))  # llmctl never samples them

    def run(rows, max_new, _seeds):
        width = max(len(r) for r in rows)
        x = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        cfg = GenerationConfig(do_sample=True, temperature=inp["temperature"], top_k=0, top_p=1.0, max_new_tokens=max_new,
                               eos_token_id=list(stop), pad_token_id=pad, suppress_tokens=padded_rows or None)
        torch.manual_seed(SEED)
        with torch.no_grad():
            y = model.generate(input_ids=x, attention_mask=mask, generation_config=cfg)[:, width:].tolist()
        out = []
        for row in y:
            end = next((i for i, t in enumerate(row) if t in stop), None)
            out.append(row if end is None else row[: end + 1])
        return out
    return run


class _Allocated(Exception):
    """Raised by the model's first forward of a batch: today's caches for it are allocated by then."""


def kv_today(inp: dict) -> dict:
    """Today's KV allocation per batch: d1115e8's own `_generate_cached` runs each batch of its
    `generate` loop up to its first forward (its KVCache objects are made before it), recording
    every KVCache it builds; the caches of one batch are alive together, those of the next replace them."""
    import torch

    from llmctl.model.load import load_model
    from llmctl.tokenizer.vocab import Vocab

    model, _ = load_model(inp["ckpt"], "cpu")
    vocab = Vocab(inp["vocab"])
    old = old_generate_module(inp["old_generate"])
    batches: list[int] = []
    base_init = old.KVCache.__init__

    def recording_init(self, *a, **kw):
        base_init(self, *a, **kw)
        batches[-1] += self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()

    old.KVCache.__init__ = recording_init
    base_cached = old.Engine._generate_cached

    def up_to_allocation(self, prompts, params, gen):
        batches.append(0)
        try:
            return base_cached(self, prompts, params, gen)
        except _Allocated:
            return [old.Generation(list(p), [], "") for p in prompts]

    old.Engine._generate_cached = up_to_allocation

    def stop_at_forward(*a, **kw):
        raise _Allocated

    model.forward = stop_at_forward
    out = {}
    for batch in inp["batches"]:
        batches.clear()
        engine = old.Engine(model, vocab.encode, vocab.decode, inp["stop_ids"], pad_id=inp["pad_id"], batch_size=batch)
        engine.generate(inp["ids"], old.SamplingParams(max_new_tokens=inp["max_new"], temperature=inp["temperature"]),
                        seeds=inp["seeds"])
        out[str(batch)] = {"peak": max(batches), "batches": len(batches), "sum": sum(batches)}
    cfg = model.cfg
    return {"alloc": out, "bytes_per_token": cfg.n_layers * 2 * cfg.n_kv_heads * cfg.head_dim * torch.finfo(torch.float32).bits // 8}


# ---------------------------------------------------------------------------------------------
# inputs


def llmctl_cmd() -> list[str]:
    return [sys.executable, "-m", "llmctl"]


def run_llmctl(args: list[str], src: Path, cwd: Path | None = None, threads: int = 2) -> None:
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": str(threads)}
    p = subprocess.run(llmctl_cmd() + args, env=env, cwd=cwd, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"llmctl {' '.join(args[:3])} … failed ({p.returncode}):\n{p.stderr[-3000:]}")


def prompt_inputs(ckpt: str, n: int, G: int) -> dict:
    """The first n training prompts as rl renders them (Prompter: the chat template), the stop ids
    and pad id of the SFT checkpoint's vocabulary, rl's per-sample seeds."""
    from llmctl.artifacts.checkpoint import resolve_checkpoint
    from llmctl.rl.rollout import Prompter
    from llmctl.tasks import load_prompts
    from llmctl.tokenizer.vocab import Vocab

    step = resolve_checkpoint(ckpt)
    vocab = Vocab(step)
    prompter = Prompter(vocab, chat=True, families=[])
    ids = [prompter.ids(p["prompt"]) for p in load_prompts(PROMPTS)[:n]]
    return {"vocab": str(step), "prompt_ids": ids, "stop_ids": list(vocab.stop_ids(chat=True)), "pad_id": vocab.pad_id,
            "vocab_rows": vocab.size, "tokenizer_sha": hashlib.sha256((step / "tokenizer.json").read_bytes()).hexdigest()}


def ensure_small(arg: str | None, tokens: Path, work: Path) -> tuple[str, str]:
    """A `small`-preset checkpoint on the demo tokenizer, and how it was made."""
    if arg:
        return arg, f"`{arg}` (given)"
    out = work / "small"
    argv = ["train", str(tokens), "-o", str(out), "--config", "small", "--max-steps", "2", "--batch-tokens", "4096",
            "--micro-batch", "8", "--seed", str(SEED), "--overwrite", "--quiet"]
    if not (out / "checkpoints" / "latest").exists():
        print(f"making the small model: llmctl {' '.join(argv)}", file=sys.stderr)
        run_llmctl(argv, REPO / "src")
    return str(out), f"`llmctl {' '.join(argv).replace(str(work) + '/', 'WORK/')}` (2 steps from the seeded init: nearly random weights)"


def old_tree(arg: str | None, work: Path) -> Path:
    """d1115e8's src/ and stages/ (made here with git archive unless --old-src names one)."""
    if arg:
        return Path(arg)
    out = work / f"old-{OLD_COMMIT}"
    if not (out / "src" / "llmctl").is_dir():
        out.mkdir(parents=True, exist_ok=True)
        tar = subprocess.run(["git", "-C", str(REPO), "archive", OLD_COMMIT, "src", "stages"], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(out)], input=tar, check=True)
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(out / "src")], check=True, stdout=subprocess.DEVNULL)
    return out


# ---------------------------------------------------------------------------------------------
# the three measurements


def side_names(spec: str) -> list[str]:
    sides = [s.strip() for s in spec.split(",") if s.strip()]
    bad = [s for s in sides if s not in ("new", "new-bf16", "hf") and not (s.startswith("today@") and s[6:].isdigit())]
    if bad or "new" not in sides:
        sys.exit(f"--sides: {bad or 'no new'} (new, new-bf16, today@B, hf; new is what the ratios divide)")
    return sides


def spawn(side: str, inp: dict, threads: int, out: Path) -> dict:
    """common.run_child with the inputs in a file beside `out` (256 rows of ids are too long for one argument)."""
    f = out.with_name(out.name + ".inputs.json")
    f.write_text(json.dumps(inp))
    return run_child(__file__, side, {"file": str(f)}, 0, threads, out)


def measure_tokens(args, workloads, threads, sides, work: Path, common_inp: dict) -> dict:
    runs: dict[tuple[str, int, str], list[dict]] = {}
    for name, ckpt, hf, max_new in workloads:
        inp = {**common_inp, "task": "tokens", "ckpt": ckpt, "hf": hf, "max_new": max_new, "temperature": 1.0,
               "ids": [p for p in common_inp["prompt_ids"] for _ in range(args.G)], "rows": len(common_inp["prompt_ids"]) * args.G}
        for r in range(args.repeat):
            for t in threads:
                for side in sides:
                    res = spawn(side, inp, t, work / f"{name}-{side}-t{t}-r{r}")
                    runs.setdefault((name, t, side), []).append(res)
                    print(f"  {name:5s} threads {t} run {r + 1}/{args.repeat} {side:9s} {res['wall']:7.2f} s  "
                          f"{res['tokens'] / res['wall']:8.0f} tok/s  ({res['tokens']} tokens, {res['ended']}/{res['rows']} ended)",
                          file=sys.stderr)
    return runs


def measure_kv(args, ckpt: str, common_inp: dict, work: Path) -> dict:
    G = args.kv_G
    prompts = common_inp["prompt_ids"][: args.prompts]
    inp = {**common_inp, "ckpt": ckpt, "max_new": args.kv_max_new, "temperature": 1.0,
           "ids": [p for p in prompts for _ in range(G)], "seeds": row_seeds(len(prompts), G), "rows": len(prompts) * G}
    new = spawn("new", {**inp, "task": "kv-new"}, args.kv_threads, work / "kv-new")
    today = spawn("today", {**inp, "task": "kv-today", "batches": sorted({*TODAY_BATCHES, inp["rows"]})}, args.kv_threads,
                  work / "kv-today")
    prompt_tokens = sum(len(p) for p in inp["ids"])
    return {"new": new, "today": today, "rows": inp["rows"], "prompt_tokens": prompt_tokens, "G": G,
            "max_new": args.kv_max_new, "prompts": len(prompts)}


EVAL_MODES = {"greedy": [], "pass@k": ["--samples", "8", "--temperature", "0.7", "--pass-k", "1", "--pass-k", "8"]}


def eval_argv(ckpt: str, out: Path, mode: str, limit: int | None) -> list[str]:
    return (["eval", ckpt, "-o", str(out), "-t", f"gsm8k:{EVAL_TASK}", "--max-new-tokens", "64", *EVAL_MODES[mode]]
            + (["--limit", str(limit)] if limit else []) + ["--overwrite", "--quiet", "--json"])


def measure_eval(args, ckpt: str, old: Path, threads: list[int], work: Path) -> dict:
    import pyarrow.parquet as pq

    trees = {"new": (REPO / "src", REPO), "today": (old / "src", old)}
    runs: dict[tuple[str, int, str], list[dict]] = {}
    for r in range(args.eval_repeat):
        for mode in EVAL_MODES:
            limit = args.eval_limit if mode == "greedy" else args.passk_limit
            for t in threads:
                for side, (src, cwd) in trees.items():
                    out = work / f"eval-{mode}-{side}-t{t}-r{r}"
                    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": str(t)}
                    cmd = llmctl_cmd() + eval_argv(ckpt, out, mode, limit)
                    load = os.getloadavg()[0]
                    wall = _timed_in(cmd, env, str(out) + ".log", cwd)
                    res = json.loads((out / "results.json").read_text())
                    task = next(iter(res["tasks"].values())) if isinstance(res.get("tasks"), dict) else res["tasks"][0]
                    rows = sorted(pq.read_table(out / "samples.parquet").to_pylist(), key=lambda x: x["item"])
                    runs.setdefault((mode, t, side), []).append(
                        {"wall": wall, "load": load, "metrics": {k: v["mean"] for k, v in task["metrics"].items()},
                         "n": task["n"], "completions": [x["completion"] for x in rows]})
                    print(f"  eval {mode:6s} threads {t} run {r + 1}/{args.eval_repeat} {side:5s} {wall:6.1f} s", file=sys.stderr)
    return runs


def _timed_in(cmd, env, log, cwd) -> float:
    """common.timed, run from `cwd` (today's tree reads its own stages/)."""
    here = os.getcwd()
    os.chdir(cwd)
    try:
        return timed(cmd, env, log)
    finally:
        os.chdir(here)


# ---------------------------------------------------------------------------------------------
# report


def med(xs) -> float:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


def mib(b) -> str:
    return "n/a" if b is None else f"{b / 2**20:,.1f} MiB"


def tokens_section(runs, workloads, threads, sides, G, n_prompts) -> tuple[str, list[str]]:
    lines, verdicts = [], []
    for name, _ckpt, _hf, max_new in workloads:
        head = ["| threads | side | **tokens/s** (median) | s (median) | run by run, tokens/s | tokens | rows ended by the stop id | mean length | peak RSS MiB |",
                "|---|---|---|---|---|---|---|---|---|"]
        ours = [s for s in sides if s.startswith("new")]
        peers = [s for s in sides if s not in ours]
        ratio = ["| threads | engine | " + " | ".join(f"**÷ {s}**" for s in peers) + " | rows identical to today's (same seeds) |",
                 "|---|---|" + "---|" * len(peers) + "---|"]
        for t in threads:
            tps = {}
            for side in sides:
                rs = runs.get((name, t, side), [])
                if not rs:
                    continue
                per = [r["tokens"] / r["wall"] for r in rs]
                tps[side] = med(per)
                head.append(f"| {t} | {side} | **{tps[side]:,.0f}** | {med(r['wall'] for r in rs):.2f} | {', '.join(f'{x:,.0f}' for x in per)} | "
                            f"{med(r['tokens'] for r in rs):,.0f} | {med(r['ended'] for r in rs):.0f}/{rs[0]['rows']} | "
                            f"{med(statistics.fmean(r['lengths']) for r in rs):.1f} | {med(r['maxrss_mb'] for r in rs):,.0f} |")
            for o in ours:
                if o not in tps:
                    continue
                cells = [f"**{tps[o] / tps[s]:.2f}×**" if s in tps else "n/a" for s in peers]
                mine = runs[(name, t, o)][0]["digests"]
                same = [f"{s}: {sum(a == b for a, b in zip(mine, runs[(name, t, s)][0]['digests']))}/{len(mine)}"
                        for s in peers if s.startswith("today") and (name, t, s) in runs]
                ratio.append(f"| {t} | {o} | " + " | ".join(cells) + f" | {', '.join(same) or 'n/a'} |")
                for s in peers:
                    if s in tps:
                        r = tps[o] / tps[s]
                        verdicts.append(f"{name}, {t} thread{'s' * (t > 1)}: {o} ÷ {s} = {r:.2f}× ({'met' if r >= 3 else 'missed'})")
        lines.append(f"**{name}** — max_new {max_new}, {n_prompts} prompts × G = {G} = {n_prompts * G} rows, temperature 1:\n\n"
                     + "\n".join(head) + "\n\n" + "\n".join(ratio))
    return "\n\n".join(lines), verdicts


def kv_section(kv: dict) -> str:
    new, today = kv["new"], kv["today"]
    bpt = today["bytes_per_token"]
    lengths = new["lengths"]
    all_live = (kv["prompt_tokens"] + sum(lengths)) * bpt  # every row in flight at once, nothing shared
    shared = (kv["prompt_tokens"] // kv["G"] + sum(lengths)) * bpt  # the same, each prompt's KV held once
    peak = new.get("stats", {}).get("peak_kv_bytes")
    storage = new.get("stats", {}).get("kv_allocated_bytes")
    rows = ["| engine | KV memory at its peak | ÷ new (blocks in use) |", "|---|---|---|"]
    rows.append(f"| new: blocks in use (`engine.stats['peak_kv_bytes']`) | **{mib(peak)}** | 1 |")
    if storage is not None:
        rows.append(f"| new: the pool's storage (`kv_allocated_bytes`: grown by doubling) | {mib(storage)} | {storage / peak:.1f}× |")
    for b, a in sorted(today["alloc"].items(), key=lambda kv_: int(kv_[0])):
        label = {16: "eval's and `llmctl generate`'s batch", 64: "rl's gen_batch"}.get(int(b), "all rows in one batch")
        rows.append(f"| today, batch {b} ({label}; {a['batches']} batches) | {mib(a['peak'])} | "
                    f"{a['peak'] / peak:.1f}× |" if peak else f"| today, batch {b} ({label}; {a['batches']} batches) | {mib(a['peak'])} | n/a |")
    stats = ", ".join(f"{k} {v:,}" if isinstance(v, int) else f"{k} {v:.3g}" for k, v in new.get("stats", {}).items()) or "none reported"
    return (f"{kv['prompts']} prompts × G = {kv['G']} = {kv['rows']} rows, max_new {kv['max_new']:,}, temperature 1, the demo model "
            f"({bpt:,} bytes of K and V per token over all layers, fp32); lengths as sampled by the new engine: mean "
            f"{statistics.fmean(lengths):.1f}, max {max(lengths)}, {new['ended']}/{new['rows']} ended by the stop id, "
            f"{new['wall']:.1f} s.\n\n" + "\n".join(rows) + f"\n\nFor scale: every row's prompt and sampled tokens held at once "
            f"would take {mib(all_live)} ({mib(shared)} with each prompt's KV held once for its G rows). The new engine's "
            f"counters: {stats}.")


def eval_section(runs, threads) -> tuple[str, list[str]]:
    rows = ["| mode | threads | side | **process s** (median) | run by run | metrics | today ÷ new |", "|---|---|---|---|---|---|---|"]
    checks = []
    for mode in EVAL_MODES:
        for t in threads:
            walls = {}
            for side in ("new", "today"):
                rs = runs.get((mode, t, side))
                if not rs:
                    continue
                walls[side] = med(r["wall"] for r in rs)
                metrics = ", ".join(f"{k} {v:.3f}" for k, v in rs[0]["metrics"].items())
                ratio = f"**{walls['today'] / walls['new']:.2f}×**" if side == "today" and "new" in walls else ""
                rows.append(f"| {mode} | {t} | {side} | **{walls[side]:.1f}** | {', '.join(f'{w:.1f}' for w in (r['wall'] for r in rs))} | "
                            f"{metrics} (n {rs[0]['n']}) | {ratio} |")
            if mode == "greedy" and runs.get((mode, t, "new")) and runs.get((mode, t, "today")):
                a, b = runs[(mode, t, "new")][0]["completions"], runs[(mode, t, "today")][0]["completions"]
                checks.append(f"greedy completions, new = today, {t} thread{'s' * (t > 1)}: {sum(x == y for x, y in zip(a, b))}/{len(a)}")
    return "\n".join(rows), checks


def versions() -> dict:
    from importlib.metadata import version

    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "llmctl": version("llmctl")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ckpt", help="the demo's SFT checkpoint (default out/demo/sft)")
    ap.add_argument("--tokens", help="the demo's train tokens, for the small model (default: beside --ckpt, ../tokens/train)")
    ap.add_argument("--small", help="a small-preset checkpoint on the demo tokenizer (default: made here, see above)")
    ap.add_argument("--threads", default="1,2", help="torch threads, one configuration each")
    ap.add_argument("--repeat", type=int, default=2, help="child processes per side and thread count, interleaved")
    ap.add_argument("--sides", default="new,today@16,today@64,hf")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("-G", type=int, default=8, help="samples per prompt (rows = prompts × G)")
    ap.add_argument("--max-new", default="64,256", help="max_new of the demo and the small workload")
    ap.add_argument("--parts", default="tokens,kv,eval", help="which measurements (tokens, kv, eval)")
    ap.add_argument("--kv-G", type=int, default=16)
    ap.add_argument("--kv-max-new", type=int, default=1024)
    ap.add_argument("--kv-threads", type=int, default=1)
    ap.add_argument("--eval-limit", type=int, help="greedy eval: the first N problems (default: all 300)")
    ap.add_argument("--passk-limit", type=int, help="pass@k eval: the first N problems (default: all 300)")
    ap.add_argument("--eval-repeat", type=int, default=2)
    ap.add_argument("--old-src", help=f"a tree holding {OLD_COMMIT}'s src/ and stages/ (default: git archive into the work folder)")
    ap.add_argument("--workdir", help="keep every output here (default: a temporary folder)")
    ap.add_argument("--no-write", action="store_true", help="print the section, leave RESULTS.md alone")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--inputs", help=argparse.SUPPRESS)
    ap.add_argument("--steps", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        res = child(args.child, json.loads(Path(json.loads(args.inputs)["file"]).read_text()), int(args.threads))
        print("RESULT " + json.dumps(res))
        return

    parts = {p.strip() for p in args.parts.split(",")}
    threads = [int(t) for t in args.threads.split(",")]
    sides = side_names(args.sides)
    max_new = [int(x) for x in args.max_new.split(",")]
    ckpt = args.ckpt or str(DEMO / "sft")
    tokens = Path(args.tokens) if args.tokens else Path(ckpt).resolve().parent / "tokens" / "train"
    load_before, t_start = os.getloadavg()[0], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-generate-") as tmp_auto:
        work = Path(args.workdir or tmp_auto)
        work.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "src" / "llmctl")], check=True, stdout=subprocess.DEVNULL)
        old_src = work / f"generate-{OLD_COMMIT}.py"
        old_src.write_bytes(subprocess.run(["git", "-C", str(REPO), "show", f"{OLD_COMMIT}:src/llmctl/model/generate.py"],
                                           check=True, capture_output=True).stdout)
        common_inp = prompt_inputs(ckpt, args.prompts, args.G) | {"old_generate": str(old_src)}
        sections, verdicts, checks, made = [], [], [], []
        if "tokens" in parts:
            small, how = ensure_small(args.small, tokens, work)
            made.append(f"small model: {how}")
            from llmctl.artifacts.checkpoint import resolve_checkpoint

            small_sha = hashlib.sha256((resolve_checkpoint(small) / "tokenizer.json").read_bytes()).hexdigest()
            checks.append(f"the small model's tokenizer.json = the SFT model's: {'yes' if small_sha == common_inp['tokenizer_sha'] else '**NO**'}")
            workloads = []
            for name, path, mn in (("demo", ckpt, max_new[0]), ("small", small, max_new[1])):
                hf = work / f"hf-{name}"
                if not (hf / "config.json").exists():
                    run_llmctl(["export", path, "-o", str(hf), "--overwrite", "--quiet"], REPO / "src")
                workloads.append((name, path, str(hf), mn))
            common_inp["seeds"] = row_seeds(args.prompts, args.G)
            runs = measure_tokens(args, workloads, threads, sides, work, common_inp)
            md, v = tokens_section(runs, workloads, threads, sides, args.G, args.prompts)
            verdicts += v
            sections.append("### Tokens/s on the RL workload\n\n" + md)
        if "kv" in parts:
            kv = measure_kv(args, ckpt, common_inp, work)
            sections.append("### Peak KV memory\n\n" + kv_section(kv))
        if "eval" in parts:
            old = old_tree(args.old_src, work)
            eruns = measure_eval(args, ckpt, old, threads, work)
            md, c = eval_section(eruns, threads)
            checks += c
            sections.append(f"### eval, whole process\n\n`llmctl {' '.join(eval_argv('CKPT', Path('OUT'), 'greedy', args.eval_limit)).replace(str(REPO) + '/', '')}` "
                            f"and the same with `{' '.join(EVAL_MODES['pass@k'])}`"
                            + (f" `--limit {args.passk_limit}`" if args.passk_limit else "")
                            + f"; today = d1115e8's tree (`{old}`), its own PYTHONPATH, run from there.\n\n" + md)
    load_after, total_min = os.getloadavg()[0], (time.perf_counter() - t_start) / 60
    v = versions()
    cmd = " ".join(["PYTHONPATH=src .venv/bin/python", "benchmarks/generate.py"] + sys.argv[1:])
    section = (f"## generate\n\n`{cmd}` — {datetime.date.today()}, `nproc` = {len(os.sched_getaffinity(0))} ({cpu_name()}), "
               f"1-min load average {load_before:.2f} before / {load_after:.2f} after, {total_min:.1f} min in all. llmctl "
               f"{v['llmctl']}, torch {v['torch']}, transformers {v['transformers']}. New = this checkout's engine; today = "
               f"{OLD_COMMIT}'s model/generate.py on the same Transformer; hf = transformers `generate` on `llmctl export`. "
               f"SFT model `{ckpt}`" + "".join(f"; {m}" for m in made) + ". Tokens/s: each side in its own child process, "
               f"interleaved, {args.repeat}× per thread count; tokens/s = sampled tokens (stop token included) ÷ the `generate` "
               f"call's wall time (model loaded, after a 2-row warm-up call); ratios of the medians. Goal (issue 33): new ≥ 3× "
               f"today and ≥ 3× transformers. The script's docstring has the details.\n\n"
               + "\n\n".join(sections)
               + ("\n\n" + "\n".join(f"- {x}" for x in verdicts) if verdicts else "")
               + ("\n\nChecks:\n\n" + "\n".join(f"- {x}" for x in checks) if checks else "") + "\n")
    print(section)
    if not args.no_write:
        write_results("generate", section)


if __name__ == "__main__":
    main()
