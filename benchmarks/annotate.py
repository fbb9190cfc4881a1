"""`llmctl annotate --endpoint` against a local `llmctl serve`: documents/s by --concurrency, and a
server killed mid-run then a resume that loses no row.

    .venv/bin/python benchmarks/annotate.py [--docs 512] [--concurrency 1 8 32] [--ckpt DIR] [--threads 1]

Documents: pages-a's extracted documents (`llmctl crawl-extract`, ../shared/data/web), each cut
to --max-chars in the prompt (the built-in edu rubric), or, without that WARC, generated text of
mixed lengths. The model: --ckpt, or a random tiny chat model made here (llmctl's BPE tokenizer of
300 ids trained on the documents, 2 layers of width 64, a context of 8,192 so the rubric and any page cut to --max-chars fit):
its answers are garbage, which annotate counts as unparseable, so what is measured is the path —
the client's bounded concurrency, the server's continuous batching, the stage's shards and its
answer cache — not a model's scores.

1. Throughput: for each --concurrency, a fresh `llmctl serve` (OMP_NUM_THREADS = --threads; a
   fresh one, so no level finds the prompts of another in its prefix cache), then `llmctl annotate
   DOCS --endpoint URL --concurrency C` as a whole child process, timed; docs/s from the stage's
   own wall seconds (its manifest) and from the whole process (start-up included). Each level's
   answers must equal the first level's: greedy answers do not depend on how many are in flight.
2. Resume: annotate at concurrency 8 into a new OUT; once about a third of the rows are answered
   (its answer cache, OUT/.shards/*.answers.jsonl) the server is killed (SIGKILL), and annotate
   must end with exit 1 after its retries, with no manifest; a new server is started (another
   port) and the same command resumes. Lost rows: documents in minus rows out, or rows whose
   answer is not the uninterrupted run's (must be 0); read back: answers the resume took from the cache.

The table goes to stdout and into benchmarks/RESULTS.md (## annotate).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import DEFAULT_WARC, REPO, Server, child_env, cpu_name, make_docs, read_parts, write_results  # benchmarks/common.py

WORDS = ("the river mill grain town baskets bridge market morning bread stone wall lantern teapot kettle map ink school "
         "lesson teacher pupils fraction number water cycle plant leaf light energy history king city trade").split()
# `llmctl annotate` through llmctl's own main(); the command is added to the app when this checkout's CLI lacks it
CLI = ("import sys\nfrom llmctl import cli\nfrom llmctl.cli import annotate\n"
       "if not any(g.typer_instance is annotate.app for g in cli.app.registered_groups):\n"
       "    cli.app.add_typer(annotate.app)\n"
       "cli.main(sys.argv[1:])\n")


def annotate_cmd(*args) -> list[str]:
    return [sys.executable, "-c", CLI, "annotate", *map(str, args)]


def input_docs(tmp: Path, n: int) -> Path:
    """n documents as one Parquet file: pages-a's, repeated as needed, or generated ones."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if DEFAULT_WARC.exists():
        texts = [r["text"] for r in read_parts(make_docs(str(tmp)))]
        source = f"pages-a's {len(texts)} documents"
    else:
        rng = random.Random(0)
        texts = [" ".join(rng.choices(WORDS, k=rng.randint(40, 400))) + "." for _ in range(n)]
        source = "generated documents (no pages-a WARC here)"
    texts = [texts[i % len(texts)] for i in range(n)]
    pq.write_table(pa.table({"id": [f"doc-{i}" for i in range(n)], "text": texts}), tmp / "docs.parquet")
    input_docs.source = f"{n} documents from {source}"
    return tmp / "docs.parquet"


def tiny_model(tmp: Path, docs: Path) -> Path:
    """A random chat model: a BPE tokenizer with llmctl's chat tokens, 2 layers of width 64, context 8,192 (a page of CJK text is ~3 tokens a character in 300 byte-level ids)."""
    sys.path.insert(0, str(REPO / "src"))
    import torch

    from llmctl.artifacts.checkpoint import save_checkpoint
    from llmctl.data.tokenize import train_tokenizer
    from llmctl.model.config import ModelConfig
    from llmctl.model.transformer import Transformer
    from llmctl.tokenizer import bpe

    train_tokenizer([str(docs)], str(tmp / "tok"), bpe.TrainTokenizerConfig(vocab_size=300))
    cfg = ModelConfig(vocab_size=300, n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_ff=128, max_seq_len=8192)
    torch.manual_seed(0)
    save_checkpoint(tmp / "model", 0, cfg, Transformer(cfg).state_dict(), {"step": 0, "chat": True},
                    tokenizer_file=tmp / "tok" / "tokenizer.json")
    return tmp / "model"


def run(args: list, log: Path) -> tuple[int, float]:
    with open(log, "w") as f:
        t0 = time.perf_counter()
        rc = subprocess.run(annotate_cmd(*args), env=child_env(1), stdout=f, stderr=subprocess.STDOUT).returncode
        return rc, time.perf_counter() - t0


def answers(out: Path) -> dict[str, str | None]:
    return {r["id"]: r["annotation"] for r in read_parts(str(out))}


def manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def throughput(a, ckpt: Path, docs: Path, tmp: Path, common: list) -> tuple[list[dict], dict]:
    rows, first = [], None
    for c in a.concurrency:
        server = Server(ckpt, a.threads, "--served-model-name", "m")
        try:
            out = tmp / f"c{c}"
            rc, wall = run([docs, "-o", out, "--endpoint", server.url + "/v1", "--concurrency", c, *common], tmp / f"c{c}.log")
        finally:
            server.kill()
        if rc:
            raise SystemExit(f"annotate at concurrency {c} failed ({rc}):\n{(tmp / f'c{c}.log').read_text()[-3000:]}")
        m, got = manifest(out), answers(out)
        first = first or got
        counts = m["counts"]
        rows.append({"concurrency": c, "stage_s": m["wall_seconds"], "process_s": wall, "docs": counts["in"],
                     "docs_s": counts["in"] / m["wall_seconds"], "docs_s_process": counts["in"] / wall,
                     "scored": counts["scored"], "unparseable": counts["unparseable"], "failed": counts["failed"],
                     "failures": counts["failures"],
                     "same_answers": sum(got.get(k) == v for k, v in first.items()), "rows_out": len(got)})
        print(json.dumps(rows[-1]), flush=True)
    return rows, first


def resume(a, ckpt: Path, docs: Path, tmp: Path, common: list, want: dict, n: int) -> dict:
    out = tmp / "resume"
    cache = out / ".shards" / "part-00000.answers.jsonl"
    server = Server(ckpt, a.threads, "--served-model-name", "m")
    cmd = [docs, "-o", out, "--concurrency", 8, "--retries", 2, "--backoff", 0.2, *common]
    p = subprocess.Popen(annotate_cmd(*cmd[:3], "--endpoint", server.url + "/v1", *cmd[3:]), env=child_env(1),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    answered = 0
    while time.monotonic() < deadline and p.poll() is None:
        answered = max(0, len(cache.read_bytes().splitlines()) - 1) if cache.exists() else 0
        if answered >= n // 3:
            break
        time.sleep(0.02)
    server.kill()
    _, err = p.communicate(timeout=600)
    killed_at = max(0, len(cache.read_bytes().splitlines()) - 1) if cache.exists() else 0
    first = {"exit": p.returncode, "error": (err.strip().splitlines() or [""])[-1], "manifest": (out / "manifest.json").exists(),
             "answered_at_kill": answered, "kept": killed_at}
    server = Server(ckpt, a.threads, "--served-model-name", "m")
    try:
        rc, wall = run([*cmd[:3], "--endpoint", server.url + "/v1", *cmd[3:], "--json"], tmp / "resume.log")
    finally:
        server.kill()
    if rc:
        raise SystemExit(f"the resumed annotate failed ({rc}):\n{(tmp / 'resume.log').read_text()[-3000:]}")
    m, got = manifest(out), answers(out)
    lost = (n - len(got)) + sum(got.get(k) != v for k, v in want.items())
    return {**first, "resumed": m["counts"]["resumed"], "asked_again": n - m["counts"]["resumed"], "rows_out": len(got),
            "lost": lost, "failed": m["counts"]["failed"], "resume_s": wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=512)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--ckpt", default=None, help="a chat checkpoint whose context holds the rubric (default: a tiny random one)")
    ap.add_argument("--threads", type=int, default=1, help="the server's OMP_NUM_THREADS")
    ap.add_argument("--max-chars", type=int, default=1000)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--no-record", action="store_true", help="print the section, leave RESULTS.md as it is (a trial run)")
    a = ap.parse_args()
    started, load_before = time.time(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-annotate-") as t:
        tmp = Path(t)
        docs = input_docs(tmp, a.docs)
        ckpt = Path(a.ckpt) if a.ckpt else tiny_model(tmp, docs)
        common = ["--max-chars", a.max_chars, "--max-tokens", a.max_tokens, "-q"]
        rows, want = throughput(a, ckpt, docs, tmp, common)
        r = resume(a, ckpt, docs, tmp, common, want, a.docs)
        print(json.dumps(r), flush=True)
    load_after = os.getloadavg()[0]
    import torch

    model = a.ckpt or "a random tiny chat model (2 layers, width 64, 300 ids, context 8,192)"
    lines = ["| concurrency | docs | stage s | docs/s | whole process s | docs/s (process) | unparseable | failed | = first level |",
             "|---|---|---|---|---|---|---|---|---|"]
    for x in rows:
        lines.append(f"| {x['concurrency']} | {x['docs']} | {x['stage_s']:.1f} | {x['docs_s']:.1f} | {x['process_s']:.1f} "
                     f"| {x['docs_s_process']:.1f} | {x['unparseable']} | {x['failed']}{' ' + json.dumps(x['failures']) if x['failed'] else ''} "
                     f"| {x['same_answers']}/{x['docs']} |")
    speed = rows[-1]["docs_s"] / rows[0]["docs_s"]
    section = "\n".join([
        "## annotate", "",
        f"`.venv/bin/python benchmarks/annotate.py --docs {a.docs} --concurrency {' '.join(map(str, a.concurrency))} "
        f"--threads {a.threads} --max-chars {a.max_chars} --max-tokens {a.max_tokens}{f' --ckpt {a.ckpt}' if a.ckpt else ''}` — "
        f"{time.strftime('%Y-%m-%d', time.localtime(started))}, `nproc` = {os.cpu_count()} ({cpu_name()}), torch {torch.__version__}; "
        f"1-min load average {load_before:.2f} before / {load_after:.2f} after; {time.time() - started:.0f} s in all.", "",
        f"`llmctl annotate --prompt edu --endpoint` against `llmctl serve` ({model}; OMP_NUM_THREADS = {a.threads}, "
        f"a fresh server per level) on 127.0.0.1; {input_docs.source}, each cut to {a.max_chars} characters in the "
        f"prompt, answers of at most {a.max_tokens} tokens, greedy. A random model's answers hold no score line: every row "
        "is counted unparseable, which is what the stage must do with garbage. docs/s: documents over the stage's wall "
        "seconds (its manifest); (process): over the whole `llmctl annotate` process, start-up included. `= first level`: "
        "rows whose answer equals the first level's.", "",
        *lines, "",
        f"Concurrency {rows[-1]['concurrency']} against {rows[0]['concurrency']}: {speed:.1f}x the documents/s.", "",
        f"Kill and resume (concurrency 8, --retries 2 --backoff 0.2): the server was killed (SIGKILL) with {r['answered_at_kill']} "
        f"of {a.docs} rows answered; annotate ended with exit {r['exit']} and {'a' if r['manifest'] else 'no'} manifest "
        f"({r['kept']} answers kept), saying: \"{r['error'][:300]}\". A new server, the same command: exit 0 in "
        f"{r['resume_s']:.1f} s, {r['resumed']} answers read back, {r['asked_again']} rows asked; rows out {r['rows_out']} "
        f"of {a.docs}, failed {r['failed']}, lost (missing, or an answer unlike the uninterrupted run's) **{r['lost']}**.",
    ])
    print(section)
    if not a.no_record:
        write_results("annotate", section)
    bad = [x for x in rows if x["failed"] or x["rows_out"] != a.docs or x["same_answers"] != a.docs]
    if bad or r["lost"] or r["exit"] != 1 or r["manifest"] or r["failed"]:
        raise SystemExit(f"rows lost, failed or unlike: {bad or r}")


if __name__ == "__main__":
    main()
