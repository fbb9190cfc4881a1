"""LoRA (model/lora.py) side by side with PEFT on CPU, and LoRA against full fine-tuning (issue 32, "Measure").

    PYTHONPATH=src .venv/bin/python benchmarks/lora.py [--rank 16] [--alpha 32] [--steps 6] [--threads 1,2]

1. LoRA vs PEFT, one process, the same model: the `small` preset's architecture (stages/train/small.toml,
   ~30M parameters, vocabulary 32,000, tied head) with random weights, and its transformers twin
   (`llmctl export`'s config and tensor names, LlamaForCausalLM) wrapped by `peft.get_peft_model`
   with the same rank, alpha and targets (all seven projections); PEFT's A matrices are copied from
   llmctl's. Parity: logits at init, trainable-parameter count, and logits after one AdamW step
   (lr 1e-3) on the same batch with the same loss (cross-entropy over the logits), max |Δ| in fp32.
   Speed: seconds per step (forward + backward + AdamW step) on a batch of 4 × 256 tokens, each side
   with its own loss path (llmctl's chunked cross-entropy, transformers' `labels=`), the two sides
   interleaved step by step, the median of --steps after 2 warm-up steps, at 1 and 2 torch threads.
2. LoRA vs full SFT on the `small` preset: `llmctl train --sft CHATS --init BASE` for 3 steps of
   8 × 512 tokens (micro-batch 8), with and without --lora-rank; each a child process under
   /usr/bin/time (peak RSS), and the AdamW state bytes summed from the tensors in its optimizer.pt.

The section goes to benchmarks/RESULTS.md (## lora).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from common import REPO, cpu_name, write_results  # noqa: E402  (benchmarks/common.py)

PY = sys.executable
SMALL = dict(vocab_size=32000, n_layers=6, d_model=512, n_heads=8, n_kv_heads=4, d_ff=1408, max_seq_len=512, tied=True)
TARGETS = ["q", "k", "v", "o", "gate", "up", "down"]
PEFT_NAMES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj", "up": "up_proj", "down": "down_proj"}


def models(rank: int, alpha: float, seed: int = 0):
    import peft
    import transformers

    from llmctl.model.config import ModelConfig
    from llmctl.model.hf_layout import architecture, hf_config, hf_state_dict
    from llmctl.model.lora import LoraConfig, adapter_state, attach, peft_state_dict
    from llmctl.model.transformer import Transformer

    torch.manual_seed(seed)
    ours = Transformer(ModelConfig(**SMALL))
    lora = LoraConfig(rank=rank, alpha=alpha, targets=TARGETS).check()
    cfg = ours.cfg
    hc = hf_config(cfg, cfg.padded_vocab)
    config = transformers.AutoConfig.for_model(architecture(cfg)[1], **{k: v for k, v in hc.items() if k != "model_type"})
    hf = transformers.AutoModelForCausalLM.from_config(config).float()
    hf.load_state_dict(hf_state_dict(cfg, ours.state_dict(), cfg.padded_vocab), strict=False)
    hf.tie_weights()
    attach(ours, lora)
    theirs = peft.get_peft_model(hf, peft.LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0,
                                                     target_modules=[PEFT_NAMES[t] for t in TARGETS]))
    peft.set_peft_model_state_dict(theirs, peft_state_dict(cfg, lora, adapter_state(ours)))
    return ours, theirs


def lm_loss(logits, x):
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), x[:, 1:].reshape(-1))


def adamw(model, lr=1e-3):
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)


def parity(rank: int, alpha: float) -> dict:
    torch.set_num_threads(2)
    ours, theirs = models(rank, alpha)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, SMALL["vocab_size"], (2, 64), generator=g)
    y = torch.randint(0, SMALL["vocab_size"], (2, 64), generator=g)
    ours.eval(), theirs.eval()
    with torch.no_grad():
        init = float((ours(y) - theirs(y).logits).abs().max())
    ours.train(), theirs.train()
    for m, logits in ((ours, lambda: ours(x)), (theirs, lambda: theirs(x).logits)):
        opt = adamw(m)
        lm_loss(logits(), x).backward()
        opt.step()
    ours.eval(), theirs.eval()
    with torch.no_grad():
        a, b = ours(y), theirs(y).logits
        after = float((a - b).abs().max())
    n_ours = sum(p.numel() for p in ours.parameters() if p.requires_grad)
    n_theirs, n_all = theirs.get_nb_trainable_parameters()
    return {"init": init, "after": after, "n_ours": n_ours, "n_theirs": n_theirs, "n_all": n_all}


def speed(rank: int, alpha: float, threads: int, steps: int) -> dict:
    torch.set_num_threads(threads)
    ours, theirs = models(rank, alpha)
    ours.train(), theirs.train()
    g = torch.Generator().manual_seed(2)
    x = torch.randint(0, SMALL["vocab_size"], (4, 257), generator=g)
    inp, tgt = x[:, :-1], x[:, 1:]
    sides = {"llmctl": (ours, adamw(ours), lambda: ours(inp, tgt)[0]),
             "peft": (theirs, adamw(theirs), lambda: theirs(input_ids=inp, labels=inp).loss)}
    times = {k: [] for k in sides}
    for i in range(steps + 2):
        for name, (m, opt, loss) in sides.items():
            t0 = time.perf_counter()
            loss().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if i >= 2:
                times[name].append(time.perf_counter() - t0)
    return {k: (min(v), statistics.median(v)) for k, v in times.items()}


# ---------------------------------------------------------------------------------------------
# LoRA vs full SFT on the small preset


def make_base(root: Path) -> tuple[Path, Path]:
    """A `small` model with random weights and a chat-capable BPE tokenizer, saved as a checkpoint,
    and a chats file of simple sums."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from llmctl.artifacts.checkpoint import save_checkpoint
    from llmctl.model.config import ModelConfig
    from llmctl.model.transformer import Transformer
    from llmctl.tokenizer import bpe
    from llmctl.data.tokenize import train_tokenizer

    rng = random.Random(0)
    texts = [" ".join(f"{a} plus {b} is {a + b}." for a, b in ((rng.randint(1, 99), rng.randint(1, 99)) for _ in range(20)))
             for _ in range(200)]
    pq.write_table(pa.table({"text": texts}), root / "docs.parquet")
    train_tokenizer([str(root / "docs.parquet")], str(root / "tok"), bpe.TrainTokenizerConfig(vocab_size=1000))
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**SMALL))
    base = save_checkpoint(root / "base", 0, model.cfg, model.state_dict(), {"step": 0},
                           tokenizer_file=root / "tok" / "tokenizer.json")
    with open(root / "chats.jsonl", "w") as f:
        for _ in range(400):
            a, b = rng.randint(1, 999), rng.randint(1, 999)
            f.write(json.dumps({"prompt": f"What is {a} plus {b}? " * 6, "answer": f"{a} plus {b} is {a + b}. " * 4}) + "\n")
    return base, root / "chats.jsonl"


def sft_memory(root: Path, base: Path, chats: Path, lora: list[str], threads: int, micro: int) -> dict:
    out = root / f"{'lora' if lora else 'full'}-{micro}"
    cmd = ["/usr/bin/time", "-f", "%M", PY, "-m", "llmctl", "train", "--sft", str(chats), "--init", str(base), "-o", str(out),
           "--seq-len", "512", "--batch-tokens", "4096", "--micro-batch", str(micro), "--max-steps", "3", "--lr", "1e-4",
           "--threads", str(threads), "-q", *lora]
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    if p.returncode:
        raise SystemExit(p.stderr)
    rss_kb = int(p.stderr.strip().splitlines()[-1])
    ck = out / "checkpoints" / "step-000003"
    opt = torch.load(ck / "optimizer.pt", weights_only=True)
    opt_bytes = sum(t.numel() * t.element_size() for s in opt["state"].values() for t in s.values() if torch.is_tensor(t))
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]
    return {"rss": rss_kb * 1024, "opt_bytes": opt_bytes, "ckpt_bytes": (ck / "model.safetensors").stat().st_size,
            "step_s": statistics.median(r["step_seconds"] for r in steps[1:]), "command": " ".join(cmd[3:]).replace(str(root), "$TMP")}


def mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=32.0)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", default="1,2")
    a = ap.parse_args()
    load = [os.getloadavg()[0]]
    par = parity(a.rank, a.alpha)
    print(f"parity {par}", file=sys.stderr)
    speeds = {}
    for t in [int(x) for x in a.threads.split(",")]:
        speeds[t] = speed(a.rank, a.alpha, t, a.steps)
        print(f"threads {t}: {speeds[t]}", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        base, chats = make_base(root)
        mem = {(name, micro): sft_memory(root, base, chats, flags, 2, micro) for micro in (8, 1) for name, flags in
               (("full", []), ("lora", ["--lora-rank", str(a.rank), "--lora-alpha", f"{a.alpha:g}"]))}
    print(f"memory {mem}", file=sys.stderr)
    load.append(os.getloadavg()[0])

    lines = ["## lora", "",
             f"`PYTHONPATH=src .venv/bin/python benchmarks/lora.py --rank {a.rank} --alpha {a.alpha:g} --steps {a.steps} "
             f"--threads {a.threads}` ({datetime.date.today()}, {cpu_name()}, torch {torch.__version__}, "
             f"peft {__import__('peft').__version__}, transformers {__import__('transformers').__version__}).", "",
             f"LoRA r {a.rank}, alpha {a.alpha:g} on q,k,v,o,gate,up,down of the `small` preset's architecture "
             f"({par['n_all']:,} parameters with the adapters, random weights); PEFT wraps its transformers twin "
             "with the same A matrices.", "",
             "| | llmctl | PEFT |", "|---|---|---|",
             f"| trainable parameters | {par['n_ours']:,} | {par['n_theirs']:,} |",
             f"| logits at init, max abs diff (fp32) | {par['init']:.2e} | |",
             f"| logits after one AdamW step on the same batch, max abs diff | {par['after']:.2e} | |"]
    for t, s in speeds.items():
        (ours_min, ours_med), (peft_min, peft_med) = s["llmctl"], s["peft"]
        lines.append(f"| s/step (fwd+bwd+AdamW, 4 × 256 tokens), {t} thread{'s' if t > 1 else ''}: min / median | "
                     f"{ours_min:.3f} / {ours_med:.3f} | {peft_min:.3f} / {peft_med:.3f} "
                     f"(llmctl {peft_min / ours_min:.2f}× / {peft_med / ours_med:.2f}× faster) |")
    lines += ["", f"Load average (1 min) at the start and the end: {load[0]:.1f}, {load[1]:.1f} (a shared 2-core machine: "
              "the sides are interleaved step by step, so both meet the same load; the minimum is the step least disturbed).", ""]
    full = mem[("full", 8)]
    lines += ["LoRA against full fine-tuning, `train --sft --init` on the `small` preset (3 steps of 8 × 512 tokens, "
              "2 threads; peak RSS of the process from /usr/bin/time, AdamW state summed from optimizer.pt):", "",
              f"`{full['command']}` [`--lora-rank {a.rank} --lora-alpha {a.alpha:g}`], and with `--micro-batch 1`", "",
              "| | full | LoRA | ratio |", "|---|---|---|---|",
              f"| AdamW state | {mib(full['opt_bytes'])} | {mib(mem[('lora', 8)]['opt_bytes'])} | "
              f"{full['opt_bytes'] / mem[('lora', 8)]['opt_bytes']:.0f}× |",
              f"| checkpoint weights file | {mib(full['ckpt_bytes'])} | {mib(mem[('lora', 8)]['ckpt_bytes'])} | "
              f"{full['ckpt_bytes'] / mem[('lora', 8)]['ckpt_bytes']:.0f}× |"]
    for micro in (8, 1):
        f, lo = mem[("full", micro)], mem[("lora", micro)]
        lines += [f"| peak RSS, micro-batch {micro} | {mib(f['rss'])} | {mib(lo['rss'])} | {f['rss'] / lo['rss']:.2f}× |",
                  f"| s/step, micro-batch {micro} (median of steps 2-3) | {f['step_s']:.2f} | {lo['step_s']:.2f} | "
                  f"{f['step_s'] / lo['step_s']:.2f}× |"]
    section = "\n".join(lines) + "\n"
    print(section)
    write_results("lora", section)


if __name__ == "__main__":
    main()
