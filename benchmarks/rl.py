"""`llmctl rl` side by side with TRL's GRPOTrainer, on CPU (DESIGN §7, issue 9 "Measure", issue 33).

    .venv-bench/bin/pip install trl==1.16.0
    .venv-bench/bin/python benchmarks/rl.py [--config bench|arith] [--ckpt RUN] [--steps 5] [--repeat 2] [--prompts-per-step P] [--threads 2,1] [--whole-repeat N]

Two configurations (--config): `bench` (the default, issue 9's: below) and `arith`, the demo preset's own
learning settings (stages/rl/arith.toml: lr 2e-5 after 2 warmup steps, temperature 0.7, top-p 0.95, max 64
new tokens, 8 prompts a step, group std without Bessel's correction, dynamic sampling with up to 3 draws)
— llmctl runs `llmctl rl CKPT --prompts FILE --config arith` and nothing else changed, its dynamic
sampling's extra draws inside its step time; TRL gets the same temperature, top-p, max length, lr and
warmup (`constant_with_warmup`, 2 steps) and has no dynamic sampling. `arith` also runs the whole-run
comparison (--whole-repeat, 0 to skip): llmctl's whole rl stage as the demo runs it (`--eval`, so its
step-0 headroom and held-out evaluations included) against TRL's whole run of as many optimizer steps
(--whole-trl-steps, default the preset's 25), each whole process timed, then each final model (TRL's
through `llmctl import`) and the SFT model scored greedy on the 300 held-out problems as the demo's eval
stage scores them (`llmctl eval -t gsm8k:… --max-new-tokens 64`). Its section is `## rl: arith`.

One run, the same model, prompts and settings, the two sides interleaved (llmctl, TRL, llmctl, TRL);
`bench`:

  llmctl  OMP_NUM_THREADS=T .venv/bin/llmctl rl CKPT --prompts FILE -o OUT --steps N -G 8
          --prompts-per-step P --max-new-tokens 48 --temperature 1 --lr 1e-6 --adv-std group-bessel
          --loss-agg token-mean --kl none --no-dynamic-sampling --truncated mask --format-reward 0.1 ...
          (every setting TRL has a counterpart for is passed as a flag and checked in its config.json;
          AdamW β (0.9, 0.99), micro-batch 32 come from the `arith` stage config)
  TRL     a child process (`rl.py --trl-child`), T torch threads: GRPOTrainer on `llmctl export CKPT`
          (LlamaForCausalLM), GRPOConfig with the same numbers (loss_type="dapo", epsilon 0.2,
          epsilon_high 0.28, beta 0, scale_rewards="group", mask_truncated_completions, constant lr,
          adamw_torch), the prompts rendered as text by llmctl's chat template (the same token ids:
          checked) in llmctl's prompt order (shuffle_dataset=False: the same prompts at every step),
          generation stopped at <|end|>, the head's padding rows suppressed, the reward llmctl's math
          verifier wrapped as a TRL reward function.

Both with T = 2 and T = 1 torch threads (--threads). Per step: wall and CPU seconds (end of a step
to end of the next; the median over the steps after the first of each run), and the phases: llmctl's from its metrics.jsonl (generate_s, score_s,
train_s), TRL's by wrapping GRPOTrainer._generate (tokenize + transformers generate + decode),
_calculate_rewards, and the rest of _generate_and_score_completions; "train" is the rest of the
step (forward, backward, clipping, optimizer, logging). Whole-process wall and CPU of each child
too; then `llmctl rl` once more per thread count in-process with timers around its parts
(`--profile-child`). About 7 minutes on the loaded 2-core machine; runs that would end after
--budget-min (9) are skipped and named. The section goes to benchmarks/RESULTS.md (## rl).
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
from dataclasses import dataclass
from types import SimpleNamespace

from common import LLMCTL, REPO, cpu_name, write_results  # noqa: E402  (benchmarks/common.py)

LLMCTL_PY = REPO / ".venv" / "bin" / "python"
PROMPTS = REPO / "examples" / "tasks" / "arithmetic-train.jsonl"
DEFAULT_CKPT = "/tmp/sft1"

EVAL = REPO / "examples" / "tasks" / "arithmetic.jsonl"  # the 300 held-out problems

# the shared settings (stages/rl/arith.toml where it has them); those that differ by --config are in SETTINGS
G = 8
FORMAT_REWARD = 0.1  # stages/rl/arith.toml's: +0.1 for an answer in the '#### n' form
BETAS = (0.9, 0.99)
EPS = 1e-8
WEIGHT_DECAY = 0.0
GRAD_CLIP = 1.0
CLIP_LOW, CLIP_HIGH = 0.2, 0.28
MICRO_BATCH = 32  # sequences per training forward pass, both sides
THREADS = 2
SEED = 0
LR_NOTE = """The learning rate is tiny on purpose: what a step costs does not depend on it, but what the
rollouts look like does once the policy moves (how many completions end, how long they are, how many are
masked), and that decides how much each side trains. At the demo's rates (1e-4, 2e-4) one update of this
2M-parameter model changes its completions a lot (a trial at 2e-4: llmctl's truncation 62 % → 88 % → 100 %
over steps 1-3, after which every completion is masked and nothing is trained); a tiny rate keeps both
sides sampling from the same model for the whole run, so their steps do comparable work."""


@dataclass(frozen=True)
class Setting:
    """What differs between the two configurations."""

    name: str  # --config
    section: str  # its RESULTS.md section
    max_new: int
    temperature: float
    top_p: float
    lr: float
    warmup: int  # optimizer steps of linear warmup
    adv_std: str  # llmctl's; TRL's scale_rewards="group" divides by the std with Bessel's correction
    dynamic_sampling: bool  # llmctl's (TRL has none)
    per_step: int  # default prompts per step


SETTINGS = {
    "bench": Setting("bench", "rl", max_new=48, temperature=1.0, top_p=1.0, lr=1e-6, warmup=0, adv_std="group-bessel",
                     dynamic_sampling=False, per_step=4),
    # stages/rl/arith.toml's own values: the preset is what llmctl runs; TRL is given these
    "arith": Setting("arith", "rl: arith", max_new=64, temperature=0.7, top_p=0.95, lr=2e-5, warmup=2, adv_std="group",
                     dynamic_sampling=True, per_step=8),
}
ARITH_STEPS = 25  # stages/rl/arith.toml: the demo's whole rl stage
TARGET = 3.0  # issue 33: llmctl's step ≥ 3× faster than TRL's, in both configurations
ARITH_NOTE = """The `arith` preset's rate moves this model: its completions get shorter and end in `#### n` more often
over the steps, and which groups have zero variance (the ones dynamic sampling draws again for) changes with them;
both sides start from the same model and their early steps do comparable work, but each side's later steps
sample from its own updated policy. llmctl's extra draws are counted in its step (its `generate` phase) — the
work its setting asks for; TRL's step has no counterpart."""


# ---------------------------------------------------------------------------------------------
# TRL child (runs in .venv-bench)


def trl_child(hf_dir: str, prompts_file: str, out: str, steps: int, per_step: int, threads: int, record: str,
              config: str = "bench", save: bool = False) -> None:
    """Runs as its own process: what a TRL user writes for this job, plus timers around its phases;
    with `save`, the final model and tokenizer go to OUT/final (the whole-run comparison scores them)."""
    S = SETTINGS[config]
    import torch

    torch.set_num_threads(threads)
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from llmctl.tokenizer.chat import ChatTemplate
    from llmctl.rl.rewards import make_verifier
    from llmctl.tasks import load_prompts

    from llmctl.rl.trainer import RLTrainer

    template = ChatTemplate(Path(hf_dir) / "tokenizer.json")
    prompts = load_prompts(prompts_file)
    rows = [{"prompt": template.render_text([{"role": "user", "content": p["prompt"]}], add_generation_prompt=True),
             "reference": p["reference"]} for p in prompts]
    # llmctl's prompt order (a pure function of seed and position), taken from llmctl itself; TRL reads
    # the rows in order (shuffle_dataset=False), so both sides draw the same prompts at every step
    order = RLTrainer._prompt_indices(SimpleNamespace(prompts=prompts, cfg=SimpleNamespace(seed=SEED)), 0, (steps + 1) * per_step)
    dataset = datasets.Dataset.from_list([rows[i] for i in order])

    tok = AutoTokenizer.from_pretrained(hf_dir)
    tok.eos_token = "<|end|>"  # a chat model's turn ends at <|end|>, as llmctl's engine stops
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    end_id = tok.convert_tokens_to_ids("<|end|>")
    model.generation_config.eos_token_id = end_id
    model.config.eos_token_id = end_id
    real_vocab = json.loads((Path(hf_dir) / "tokenizer.json").read_text())
    n_real = max(real_vocab["model"]["vocab"].values()) + 1
    padded = list(range(n_real, model.config.vocab_size))  # the head's padding rows: llmctl never samples them

    verifier = make_verifier("math", format_reward=FORMAT_REWARD)

    def math_reward(completions, reference, **_):
        return [float(verifier.verify(c, r).reward) for c, r in zip(completions, reference)]

    grad_accum = per_step * G // MICRO_BATCH
    args = GRPOConfig(
        output_dir=out, max_steps=steps, per_device_train_batch_size=MICRO_BATCH, gradient_accumulation_steps=grad_accum,
        num_generations=G, max_completion_length=S.max_new, temperature=S.temperature, top_p=S.top_p, top_k=0,
        generation_kwargs={"suppress_tokens": padded} if padded else None,
        learning_rate=S.lr, lr_scheduler_type="constant_with_warmup" if S.warmup else "constant", warmup_steps=S.warmup,
        adam_beta1=BETAS[0], adam_beta2=BETAS[1],
        adam_epsilon=EPS, weight_decay=WEIGHT_DECAY, max_grad_norm=GRAD_CLIP, optim="adamw_torch",
        beta=0.0, loss_type="dapo", epsilon=CLIP_LOW, epsilon_high=CLIP_HIGH, scale_rewards="group", num_iterations=1,
        mask_truncated_completions=True, shuffle_dataset=False, bf16=False, fp16=False, use_cpu=True, seed=SEED, logging_steps=1,
        report_to="none", save_strategy="no", disable_tqdm=True, dataloader_num_workers=0, log_completions=False,
    )

    phases = {"generate": [0.0, 0.0], "score": [0.0, 0.0], "rollout": [0.0, 0.0]}
    seen_ids: list[list[int]] = []

    def clock():
        return time.perf_counter(), time.process_time()

    def timed(name, fn):
        def wrapper(*a, **kw):
            w0, c0 = clock()
            try:
                return fn(*a, **kw)
            finally:
                w1, c1 = clock()
                phases[name][0] += w1 - w0
                phases[name][1] += c1 - c0
        return wrapper

    trainer = GRPOTrainer(model=model, reward_funcs=[math_reward], args=args, train_dataset=dataset, processing_class=tok)
    trainer._generate = timed("generate", trainer._generate)
    trainer._calculate_rewards = timed("score", trainer._calculate_rewards)
    trainer._generate_and_score_completions = timed("rollout", trainer._generate_and_score_completions)
    tokenize = trainer._tokenize_prompts

    def capture(prompts):
        got = tokenize(prompts)
        seen_ids.extend([list(map(int, ids)) for ids in got[0]])
        return got

    trainer._tokenize_prompts = capture

    rec = open(record, "w")
    last = [clock()]

    class Steps(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            w, c = clock()
            g, s, r = (phases[k] for k in ("generate", "score", "rollout"))
            wall, cpu = w - last[0][0], c - last[0][1]
            row = {"step": state.global_step, "wall": wall, "cpu": cpu, "generate_s": g[0], "score_s": s[0],
                   "rollout_other_s": r[0] - g[0] - s[0], "train_s": wall - r[0], "generate_cpu": g[1],
                   "score_cpu": s[1], "train_cpu": cpu - r[1], "t": w}
            rec.write(json.dumps(row) + "\n")
            rec.flush()
            for v in phases.values():
                v[0] = v[1] = 0.0
            last[0] = clock()

    trainer.add_callback(Steps())
    last[0] = clock()
    trainer.train()
    rec.close()
    if save:  # TRL's weights and config.json; every other file (tokenizer, chat template, EOS ids) the export's own
        final = Path(out, "final")
        trainer.save_model(str(final))
        for f in Path(hf_dir).iterdir():
            if f.is_file() and f.suffix != ".safetensors" and f.name != "config.json":
                shutil.copyfile(f, final / f.name)
    metrics = [h for h in trainer.state.log_history if "loss" in h]
    Path(record + ".extra.json").write_text(json.dumps({"prompt_ids": seen_ids, "log": metrics}))


# ---------------------------------------------------------------------------------------------
# where llmctl's time goes (runs in the product's .venv, `llmctl rl` in-process with timers)

PROFILE_PARTS = [
    # (key, label, top level of a step?)
    ("generate", "Engine.generate (all of rollout sampling)", True),
    ("prefill", "  prefill forwards (`Scheduler._forward` in `_prefill`: a prompt once for its G rows)", False),
    ("decode", "  decode forwards (`Scheduler._forward` in `_decode`: 1 token a running row, paged KV)", False),
    ("sample", "  sampling: softmax + draw + per-row bookkeeping (`Scheduler._sample`)", False),
    ("rows", "    of which per-row bookkeeping (`Scheduler._accept`)", False),
    ("sched", "  the rest: admission, block tables, masks", False),
    ("verify", "verifier (math)", True),
    ("train", "`RLTrainer._train`", True),
    ("old_logps", "  old log-probs: a no-grad forward over the batch", False),
    ("fwd", "  training forward + log-softmax + entropy (`_logps`)", False),
    ("backward", "  backward", False),
    ("clip", "  `clip_grad_norm_`", False),
    ("optim", "  AdamW step", False),
    ("rollouts", "rollouts Parquet (`RolloutWriter.write`)", True),
]


def profile_child(ckpt: str, prompts_file: str, out: str, argv_json: str, result: str) -> None:
    """`llmctl rl` with timers (wall, CPU) around its parts, summed over steps 2..N."""
    import torch

    from llmctl import cli
    from llmctl.model import generate as gen_mod
    from llmctl.model.scheduler import Scheduler
    from llmctl.rl import rewards, rollout, trainer as tr

    acc: dict[str, list[float]] = {k: [0.0, 0.0] for k, *_ in PROFILE_PARTS}
    state = {"in_gen": False, "t0": None, "steps": 0, "step_total": [0.0, 0.0]}

    def clock():
        return time.perf_counter(), time.process_time()

    def add(key, c0):
        w1, p1 = clock()
        acc[key][0] += w1 - c0[0]
        acc[key][1] += p1 - c0[1]

    def wrap(owner, name, key=None, pick=None):
        orig = getattr(owner, name)

        def wrapper(*a, **kw):
            k = pick(*a, **kw) if pick else key
            c0 = clock()
            try:
                return orig(*a, **kw)
            finally:
                if k:
                    add(k, c0)
        setattr(owner, name, wrapper)

    orig_generate = gen_mod.Engine.generate

    def generate(self, *a, **kw):
        state["in_gen"] = True
        c0 = clock()
        try:
            return orig_generate(self, *a, **kw)
        finally:
            state["in_gen"] = False
            add("generate", c0)

    gen_mod.Engine.generate = generate
    def phase(name):
        orig = getattr(Scheduler, name)

        def wrapper(*a, **kw):
            state["phase"] = name.strip("_")
            try:
                return orig(*a, **kw)
            finally:
                state["phase"] = None
        setattr(Scheduler, name, wrapper)

    phase("_prefill")
    phase("_decode")
    wrap(Scheduler, "_forward", pick=lambda *a, **kw: state.get("phase"))
    wrap(Scheduler, "_sample", "sample")
    wrap(Scheduler, "_accept", "rows")
    wrap(rewards.Verifier, "verify", "verify")
    wrap(tr.RLTrainer, "_train", "train")
    wrap(tr.RLTrainer, "_logps", pick=lambda *a, **kw: "fwd" if torch.is_grad_enabled() else "old_logps")
    wrap(torch.Tensor, "backward", "backward")
    wrap(torch.nn.utils, "clip_grad_norm_", "clip")
    wrap(torch.optim.AdamW, "step", "optim")
    orig_write = rollout.RolloutWriter.write

    def write_rollouts(self, groups, step):
        c0 = clock()
        orig_write(self, groups, step)
        add("rollouts", c0)
        now = clock()
        if state["t0"] is None:  # end of the first step: start counting
            for v in acc.values():
                v[0] = v[1] = 0.0
        else:
            state["steps"] += 1
            state["step_total"] = [now[0] - state["t0"][0], now[1] - state["t0"][1]]
        state["t0"] = state["t0"] or now

    rollout.RolloutWriter.write = write_rollouts
    try:
        cli.main(json.loads(argv_json))
    except SystemExit as e:
        if e.code:
            raise
    acc["sched"] = [acc["generate"][i] - acc["prefill"][i] - acc["decode"][i] - acc["sample"][i] for i in (0, 1)]
    Path(result).write_text(json.dumps({"steps": state["steps"], "total": state["step_total"], "parts": acc,
                                        "threads": torch.get_num_threads()}))


# ---------------------------------------------------------------------------------------------
# the runs


def cpu_seconds(r) -> float:
    return r.ru_utime + r.ru_stime


def machine_busy_seconds() -> float:
    """CPU seconds all cores have spent busy since boot (every process on the machine)."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def run_child(cmd: list[str], log: str, env: dict, watch: str | None = None) -> dict:
    """A whole child process: wall, CPU (its threads; rusage of the waited-for child), the share of
    the machine other processes used meanwhile; with `watch` (llmctl's metrics.jsonl), the wall
    time and the child's CPU (/proc/PID/stat) at the moment each new line appears."""
    marks = []
    with open(log, "w") as f:
        load = os.getloadavg()[0]
        b0, r0, t0 = machine_busy_seconds(), resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
        lines = 0
        while p.poll() is None:
            if watch and os.path.exists(watch):
                n = Path(watch).read_bytes().count(b"\n")
                if n > lines:
                    marks += [(time.perf_counter() - t0, proc_cpu(p.pid))] * (n - lines)
                    lines = n
            time.sleep(0.02)
        dt, r1, b1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN), machine_busy_seconds()
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n--- {log}:\n{Path(log).read_text()[-4000:]}")
    cpu = cpu_seconds(r1) - cpu_seconds(r0)
    others = max(0.0, b1 - b0 - cpu) / dt / len(os.sched_getaffinity(0))
    return {"wall": dt, "cpu": cpu, "others": others, "load": load, "marks": marks}


def child_env(threads: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def llmctl_argv(S: Setting, ckpt: str, out: str, steps: int, per_step: int, held_out: bool = False) -> list[str]:
    """Our side's flags. bench: the `arith` stage config (β2 0.99, clip 0.2/0.28, token-mean, no KL,
    masked truncation, micro-batch 32) with what TRL has no counterpart for switched off and bench's
    own rate and sampling. arith: the preset as it is (`held_out`: with the demo's --eval, as its rl
    stage runs)."""
    if S.name == "arith":
        return (["rl", ckpt, "--prompts", str(PROMPTS)] + (["--eval", str(EVAL)] if held_out else []) +
                ["-o", out, "--config", "arith", "--steps", str(steps), "--prompts-per-step", str(per_step), "--seed", str(SEED),
                 "--device", "cpu", "--overwrite", "--quiet", "--json"])
    return ["rl", ckpt, "--prompts", str(PROMPTS), "-o", out, "--config", "arith", "--steps", str(steps), "-G", str(G),
            "--prompts-per-step", str(per_step), "--max-new-tokens", str(S.max_new), "--temperature", str(S.temperature),
            "--top-p", "1.0", "--format-reward", str(FORMAT_REWARD), "--lr", str(S.lr), "--warmup-steps", str(S.warmup), "--adv-std", S.adv_std, "--clip-low", str(CLIP_LOW),
            "--clip-high", str(CLIP_HIGH), "--loss-agg", "token-mean", "--kl", "none", "--epochs", "1",
            "--no-dynamic-sampling", "--truncated", "mask", "--verifier", "math", "--seed", str(SEED), "--device", "cpu",
            "--overwrite", "--quiet", "--json"]


def run_llmctl(S: Setting, ckpt: str, out: str, steps: int, per_step: int, threads: int, held_out: bool = False) -> dict:
    res = run_child([str(LLMCTL)] + llmctl_argv(S, ckpt, out, steps, per_step, held_out), out + ".log", child_env(threads),
                    watch=os.path.join(out, "metrics.jsonl"))
    recs = [json.loads(l) for l in Path(out, "metrics.jsonl").read_text().splitlines() if l.strip()]
    marks = res["marks"]
    if recs and recs[0]["step"] == 0:  # --eval: the step-0 evaluation and headroom, before the first step
        res["step0"] = {"wall": marks[0][0] if marks else float("nan"), **{k: v for k, v in recs[0].items() if k != "step"}}
        recs, marks = recs[1:], marks[1:]
    rows = []
    for k, m in enumerate(recs):
        row = {"step": m["step"], "generate_s": m["generate_s"], "score_s": m["score_s"], "train_s": m["train_s"],
               "rollout_other_s": 0.0, "len": m["response_length"], "trunc": m["truncation_rate"],
               "trained": m.get("trained_samples", 0), "reward": m["reward_mean"], "draws": m.get("groups_drawn", per_step) / per_step,
               "eval": m.get("eval")}
        if k > 0 and len(marks) == len(recs):
            row["wall"] = marks[k][0] - marks[k - 1][0]
            c0, c1 = marks[k - 1][1], marks[k][1]
            row["cpu"] = c1 - c0 if c0 is not None and c1 is not None else float("nan")
            row["other_s"] = row["wall"] - row["generate_s"] - row["score_s"] - row["train_s"]
        rows.append(row)
    res["steps"] = rows
    res["first_step_end"] = marks[0][0] if marks else float("nan")
    res["config"] = json.loads(Path(out, "config.json").read_text())["rl"]
    import pyarrow.parquet as pq

    res["prompt_order"] = [list(dict.fromkeys(pq.read_table(f, columns=["prompt_index"]).column("prompt_index").to_pylist()))
                           for f in sorted(Path(out, "rollouts").glob("step-*.parquet"))]
    return res


def run_trl(S: Setting, hf: str, out: str, steps: int, per_step: int, threads: int, tmp: str, save: bool = False) -> dict:
    record = out + ".steps.jsonl"
    env = child_env(threads)
    env.update(HF_HOME=os.path.join(tmp, "hf-home"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    cmd = [sys.executable, __file__, "--trl-child", hf, str(PROMPTS), out, str(steps), str(per_step), str(threads), record,
           S.name, str(int(save))]
    t0 = time.perf_counter()
    res = run_child(cmd, out + ".log", env)
    recs = [json.loads(l) for l in Path(record).read_text().splitlines() if l.strip()]
    extra = json.loads(Path(record + ".extra.json").read_text())
    rows = []
    for k, m in enumerate(recs):
        h = extra["log"][k] if k < len(extra["log"]) else {}
        row = {key: m[key] for key in ("step", "generate_s", "score_s", "rollout_other_s", "train_s")}
        row.update(len=h.get("completions/mean_length"), trunc=h.get("completions/clipped_ratio"),
                   trained=per_step * G, reward=h.get("reward"), draws=1.0)
        if k > 0:
            row.update(wall=m["wall"], cpu=m["cpu"], other_s=0.0)
        rows.append(row)
    res["steps"] = rows
    res["prompt_ids"] = extra["prompt_ids"]
    res["first_step_end"] = recs[0]["t"] - t0 if recs else float("nan")  # both clocks are perf_counter (CLOCK_MONOTONIC)
    return res


def run_profile(S: Setting, ckpt: str, out: str, steps: int, per_step: int, threads: int) -> dict:
    result = out + ".profile.json"
    cmd = [str(LLMCTL_PY), __file__, "--profile-child", ckpt, str(PROMPTS), out, json.dumps(llmctl_argv(S, ckpt, out, steps, per_step)), result]
    run_child(cmd, out + ".log", child_env(threads))
    return json.loads(Path(result).read_text())


# ---------------------------------------------------------------------------------------------
# the same model, the same prompt ids


def prompt_checks(ckpt: str, hf: str) -> dict:
    """Our chat template's prompt ids for every prompt, and what TRL's tokenizer call
    (`processing_class(text=prompts)`) makes of the same prompts rendered as text."""
    from transformers import AutoTokenizer

    from llmctl.artifacts import checkpoint as ckpt_io
    from llmctl.tokenizer.chat import ChatTemplate
    from llmctl.tasks import load_prompts

    tok_file = ckpt_io.resolve_checkpoint(ckpt) / "tokenizer.json"
    ours = ChatTemplate(tok_file)
    texts = ChatTemplate(Path(hf) / "tokenizer.json")
    prompts = load_prompts(PROMPTS)
    msgs = [[{"role": "user", "content": p["prompt"]}] for p in prompts]
    ids = [ours.prompt_ids(m) for m in msgs]
    rendered = [texts.render_text(m, add_generation_prompt=True) for m in msgs]
    hf_ids = AutoTokenizer.from_pretrained(hf)(text=rendered)["input_ids"]
    same = sum(a == list(b) for a, b in zip(ids, hf_ids))
    return {"ids": ids, "same": same, "n": len(ids), "example": rendered[0], "example_ids": ids[0],
            "tokenizer_files_equal": Path(tok_file).read_bytes() == (Path(hf) / "tokenizer.json").read_bytes()}


def model_check(ckpt: str, hf: str, prompt_ids: list[list[int]]) -> dict:
    """Logits of llmctl's model and of the exported LlamaForCausalLM on the same prompts."""
    import torch
    from transformers import AutoModelForCausalLM

    from llmctl.model.load import load_model

    torch.set_num_threads(1)
    ours, _ = load_model(ckpt, torch.device("cpu"))
    theirs = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32)
    diff, n = 0.0, 0
    with torch.no_grad():
        for ids in prompt_ids[:16]:
            x = torch.tensor([ids])
            a, b = ours.eval()(x).float(), theirs.eval()(input_ids=x).logits.float()
            cols = min(a.shape[-1], b.shape[-1])  # our head's padding rows; an export may keep them or not
            diff = max(diff, float((a[..., :cols] - b[..., :cols]).abs().max()))
            n += 1
    return {"max_abs_logit_diff": diff, "prompts": n, "vocab_ours": ours.cfg.vocab_size,
            "head_rows": int(theirs.config.vocab_size)}


def same_prompt_order(runs, threads, ids, per_step) -> str:
    """Steps at which TRL generated from exactly llmctl's prompts at the same positions of its prompt
    order (ids, in order, G copies each). Without dynamic sampling, position = step × P: the same
    prompts at every step; with it, llmctl's extra draws move its later steps further along the order."""
    order = next((res["prompt_order"] for t in threads for res in runs.get(("llmctl", t), [])), None)
    if order is None:
        return "n/a"
    flat = [i for step in order for i in step]  # llmctl's prompts by position (every draw of every step)
    ok = total = 0
    for t in threads:
        for res in runs.get(("TRL", t), []):
            got = res["prompt_ids"]
            for s in range(len(order)):
                chunk = got[s * per_step * G : (s + 1) * per_step * G]
                idx = flat[s * per_step : (s + 1) * per_step]
                if not chunk or len(idx) < per_step:
                    continue
                total += 1
                ok += chunk == [ids[i] for i in idx for _ in range(G)]
    return f"{'yes' if ok == total and total else '**NO**'} ({ok}/{total} TRL steps)"


def config_check(S: Setting, runs, threads) -> str:
    """llmctl's resolved config (its config.json) against the settings given to TRL."""
    want = {"group_size": G, "max_new_tokens": S.max_new, "temperature": S.temperature, "top_p": S.top_p, "lr": S.lr,
            "warmup_steps": S.warmup, "weight_decay": WEIGHT_DECAY,
            "beta1": BETAS[0], "beta2": BETAS[1], "grad_clip": GRAD_CLIP, "clip_low": CLIP_LOW, "clip_high": CLIP_HIGH,
            "loss_agg": "token-mean", "adv_std": S.adv_std, "kl": "none", "epochs": 1, "truncated": "mask",
            "format_reward": FORMAT_REWARD, "micro_batch": MICRO_BATCH, "dynamic_sampling": S.dynamic_sampling}
    cfg = next((res["config"] for t in threads for res in runs.get(("llmctl", t), [])), None)
    if cfg is None:
        return "n/a"
    bad = [f"{k}={cfg.get(k)!r} (TRL: {v!r})" for k, v in want.items() if cfg.get(k) != v]
    return "**NO**: " + ", ".join(bad) if bad else f"yes ({len(want)} settings)"


# ---------------------------------------------------------------------------------------------
# report


def med(values) -> float:
    v = [x for x in values if x is not None and x == x]
    return statistics.median(v) if v else float("nan")


def versions() -> dict:
    from importlib.metadata import version

    llm = subprocess.run([str(LLMCTL), "--version"], capture_output=True, text=True).stdout.strip()
    product = subprocess.run([str(LLMCTL_PY), "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True).stdout.strip()
    return {"llmctl": llm or version("llmctl"), "llmctl_torch": product, **{k: version(k) for k in ("trl", "transformers", "torch", "accelerate", "datasets")}}


def ensure_ckpt(path: str | None) -> str:
    if path:
        return path
    if Path(DEFAULT_CKPT).is_dir():
        return DEFAULT_CKPT
    fallback = "/tmp/sft-bench"
    if not Path(fallback, "checkpoints").is_dir():
        init = REPO / "out" / "demo" / "run"
        if not init.is_dir():
            sys.exit(f"no SFT checkpoint: {DEFAULT_CKPT} is missing and so is {init} (run `make demo` first, or pass --ckpt)")
        cmd = [str(LLMCTL), "train", "--sft", str(PROMPTS), "--init", str(init), "-o", fallback, "--config", "sft-tiny", "--max-steps", "20", "--overwrite", "--quiet"]
        print(f"building the SFT checkpoint: {' '.join(cmd)}", file=sys.stderr)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return fallback


def reading_notes(stats, profiles, others: float) -> str:
    """What the thread counts do to each phase, and where llmctl's margin comes from (numbers of this run)."""
    notes = []
    a2, b2, a1, b1 = (stats.get((side, t)) for t in (2, 1) for side in ("llmctl", "TRL"))
    if a2 and b2 and a1 and b1:
        notes.append(
            f"**Threads.** With 2 torch threads TRL's generation takes {b2['generate_s']:.2f} s a step against {b1['generate_s']:.2f} s "
            f"with 1: transformers' decode loop runs hundreds of tiny ops per token on 2 OpenMP threads, and on a shared "
            f"machine (here other processes held {others:.0%} of the cores, median over the runs) a descheduled thread stalls every op. "
            f"llmctl's engine runs a forward on one thread when the model and the forward are this small (`Engine.threads_for`, "
            f"model/generate.py): its generation takes {a2['generate_s']:.2f} s vs {a1['generate_s']:.2f} s; its training phase uses "
            f"both threads: {a2['train_s']:.2f} s vs {a1['train_s']:.2f} s (TRL's: {b2['train_s']:.2f} s vs {b1['train_s']:.2f} s). "
            f"On a loaded machine the 2-thread ratio measures the load as much as the code; the 1-thread rows are the "
            f"like-for-like comparison.")
        gen = b1["generate_s"] / a1["generate_s"]
        parity = "at parity" if 0.8 <= gen <= 1.25 else ("faster in llmctl" if gen > 1 else "slower in llmctl")
        notes.append(
            f"**Where the 1-thread margin comes from.** Generation is {parity} ({gen:.2f}×; TRL's `model.generate` prefills "
            f"each of a prompt's {G} copies and computes every row until the longest ends; llmctl's engine prefills a prompt "
            f"once for its {G} samples and decodes only the rows still running (continuous batching over a paged KV pool); "
            f"TRL samples with `torch.multinomial`, llmctl by inverse CDF from one counter-based random stream per sample, "
            f"which rl needs so a sample does not depend on its rank or batch). "
            f"The train phase: {b1['train_s'] / a1['train_s']:.2f}×. llmctl drops the masked "
            f"(truncated) completions from the batch — {a1['trained']:.0f} of {b1['trained']:.0f} sequences trained at the median — "
            f"while TRL forwards and backpropagates all of them with a zero mask; per sequence forwarded llmctl is "
            f"{1000 * a1['train_s'] / a1['trained']:.0f} ms vs TRL's {1000 * b1['train_s'] / b1['trained']:.0f} ms (at μ = 1 neither "
            f"runs a separate forward for the old log-probs). So the ratio moves with the truncation rate: "
            f"with fewer truncated completions it falls toward the per-sequence ratio.")
    if profiles.get(1):
        pr = profiles[1]
        n = max(1, pr["steps"])
        part = {k: pr["parts"][k][0] / n for k, *_ in PROFILE_PARTS}
        total = pr["total"][0] / n
        notes.append(
            f"**llmctl's step at 1 thread** (profile below, {total:.2f} s): generate {part['generate']:.2f} s "
            f"({part['generate'] / total:.0%}; prefill {part['prefill']:.2f}, decode forwards {part['decode']:.2f}, sampling "
            f"{part['sample']:.2f}), train {part['train']:.2f} s ({part['train'] / total:.0%}; old log-probs {part['old_logps']:.2f}, "
            f"forward {part['fwd']:.2f}, backward {part['backward']:.2f}, AdamW {part['optim']:.3f}).")
    return "\n\n".join(notes)


def reward_mean(runs, side, t) -> str:
    rewards = [s["reward"] for res in runs.get((side, t), []) for s in res["steps"] if s.get("reward") is not None]
    return f"{statistics.fmean(rewards):.3f}" if rewards else "n/a"


def fmt(x: float, d: int = 2) -> str:
    return "n/a" if x is None or x != x else f"{round(x, d) + 0.0:.{d}f}"


def report(S: Setting, args, runs, profiles, pc, mc, trl_ids_ok, n_trl_ids, threads, skipped, load_before, load_after, total_min,
           ckpt, whole_md: str = "") -> str:
    v = versions()
    keys = ("wall", "cpu", "generate_s", "score_s", "rollout_other_s", "train_s", "other_s", "len", "trunc", "trained", "reward", "draws")
    stats = {}
    for key, rs in runs.items():
        steps = [s for res in rs for s in res["steps"] if "wall" in s]
        stats[key] = {k: med(s.get(k) for s in steps) for k in keys} | {"n": len(steps), "runs": len(rs)}

    rows = ["| threads | side | **s / step** | CPU s / step | generate | score | rollout, rest | train | rest of step | completion tokens (mean) | truncated | sequences trained | draws of P prompts | steps counted |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    verdicts, ratio_rows = [], []
    for t in threads:
        for side in ("llmctl", "TRL"):
            st = stats.get((side, t))
            if not st:
                continue
            rows.append(f"| {t} | {side} | **{fmt(st['wall'])}** | {fmt(st['cpu'])} | {fmt(st['generate_s'])} | {fmt(st['score_s'], 3)} | "
                        f"{fmt(st['rollout_other_s'], 3)} | {fmt(st['train_s'])} | {fmt(st['other_s'], 3)} | {fmt(st['len'], 1)} | "
                        f"{fmt(100 * st['trunc'], 0)} % | {fmt(st['trained'], 0)} | {fmt(st['draws'], 1)} | {st['n']} ({st['runs']} runs) |")
        a, b = stats.get(("llmctl", t)), stats.get(("TRL", t))
        if a and b:
            wall, cpu = b["wall"] / a["wall"], b["cpu"] / a["cpu"]
            pairs = [med(s["wall"] for s in y["steps"] if "wall" in s) / med(s["wall"] for s in x["steps"] if "wall" in s)
                     for x, y in zip(runs[("llmctl", t)], runs[("TRL", t)])]
            ratio_rows.append(f"| {t} | **{wall:.2f}×** | {cpu:.2f}× | {', '.join(f'{p:.2f}×' for p in pairs)} | "
                              f"{fmt(b['generate_s'] / a['generate_s'])}× | {fmt(b['train_s'] / a['train_s'])}× | "
                              f"{fmt(1000 * a['train_s'] / a['trained'], 0)} / {fmt(1000 * b['train_s'] / b['trained'], 0)} |")
            verdicts.append(f"threads {t}: TRL ÷ llmctl = {wall:.2f}× per step (wall), {cpu:.2f}× (CPU) → "
                            f"{'**met**' if wall >= TARGET else '**missed**'}" + ("" if (wall >= TARGET) == (cpu >= TARGET) else f" on wall time; {'met' if cpu >= TARGET else 'missed'} on CPU time"))
    step_md = "\n".join(rows)
    reading = reading_notes(stats, profiles, med(r["others"] for rs in runs.values() for r in rs)) if S.name == "bench" else ""
    ratio_md = "\n".join(["| threads | **TRL ÷ llmctl, s / step** | CPU s / step | run by run (wall) | generate | train | train ms per sequence forwarded: llmctl / TRL |", "|---|---|---|---|---|---|---|"] + ratio_rows)

    prow = ["| side | threads | process wall s (median) | CPU s | first step ends at s | other processes' share of the cores | 1-min load at start |", "|---|---|---|---|---|---|---|"]
    for (side, t), rs in sorted(runs.items(), key=lambda kv: (-kv[0][1], kv[0][0])):
        loads = ", ".join(f"{r['load']:.1f}" for r in rs)
        prow.append(f"| {side} | {t} | {med(r['wall'] for r in rs):.1f} | {med(r['cpu'] for r in rs):.1f} | {med(r['first_step_end'] for r in rs):.1f} | "
                    f"{med(r['others'] for r in rs):.0%} | {loads} |")
    proc_md = "\n".join(prow)

    prof_md = ""
    if profiles:
        head = "| part of an llmctl step | " + " | ".join(f"threads {t}: wall s / step | CPU s / step" for t in profiles) + " |"
        prow = [head, "|---|" + "---|---|" * len(profiles)]
        for key, label, _top in PROFILE_PARTS:
            cells = []
            for t, pr in profiles.items():
                n = max(1, pr["steps"])
                cells.append(f"{pr['parts'][key][0] / n:.3f} | {pr['parts'][key][1] / n:.3f}")
            prow.append(f"| {label} | " + " | ".join(cells) + " |")
        cells = []
        for t, pr in profiles.items():
            n = max(1, pr["steps"])
            top = [sum(pr["parts"][k][i] for k, _, top in PROFILE_PARTS if top) for i in (0, 1)]
            cells.append(f"{(pr['total'][0] - top[0]) / n:.3f} | {(pr['total'][1] - top[1]) / n:.3f}")
        prow.append("| rest (prompt order, advantages, metrics) | " + " | ".join(cells) + " |")
        prow.append("| **whole step** | " + " | ".join(f"**{pr['total'][0] / max(1, pr['steps']):.3f}** | {pr['total'][1] / max(1, pr['steps']):.3f}" for pr in profiles.values()) + " |")
        prof_md = "\n".join(prow)

    checks = [
        ("prompt ids: llmctl's chat template vs TRL's tokenizer call on the rendered text, all prompts", f"{'yes' if pc['same'] == pc['n'] else '**NO**'} ({pc['same']}/{pc['n']})"),
        ("prompt ids TRL actually generated from (captured in `_tokenize_prompts`) ∈ llmctl's", f"{'yes' if trl_ids_ok else '**NO**'} ({n_trl_ids} prompts)"),
        ("TRL's prompts at each step = llmctl's at the same positions of its prompt order (TRL's rows in that order, "
         "`shuffle_dataset=False`; without dynamic sampling: the same prompts at every step)", pc["same_order"]),
        ("llmctl's resolved config (its config.json) = the settings given to TRL" + (" (TRL's group std has Bessel's correction, the preset's has none)" if S.adv_std == "group" else ""), pc["config"]),
        ("same tokenizer.json (checkpoint vs export)", "yes" if pc["tokenizer_files_equal"] else "**NO**"),
        (f"max abs logit difference, llmctl model vs exported LlamaForCausalLM ({mc['prompts']} prompts, fp32)", f"{mc['max_abs_logit_diff']:.1e}"),
        ("vocabulary / head rows (the padding rows: llmctl never samples them; TRL gets `suppress_tokens` for them)", f"{mc['vocab_ours']} / {mc['head_rows']}"),
        ("example prompt (rendered for TRL)", "`" + pc["example"].replace("|", "\\|")[:120] + "…`"),
        ("reward mean over all sampled completions, by thread count: llmctl / TRL (same model, same sampling: should be close)",
         " / ".join(", ".join(reward_mean(runs, side, t) for t in threads if runs.get((side, t))) for side in ("llmctl", "TRL"))),
    ]
    check_md = "\n".join(["| check | result |", "|---|---|"] + [f"| {k} | {v} |" for k, v in checks])
    cmd = " ".join([".venv-bench/bin/python", "benchmarks/rl.py"] + sys.argv[1:])
    P = args.prompts_per_step
    skipped_md = f" Skipped for the time budget: {', '.join(skipped)}." if skipped else ""
    if S.name == "bench":
        settings_md = f"""G = {G}, {P} prompts per step ({P * G} completions), max {S.max_new} new tokens, temperature
{S.temperature}, top-p 1, no top-k, generation stops at `<|end|>`; AdamW lr {S.lr} constant (llmctl `--warmup-steps 0`), β = {BETAS}, ε = {EPS}, no
weight decay, grad-norm clip {GRAD_CLIP}; one optimizer step per step over micro-batches of {MICRO_BATCH}; μ = 1; clip
ε = {CLIP_LOW} / {CLIP_HIGH}; token-mean loss (TRL `loss_type="dapo"`); no KL (TRL `beta=0.0`); advantages
(r − group mean) ÷ group std with Bessel's correction (TRL `scale_rewards="group"`; llmctl `--adv-std group-bessel`);
truncated completions out of the loss (TRL `mask_truncated_completions=True`; llmctl `--truncated mask`); reward
1/0 from llmctl's math verifier (`make_verifier("math")`, a TRL reward function around it for TRL); fp32 (no
bf16); llmctl's dynamic sampling off (TRL has none)."""
        note = LR_NOTE
    else:
        settings_md = f"""llmctl runs the `arith` preset as it is (stages/rl/arith.toml): G = {G}, {P} prompts per
step ({P * G} completions), max {S.max_new} new tokens, temperature {S.temperature}, top-p {S.top_p}, AdamW lr {S.lr} after
{S.warmup} linear warmup steps, β = {BETAS}, ε = {EPS}, no weight decay, clip {GRAD_CLIP}, micro-batches of {MICRO_BATCH},
clip ε = {CLIP_LOW} / {CLIP_HIGH}, token-mean loss, no KL, advantages ÷ the group std (no Bessel correction), masked
truncation, the math verifier with a {FORMAT_REWARD} format reward, and **dynamic sampling** (a group whose rewards are
all equal is dropped and a further draw of {P} prompts made, up to 3 draws a step; "draws" below). TRL gets the same
numbers where it has them (temperature, `top_p`, `max_completion_length`, `learning_rate` with
`lr_scheduler_type="constant_with_warmup"`, `warmup_steps={S.warmup}`, the rest as in `## rl`); it has no dynamic
sampling, so its step generates {P} groups once."""
        note = ARITH_NOTE
    goal = f"Target (issue 33): llmctl ≥ {TARGET:g}× faster per step than TRL (issue 9's was 2×)."
    return f"""## {S.section}

`{cmd}` — {datetime.date.today()}, `nproc` = {len(os.sched_getaffinity(0))} ({cpu_name()}),
1-min load average {load_before:.2f} before / {load_after:.2f} after, {total_min:.1f} min in all.{skipped_md}
{v['llmctl']} (torch {v['llmctl_torch']}); peer: **TRL {v['trl']}** (transformers {v['transformers']}, accelerate
{v['accelerate']}, datasets {v['datasets']}, torch {v['torch']}).

Both sides start from the same weights: `{ckpt}` (the tiny SFT'd chat model) for llmctl, its `llmctl export`
(LlamaForCausalLM) for TRL. The same {PROMPTS.relative_to(REPO)} prompts, rendered by llmctl's chat template
(`<|endoftext|><|user|>question<|end|><|assistant|>`; TRL gets the text, which its tokenizer turns into the same
ids: checked below). {settings_md} Each side runs {args.steps} steps per process, {args.repeat}×,
interleaved (llmctl, TRL, llmctl, TRL) for each torch thread count; the first step of each run is warm-up and
not counted. Commands:

```sh
.venv/bin/llmctl export CKPT -o HF
OMP_NUM_THREADS=T .venv/bin/llmctl {' '.join(llmctl_argv(S, 'CKPT', 'OUT', args.steps, P)).replace(str(REPO) + '/', '')}
OMP_NUM_THREADS=T .venv-bench/bin/python benchmarks/rl.py --trl-child HF PROMPTS OUT {args.steps} {P} T RECORD {S.name} 0
```

**Seconds per step**, median over the counted steps. A step is end of step to end of the next: llmctl's from the
moment each line lands in its metrics.jsonl (CPU: the process's utime + stime from /proc at the same moments),
TRL's from a `TrainerCallback.on_step_end` (CPU: `time.process_time`). Phases: llmctl's `generate_s` (prompt
draw + sampling + verifying), `score_s` (advantages), `train_s` from metrics.jsonl, "rest of step" = the rest
(rollouts Parquet, metrics); TRL's "generate" = `GRPOTrainer._generate` (tokenize + `model.generate` + decode),
"score" = `_calculate_rewards` (our verifier), "rollout, rest" = the rest of `_generate_and_score_completions`
(padding, advantages, metrics), "train" = the rest of the step (forward, backward, clip, AdamW, logging). TRL
forwards every completion (the truncated ones with a zero mask); llmctl leaves masked completions out of the
batch ("sequences trained"). llmctl recomputes the old log-probs with a no-grad forward; TRL skips that when μ = 1
and generation is aligned with the optimizer step (it is here).

{step_md}

{ratio_md}

{goal} {'; '.join(verdicts)}.

{reading}

{note}

**Whole process** (interpreter start-up, imports, model load, {args.steps} steps, llmctl's final checkpoint; TRL
saves nothing):

{proc_md}

{check_md}
{whole_md}""" + (f"""
**Where llmctl's time goes**: `llmctl rl` run in-process with the same flags ({args.profile_steps} steps, steps 2..N
summed; `rl.py --profile-child`), wall and CPU (`time.process_time`, all threads) around its parts. Indented
rows are inside the row above them.

{prof_md}
""" if prof_md else "")


# ---------------------------------------------------------------------------------------------
# arith: the whole run and its held-out result


def held_out(model: str, out: str, threads: int) -> dict:
    """Greedy accuracy on the 300 held-out problems, as the demo's eval stage scores an SFT or RL model."""
    argv = ["eval", model, "-o", out, "-t", f"gsm8k:{EVAL}", "--max-new-tokens", "64", "--overwrite", "--quiet", "--json"]
    p = subprocess.run([str(LLMCTL)] + argv, env=child_env(threads), capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"llmctl eval {model} failed:\n{p.stderr[-3000:]}")
    task = next(iter(json.loads(Path(out, "results.json").read_text())["tasks"].values()))
    return {"dir": out, **{k: task["metrics"]["acc"][k] for k in ("n", "mean", "ci_low", "ci_high")}}


def whole_runs(S: Setting, args, ckpt: str, hf: str, tmp: str) -> dict:
    """llmctl's whole rl stage (the demo's command) and TRL's whole run, interleaved, each final model
    scored on the held-out problems; the SFT model too."""
    t, P = args.whole_threads, args.prompts_per_step
    runs: dict[str, list[dict]] = {"llmctl": [], "TRL": []}
    for r in range(args.whole_repeat):
        for side in runs:
            out = os.path.join(tmp, f"whole-{side.lower()}-r{r}")
            shutil.rmtree(out, ignore_errors=True)
            if side == "llmctl":
                res = run_llmctl(S, ckpt, out, args.whole_steps, P, t, held_out=True)
                model = out
            else:
                res = run_trl(S, hf, out, args.whole_trl_steps, P, t, tmp, save=True)
                model = out + "-ckpt"
                p = subprocess.run([str(LLMCTL), "import", os.path.join(out, "final"), "-o", model, "--overwrite", "--quiet"],
                                   capture_output=True, text=True)
                if p.returncode:
                    sys.exit(f"llmctl import of TRL's model failed:\n{p.stderr[-3000:]}")
            res["held_out"] = held_out(model, out + "-eval", t)
            runs[side].append(res)
            print(f"  whole run {r + 1}/{args.whole_repeat}  {side:6s} {res['wall']:6.1f} s  held-out {res['held_out']['mean']:.3f}",
                  file=sys.stderr)
    return {"runs": runs, "sft": held_out(ckpt, os.path.join(tmp, "sft-eval"), t), "threads": t}


def whole_md(S: Setting, args, w: dict) -> str:
    from llmctl.eval.compare import compare_results

    runs, t, P = w["runs"], w["threads"], args.prompts_per_step
    rows = ["| side | run | **process wall s** | CPU s | steps | Σ generate s | Σ train s | start to the step-0 record (start-up, load, evaluation, headroom) s | "
            "held-out evaluations in the steps s | **held-out accuracy** (greedy, 300) [95%] | 1-min load at start |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for side, rs in runs.items():
        for k, res in enumerate(rs):
            steps = res["steps"]
            gen = sum(s["generate_s"] for s in steps)
            train = sum(s["train_s"] for s in steps)
            step0 = res.get("step0", {}).get("wall")
            in_steps = sum(s["wall"] - s["generate_s"] - s["score_s"] - s["train_s"] for s in steps if s.get("eval") and "wall" in s)
            h = res["held_out"]
            rows.append(f"| {side} | {k + 1} | **{res['wall']:.1f}** | {res['cpu']:.1f} | {len(steps)} | {gen:.1f} | {train:.1f} | "
                        f"{fmt(step0, 1) if step0 is not None else '—'} | {fmt(in_steps, 1) if side == 'llmctl' else '—'} | "
                        f"**{h['mean']:.1%}** [{h['ci_low']:.1%}, {h['ci_high']:.1%}] | {res['load']:.1f} |")
    lw, tw = med(r["wall"] for r in runs["llmctl"]), med(r["wall"] for r in runs["TRL"])
    gap = compare_results(runs["TRL"][0]["held_out"]["dir"], runs["llmctl"][0]["held_out"]["dir"])["tasks"][0]
    sft = w["sft"]
    draws = [s["draws"] for r in runs["llmctl"] for s in r["steps"]]
    return f"""
**The whole run** ({t} torch threads, {args.whole_repeat}× each, interleaved). llmctl: the demo's rl stage, `llmctl
{' '.join(llmctl_argv(S, 'CKPT', 'OUT', args.whole_steps, P, held_out=True)).replace(str(REPO) + '/', '')}` ({args.whole_steps} steps;
before the first, the held-out evaluation of the first 100 problems and the headroom on 50; at step {args.whole_steps}, the
evaluation again; its dynamic sampling drew {statistics.fmean(draws):.2f} draws of {P} prompts a step on average).
TRL: `--trl-child HF PROMPTS OUT {args.whole_trl_steps} {P} {t} RECORD arith 1` ({args.whole_trl_steps} steps, then
`trainer.save_model`). Each final model, TRL's through `llmctl import` (its weights, the export's tokenizer files), is
scored as the demo's eval stage scores one: `llmctl eval MODEL -t gsm8k:examples/tasks/arithmetic.jsonl
--max-new-tokens 64` (greedy, all 300 held-out problems; not part of the times). The SFT model they start from:
{sft['mean']:.1%} [{sft['ci_low']:.1%}, {sft['ci_high']:.1%}].

{chr(10).join(rows)}

Whole process, median: TRL {tw:.1f} s, llmctl {lw:.1f} s: **TRL ÷ llmctl = {tw / lw:.2f}×**. Held-out accuracy, TRL −
llmctl (first runs, paired over the same problems): {gap['diff'] * 100:+.1f} points [{gap['ci_low'] * 100:+.1f},
{gap['ci_high'] * 100:+.1f}].
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", choices=sorted(SETTINGS), default="bench",
                    help="bench: issue 9's settings (lr 1e-6, T 1, no dynamic sampling); arith: the demo preset's own (see above)")
    ap.add_argument("--ckpt", help=f"the SFT checkpoint to start from (default {DEFAULT_CKPT})")
    ap.add_argument("--steps", type=int, default=5, help="optimizer steps per run (the first is warm-up, not counted)")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each side per thread count, interleaved")
    ap.add_argument("--prompts-per-step", type=int, help="default: bench 4, arith 8 (the preset's)")
    ap.add_argument("--whole-repeat", type=int, default=2, help="arith: whole runs of each side (0: none)")
    ap.add_argument("--whole-threads", type=int, default=2, help="arith: torch threads of the whole runs")
    ap.add_argument("--whole-steps", type=int, default=ARITH_STEPS, help="arith: llmctl's steps in its whole run (the preset's 25)")
    ap.add_argument("--whole-trl-steps", type=int, help="arith: TRL's steps in its whole run (default: --whole-steps)")
    ap.add_argument("--threads", default="2,1", help="torch threads, one configuration each (both sides)")
    ap.add_argument("--profile-steps", type=int, default=4, help="steps of the profiled llmctl run per thread count (0: none)")
    ap.add_argument("--budget-min", type=float, default=9.0, help="skip a run that would end after this many minutes")
    ap.add_argument("--workdir", help="keep every output here (default: a temporary folder)")
    ap.add_argument("--no-write", action="store_true", help="print the section, leave RESULTS.md alone")
    ap.add_argument("--trl-child", nargs=9, help=argparse.SUPPRESS)
    ap.add_argument("--profile-child", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.trl_child:
        h, p, o, s, ps, t, r, config, save = args.trl_child
        return trl_child(h, p, o, int(s), int(ps), int(t), r, config, save == "1")
    if args.profile_child:
        return profile_child(*args.profile_child)
    S = SETTINGS[args.config]
    args.prompts_per_step = args.prompts_per_step or S.per_step
    args.whole_trl_steps = args.whole_trl_steps or args.whole_steps
    if (args.prompts_per_step * G) % MICRO_BATCH:
        sys.exit(f"--prompts-per-step × {G} must be a multiple of {MICRO_BATCH} (TRL's per-device batch)")

    load_before = os.getloadavg()[0]
    t_start = time.perf_counter()
    threads = [int(t) for t in args.threads.split(",")]
    ckpt = ensure_ckpt(args.ckpt)
    with tempfile.TemporaryDirectory(prefix="bench-rl-") as tmp_auto:
        tmp = args.workdir or tmp_auto
        os.makedirs(tmp, exist_ok=True)
        hf = os.path.join(tmp, "hf")
        shutil.rmtree(hf, ignore_errors=True)
        subprocess.run([str(LLMCTL), "export", ckpt, "-o", hf], check=True, stdout=subprocess.DEVNULL)
        subprocess.run([str(LLMCTL_PY), "-m", "compileall", "-q", str(REPO / "src" / "llmctl")], check=True, stdout=subprocess.DEVNULL)
        pc = prompt_checks(ckpt, hf)
        mc = model_check(ckpt, hf, pc["ids"])
        print(f"prompt ids identical: {pc['same']}/{pc['n']}; max |logit diff| {mc['max_abs_logit_diff']:.2e}", file=sys.stderr)

        runs: dict[tuple[str, int], list[dict]] = {}
        skipped = []
        budget = args.budget_min * 60
        for r in range(args.repeat):
            for t in threads:
                for side in ("llmctl", "TRL"):
                    prev = runs.get((side, t))
                    elapsed = time.perf_counter() - t_start
                    if prev and elapsed + prev[-1]["wall"] > budget:
                        skipped.append(f"{side} threads {t} run {r + 1}")
                        continue
                    out = os.path.join(tmp, f"{side.lower()}-t{t}-r{r}")
                    shutil.rmtree(out, ignore_errors=True)
                    res = run_llmctl(S, ckpt, out, args.steps, args.prompts_per_step, t) if side == "llmctl" else \
                        run_trl(S, hf, out, args.steps, args.prompts_per_step, t, tmp)
                    runs.setdefault((side, t), []).append(res)
                    per = [s["wall"] for s in res["steps"] if "wall" in s]
                    print(f"  run {r + 1}/{args.repeat}  threads {t}  {side:6s} {res['wall']:6.1f} s  cpu {res['cpu']:6.1f} s  "
                          f"step s {', '.join(f'{w:.2f}' for w in per)}  load {res['load']:.1f}", file=sys.stderr)
        profiles = {}
        for t in threads if args.profile_steps else []:
            if time.perf_counter() - t_start + 40 > budget:
                skipped.append(f"profile threads {t}")
                continue
            profiles[t] = run_profile(S, ckpt, os.path.join(tmp, f"profile-t{t}"), args.profile_steps, args.prompts_per_step, t)
            print(f"  profile threads {t}: {profiles[t]['total'][0] / max(1, profiles[t]['steps']):.2f} s/step", file=sys.stderr)
        whole = whole_md(S, args, whole_runs(S, args, ckpt, hf, tmp)) if S.name == "arith" and args.whole_repeat else ""
    load_after = os.getloadavg()[0]
    total_min = (time.perf_counter() - t_start) / 60
    n_trl_ids = sum(len(res["prompt_ids"]) for rs in (runs.get(("TRL", t), []) for t in threads) for res in rs)
    trl_ids_ok = all(ids in pc["ids"] for t in threads for res in runs.get(("TRL", t), []) for ids in res["prompt_ids"])
    pc["same_order"] = same_prompt_order(runs, threads, pc["ids"], args.prompts_per_step)
    pc["config"] = config_check(S, runs, threads)
    section = report(S, args, runs, profiles, pc, mc, trl_ids_ok, n_trl_ids, threads, skipped, load_before, load_after, total_min, ckpt,
                     whole)
    print(section)
    if not args.no_write:
        write_results(S.section, section)


if __name__ == "__main__":
    main()
