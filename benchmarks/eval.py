"""eval side by side with lm-evaluation-harness, and the KV-cache generation engine (issue 8).

    make bench-setup && .venv-bench/bin/pip install "lm-eval[hf]==0.4.13"
    .venv-bench/bin/python benchmarks/eval.py [--ckpt DIR] [--mc FILE] [--gsm8k FILE] [--repeat N] [--mc-threads default,1]

The script itself needs only the standard library and pyarrow; llmctl's side runs in .venv, the
harness in .venv-bench, each as a child process of this one.

One run, on CPU, the same checkpoint (exported with `llmctl export` for the harness), the same
task files:

1. agreement: the multiple-choice file through lm-evaluation-harness (HF backend, a local task
   config this script writes: `output_type: multiple_choice`, `target_delimiter: ""`) and through
   `llmctl eval run -t mc:FILE`; per item, the option each side picks with acc and with acc_norm
   (llmctl uses the harness's names: acc = sum of log-probs, acc_norm = per character). Then the first --gen-limit GSM8K problems, greedy, the same
   stop strings and max new tokens, through a `generate_until` task with lm-eval's two gsm8k regex
   filters (strict-match: the number after '#### '; flexible-extract: the last number) and through
   `llmctl eval run -t gsm8k:FILE`: per item, the completion text and both extracted answers.
2. speed on the multiple-choice file: each side in its own child process, interleaved, --repeat
   times, medians, once per --mc-threads setting (each tool's default threads; both pinned to one);
   timed inside the process around the scoring (harness: `HFLM.loglikelihood`; llmctl:
   `Evaluator._multiple_choice`) and outside around the whole process. Then one more llmctl call on
   one thread under torch.profiler, with the token counts of its two scoring passes.
3. generation: `Engine.generate(prompts, greedy, 256 new tokens, no EOS, no stop strings)` with
   the KV cache against `use_cache=False` (the whole sequence recomputed each step), one process,
   interleaved, --repeat times; the two must give the same tokens.
The tables go to stdout and into benchmarks/RESULTS.md (## eval).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import LLMCTL, REPO, cpu_name, write_results  # benchmarks/common.py (stdlib only)

LLMCTL_PY = REPO / ".venv" / "bin" / "python"  # the product's venv: llmctl's side runs here
BENCH_PY = REPO / ".venv-bench" / "bin" / "python"  # the peers' venv: lm-eval runs here
DEMO_RUN = REPO / "out" / "demo" / "run"
DEMO_TOKENS = REPO / "out" / "demo" / "tokens" / "train"
TASKS = REPO / "examples" / "tasks"
FALLBACK_GSM8K = REPO.parent / "shared" / "data" / "gsm8k" / "test.jsonl"

GSM8K_PROMPT = "Question: {question}\nAnswer:"  # llmctl's GSM8K prompt (eval/tasks.py), written out here
STOP = ["\n\nQuestion:", "Question:", "\n\n"]  # llmctl's GSM8K stop strings (eval/tasks.py GSM8K_STOP)
STRICT = r"#### (\-?[0-9\.\,]+)"  # the harness's own gsm8k strict-match pattern (lm_eval/tasks/gsm8k/gsm8k.yaml)
FLEXIBLE = r"(-?[$0-9.,]{2,})|(-?[0-9]+)"  # its flexible-extract pattern, group_select -1 (the last match)


# ---------------------------------------------------------------------------------------------
# inputs


def resolve_checkpoint(arg: str | None, tmp: str) -> tuple[str, str]:
    """A step directory copied into tmp (a demo run being retrained must not change under us),
    and where it came from."""
    if arg:
        src = Path(arg)
    elif (DEMO_RUN / "checkpoints" / "latest").is_file():
        src = DEMO_RUN
    elif DEMO_TOKENS.is_dir():
        run = os.path.join(tmp, "run")
        cmd = [str(LLMCTL), "train", str(DEMO_TOKENS), "-o", run, "--max-steps", "60", "--quiet"]
        print(f"no checkpoint: {' '.join(cmd)}", file=sys.stderr)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        src = Path(run)
    else:
        sys.exit("no checkpoint: pass --ckpt, or run `make demo` first (out/demo/run)")
    step = src
    if (src / "checkpoints" / "latest").is_file():
        src = src / "checkpoints"
    if (src / "latest").is_file():
        step = src / (src / "latest").read_text().strip()
    dst = os.path.join(tmp, "ckpt")
    shutil.copytree(step, dst, ignore=shutil.ignore_patterns("optimizer.pt"))
    return dst, str(step.relative_to(REPO) if step.is_relative_to(REPO) else step)


def task_files(args, tmp: str) -> tuple[str, str, str]:
    """The multiple-choice file, and a file holding the first --gen-limit GSM8K problems (the
    same file goes to both tools); the GSM8K source."""
    mc = args.mc or str(TASKS / "cloze.jsonl")
    src = args.gsm8k or (str(TASKS / "arithmetic.jsonl") if (TASKS / "arithmetic.jsonl").is_file() else str(FALLBACK_GSM8K))
    if not Path(mc).is_file():
        sys.exit(f"{mc} not found: pass --mc FILE ({{context, choices, label}} JSONL)")
    lines = [ln for ln in Path(src).read_text().splitlines() if ln.strip()][: args.gen_limit]
    gsm = os.path.join(tmp, "gsm8k-subset.jsonl")
    Path(gsm).write_text("\n".join(lines) + "\n")
    return os.path.abspath(mc), gsm, src


def harness_tasks(folder: str, mc: str, gsm: str, max_gen_toks: int) -> None:
    """lm-eval task configs (YAML; written as JSON, which YAML reads) for the two files."""
    os.makedirs(folder, exist_ok=True)
    cloze = {
        "task": "bench_mc",
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": mc}},
        "output_type": "multiple_choice",
        "test_split": "test",
        "doc_to_text": "context",  # a column name: the field as is
        "doc_to_choice": "choices",
        "doc_to_target": "label",
        "target_delimiter": "",  # the choices carry their own leading space, as llmctl scores them
        "metric_list": [{"metric": "acc"}, {"metric": "acc_norm"}],
    }
    gsm8k = {
        "task": "bench_gsm8k",
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": gsm}},
        "output_type": "generate_until",
        "test_split": "test",
        "doc_to_text": "Question: {{question}}\nAnswer:",
        "doc_to_target": "{{answer.split('####')[-1].strip()}}",
        "generation_kwargs": {"until": STOP, "do_sample": False, "temperature": 0.0, "max_gen_toks": max_gen_toks},
        "filter_list": [
            {"name": "strict-match", "filter": [{"function": "regex", "regex_pattern": STRICT}, {"function": "take_first"}]},
            {"name": "flexible-extract", "filter": [{"function": "regex", "regex_pattern": FLEXIBLE, "group_select": -1}, {"function": "take_first"}]},
        ],
        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True, "regexes_to_ignore": [",", "\\$", "\\.$"]}],
    }
    for cfg in (cloze, gsm8k):
        Path(folder, cfg["task"] + ".yaml").write_text(json.dumps(cfg, indent=2) + "\n")


def harness_env(tmp: str, threads: int | None) -> dict:
    """Offline, and every Hugging Face cache under tmp (never the user's ~/.cache)."""
    env = dict(os.environ, HF_HOME=os.path.join(tmp, "hf-home"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", HF_HUB_DISABLE_TELEMETRY="1")
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


# ---------------------------------------------------------------------------------------------
# children (each runs as its own process, in its own venv)


def llmctl_child(result: str, argv: list[str]) -> None:
    """`llmctl eval run ARGV` (the CLI's own entry point, in .venv) with timers around model
    loading, the multiple-choice and generative task runs, and each scoring pass."""
    t_start = time.perf_counter()
    import torch

    import llmctl.eval.runner as runner
    from llmctl.cli import main

    times: dict = {"score_passes": []}

    def timer(key, fn, append=False):
        def wrapped(*a, **k):
            t0, c0 = time.perf_counter(), time.process_time()
            out = fn(*a, **k)
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            if append:
                times[key].append(dt)
            else:
                times[key], times[key + "_cpu"] = times.get(key, 0.0) + dt, times.get(key + "_cpu", 0.0) + dc
            return out

        return wrapped

    runner.Evaluator.__init__ = timer("load", runner.Evaluator.__init__)
    runner.Evaluator._multiple_choice = timer("mc", runner.Evaluator._multiple_choice)
    runner.Evaluator._generative = timer("gen", runner.Evaluator._generative)
    runner.score_items = timer("score_passes", runner.score_items, append=True)  # the runner's own name for it
    try:
        main(argv)
    except SystemExit as e:
        if e.code:
            raise
    times["threads"] = torch.get_num_threads()
    times["in_process"] = time.perf_counter() - t_start
    Path(result).write_text(json.dumps(times))


def harness_child(spec_file: str) -> None:
    """lm_eval.simple_evaluate on the local task, HF backend, with timers around the model's
    loglikelihood / generate_until calls; writes its per-item samples as JSON."""
    spec = json.loads(Path(spec_file).read_text())
    import torch

    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    times: dict = {}

    def timer(key, fn):
        def wrapped(self, requests, *a, **k):
            t0, c0 = time.perf_counter(), time.process_time()
            out = fn(self, requests, *a, **k)
            times[key], times[key + "_cpu"], times[key + "_requests"] = time.perf_counter() - t0, time.process_time() - c0, len(requests)
            return out

        return wrapped

    HFLM.loglikelihood = timer("loglikelihood", HFLM.loglikelihood)
    HFLM.generate_until = timer("generate_until", HFLM.generate_until)
    tm = TaskManager(include_path=spec["tasks"], include_defaults=False)
    res = lm_eval.simple_evaluate(
        model="hf",
        model_args=spec["model_args"],
        tasks=[spec["task"]],
        device="cpu",
        batch_size=spec["batch_size"],
        task_manager=tm,
        log_samples=True,
        bootstrap_iters=0,
    )
    t_post = time.perf_counter()
    samples = [
        {"doc_id": s["doc_id"], "filter": s["filter"], "target": s["target"], "arguments": s["arguments"], "resps": s["resps"],
         "filtered_resps": s["filtered_resps"], **{m: s[m] for m in ("acc", "acc_norm", "exact_match") if m in s}}
        for s in res["samples"][spec["task"]]
    ]
    out = {"results": res["results"][spec["task"]], "samples": samples, "times": times, "threads": torch.get_num_threads()}
    Path(spec["result"]).write_text(json.dumps(out, default=str))
    times["post"] = time.perf_counter() - t_post  # writing the samples out: not the tool's time
    Path(spec["result"] + ".post").write_text(str(times["post"]))


def gen_child(spec_file: str) -> None:
    """Engine.generate with and without the KV cache, interleaved, in one process."""
    spec = json.loads(Path(spec_file).read_text())
    import torch
    from tokenizers import Tokenizer

    from llmctl.model.load import load_model
    from llmctl.model.generate import Engine, EngineConfig, SamplingParams

    model, ckpt = load_model(spec["ckpt"], "cpu")
    tok = Tokenizer.from_file(str(ckpt.tokenizer_file))
    encode = lambda s: tok.encode(s, add_special_tokens=False).ids  # noqa: E731
    decode = lambda ids: tok.decode(ids, skip_special_tokens=False)  # noqa: E731
    eos = tok.token_to_id("<|endoftext|>") or 0
    # no stop ids and no stop strings: every row runs to max_new_tokens
    engine = Engine(model, encode, decode, stop_ids=(), pad_id=eos, config=EngineConfig(max_rows=len(spec["prompts"])))
    params = SamplingParams(max_new_tokens=spec["new_tokens"], temperature=0.0, stop=())
    engine.generate(spec["prompts"], SamplingParams(max_new_tokens=4))  # warm-up: allocator, kernels
    engine.generate(spec["prompts"], SamplingParams(max_new_tokens=4), use_cache=False)
    runs, ids = [], {}
    for r in range(spec["repeat"]):
        for cached in (True, False):
            t0, c0 = time.perf_counter(), time.process_time()
            out = engine.generate(spec["prompts"], params, use_cache=cached)
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            runs.append({"cached": cached, "run": r, "seconds": dt, "cpu": dc, "tokens": sum(len(g.ids) for g in out)})
            ids.setdefault(cached, []).append([g.ids for g in out])
            print(f"  generate run {r + 1}/{spec['repeat']}  {'kv-cache' if cached else 'recompute':9s} {dt:7.2f} s  cpu {dc:7.2f} s", file=sys.stderr)
    same = all(a == ids[True][0] for a in ids[True] + ids[False])
    first = ids[True][0]
    out = {
        "runs": runs,
        "same_tokens": same,
        "rows_full_length": all(len(x) == spec["new_tokens"] for x in first),
        "prompt_tokens": [len(encode(p)) for p in spec["prompts"]],
        "threads_outside_generate": torch.get_num_threads(),
        "decode_threads": engine._decode_threads() if hasattr(engine, "_decode_threads") else None,
        "n_params": model.cfg.n_params(),
        "max_seq_len": model.cfg.max_seq_len,
    }
    Path(spec["result"]).write_text(json.dumps(out))


def padded_positions(lengths: list[int]) -> int:
    """Positions the scoring forward passes cover: rows as score._score_items packs them × width."""
    from llmctl.eval.runner import EvalConfig
    from llmctl.eval.score import pack_rows, row_width

    width = row_width(lengths, EvalConfig().batch_tokens)
    return len(pack_rows(lengths, width)) * width


def profile_child(spec_file: str) -> None:
    """Where llmctl's multiple-choice scoring spends its time: token counts of both scoring passes
    (and of the harness's unpacked requests), then one `Evaluator._multiple_choice` under
    torch.profiler on one thread (after a warm-up call), ops grouped by name and input shapes."""
    spec = json.loads(Path(spec_file).read_text())
    import torch
    from torch.profiler import ProfilerActivity, profile

    import llmctl.eval.runner as runner
    from llmctl.eval.score import encode_pair, pack_item
    from llmctl.eval.tasks import load_items, parse_task

    torch.set_num_threads(1)
    ev = runner.Evaluator(spec["ckpt"], runner.EvalConfig(device="cpu"))
    task = parse_task(f"mc:{spec['mc']}")
    items = load_items(task)
    cond = [[encode_pair(ev.encode, c, o, ev.doc_start, ev.vocab.add_bos) for c, o in it.pairs] for it in items]
    pmi = [[encode_pair(ev.encode, runner.PMI_CONTEXT, o, ev.doc_start, ev.vocab.add_bos) for _, o in it.pairs] for it in items]
    counts = {
        "harness_tokens": sum(len(r.tokens) - 1 for reqs in cond for r in reqs),  # it feeds (context + continuation)[:-1]
        "cond_tokens": sum(len(pack_item(reqs).tokens) for reqs in cond),
        "cond_run": padded_positions([len(pack_item(reqs).tokens) for reqs in cond]),
        "pmi_tokens": sum(len(pack_item(reqs).tokens) for reqs in pmi),
        "scored_tokens": sum(len(r.tokens) - r.start for reqs in cond + pmi for r in reqs),
        "vocab": ev.model.cfg.padded_vocab, "d_model": ev.model.cfg.d_model,
    }
    ev._multiple_choice(task, items)  # warm-up
    t0, c0 = time.perf_counter(), time.process_time()
    ev._multiple_choice(task, items)
    counts["plain_s"], counts["plain_cpu"] = time.perf_counter() - t0, time.process_time() - c0
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        ev._multiple_choice(task, items)
    head = [counts["vocab"], counts["d_model"]]
    groups: dict[str, float] = {}
    for e in prof.key_averages(group_by_input_shape=True):
        name = e.key
        if name in ("aten::linear", "aten::addmm", "aten::mm", "aten::matmul"):
            is_head = any(list(s) in (head, head[::-1]) for s in e.input_shapes if s)  # the tied head: (vocab, d) or its transpose
            name = "head matmul (hidden × vocabulary)" if is_head else "layer matmuls (qkv, o, gate_up, down)"
        elif "scaled_dot_product" in name or "attention" in name:
            name = "attention (SDPA with the block mask)"
        elif "log_softmax" in name:
            name = "log_softmax over the vocabulary"
        groups[name] = groups.get(name, 0.0) + e.self_cpu_time_total / 1e6
    counts["ops"] = sorted(groups.items(), key=lambda kv: -kv[1])[:10]
    counts["ops_total"] = sum(groups.values())
    Path(spec["result"]).write_text(json.dumps(counts))


# ---------------------------------------------------------------------------------------------
# timing (whole child processes)

OTHERS: list[float] = []  # share of the machine's cores other processes took during each timed child


def machine_busy_seconds() -> float:
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def timed(cmd: list[str], log: str, env: dict | None = None, cwd: str | None = None) -> tuple[float, float]:
    """Wall and CPU seconds (user + sys, threads included) of a whole child process."""
    with open(log, "w") as f:
        b0, r0, t0 = machine_busy_seconds(), resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd).returncode
        dt, r1, b1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN), machine_busy_seconds()
    if rc != 0:
        sys.exit(f"failed ({rc}): {' '.join(cmd)}\n--- {log}:\n{Path(log).read_text()[-4000:]}")
    cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    OTHERS.append(max(0.0, b1 - b0 - cpu) / dt / len(os.sched_getaffinity(0)))
    return dt, cpu


def run_llmctl(ckpt: str, task: str, out: str, env: dict, tmp: str, extra: list[str] = ()) -> dict:
    result = out + ".json"
    argv = ["eval", "run", ckpt, "-t", task, "-o", out, "--device", "cpu", *extra, "--overwrite", "--quiet"]
    wall, cpu = timed([str(LLMCTL_PY), __file__, "--llmctl-child", result, "--", *argv], out + ".log", env=env, cwd=tmp)
    r = json.loads(Path(result).read_text())
    r.update(wall=wall, cpu=cpu, out=out, argv=argv)
    return r


def run_harness(task: str, hf: str, tasks: str, batch_size: int, out: str, env: dict, tmp: str) -> dict:
    spec = {"task": task, "tasks": tasks, "batch_size": batch_size, "result": out + ".json",
            "model_args": f"pretrained={hf},dtype=float32,max_length=1024"}
    Path(out + ".spec.json").write_text(json.dumps(spec))
    wall, cpu = timed([str(BENCH_PY), __file__, "--harness-child", out + ".spec.json"], out + ".log", env=env, cwd=tmp)
    r = json.loads(Path(out + ".json").read_text())
    post = float(Path(out + ".json.post").read_text())
    r.update(wall=wall - post, cpu=cpu, post=post, model_args=spec["model_args"])
    return r


def llmctl_samples(out: str) -> tuple[list[dict], dict]:
    import pyarrow.parquet as pq

    rows = pq.read_table(os.path.join(out, "samples.parquet")).to_pylist()
    return sorted(rows, key=lambda r: r["item"]), json.loads(Path(out, "results.json").read_text())


# ---------------------------------------------------------------------------------------------
# comparisons


def argmax_first(xs: list[float]) -> int:
    return max(range(len(xs)), key=xs.__getitem__)  # numpy.argmax's tie rule (the first maximum)


MC_METRICS = ("acc", "acc_norm")  # the harness's two, which llmctl reports under the same names


def compare_mc(h: dict, lm_rows: list[dict], lm_res: dict) -> dict:
    """Per item: the option each side picks with acc and with acc_norm."""
    hs = sorted((s for s in h["samples"] if s["filter"] == "none"), key=lambda s: s["doc_id"])
    assert len(hs) == len(lm_rows), (len(hs), len(lm_rows))
    out = {"n": len(hs), **{m: [] for m in MC_METRICS}, "reproduced": 0, "max_dlp": 0.0, "min_margin": {}, "same_strings": 0}
    margins = {m: [] for m in MC_METRICS}
    for s, row in zip(hs, lm_rows):
        lls = [r[0] for r in s["filtered_resps"]]
        choices = [a[1] for a in s["arguments"]]
        norm = [ll / len(c) for ll, c in zip(lls, choices)]  # the harness's acc_norm: ÷ characters of the choice
        values = {"acc": lls, "acc_norm": norm}
        pick = {m: argmax_first(v) for m, v in values.items()}
        out["reproduced"] += all(float(pick[m] == s["target"]) == s[m] for m in MC_METRICS)
        lm_lp = json.loads(row["logprobs"])
        out["max_dlp"] = max(out["max_dlp"], max(abs(a - b) for a, b in zip(lls, lm_lp)))
        for m in MC_METRICS:
            if pick[m] != row[f"pred_{m}"]:
                out[m].append({"item": s["doc_id"], "harness": pick[m], "llmctl": row[f"pred_{m}"], "values": values[m]})
            top = sorted(values[m], reverse=True)
            margins[m].append(top[0] - top[1])
    out["min_margin"] = {k: min(v) for k, v in margins.items()}
    res = h["results"]
    m = lm_res["tasks"][next(iter(lm_res["tasks"]))]["metrics"]
    out["mean"] = {k: (res[f"{k},none"], m[k]["mean"]) for k in MC_METRICS}  # (harness, llmctl)
    return out


def canonical(s: str | None) -> str | None:
    """One spelling per number for the harness side (written here, not llmctl's): '$' and
    thousands commas dropped, a trailing '.' dropped, 3.50 → 3.5, 1,000 → 1000, -0 → 0; a/b as
    the reduced fraction's decimal when it terminates. Anything else is returned stripped."""
    from decimal import Decimal, InvalidOperation
    from fractions import Fraction

    if s is None or s == "[invalid]":
        return None
    t = s.strip().replace("$", "").replace(",", "").rstrip(".")
    try:
        if "/" in t:
            q = Fraction(*(Fraction(x) for x in t.split("/")))
            d = Decimal(q.numerator) / Decimal(q.denominator)
        else:
            d = Decimal(t)
    except (InvalidOperation, ValueError, ZeroDivisionError, TypeError):
        return s.strip()
    text = format(d.normalize(), "f")
    return "0" if text in ("-0", "0") else text


def compare_gen(h: dict, lm_rows: list[dict], lm_res: dict, gsm: str) -> dict:
    """Per item: the prompt, the completion, the extracted answers (harness: its strict-match
    filter's number against llmctl's strict `prediction`, its flexible-extract's against
    `prediction_flexible`) and whether the strict one is right (llmctl's `acc`)."""
    by = {}
    for s in h["samples"]:
        by.setdefault(s["doc_id"], {})[s["filter"]] = s
    docs = [json.loads(ln) for ln in Path(gsm).read_text().splitlines() if ln.strip()]
    out = {"n": len(docs), "same_prompt": 0, "same_completion": 0, "same_answer": 0, "h_correct": 0, "differ": [], "finish": {}}
    for i, (doc, row) in enumerate(zip(docs, lm_rows)):
        f = by[i]
        prompt = f["strict-match"]["arguments"][0][0]
        completion = f["strict-match"]["resps"][0][0]
        strict, flexible = f["strict-match"]["filtered_resps"][0], f["flexible-extract"]["filtered_resps"][0]
        answer = canonical(strict)
        target = canonical(doc["answer"].split("####")[-1])
        out["h_correct"] += answer == target
        out["same_prompt"] += prompt == GSM8K_PROMPT.format(question=doc["question"])
        out["same_completion"] += completion == row["completion"]
        same = answer == row["prediction"] and canonical(flexible) == row["prediction_flexible"]
        out["same_answer"] += same
        out["finish"][row["finish"]] = out["finish"].get(row["finish"], 0) + 1
        if not same or completion != row["completion"]:
            k = next((j for j, (a, b) in enumerate(zip(completion, row["completion"])) if a != b), min(len(completion), len(row["completion"])))
            out["differ"].append({"item": i, "harness": answer, "llmctl": row["prediction"], "at_char": k,
                                  "h_text": completion[max(0, k - 30) : k + 40], "l_text": row["completion"][max(0, k - 30) : k + 40]})
    m = lm_res["tasks"][next(iter(lm_res["tasks"]))]
    out["acc"] = (out["h_correct"] / len(docs), m["metrics"]["acc"]["mean"])
    out["truncated"] = m["reporting"].get("truncated_generations")
    out["harness_em"] = {k: v for k, v in h["results"].items() if k.startswith("exact_match,")}
    return out


# ---------------------------------------------------------------------------------------------
# report


def yes(ok: bool) -> str:
    return "yes" if ok else "**NO**"


def verdict(ok: bool) -> str:
    return "**met**" if ok else "**missed**"


def med(xs):
    return statistics.median(xs)


def versions() -> dict:
    def ask(py, code):
        return subprocess.run([str(py), "-c", code], capture_output=True, text=True).stdout.split()

    code = "from importlib.metadata import version as v; print(*[v(p) for p in ('{}')])"
    prod = ask(LLMCTL_PY, code.format("', '".join(["torch", "transformers", "tokenizers"])))
    peer = ask(BENCH_PY, code.format("', '".join(["lm_eval", "torch", "transformers", "tokenizers", "datasets"])))
    llm = subprocess.run([str(LLMCTL), "--version"], capture_output=True, text=True).stdout.strip()
    return {"llmctl": llm, "prod": prod, "peer": peer}


def byte_compile() -> None:
    """As tokenization.py: compile llmctl once, as `pip install` would (PYTHONDONTWRITEBYTECODE=1
    here, and this checkout is an editable install; the peers' packages ship bytecode)."""
    subprocess.run([str(LLMCTL_PY), "-m", "compileall", "-q", str(REPO / "src" / "llmctl")], check=True, stdout=subprocess.DEVNULL)


def speed_rows(label: str, L: list[dict], H: list[dict], n: int, batch: int) -> tuple[list[str], dict]:
    """Speed table rows of one thread setting, and its medians."""
    m = {
        "lm_in": med([r["mc"] for r in L]), "h_in": med([r["times"]["loglikelihood"] for r in H]),
        "lm_in_cpu": med([r["mc_cpu"] for r in L]), "h_in_cpu": med([r["times"]["loglikelihood_cpu"] for r in H]),
        "lm_w": med([r["wall"] for r in L]), "h_w": med([r["wall"] for r in H]),
        "lm_c": med([r["cpu"] for r in L]), "h_c": med([r["cpu"] for r in H]),
        "pass1": med([r["score_passes"][0] for r in L]), "pass2": med([r["score_passes"][1] if len(r["score_passes"]) > 1 else 0.0 for r in L]),
    }
    th = f"{L[0]['threads']} / {H[0]['threads']}"
    rows = [
        f"| {label} | {th} | scoring | {m['lm_in']:.2f} | {m['h_in']:.2f} | {n / m['lm_in']:.1f} | {n / m['h_in']:.1f} | **{m['h_in'] / m['lm_in']:.2f}×** "
        f"| {m['lm_in_cpu']:.2f} | {m['h_in_cpu']:.2f} | **{m['h_in_cpu'] / m['lm_in_cpu']:.2f}×** | {m['pass1']:.2f} + {m['pass2']:.2f} |",
        f"| {label} | {th} | whole process | {m['lm_w']:.2f} | {m['h_w']:.2f} | {n / m['lm_w']:.1f} | {n / m['h_w']:.1f} | **{m['h_w'] / m['lm_w']:.2f}×** "
        f"| {m['lm_c']:.2f} | {m['h_c']:.2f} | {m['h_c'] / m['lm_c']:.2f}× | |",
    ]
    m["per_run"] = " / ".join(f"{h['times']['loglikelihood'] / lm['mc']:.2f}" for lm, h in zip(L, H))
    m["per_run_cpu"] = " / ".join(f"{h['times']['loglikelihood_cpu'] / lm['mc_cpu']:.2f}" for lm, h in zip(L, H))
    m["per_run_w"] = " / ".join(f"{h['wall'] / lm['wall']:.2f}" for lm, h in zip(L, H))
    return rows, m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ckpt", help="a checkpoint (step dir or run dir); default: out/demo/run's latest")
    ap.add_argument("--mc", help="multiple-choice file {context, choices, label}; default: examples/tasks/cloze.jsonl")
    ap.add_argument("--gsm8k", help="GSM8K-format file; default: examples/tasks/arithmetic.jsonl")
    ap.add_argument("--gen-limit", type=int, default=50, help="first N GSM8K problems (default 50)")
    ap.add_argument("--max-gen-toks", type=int, default=256, help="max new tokens per GSM8K answer, both sides (llmctl's default)")
    ap.add_argument("--batch-size", type=int, default=8, help="lm-eval batch size (fixed)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--gen-batch", type=int, default=4, help="prompts per generate call in the KV-cache measurement")
    ap.add_argument("--gen-tokens", type=int, default=256)
    ap.add_argument("--mc-threads", default="default,1",
                    help="thread settings of the multiple-choice timing, comma-separated: 'default' (each tool's own) or N (OMP_NUM_THREADS=N on both sides)")
    ap.add_argument("--workdir", help="keep every output here (default: a temporary folder)")
    ap.add_argument("--no-write", action="store_true", help="print the section, leave RESULTS.md alone")
    children = {"--llmctl-child": lambda a: llmctl_child(a[0], a[2:]), "--harness-child": lambda a: harness_child(a[0]),
                "--gen-child": lambda a: gen_child(a[0]), "--profile-child": lambda a: profile_child(a[0])}  # --llmctl-child RESULT -- LLMCTL ARGS...
    if len(sys.argv) > 2 and sys.argv[1] in children:
        return children[sys.argv[1]](sys.argv[2:])
    args = ap.parse_args()
    settings = [None if t.strip() == "default" else int(t) for t in args.mc_threads.split(",")]
    if not BENCH_PY.exists() or subprocess.run([str(BENCH_PY), "-c", "import lm_eval"], capture_output=True).returncode:
        sys.exit(f'{BENCH_PY} cannot import lm_eval: .venv-bench/bin/pip install "lm-eval[hf]"')

    load_before = os.getloadavg()[0]
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-eval-") as tmp_auto:
        tmp = os.path.abspath(args.workdir or tmp_auto)
        os.makedirs(tmp, exist_ok=True)
        byte_compile()
        ckpt, ckpt_src = resolve_checkpoint(args.ckpt, tmp)
        step = json.loads(Path(ckpt, "trainer_state.json").read_text()).get("step")
        hf = os.path.join(tmp, "hf")
        shutil.rmtree(hf, ignore_errors=True)
        export_s, _ = timed([str(LLMCTL), "export", ckpt, "-o", hf, "--quiet"], os.path.join(tmp, "export.log"))
        mc, gsm, gsm_src = task_files(args, tmp)
        tasks = os.path.join(tmp, "tasks")
        harness_tasks(tasks, mc, gsm, args.max_gen_toks)
        n_mc = sum(1 for ln in Path(mc).read_text().splitlines() if ln.strip())

        # 1. GSM8K subset, once per side (agreement; also warms the page cache of both venvs). The
        # harness decodes on one thread, as llmctl's engine does for a model this small: with torch's
        # default 2 threads on this shared machine, HF generate took ~0.7 s a step
        print(f"gsm8k: {args.gen_limit} problems, greedy, {args.max_gen_toks} new tokens at most", file=sys.stderr)
        lm_gen = run_llmctl(ckpt, f"gsm8k:{gsm}", os.path.join(tmp, "llmctl-gsm8k"), harness_env(tmp, None), tmp,
                            ["--max-new-tokens", str(args.max_gen_toks)])
        h_gen = run_harness("bench_gsm8k", hf, tasks, args.batch_size, os.path.join(tmp, "harness-gsm8k"), harness_env(tmp, 1), tmp)
        gen_rows, gen_res = llmctl_samples(lm_gen["out"])
        gcmp = compare_gen(h_gen, gen_rows, gen_res, gsm)
        print(f"  llmctl {lm_gen['wall']:.1f} s, harness {h_gen['wall']:.1f} s; same answer {gcmp['same_answer']}/{gcmp['n']}", file=sys.stderr)

        # 2. multiple choice: per thread setting, interleaved, repeated
        runs, others = {}, {}
        for th in settings:
            env, n0 = harness_env(tmp, th), len(OTHERS)
            L, H = runs.setdefault(th, ([], []))
            for r in range(args.repeat):
                tag = f"t{th or 'd'}-r{r}"
                L.append(run_llmctl(ckpt, f"mc:{mc}", os.path.join(tmp, f"llmctl-mc-{tag}"), env, tmp))
                H.append(run_harness("bench_mc", hf, tasks, args.batch_size, os.path.join(tmp, f"harness-mc-{tag}"), env, tmp))
                print(f"  mc threads {th or 'default'} run {r + 1}/{args.repeat}  llmctl scoring {L[-1]['mc']:6.2f} s (process {L[-1]['wall']:6.2f} s)  "
                      f"harness loglikelihood {H[-1]['times']['loglikelihood']:6.2f} s (process {H[-1]['wall']:6.2f} s)", file=sys.stderr)
            others[th] = OTHERS[n0:]
        first_L, first_H = runs[settings[0]]
        mcmp = compare_mc(first_H[-1], *llmctl_samples(first_L[-1]["out"]))
        all_runs = [(lm, h) for L, H in runs.values() for lm, h in zip(L, H)]
        mc_total = sum(len(c["acc"]) + len(c["acc_norm"]) for c in (compare_mc(h, *llmctl_samples(lm["out"])) for lm, h in all_runs))

        # 3. generation: KV cache vs recomputation, one llmctl process
        qs = [json.loads(ln)["question"] for ln in Path(gsm).read_text().splitlines() if ln.strip()][: args.gen_batch]
        gspec = {"ckpt": ckpt, "prompts": [GSM8K_PROMPT.format(question=q) for q in qs], "new_tokens": args.gen_tokens,
                 "repeat": args.repeat, "result": os.path.join(tmp, "generate.json")}
        Path(tmp, "generate.spec.json").write_text(json.dumps(gspec))
        timed([str(LLMCTL_PY), __file__, "--gen-child", os.path.join(tmp, "generate.spec.json")], os.path.join(tmp, "generate.log"), cwd=tmp)
        gres = json.loads(Path(gspec["result"]).read_text())
        print(Path(tmp, "generate.log").read_text(), file=sys.stderr, end="")

        # 4. where llmctl's scoring time goes (one profiled call, one thread)
        pspec = {"ckpt": ckpt, "mc": mc, "result": os.path.join(tmp, "profile.json")}
        Path(tmp, "profile.spec.json").write_text(json.dumps(pspec))
        timed([str(LLMCTL_PY), __file__, "--profile-child", os.path.join(tmp, "profile.spec.json")], os.path.join(tmp, "profile.log"), cwd=tmp)
        pres = json.loads(Path(pspec["result"]).read_text())
    load_after = os.getloadavg()[0]
    total_min = (time.perf_counter() - t_start) / 60
    v = versions()

    # --- agreement table
    def agree_row(label, n, mism, acc):
        return f"| {label} | {n} | {n - len(mism)} | **{len(mism)}** | {acc[1]:.4f} | {acc[0]:.4f} |"

    agree = [
        "| task, decision | items | same on both | mismatches | llmctl acc | harness acc |",
        "|---|---|---|---|---|---|",
        agree_row("multiple choice, `acc` (argmax ln P(o\\|x))", mcmp["n"], mcmp["acc"], mcmp["mean"]["acc"]),
        agree_row("multiple choice, `acc_norm` (argmax ln P(o\\|x) ÷ chars(o))", mcmp["n"], mcmp["acc_norm"], mcmp["mean"]["acc_norm"]),
        f"| GSM8K subset, extracted answer (greedy) | {gcmp['n']} | {gcmp['same_answer']} | **{gcmp['n'] - gcmp['same_answer']}** "
        f"| {gcmp['acc'][1]:.4f} | {gcmp['acc'][0]:.4f} |",
    ]
    checks = [
        ("GSM8K: same completion text (after the cut at the first stop string)", f"{yes(gcmp['same_completion'] == gcmp['n'])} ({gcmp['same_completion']}/{gcmp['n']})"),
        ("GSM8K: harness prompt = llmctl's `Question: {q}\\nAnswer:`", f"{yes(gcmp['same_prompt'] == gcmp['n'])} ({gcmp['same_prompt']}/{gcmp['n']})"),
        ("GSM8K: llmctl finish reasons; truncated (hit max new tokens)", f"{gcmp['finish']}; {gcmp['truncated']}"),
        ("GSM8K: harness's own exact_match per filter", ", ".join(f"{k.split(',')[1]} {val:.4f}" for k, val in gcmp["harness_em"].items())),
        ("multiple choice: max \\|Δ ln P(o\\|x)\\| over all options (llmctl's samples keep 6 decimals)", f"{mcmp['max_dlp']:.2e}"),
        ("multiple choice: smallest gap between the best two options (acc / acc_norm scores)", f"{mcmp['min_margin']['acc']:.2e} / {mcmp['min_margin']['acc_norm']:.2e}"),
        ("multiple choice: harness's own per-item acc / acc_norm reproduced from its log-likelihoods", f"{yes(mcmp['reproduced'] == mcmp['n'])} ({mcmp['reproduced']}/{mcmp['n']})"),
        (f"multiple choice: mismatches summed over all {len(all_runs)} timed run pairs (acc and acc_norm, every thread setting)", str(mc_total)),
    ]
    check_md = "\n".join(["| check | result |", "|---|---|"] + [f"| {k} | {val} |" for k, val in checks])
    differ = [f"item {d['item']}: harness {d['harness']!r} vs llmctl {d['llmctl']!r}; completions part at char {d['at_char']}: "
              f"{d['h_text']!r} / {d['l_text']!r}" for d in gcmp["differ"][:5]]
    differ += [f"mc item {d['item']} ({k}): harness picks {d['harness']}, llmctl {d['llmctl']}; harness scores {[round(x, 5) for x in d['values']]}"
               for k in MC_METRICS for d in mcmp[k][:5]]
    differ_md = ("Disagreements (first few):\n\n```\n" + "\n".join(differ) + "\n```\n") if differ else ""

    # --- speed table, multiple choice
    speed = [
        "| threads | torch threads llmctl / harness | timed | llmctl s | harness s | llmctl items/s | harness items/s | **llmctl / harness** "
        "| llmctl CPU s | harness CPU s | **CPU harness / llmctl** | llmctl passes s (cond + pmi) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    meds, notes = {}, []
    for th in settings:
        label = "default" if th is None else f"OMP_NUM_THREADS={th}"
        rows, meds[th] = speed_rows(label, *runs[th], n_mc, args.batch_size)
        speed += rows
        notes.append(f"{label}: scoring {meds[th]['per_run']} (CPU {meds[th]['per_run_cpu']}), whole process {meds[th]['per_run_w']}; "
                     f"other processes took a median {med(others[th]):.0%} (max {max(others[th]):.0%}) of the cores")
    label_of = {th: "default" if th is None else f"OMP_NUM_THREADS={th}" for th in settings}
    per_setting = ", ".join(f"{label_of[th]} {meds[th]['h_in'] / meds[th]['lm_in']:.2f}× wall / {meds[th]['h_in_cpu'] / meds[th]['lm_in_cpu']:.2f}× CPU"
                            for th in settings)

    # --- generation table
    gr = gres["runs"]
    c_s, u_s = med([x["seconds"] for x in gr if x["cached"]]), med([x["seconds"] for x in gr if not x["cached"]])
    c_c, u_c = med([x["cpu"] for x in gr if x["cached"]]), med([x["cpu"] for x in gr if not x["cached"]])
    ntok = gr[0]["tokens"]
    gen_md = "\n".join([
        "| mode | median s | new tokens | tokens/s | **KV cache / recompute** | CPU s | CPU recompute / KV cache |",
        "|---|---|---|---|---|---|---|",
        f"| KV cache (`use_cache=True`) | {c_s:.2f} | {ntok} | {ntok / c_s:.1f} | **{u_s / c_s:.1f}×** | {c_c:.2f} | {u_c / c_c:.1f}× |",
        f"| recompute (`use_cache=False`) | {u_s:.2f} | {ntok} | {ntok / u_s:.1f} | — | {u_c:.2f} | — |",
    ])
    gen_runs = " / ".join(f"{u['seconds'] / c['seconds']:.1f}" for c, u in zip(gr[0::2], gr[1::2]))

    mc_ok = not mcmp["acc"] and not mcmp["acc_norm"] and mc_total == 0
    gen_ok = gcmp["same_answer"] == gcmp["n"]
    speed_ok = all(meds[th]["h_in"] / meds[th]["lm_in"] >= 2 for th in settings)  # met only where every setting meets it
    kv_ok = u_s / c_s >= 5
    cmd = " ".join([".venv-bench/bin/python", "benchmarks/eval.py"] + sys.argv[1:])
    ops_md = "\n".join(["| op (self time, profiler) | s | share |", "|---|---|---|"]
                        + [f"| {name} | {sec:.3f} | {sec / pres['ops_total']:.0%} |" for name, sec in pres["ops"]])
    p1, p2 = meds[settings[-1]]["pass1"], meds[settings[-1]]["pass2"]
    section = f"""## eval

`{cmd}` — {datetime.date.today()}, `nproc` = {len(os.sched_getaffinity(0))} ({cpu_name()}), CPU, float32,
1-min load average {load_before:.2f} before / {load_after:.2f} after, {total_min:.1f} min in all.
{v['llmctl']} (torch {v['prod'][0]}); peer: lm-eval {v['peer'][0]} (torch {v['peer'][1]}, transformers {v['peer'][2]},
tokenizers {v['peer'][3]}, datasets {v['peer'][4]}), HF backend on the `llmctl export` of the checkpoint
(`LlamaForCausalLM`, export {export_s:.1f} s), `model_args="pretrained=HF_DIR,dtype=float32,max_length=1024"`,
`device="cpu"`, `batch_size={args.batch_size}`, `log_samples=True` (`max_length`: the checkpoint's {gres['max_seq_len']}-token
context would leave the harness no room for {args.max_gen_toks} new tokens and it would cut prompts from the left;
llmctl cuts nothing). Checkpoint: `{ckpt_src}` (step {step}, {gres['n_params']:,} parameters), copied first.
Inputs: `{os.path.relpath(mc, REPO)}` ({n_mc} items, 4 options) and the first {gcmp['n']} problems of
`{os.path.relpath(gsm_src, REPO)}`. Offline: the harness reads the files with its `json` dataset builder,
every Hugging Face cache in the temporary folder. llmctl is byte-compiled first, as tokenization.py does.

**Agreement.** Task configs written by the script: `bench_mc` (`output_type: multiple_choice`,
`doc_to_text: context`, `doc_to_choice: choices`, `doc_to_target: label`, `target_delimiter: ""`: the
choices carry their leading space), metrics acc and acc_norm; `bench_gsm8k` (`generate_until`,
`doc_to_text: "Question: {{{{question}}}}\\nAnswer:"`, `until` = llmctl's stop strings
`{json.dumps(STOP)}` (the harness adds its EOS), `do_sample: false`, `max_gen_toks: {args.max_gen_toks}`, two regex
filters, lm-eval's own gsm8k ones: strict-match `{STRICT}` and flexible-extract `{FLEXIBLE}` (the last match),
each canonicalized by this script). llmctl: `llmctl eval run CKPT
-t mc:FILE` and `-t gsm8k:FILE --max-new-tokens {args.max_gen_toks}` (0 shots, greedy; strict `after_hash` alone,
flexible the flexible-extract pattern), per item from `samples.parquet`: an item agrees when both answers do. The harness's GSM8K run uses one torch thread
(llmctl's engine picks one for a model this small; with 2 on this loaded machine an HF decode step took
~0.7 s). Target: the same decision on every item — multiple choice {verdict(mc_ok)}, GSM8K {verdict(gen_ok)}.

{chr(10).join(agree)}

{check_md}

{differ_md}
**Speed, multiple choice** ({n_mc} items × 4 options): each side in its own child process, {args.repeat} runs
interleaved (llmctl, harness, llmctl, …) per thread setting, medians. Timed inside the process around the
scoring — llmctl `Evaluator._multiple_choice` (tokenize, pack, score, the normalizations),
the harness `HFLM.loglikelihood` ({first_H[0]['times']['loglikelihood_requests']} requests: tokenize, sort, batches of {args.batch_size}, forward,
log-softmax) — and outside around the whole process (`llmctl eval run CKPT -t mc:FILE -o OUT --device cpu`
vs `simple_evaluate(model="hf", …)`: start-up, imports, model and task loading; the harness child's
writing its samples to JSON afterwards left out). llmctl runs its `pmi` pass (every option after
`"Answer:"`) only with `--pmi` or `--norm pmi`, so here the last column's second pass is 0. CPU s = user + sys, threads included (`time.process_time` inside, `getrusage` of the child
outside). `default` lets each tool pick its torch threads (2 here); `OMP_NUM_THREADS=1` pins both to
one: on this shared 2-core machine, 2-thread runs stall whenever another job holds a core, so their wall
times swing by 2-3× from run to run, the 1-thread runs much less. Target: llmctl ≥ 2× the harness's
items/s around the scoring, in every thread setting — {verdict(speed_ok)} ({per_setting}).

{chr(10).join(speed)}

Run by run, harness ÷ llmctl: {"; ".join(notes)}.
GSM8K subset, one run each (agreement, not a target): llmctl `_generative` {lm_gen['gen']:.1f} s (batch 16),
harness `generate_until` {h_gen['times']['generate_until']:.1f} s (batch {args.batch_size}, HF `generate` with its KV cache).

Where llmctl's scoring time goes (one more `_multiple_choice` call on one thread, under torch.profiler
after a warm-up; plain, it took {pres['plain_s']:.2f} s, {pres['plain_cpu']:.2f} s CPU). Token positions run through the model:
the conditional pass {pres['cond_tokens']:,} (each item's shared context once, then its options without their last
token, which predicts nothing scored; items packed several to a row, first-fit, so with padding the forward passes
cover {pres['cond_run']:,} positions), the `pmi` pass
{pres['pmi_tokens']:,}, together {pres['cond_tokens'] + pres['pmi_tokens']:,}, against the harness's {pres['harness_tokens']:,} (context + option,
per option; the `pmi` pass, not run by default, is counted for reference); {pres['scored_tokens']:,} of llmctl's
positions are ones whose log-probabilities are used, and only there do the head and log-softmax run. Median pass times above ({label_of[settings[-1]]}): conditional {p1:.2f} s, `pmi` {p2:.2f} s.

{ops_md}

**Generation** (`llmctl.model.generate.Engine`): {args.gen_batch} GSM8K prompts ({', '.join(map(str, gres['prompt_tokens']))} tokens) in one batch,
greedy, {args.gen_tokens} new tokens each (no stop ids, no stop strings: every row runs to the end), the KV
cache (`generate(..., use_cache=True)`: batched prefill, then one token per row per step) against
`use_cache=False` (each step recomputes each row's whole sequence, row by row), one process, {args.repeat}
interleaved runs after a 4-token warm-up of each, medians, tokens/s = new tokens ÷ wall time of the
`generate` call (prefill included). Target: ≥ 5× — {verdict(kv_ok)}.

{gen_md}

Run by run, recompute ÷ KV cache: {gen_runs}. The same tokens cached and recomputed, every run:
{yes(gres['same_tokens'])}; every row {args.gen_tokens} tokens long: {yes(gres['rows_full_length'])}. Torch threads inside `generate`:
{gres['decode_threads'] or 'default'} (the engine's choice for a model this small). Generation runs past the checkpoint's
{gres['max_seq_len']}-token context (prompt + {args.gen_tokens}); the RoPE tables extend.
"""
    print(section)
    if not args.no_write:
        write_results("eval", section)


if __name__ == "__main__":
    main()
