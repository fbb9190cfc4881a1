"""`llmctl annotate` (src/llmctl/eval/annotate.py): the strict score parser, the prompt, and the
stage against real servers on 127.0.0.1 — a real `llmctl serve` of a tiny model (whose answers
are garbage: every row counted unparseable, none lost, the same answers as the engine run here on
the checkpoint), and a small scripted OpenAI-shaped server written below (good answers, garbage
bodies, 500s retried, 400s, a crash mid-run and a resume that asks only for the rows without an
answer). Every server is a process started here, bounded by a timeout and stopped by its pid."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import RecordingProgress
from llmctl.errors import StageFailed, UsageError
from llmctl.eval.annotate import EDU_PROMPT, AnnotateConfig, build_prompt, load_prompt, parse_score, run_annotate
from llmctl.runtime.options import RunOptions
from servelib import Server

WORDS = "river mill grain town baskets bridge market morning bread stone wall lantern teapot kettle map ink".split()


# ---------------------------------------------------------------------------------------------
# the parser


@pytest.mark.parametrize("answer, want", [
    ("The page teaches fractions.\nEducational score: 4", 4),
    ("Educational score: 0", 0),
    ("Educational score: 5", 5),
    ("  educational SCORE :  3  ", 3),  # any case, spaces around
    ("Score: 2", 2),  # any label
    ("Educational score: 3\nHope this helps!", 3),  # lines after the score line do not matter
    ("Educational score: 2\n\nOn reflection:\nEducational score: 4", 4),  # several score lines: the last decides
    ("Educational score: 4\nFinal score: 1", 1),
    ("Educational score: 04", 4),
    # malformed: null
    (None, None),
    ("", None),
    ("The page is about bread.", None),  # no score line
    ("Educational score:", None),  # no number
    ("Educational score: 6", None),  # out of range
    ("Educational score: -1", None),
    ("Educational score: 100000000", None),
    ("Educational score: 3.5", None),  # not an integer
    ("Educational score: three", None),
    ("Educational score: 3/5", None),
    ("Educational score: 3 out of 5", None),  # trailing text
    ("Educational score: 3.", None),
    ("Educational score: **3**", None),
    ("Educational score: 4\nEducational score: maybe 5", None),  # the last score line is malformed: no fallback
    ("Educational score: 4\nThe score: unclear", None),
    ("The underscore: 4", None),  # 'score' must be a word
    ("Educational score: ٣", None),  # only ASCII digits
])
def test_parse_score(answer, want):
    assert parse_score(answer, 0, 5) == want


def test_parse_score_custom_range():
    assert parse_score("Quality score: 9", 1, 10) == 9
    assert parse_score("Quality score: 0", 1, 10) is None
    assert parse_score("Quality score: 11", 1, 10) is None


def test_the_edu_prompt_and_templates(tmp_path):
    for words in ("additive", "0 to 5", "Educational score: <number>", "{text}"):
        assert words in EDU_PROMPT
    p, cut = build_prompt(EDU_PROMPT, "x" * 50, 10)
    assert cut and "x" * 10 in p and "x" * 11 not in p and "{text}" not in p
    p, cut = build_prompt(EDU_PROMPT, "short", 10)
    assert not cut and "short" in p
    assert build_prompt(EDU_PROMPT, "x" * 50, 0) == (EDU_PROMPT.replace("{text}", "x" * 50), False)  # 0: never cut
    f = tmp_path / "t.txt"
    f.write_text('Rate this: {"json": {text}} {other}\nQuality score: N')
    assert build_prompt(load_prompt(str(f)), "DOC", 100)[0] == 'Rate this: {"json": DOC} {other}\nQuality score: N'
    (tmp_path / "no.txt").write_text("no placeholder")
    for prompt, words in ((str(tmp_path / "no.txt"), "has no {text}"), (str(tmp_path / "missing.txt"), "neither a built-in")):
        with pytest.raises(UsageError, match=re.escape(words)):
            load_prompt(prompt)


# ---------------------------------------------------------------------------------------------
# a scripted OpenAI-shaped server: a real HTTP server in its own process

SCRIPTED = r'''
import json, os, re, signal, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

script = json.loads(open(sys.argv[2]).read())
log = open(sys.argv[3], "a", buffering=1)
lock = threading.Lock()
state = {"attempts": {}, "answered": 0, "inflight": 0, "max_inflight": 0, "requests": 0}

def default(n):
    return {"answer": f"The page is about item {n}.\nEducational score: {n % 6}"}

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def send(self, status, body, ctype="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()
    def do_GET(self):
        if self.path == "/v1/models":
            self.send(200, {"object": "list", "data": [{"id": "scripted", "object": "model"}]})
        elif self.path == "/stats":
            with lock:
                self.send(200, dict(state, attempts=None))
        else:
            self.send(404, {"error": {"message": "no route"}})
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with lock:
            state["inflight"] += 1
            state["requests"] += 1
            state["max_inflight"] = max(state["max_inflight"], state["inflight"])
        try:
            self.answer(body)
        finally:
            with lock:
                state["inflight"] -= 1
    def answer(self, body):
        if body.get("model") != "scripted":
            return self.send(404, {"error": {"message": "no such model", "code": "model_not_found"}})
        m = re.search(r"DOC-(\d+)", body["messages"][0]["content"])
        n = int(m.group(1)) if m else -1
        with lock:
            k = state["attempts"][n] = state["attempts"].get(n, 0) + 1
        plan = script.get("docs", {}).get(str(n), [default(n)])
        r = plan[min(k, len(plan)) - 1]
        time.sleep(r.get("sleep", script.get("delay", 0)))
        log.write(f"{n} {k} {r.get('status', 200)}\n")
        if "raw" in r:
            return self.send(r.get("status", 200), r["raw"].encode(), "text/plain")
        if r.get("status", 200) != 200:
            return self.send(r["status"], {"error": {"message": r.get("message", "scripted failure"), "code": r.get("code")}})
        msg = {"role": "assistant", "content": r["answer"]}
        self.send(200, {"id": "x", "object": "chat.completion", "created": 0, "model": "scripted",
                        "choices": [{"index": 0, "message": msg, "finish_reason": r.get("finish", "stop")}],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
        with lock:
            state["answered"] += 1
            if state["answered"] == script.get("die_after"):
                os.kill(os.getpid(), signal.SIGKILL)  # a crash mid-run, with other requests in flight

server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H)
server.daemon_threads = True
print("PORT", server.server_address[1], flush=True)
server.serve_forever()
'''


class Scripted:
    """The scripted server as a process on 127.0.0.1: `url`, its request log, its counters."""

    def __init__(self, d: Path, script: dict, port: int = 0):
        d.mkdir(parents=True, exist_ok=True)
        (d / "server.py").write_text(SCRIPTED)
        (d / "script.json").write_text(json.dumps(script))
        self.log = d / "requests.log"
        self.log.touch()
        self.proc = subprocess.Popen([sys.executable, str(d / "server.py"), str(port), str(d / "script.json"), str(self.log)],
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            self.stop()
            raise AssertionError(f"the scripted server did not start: {line!r}")
        self.port = int(line.split()[1])
        self.url = f"http://127.0.0.1:{self.port}/v1"

    def requests(self) -> list[tuple[int, int, int]]:
        """(document, attempt, status) of every request answered, in order."""
        return [tuple(map(int, x.split())) for x in self.log.read_text().splitlines()]

    def stats(self) -> dict:
        return httpx.get(f"http://127.0.0.1:{self.port}/stats", timeout=10).json()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def docs(d: Path, n: int, files: int = 1, start: int = 0, extra: dict | None = None) -> list[Path]:
    """`files` Parquet files of `n` documents in all, each naming its number (DOC-i) for the server."""
    d.mkdir(parents=True, exist_ok=True)
    out = []
    per = -(-n // files)
    for f in range(files):
        ids = range(start + f * per, start + min(n, (f + 1) * per))
        texts = [f"DOC-{i} " + " ".join(random.Random(i).choices(WORDS, k=30)) for i in ids]
        cols = {"id": [f"d{i}" for i in ids], "text": texts, "url": [f"https://example.com/{i}" for i in ids]}
        for k, v in (extra or {}).items():
            cols[k] = v
        pq.write_table(pa.table(cols), d / f"in-{f}.parquet")
        out.append(d / f"in-{f}.parquet")
    return out


def rows(out: Path) -> list[dict]:
    return [r for p in sorted(out.glob("part-*.parquet")) for r in pq.read_table(p).to_pylist()]


def endpoint_cfg(url: str, **kw) -> AnnotateConfig:
    return AnnotateConfig(endpoint=url, **{"concurrency": 4, "retries": 2, "backoff": 0.05, "timeout": 20, **kw})


ONE = RunOptions(workers=1)


# ---------------------------------------------------------------------------------------------
# the stage against the scripted server


def test_good_answers_garbage_bodies_errors_and_retries(tmp_path):
    n = 24
    script = {"delay": 0.02, "docs": {
        "1": [{"raw": "<html>502 Bad Gateway</html>"}],  # a 200 that is no chat completion
        "2": [{"raw": '{"choices": []}'}],
        "3": [{"status": 500}, {"status": 500}, {"answer": "Fine.\nEducational score: 5"}],  # retried, then answered
        "4": [{"status": 500}],  # fails every time: the row fails for good
        "5": [{"status": 400, "message": "This model's maximum context length is 8 tokens", "code": "context_length_exceeded"}],
        "6": [{"status": 422}],
        "7": [{"answer": "I cannot tell."}],  # no score line
        "8": [{"answer": "Educational score: 3 out of 5"}],
        "9": [{"answer": "Educational score: 9"}],
        "10": [{"answer": "Educational score: 2\nEducational score: 4"}],
        "11": [{"answer": "Let me think about the page and", "finish": "length"}],
        "12": [{"status": 503}, {"answer": "Educational score: 1"}],  # unavailable a moment: retried
    }}
    with Scripted(tmp_path / "srv", script) as srv:
        inputs = docs(tmp_path / "in", n, files=2)
        progress = RecordingProgress()
        m = run_annotate([str(p) for p in inputs], str(tmp_path / "out"), endpoint_cfg(srv.url), ONE, progress)
        stats = srv.stats()
        reqs = srv.requests()
    got = rows(tmp_path / "out")
    assert [r["id"] for r in got] == [f"d{i}" for i in range(n)]  # every row, in order, other columns kept
    assert all(r["url"] == f"https://example.com/{i}" for i, r in enumerate(got))
    want = {i: i % 6 for i in range(n)} | {1: None, 2: None, 3: 5, 4: None, 5: None, 6: None, 7: None, 8: None,
                                          9: None, 10: 4, 11: None, 12: 1}
    assert {i: r["score"] for i, r in enumerate(got)} == want
    assert got[7]["annotation"] == "I cannot tell." and got[1]["annotation"] is None and got[10]["annotation"].endswith("score: 4")
    c = m.counts
    assert (c["scored"], c["unparseable"], c["failed"]) == (n - 9, 4, 5)
    assert c["failures"] == {"bad_response": 2, "http_500": 1, "context_length_exceeded": 1, "http_422": 1}
    assert c["answers_cut"] == 1 and c["in"] == c["out"] == n and c["resumed"] == 0
    assert c["scores"] == {str(s): sum(v == s for v in want.values()) for s in range(6)}
    assert sum(c["scores"].values()) == c["scored"]
    # 500: the first try and 2 retries; 4xx and bad bodies: asked once
    tries = {d: max(k for dd, k, _ in reqs if dd == d) for d in range(n)}
    assert (tries[3], tries[4], tries[12], tries[5], tries[6], tries[1]) == (3, 3, 2, 1, 1, 1)
    assert 1 < stats["max_inflight"] <= 4  # bounded concurrency, and used
    assert m.config["backend"] == "endpoint" and m.config["model"] == "scripted"  # the one model the server lists
    assert m.config["prompt"] == "edu" and m.config["prompt_sha256"] == __import__("hashlib").sha256(EDU_PROMPT.encode()).hexdigest()
    assert m.config["run"]["endpoint"] == srv.url and m.config["run"]["concurrency"] == 4
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["counts"]["scored"] == n - 9 and manifest["config"]["prompt_sha256"] == m.config["prompt_sha256"]
    assert not list((tmp_path / "out" / ".shards").glob("*.answers.jsonl"))  # the caches go with the manifest
    assert progress.done == n


def test_empty_texts_are_skipped_and_never_asked_and_annotation_can_be_dropped(tmp_path):
    texts = ["DOC-0 bread", "", None, "DOC-3 mill", "   "]
    pq.write_table(pa.table({"id": ["a", "b", "c", "d", "e"], "text": texts}), tmp_path / "in.parquet")
    with Scripted(tmp_path / "srv", {"docs": {"-1": [{"answer": "Educational score: 2"}]}}) as srv:
        m = run_annotate([str(tmp_path / "in.parquet")], str(tmp_path / "out"), endpoint_cfg(srv.url, keep_annotation=False), ONE)
        asked = sorted(d for d, _, _ in srv.requests())
    got = rows(tmp_path / "out")
    assert [r["id"] for r in got] == ["a", "d", "e"] and [r["score"] for r in got] == [0, 3, 2]
    assert "annotation" not in got[0]
    assert asked == [-1, 0, 3]  # the blank one is asked (it has text); empty and null ones are not
    assert m.counts["skipped"] == {"empty_text": 1, "null_text": 1}
    assert m.counts["in"] == 3 and m.counts["unparseable"] == 0 and m.counts["scored"] == 3


def test_a_crash_mid_run_then_a_resume_asks_only_for_the_rows_without_an_answer(tmp_path):
    n = 60
    inputs = [str(p) for p in docs(tmp_path / "in", n, files=3)]
    out = tmp_path / "out"
    with Scripted(tmp_path / "srv1", {"delay": 0.01, "die_after": 13}) as srv:
        progress = RecordingProgress()
        with pytest.raises(StageFailed) as e:
            run_annotate(inputs, str(out), endpoint_cfg(srv.url), ONE, progress)
        first = srv.requests()
    msg = str(e.value)
    assert "\n" not in msg and "did not answer after 3 tries" in msg and "run the same command again to resume" in msg, msg
    assert not (out / "manifest.json").exists() and not list(out.glob("part-*.parquet"))  # nothing looks finished
    caches = sorted((out / ".shards").glob("*.answers.jsonl"))
    kept = {int(json.loads(x)["i"]) for x in caches[0].read_text().splitlines()[1:]}
    assert len(caches) == 1 and len(kept) >= 12  # the answers in before the crash are kept
    assert {d for d, _, _ in first} <= set(range(20))  # the other shards were not asked once the server was given up
    # the server comes back (elsewhere: where it is is not the run's identity) and the same command resumes
    with Scripted(tmp_path / "srv2", {"delay": 0.01}) as srv:
        m = run_annotate(inputs, str(out), endpoint_cfg(srv.url), ONE)
        second = [d for d, _, _ in srv.requests()]
    assert sorted(second) == sorted(set(range(n)) - kept)  # each row without an answer asked once, no other
    got = rows(out)
    assert [r["id"] for r in got] == [f"d{i}" for i in range(n)] and [r["score"] for r in got] == [i % 6 for i in range(n)]
    assert m.counts["scored"] == n and m.counts["failed"] == 0 and m.counts["resumed"] == len(kept)
    assert (out / "manifest.json").exists() and not list((out / ".shards").glob("*.answers.jsonl"))
    # the same run again does nothing more; another prompt is another run, refused
    with Scripted(tmp_path / "srv3", {}) as srv:
        run_annotate(inputs, str(out), endpoint_cfg(srv.url), ONE)
        assert srv.requests() == []
        other = tmp_path / "other.txt"
        other.write_text("Rate {text}\nScore: N")
        with pytest.raises(UsageError, match="different annotate config"):
            run_annotate(inputs, str(out), endpoint_cfg(srv.url, prompt=str(other)), ONE)


def test_an_unreachable_endpoint_is_one_line_and_writes_nothing(tmp_path):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    inputs = [str(p) for p in docs(tmp_path / "in", 5)]
    t0 = time.monotonic()
    with pytest.raises(StageFailed) as e:
        run_annotate(inputs, str(tmp_path / "out"), endpoint_cfg(f"http://127.0.0.1:{port}"), ONE)
    assert "did not answer after 3 tries" in str(e.value) and "ConnectError" in str(e.value) and "\n" not in str(e.value)
    assert time.monotonic() - t0 < 15 and not (tmp_path / "out").exists()
    # a wrong model name: the first request's 404 ends the run, nothing is finished
    with Scripted(tmp_path / "srv", {}) as srv:
        with pytest.raises(StageFailed, match="HTTP 404: no such model"):
            run_annotate(inputs, str(tmp_path / "out2"), endpoint_cfg(srv.url, model="gpt-9"), ONE)
        assert len(srv.requests()) <= 4  # the requests in flight at most, not every row
    assert not (tmp_path / "out2" / "manifest.json").exists()


def cli_process(*args, timeout: int = 120) -> subprocess.Popen:
    """`llmctl annotate ARGS` as a process, through llmctl's own main() (exit codes, one-line
    errors); the command is added to the app here when the CLI does not have it yet."""
    code = ("import sys\nfrom llmctl import cli\nfrom llmctl.cli import annotate\n"
            "if not any(g.typer_instance is annotate.app for g in cli.app.registered_groups):\n"
            "    cli.app.add_typer(annotate.app)\n"
            "cli.main(sys.argv[1:])\n")
    return subprocess.Popen([sys.executable, "-c", code, "annotate", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200", "OMP_NUM_THREADS": "1"})


def test_cli_kill_9_mid_run_then_the_same_command_finishes(tmp_path):
    n = 40
    inputs = docs(tmp_path / "in", n)
    out = tmp_path / "out"
    with Scripted(tmp_path / "srv", {"delay": 0.2}) as srv:
        args = [*inputs, "-o", out, "--endpoint", srv.url, "--concurrency", "2", "-q"]
        p = cli_process(*args)
        cache = out / ".shards" / "part-00000.answers.jsonl"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not cache.exists() or len(cache.read_text().splitlines()) < 8):
            time.sleep(0.05)
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
        kept = len(cache.read_text().splitlines()) - 1
        assert 8 <= kept < n
        p = cli_process(*args, "--json")
        stdout, stderr = p.communicate(timeout=120)
        assert p.returncode == 0, stderr
        asked = [d for d, _, _ in srv.requests()]
    summary = json.loads(stdout)
    assert summary["counts"]["scored"] == n and summary["counts"]["resumed"] >= kept - 1
    assert len(asked) <= n + 2 and set(asked) == set(range(n))  # at most the 2 in flight at the kill asked twice
    assert [r["score"] for r in rows(out)] == [i % 6 for i in range(n)]


@pytest.fixture
def with_annotate(monkeypatch):
    """llmctl's main() with the annotate command in its app (added here when the CLI lacks it)."""
    import typer

    from llmctl import cli
    from llmctl.cli import annotate

    if not any(g.typer_instance is annotate.app for g in cli.app.registered_groups):
        app = typer.Typer()
        app.callback()(lambda: None)
        app.add_typer(annotate.app)
        monkeypatch.setattr(cli, "app", app)


def test_cli_errors_are_one_line(tmp_path, with_annotate):
    from test_bad_input import cli

    inputs = docs(tmp_path / "in", 2)
    for i, (args, code, words) in enumerate([
        ([], 2, "needs one backend"),
        (["--endpoint", "http://127.0.0.1:9", "--checkpoint", tmp_path], 2, "needs one backend"),
        (["--endpoint", "ftp://x"], 2, "not an http(s) URL"),
        (["--endpoint", "http://127.0.0.1:9", "--prompt", tmp_path / "nope.txt"], 2, "neither a built-in prompt"),
        (["--endpoint", "http://127.0.0.1:9", "--max-score", "10"], 2, "--prompt edu scores 0 to 5"),
        (["--endpoint", "http://127.0.0.1:9", "--concurrency", "0"], 2, "--concurrency must be >= 1, got 0"),
        (["--endpoint", "http://127.0.0.1:9", "--timeout", "nan"], 2, "--timeout must be finite"),
        (["--checkpoint", tmp_path / "none"], 2, "checkpoint not found"),
        (["--endpoint", "http://127.0.0.1:9", "--retries", "0", "--backoff", "0"], 1, "did not answer after 1 try"),
    ]):
        r = cli("annotate", *inputs, "-o", tmp_path / f"o{i}", *args)
        lines = r.err.strip().splitlines()
        assert r.code == code and len(lines) == 1 and words in lines[0] and "Traceback" not in r.err, r.why()
        assert not (tmp_path / f"o{i}").exists()


# ---------------------------------------------------------------------------------------------
# a real `llmctl serve` of a tiny model, and the same checkpoint run here


@pytest.fixture(scope="module")
def tiny_chat(tmp_path_factory):
    """A random tiny chat model (tests/preflib's tokenizer) with a context the rubric fits in."""
    import torch

    from llmctl.artifacts.checkpoint import save_checkpoint
    from llmctl.model.config import ModelConfig
    from llmctl.model.transformer import Transformer
    from preflib import make_checkpoint

    d = tmp_path_factory.mktemp("annotate-model")
    _, tok = make_checkpoint(d)
    cfg = ModelConfig(vocab_size=300, n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_ff=128, max_seq_len=2048)
    torch.manual_seed(0)
    save_checkpoint(d / "chat", 0, cfg, Transformer(cfg).state_dict(), {"step": 0, "chat": True}, tokenizer_file=tok)
    return d / "chat"


def test_a_real_llmctl_serve_of_a_tiny_model_and_the_same_checkpoint_here(tiny_chat, tmp_path):
    n = 12
    inputs = [str(p) for p in docs(tmp_path / "in", n, files=2)]
    srv = Server(tiny_chat, "--served-model-name", "tiny")  # tests/test_serve.py's
    try:
        m = run_annotate(inputs, str(tmp_path / "served"), endpoint_cfg(srv.url + "/v1", max_chars=200, max_tokens=12), ONE)
    finally:
        srv.kill()
    served = rows(tmp_path / "served")
    assert [r["id"] for r in served] == [f"d{i}" for i in range(n)]  # no row lost
    c = m.counts
    assert c["in"] == c["out"] == n and c["failed"] == 0 and c["scored"] + c["unparseable"] == n
    assert c["unparseable"] == n and c["answers_cut"] > 0  # a random model's answers: garbage, counted as such
    assert all(isinstance(r["annotation"], str) for r in served) and m.config["model"] == "tiny"
    # the same checkpoint through the engine here: the same greedy answers, batched
    local = run_annotate(inputs, str(tmp_path / "local"), AnnotateConfig(checkpoint=str(tiny_chat), max_chars=200, max_tokens=12,
                                                                        batch_size=5, device="cpu"), ONE)
    assert [r["annotation"] for r in rows(tmp_path / "local")] == [r["annotation"] for r in served]
    assert local.counts["unparseable"] == n and local.config["backend"] == "checkpoint" and len(local.config["weights_sha256"]) == 64
    # a prompt past the context: failed for good, counted by why, the run finishes
    long = run_annotate(inputs[:1], str(tmp_path / "long"), AnnotateConfig(checkpoint=str(tiny_chat), max_chars=0, max_tokens=2040,
                                                                          device="cpu"), ONE)
    assert long.counts["failures"] == {"context_length_exceeded": 6} and [r["score"] for r in rows(tmp_path / "long")] == [None] * 6
    with pytest.raises(UsageError, match="--max-tokens must be at most the context length 2048"):
        run_annotate(inputs, str(tmp_path / "x"), AnnotateConfig(checkpoint=str(tiny_chat), max_tokens=5000), ONE)
