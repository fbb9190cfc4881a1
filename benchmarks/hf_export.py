"""export against transformers and lm-evaluation-harness: what a user of the exported model gets.

    make demo && make bench-setup
    .venv-bench/bin/python benchmarks/hf_export.py [--ckpt out/demo/rl] [--limit 100]

One run on CPU, in .venv-bench (llmctl, transformers and lm-eval installed side by side), on a chat
checkpoint (default: the demo's RL model) and the held-out arithmetic problems:

1. `llmctl export CKPT`; then the files as transformers reads them: the class, vocab size against
   the tokenizer, bos/eos/pad, generation_config's EOS ids, and `apply_chat_template` of a 3-turn
   conversation against llmctl's renderer.
2. Greedy answers to the first --limit problems: transformers' `generate` on the export against
   llmctl's engine on the checkpoint; per item, the same completion text and the same stop.
3. Sampling at T = 1 (--samples sequences of 64 tokens from transformers): ids outside the tokenizer
   (none can be sampled now), and the share of probability the padding rows held in the checkpoint's
   head, which an export of the padded table would have handed to ids no tokenizer decodes.
4. lm-evaluation-harness `simple_evaluate(model="hf", apply_chat_template=True)` on a local
   generate_until task over the same problems (user turn = the question, as `llmctl eval` prompts a
   chat model): it runs, and its completions match `llmctl eval`'s per item; both scored with
   llmctl's answer rule.
The table goes to stdout and into benchmarks/RESULTS.md (## hf export).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

from common import LLMCTL, REPO, cpu_name, write_results  # benchmarks/common.py

DEMO_RL = REPO / "out" / "demo" / "rl"
PROBLEMS = REPO / "examples" / "tasks" / "arithmetic.jsonl"
CONVERSATION = [{"role": "user", "content": "A barge carries 9 crates of 2 eggs. How many eggs?"},
                {"role": "assistant", "content": "The barge carries 9 * 2 = 18 eggs.\n#### 18"},
                {"role": "user", "content": "And with 3 more crates?"}]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ckpt", default=str(DEMO_RL))
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    args = ap.parse_args()

    import torch
    import transformers

    from llmctl.model.load import load_model
    from llmctl.model.generate import Engine, SamplingParams
    from llmctl.tokenizer.vocab import Vocab
    from llmctl.tasks import GenScoring

    tmp = Path(tempfile.mkdtemp(prefix="bench-hf-export-"))
    hf_dir = tmp / "hf"
    subprocess.run([str(LLMCTL), "export", args.ckpt, "-o", str(hf_dir)], check=True)
    ours, ck = load_model(args.ckpt)
    vocab = Vocab(ck.path)
    chat = vocab.require_chat()
    tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    rows: list[tuple[str, str]] = []
    rows.append(("class; vocab (config / tokenizer / llmctl rows)",
                 f"{type(model).__name__}; {model.config.vocab_size:,} / {len(tok):,} / {ck.config.padded_vocab:,}"))
    rows.append(("bos / eos / pad", f"{tok.bos_token} / {tok.eos_token} / {tok.pad_token}"))
    rows.append(("generation_config eos_token_id", str(model.generation_config.eos_token_id)))
    hf_ids = tok.apply_chat_template(CONVERSATION, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    rows.append(("apply_chat_template = llmctl ids (3 turns)", str(list(hf_ids) == chat.prompt_ids(CONVERSATION))))

    items = [json.loads(line) for line in PROBLEMS.read_text().splitlines()[: args.limit]]
    prompts = [chat.prompt_ids([{"role": "user", "content": it["question"]}]) for it in items]
    gens = Engine.for_vocab(ours, vocab, chat=True).generate(prompts, SamplingParams(max_new_tokens=args.max_new_tokens))
    same_text = same_stop = hf_stopped = 0
    for p, g in zip(prompts, gens):
        x = torch.tensor([p])
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=args.max_new_tokens)[0, len(p):].tolist()
        stopped = bool(out) and out[-1] in model.generation_config.eos_token_id
        hf_stopped += stopped
        same_stop += stopped == (g.finish == "eos")
        same_text += tok.decode(out, skip_special_tokens=True) == g.text
    n = len(items)
    rows.append((f"greedy: same completion as llmctl (n = {n})", f"{same_text}/{n}"))
    rows.append(("greedy: transformers stops at an EOS where llmctl does", f"{same_stop}/{n} ({hf_stopped} stopped)"))

    torch.manual_seed(0)
    x = torch.tensor([prompts[0]])
    sampled = model.generate(x, attention_mask=torch.ones_like(x), do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                             max_new_tokens=64, num_return_sequences=args.samples, eos_token_id=None)[:, len(prompts[0]):]
    outside = int((sampled >= len(tok)).sum())
    with torch.no_grad():  # the checkpoint's own distribution at each sampled position, over all its rows
        seqs = torch.cat([x.expand(len(sampled), -1), sampled], dim=1)
        probs = ours(seqs)[:, x.shape[1] - 1 : -1].float().softmax(-1)
    pad_mass = float(probs[..., ck.config.vocab_size:].sum(-1).mean())
    rows.append((f"T = 1: sampled ids outside the tokenizer ({sampled.numel():,} tokens)", str(outside)))
    rows.append(("T = 1: probability the padding rows held (an uncut export's share)",
                 f"{100 * pad_mass:.3f}% (1 token in {1 / pad_mass:,.0f})" if pad_mass > 0 else "0"))

    # lm-evaluation-harness on the export, the chat template applied, against `llmctl eval`
    data = tmp / "problems.jsonl"
    data.write_text("".join(json.dumps(it) + "\n" for it in items))
    tasks = tmp / "tasks"
    tasks.mkdir()
    (tasks / "bench_chat_arith.yaml").write_text(json.dumps({
        "task": "bench_chat_arith", "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data)}},
        "output_type": "generate_until", "test_split": "test", "doc_to_text": "{{question}}",
        "doc_to_target": "{{answer.split('####')[-1].strip()}}",
        "generation_kwargs": {"until": [], "do_sample": False, "temperature": 0.0, "max_gen_toks": args.max_new_tokens},
        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}],
    }))
    import lm_eval
    from lm_eval.tasks import TaskManager

    res = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={hf_dir},dtype=float32", tasks=["bench_chat_arith"],
                                  device="cpu", batch_size=16, task_manager=TaskManager(include_path=str(tasks), include_defaults=False),
                                  apply_chat_template=True, log_samples=True, bootstrap_iters=0)
    harness = {s["doc_id"]: s["resps"][0][0] for s in res["samples"]["bench_chat_arith"]}
    ev = tmp / "eval"
    subprocess.run([str(LLMCTL), "eval", args.ckpt, "-t", f"gsm8k:{data}", "-o", str(ev), "--max-new-tokens",
                    str(args.max_new_tokens), "--quiet"], check=True)
    import pyarrow.parquet as pq

    ours_rows = sorted(pq.read_table(ev / "samples.parquet").to_pylist(), key=lambda r: r["item"])
    scoring = GenScoring(extract="after_hash")
    target = [it["answer"].split("####")[-1].strip() for it in items]
    same = sum(harness[i].strip() == r["completion"].strip() for i, r in enumerate(ours_rows))
    acc_h = sum(scoring.strict(harness[i]) == scoring.strict("#### " + target[i]) for i in range(n)) / n
    acc_l = sum(r["correct"] > 0 for r in ours_rows) / n
    rows.append(("lm-eval apply_chat_template=True: completions equal to llmctl eval's", f"{same}/{n}"))
    rows.append(("accuracy, llmctl's answer rule: lm-eval on the export / llmctl eval", f"{acc_h:.3f} / {acc_l:.3f}"))

    cmd = f".venv-bench/bin/python benchmarks/hf_export.py --ckpt {args.ckpt} --limit {args.limit}"
    table = "\n".join(["| check | result |", "|---|---|", *[f"| {a} | {b} |" for a, b in rows]])
    section = (f"## hf export\n\n`{cmd}` on {cpu_name()}, transformers {transformers.__version__}, lm-eval "
               f"{getattr(lm_eval, '__version__', '?')}; checkpoint `{args.ckpt}` (step {ck.trainer_state.get('step')}).\n\n{table}\n")
    print(section)
    write_results("hf export", section)


if __name__ == "__main__":
    main()
