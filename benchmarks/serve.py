"""`llmctl serve` under load: concurrent chat requests from OpenAI's own Python client.

    make demo
    .venv/bin/python benchmarks/serve.py [--ckpt out/demo/sft] [--requests 64] [--threads 1 2]

For each thread count, one server process (`python -m llmctl serve CKPT --port 0`, this checkout,
OMP_NUM_THREADS = threads) on 127.0.0.1, and `openai.AsyncOpenAI` against it unchanged:

1. --requests chat requests at once (asyncio.gather), of mixed lengths: the held-out arithmetic
   questions, one to three of them in a message (prompts of ~20 to ~130 tokens), max_tokens cycling
   through 16, 32, 64 and 96, temperature 0; every other one streamed (its time to first token
   recorded, its deltas joined). Requests/s, completion tokens/s, p50 / p99 latency, errors.
2. The same requests one at a time, for what continuous batching buys over serving them in turn.
3. Every answer against `llmctl generate` on the same checkpoint at temperature 0 (one generate
   run per max_tokens value): the same text, per request.
The table goes to stdout and into benchmarks/RESULTS.md (## serve).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from common import REPO, Server, child_env, cpu_name, write_results  # benchmarks/common.py

DEMO_SFT = REPO / "out" / "demo" / "sft"
QUESTIONS = REPO / "examples" / "tasks" / "arithmetic.jsonl"
MAX_TOKENS = (16, 32, 64, 96)  # the longest prompt (3 questions, ~150 tokens) plus 96 fits the demo's context of 256


def requests(n: int) -> list[dict]:
    qs = [json.loads(line)["question"] for line in QUESTIONS.read_text().splitlines()]
    out = []
    for i in range(n):
        k = 1 + i % 3  # one to three questions in a message: prompts of mixed lengths
        content = " ".join(qs[(i * 3 + j) % len(qs)] for j in range(k))
        out.append({"content": content, "max_tokens": MAX_TOKENS[i % len(MAX_TOKENS)], "stream": i % 2 == 1})
    return out


async def one(client, name: str, r: dict) -> dict:
    t0 = time.perf_counter()
    messages = [{"role": "user", "content": r["content"]}]
    try:
        if r["stream"]:
            text, first, tokens = [], None, 0
            stream = await client.chat.completions.create(model=name, messages=messages, temperature=0, max_tokens=r["max_tokens"],
                                                          stream=True, stream_options={"include_usage": True})
            async for c in stream:
                if c.choices and c.choices[0].delta.content:
                    first = first or time.perf_counter()
                    text.append(c.choices[0].delta.content)
                if c.usage:
                    tokens = c.usage.completion_tokens
            out = {"text": "".join(text), "ttft": (first or time.perf_counter()) - t0, "tokens": tokens}
        else:
            resp = await client.chat.completions.create(model=name, messages=messages, temperature=0, max_tokens=r["max_tokens"])
            out = {"text": resp.choices[0].message.content, "tokens": resp.usage.completion_tokens}
    except Exception as e:  # counted: the load test's errors must be 0
        return {"error": f"{type(e).__name__}: {e}", "latency": time.perf_counter() - t0}
    return {**out, "latency": time.perf_counter() - t0}


async def load(url: str, name: str, reqs: list[dict], concurrent: bool) -> tuple[list[dict], float]:
    import httpx
    import openai

    limits = httpx.Limits(max_connections=len(reqs) + 8, max_keepalive_connections=len(reqs) + 8)
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600,
                                  http_client=openai.DefaultAsyncHttpxClient(limits=limits)) as client:
        await one(client, name, {"content": "Warm up.", "max_tokens": 4, "stream": False})
        t0 = time.perf_counter()
        if concurrent:
            results = await asyncio.gather(*(one(client, name, r) for r in reqs))
        else:
            results = [await one(client, name, r) for r in reqs]
        return list(results), time.perf_counter() - t0


def generate(ckpt: str, reqs: list[dict]) -> list[str]:
    """`llmctl generate` at temperature 0, one run per max_tokens value: each request's expected text."""
    want: list[str | None] = [None] * len(reqs)
    for m in MAX_TOKENS:
        idx = [i for i, r in enumerate(reqs) if r["max_tokens"] == m]
        args = [x for i in idx for x in ("-p", reqs[i]["content"])]
        p = subprocess.run([sys.executable, "-m", "llmctl", "generate", ckpt, *args, "--max-new-tokens", str(m), "--json"],
                           env=child_env(2), capture_output=True, text=True, check=True)
        for i, g in zip(idx, json.loads(p.stdout)):
            want[i] = g["completion"]
    return want


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def summary(results: list[dict], wall: float, want: list[str]) -> dict:
    ok = [r for r in results if "error" not in r]
    lat = [r["latency"] for r in ok]
    ttft = [r["ttft"] for r in ok if "ttft" in r]
    return {"requests": len(results), "errors": len(results) - len(ok), "wall_s": wall, "rps": len(results) / wall,
            "tok_s": sum(r["tokens"] for r in ok) / wall, "p50": pct(lat, 0.5) if lat else None,
            "p99": pct(lat, 0.99) if lat else None, "ttft_p50": pct(ttft, 0.5) if ttft else None,
            "equal": sum(r.get("text") == w for r, w in zip(results, want)),
            "first_error": next((r["error"] for r in results if "error" in r), None)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ckpt", default=str(DEMO_SFT))
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args()
    reqs = requests(args.requests)
    started = time.time()
    load_before = os.getloadavg()[0]
    want = generate(args.ckpt, reqs)
    rows = []
    for threads in args.threads:
        server = Server(args.ckpt, threads)
        try:
            for concurrent in (True, False):
                results, wall = asyncio.run(load(server.url, server.name, reqs, concurrent))
                s = summary(results, wall, want)
                rows.append({"threads": threads, "concurrency": len(reqs) if concurrent else 1, **s})
                print(json.dumps(rows[-1]), flush=True)
        finally:
            code = server.stop()
        rows[-1]["exit"] = rows[-2]["exit"] = code
    load_after = os.getloadavg()[0]

    import openai
    import torch

    def f(x, spec):
        return "n/a" if x is None else format(x, spec)

    lines = ["| threads | concurrent | wall s | requests/s | tokens/s | p50 latency s | p99 latency s | p50 first token s | errors | = generate |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['threads']} | {r['concurrency']} | {r['wall_s']:.1f} | {r['rps']:.2f} | {r['tok_s']:.0f} | {f(r['p50'], '.2f')} "
                     f"| {f(r['p99'], '.2f')} | {f(r['ttft_p50'], '.2f')} | {r['errors']} | {r['equal']}/{r['requests']} |")
    speedup = {t: next(r["rps"] for r in rows if r["threads"] == t and r["concurrency"] > 1) /
               next(r["rps"] for r in rows if r["threads"] == t and r["concurrency"] == 1) for t in args.threads}
    ck = Path(args.ckpt)
    section = "\n".join([
        "## serve", "",
        f"`.venv/bin/python benchmarks/serve.py --ckpt {args.ckpt} --requests {args.requests} --threads {' '.join(map(str, args.threads))}` — "
        f"{time.strftime('%Y-%m-%d', time.localtime(started))}, `nproc` = {os.cpu_count()} ({cpu_name()}), torch {torch.__version__}, "
        f"openai {openai.__version__}; 1-min load average {load_before:.2f} before / {load_after:.2f} after; "
        f"{time.time() - started:.0f} s in all.", "",
        f"`llmctl serve {ck}` on 127.0.0.1 (one server process per thread count, OMP_NUM_THREADS = threads), driven by "
        f"`openai.AsyncOpenAI` unchanged: {args.requests} chat requests of mixed lengths (1-3 held-out arithmetic questions "
        f"in a message, max_tokens cycling {', '.join(map(str, MAX_TOKENS))}, temperature 0, every other one streamed), "
        "all at once (`concurrent` = their number) and then one at a time (1). Latency: from sending a request to its last "
        "byte; first token: a streamed request's first text delta. `= generate`: answers whose text equals `llmctl generate`'s "
        "on the same checkpoint at temperature 0. Exit code of each server after SIGTERM: "
        f"{', '.join(str(r['exit']) for r in rows[::2])}.", "",
        *lines, "",
        "Continuous batching against serving the same requests in turn: "
        + ", ".join(f"{speedup[t]:.1f}x the requests/s on {t} thread{'s' if t > 1 else ''}" for t in args.threads) + ".",
    ])
    print(section)
    write_results("serve", section)
    bad = [r for r in rows if r["errors"] or r["equal"] != r["requests"]]
    if bad:
        raise SystemExit(f"errors or answers unlike generate's: {bad}")


if __name__ == "__main__":
    main()
