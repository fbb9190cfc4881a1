"""`llmctl serve` (src/llmctl/serve/): a real server process on 127.0.0.1, driven by OpenAI's own
Python client — completions, chat, streaming, n, stop strings, seeds, the error paths — and its
answers held to `llmctl generate`'s on the same checkpoint. The pieces without a socket (streamed
text deltas, request checks, an engine failure, an exported folder) run in this process."""

from __future__ import annotations

import json
import random
import shutil
import signal
import socket
import tempfile
import threading
from pathlib import Path

import httpx
import pytest

from conftest import ROOT, llmctl
from preflib import OBJECTS, SUBJECTS, VERBS, make_checkpoint, write_jsonl
from servelib import Server
from llmctl.artifacts.checkpoint import save_checkpoint
from llmctl.model.config import ModelConfig
from llmctl.model.transformer import Transformer

openai = pytest.importorskip("openai")

QUESTIONS = [f"What does {s} do?" for s in SUBJECTS[:4]] + ["Tell me about the river and the market, please."]
CONTEXT = 256


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny chat model taught by 60 SFT steps to answer one sentence and end its turn (with a
    context of 256 so a long request has room), and the same weights as a plain, non-chat
    checkpoint."""
    import torch

    d = tmp_path_factory.mktemp("serve")
    _, tok = make_checkpoint(d)  # its tokenizer, with llmctl's chat tokens
    cfg = ModelConfig(vocab_size=300, n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_ff=128, max_seq_len=CONTEXT)
    torch.manual_seed(0)
    save_checkpoint(d / "base", 0, cfg, Transformer(cfg).state_dict(), {"step": 0, "chat": True}, tokenizer_file=tok)
    rng = random.Random(0)
    write_jsonl(d / "chats.jsonl", [{"messages": [
        {"role": "user", "content": f"What does {s} do?"},
        {"role": "assistant", "content": f"{s.capitalize()} {rng.choice(VERBS)} {rng.choice(OBJECTS)}."}]}
        for s in (rng.choice(SUBJECTS) for _ in range(60))])
    llmctl("train", "--sft", d / "chats.jsonl", "--init", d / "base", "-o", d / "sft", "--seq-len", "64",
           "--batch-tokens", "512", "--micro-batch", "8", "--max-steps", "60", "--lr", "3e-3", "--set", "train.warmup_frac=0",
           "--set", "train.warmup_tokens=0", "--threads", "1", "--eval-every", "0", "--quiet", check=True, cwd=ROOT)
    step = next((d / "sft" / "checkpoints").glob("step-*"))
    shutil.copytree(step, d / "plain")
    state = json.loads((d / "plain" / "trainer_state.json").read_text())
    (d / "plain" / "trainer_state.json").write_text(json.dumps({**state, "chat": False, "chat_template": None}))
    return {"dir": d, "chat": d / "sft", "plain": d / "plain"}


@pytest.fixture(scope="module")
def chat_server(models):
    s = Server(models["chat"])
    try:
        yield s
    finally:
        code, err = s.stop()
        assert code == 0 and "stopped (SIGTERM)" in err and "Traceback" not in err, err


@pytest.fixture(scope="module")
def plain_server(models):
    s = Server(models["plain"], "--served-model-name", "plain")
    try:
        yield s
    finally:
        s.kill()


def generate(path, prompts, *args) -> list[dict]:
    p = llmctl("generate", path, *[x for q in prompts for x in ("-p", q)], *args, "--json", check=True)
    return json.loads(p.stdout)


def chat(s: Server, content: str, **kw):
    return s.client.chat.completions.create(model=s.name, messages=[{"role": "user", "content": content}], **kw)


# ---------------------------------------------------------------------------------------------
# a real server


def test_models_and_health(chat_server):
    assert [m.id for m in chat_server.client.models.list()] == [chat_server.name]
    assert chat_server.health()["status"] == "ok"


def test_chat_at_temperature_0_is_what_generate_says(models, chat_server):
    want = generate(models["chat"], QUESTIONS, "--max-new-tokens", "40")
    got = [chat(chat_server, q, temperature=0, max_tokens=40) for q in QUESTIONS]
    assert [r.choices[0].message.content for r in got] == [w["completion"] for w in want]
    assert [r.choices[0].finish_reason for r in got] == ["stop" if w["finish"] == "eos" else "length" for w in want]
    assert any(w["finish"] == "eos" for w in want)  # the model ends its turn: finish "stop" is exercised
    for r, w in zip(got, want):
        u = r.usage
        assert u.completion_tokens == w["tokens"] and u.prompt_tokens > 5 and u.total_tokens == u.prompt_tokens + u.completion_tokens


def test_completions_at_temperature_0_are_what_generate_says(models, plain_server):
    prompts = ["The miller carries", "Our market", "A farmer watches the stone"]
    want = generate(models["plain"], prompts, "--max-new-tokens", "12")
    r = plain_server.client.completions.create(model="plain", prompt=prompts, temperature=0, max_tokens=12)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.text for c in r.choices] == [w["completion"] for w in want]
    assert r.usage.completion_tokens == sum(w["tokens"] for w in want)


def test_streamed_deltas_are_the_whole_answer(chat_server):
    for q in QUESTIONS:
        whole = chat(chat_server, q, temperature=0, max_tokens=60).choices[0]
        chunks = list(chat(chat_server, q, temperature=0, max_tokens=60, stream=True,
                           stream_options={"include_usage": True}))
        assert chunks[0].choices[0].delta.role == "assistant"
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert text == whole.message.content and finish == [whole.finish_reason]
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    s = chat_server.client.completions.create(model=chat_server.name, prompt="the river", temperature=0, max_tokens=30, stream=True)
    w = chat_server.client.completions.create(model=chat_server.name, prompt="the river", temperature=0, max_tokens=30)
    assert "".join(c.choices[0].text for c in s) == w.choices[0].text


def test_n_samples_and_seeds(models, chat_server):
    """With a seed the samples are reproducible, and they are `llmctl generate --seed`'s: sample i
    of the request draws from the seed generate gives row i."""
    q = QUESTIONS[0]
    a = chat(chat_server, q, n=4, temperature=1.0, seed=7, max_tokens=30)
    b = chat(chat_server, q, n=4, temperature=1.0, seed=7, max_tokens=30)
    assert [c.index for c in a.choices] == [0, 1, 2, 3]
    texts = [c.message.content for c in a.choices]
    assert texts == [c.message.content for c in b.choices]
    assert len(set(texts)) > 1  # the samples are not one sample repeated
    want = generate(models["chat"], [q], "-n", "4", "--temperature", "1", "--seed", "7", "--max-new-tokens", "30")
    assert texts == [w["completion"] for w in want]
    other = chat(chat_server, q, n=4, temperature=1.0, seed=8, max_tokens=30)
    assert [c.message.content for c in other.choices] != texts
    unseeded = [chat(chat_server, q, n=4, temperature=1.0, max_tokens=30) for _ in range(2)]
    assert [c.message.content for c in unseeded[0].choices] != [c.message.content for c in unseeded[1].choices]


def test_stop_strings_cut_whole_and_streamed_answers(chat_server):
    full = chat(chat_server, QUESTIONS[0], temperature=0, max_tokens=60).choices[0].message.content
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    want = full[: full.index(stop)]
    for stops in (stop, ["zzz-never", stop]):
        r = chat(chat_server, QUESTIONS[0], temperature=0, max_tokens=60, stop=stops).choices[0]
        assert (r.message.content, r.finish_reason) == (want, "stop")
        streamed = chat(chat_server, QUESTIONS[0], temperature=0, max_tokens=60, stop=stops, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in streamed) == want


def test_logprobs_of_a_whole_answer(chat_server):
    r = chat(chat_server, QUESTIONS[1], temperature=0, max_tokens=20, logprobs=True).choices[0]
    content = r.logprobs.content
    assert "".join(t.token for t in content) == r.message.content
    assert all(t.logprob <= 0 for t in content)


def test_bad_requests_are_4xx_json_and_the_server_lives(chat_server):
    s = chat_server
    bad = [dict(n=0), dict(n=129), dict(temperature=-1), dict(top_p=0), dict(max_tokens=0), dict(max_tokens=CONTEXT),
           dict(seed=-1), dict(stop=["a", "b", "c", "d", "e"]), dict(stop=""), dict(presence_penalty=1.0),
           dict(extra_body={"top_k": -1}), dict(extra_body={"n": True}), dict(extra_body={"temperature": "hot"})]
    for kw in bad:
        with pytest.raises(openai.BadRequestError) as e:
            chat(s, "hi", **kw)
        err = e.value.body
        assert set(err) >= {"message", "type", "param", "code"} and err["type"] == "invalid_request_error", kw
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        chat(s, "hi " * 300)
    for messages in ([], [{"role": "robot", "content": "hi"}], [{"role": "user", "content": 3}],
                     [{"role": "assistant", "content": "hi"}]):
        with pytest.raises(openai.BadRequestError):
            s.client.chat.completions.create(model=s.name, messages=messages)
    with pytest.raises(openai.NotFoundError) as e:
        s.client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        s.client.completions.create(model=s.name, prompt=[[1, 2], [10**6]])
    for method, path, body, status in (("POST", "/v1/chat/completions", b"{not json", 400),
                                       ("POST", "/v1/completions", b"[1, 2]", 400),
                                       ("POST", "/v1/completions", b"[" * 100_000, 400),  # past the parser's stack
                                       ("POST", "/v1/completions", b" " * (17 << 20), 413),
                                       ("GET", "/v1/nowhere", None, 404), ("GET", "/v1/completions", None, 405)):
        r = httpx.request(method, s.url + path, content=body)
        assert r.status_code == status and set(r.json()["error"]) == {"message", "type", "param", "code"}, r.text
    assert chat(s, QUESTIONS[0], temperature=0, max_tokens=5).choices[0].message.content  # still serving


def test_a_plain_checkpoint_refuses_chat(plain_server):
    with pytest.raises(openai.BadRequestError) as e:
        plain_server.client.chat.completions.create(model="plain", messages=[{"role": "user", "content": "hi"}])
    assert e.value.body["code"] == "not_a_chat_model"


def test_a_client_that_goes_away_aborts_its_request(plain_server):
    s, body = plain_server, {"model": "plain", "prompt": "the river", "temperature": 0, "max_tokens": CONTEXT - 10}
    # as a plain model it does not stop at its turn end: this answer runs to max_tokens
    assert s.client.completions.create(**body).choices[0].finish_reason == "length"
    before = s.health()["requests"]
    with httpx.stream("POST", s.url + "/v1/completions", json={**body, "stream": True}, timeout=60) as r:
        next(r.iter_lines())  # the stream has begun; leave without reading the rest
    for _ in range(600):  # the engine thread takes the abort between two steps
        now = s.health()["requests"]
        if now["running"] == 0:
            break
        threading.Event().wait(0.05)
    assert now["aborted"] == before["aborted"] + 1 and now["finished"] == before["finished"] and now["running"] == 0


def test_concurrent_requests_get_their_own_answers(chat_server):
    from concurrent.futures import ThreadPoolExecutor

    alone = [chat(chat_server, q, temperature=0, max_tokens=40).choices[0].message.content for q in QUESTIONS]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda q: chat(chat_server, q, temperature=0, max_tokens=40).choices[0].message.content,
                                 QUESTIONS * 3))
    assert together == alone * 3


def test_sigint_stops_the_server_cleanly(models):
    s = Server(models["plain"])
    code, err = s.stop(signal.SIGINT)
    assert code == 0 and "stopped (SIGINT)" in err and "Traceback" not in err, err


def test_bad_flags_are_refused_before_the_model_loads(models, tmp_path):
    from test_bad_input import cli, usage_error

    for args, words in ((["--port", "70000"], "--port must be at most 65535"), (["--port", "-1"], "--port must be >= 0"),
                        (["--weights", "best"], "--weights must be one of"), (["--host", "192.0.2.1"], "--host 192.0.2.1 --port 8000: cannot listen there")):  # RFC 5737's TEST-NET-1
        usage_error(cli("serve", models["chat"], *args), words)
    usage_error(cli("serve", tmp_path / "nothing", "--port", "0"), "not found")
    with socket.socket() as taken:  # a port in use
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        usage_error(cli("serve", models["chat"], "--port", str(taken.getsockname()[1])), "cannot listen there")


# ---------------------------------------------------------------------------------------------
# in this process


def test_deltas_hold_back_split_characters_and_stop_prefixes():
    from llmctl.serve.text import DeltaText, held_for_stop

    pieces = {1: b"ab", 2: b"\xc3", 3: b"\xa9", 4: b"cd", 5: b"ST", 6: b"OP", 7: b"S"}
    decode = lambda ids: b"".join(pieces[i] for i in ids).decode("utf-8", errors="replace")  # noqa: E731
    t = DeltaText(decode, stop=["STOP"])
    assert [t.add([i]) for i in (1, 2, 3, 4, 7)] == ["ab", "", "é", "cd", ""]
    assert t.finish("abécdS") == "S"
    t = DeltaText(decode, stop=["STOP"])
    assert [t.add([i]) for i in (1, 5)] == ["ab", ""] and t.finish("ab") == ""
    assert held_for_stop("xxST", ["STOP", "T!"]) == 2 and held_for_stop("xxST", ["Q"]) == 0


def test_request_checks(models):
    from llmctl.serve.model import load_served
    from llmctl.serve.protocol import ApiError, chat_job, completion_job

    served = load_served(models["chat"], "m")
    ok = {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "you"}]}]}
    job = chat_job(ok, served)
    assert job.prompts == [served.chat.prompt_ids([{"role": "user", "content": "hi you"}])]
    assert job.params.max_new_tokens == CONTEXT - len(job.prompts[0]) and job.params.temperature == 1.0
    assert chat_job({**ok, "seed": 3, "n": 2}, served).seeds == chat_job({**ok, "seed": 3, "n": 2}, served).seeds
    assert completion_job({"model": "m", "prompt": "x"}, served).params.max_new_tokens == 16  # OpenAI's default
    for body, param in (({**ok, "temperature": float("nan")}, "temperature"), ({**ok, "seed": 2**70}, "seed"),
                        ({**ok, "n": 2.5}, "n"), ({**ok, "max_completion_tokens": 0}, "max_completion_tokens"),
                        ({**ok, "stream_options": {"include_usage": True}}, "stream_options"),
                        ({**ok, "logprobs": True, "stream": True}, "logprobs"), ({**ok, "top_logprobs": 2}, "top_logprobs"),
                        ({**ok, "tools": [{"type": "function"}]}, "tools")):
        with pytest.raises(ApiError) as e:
            chat_job(body, served)
        assert e.value.status == 400 and e.value.param == param, body
    with pytest.raises(ApiError) as e:
        completion_job({"model": "m", "prompt": ["a"] * 129}, served)
    assert e.value.param == "prompt" and e.value.message.startswith("the number of prompts must be at most 128")


def test_an_engine_failure_is_a_500_and_the_next_request_is_served(models):
    from starlette.testclient import TestClient

    from llmctl.model.generate import Engine
    from llmctl.serve.app import build_app
    from llmctl.serve.model import load_served
    from llmctl.serve.worker import EngineWorker

    served = load_served(models["chat"], "m")
    worker = EngineWorker(Engine.for_vocab(served.model, served.vocab, chat=True))

    def broken():
        raise RuntimeError("a broken step")

    worker.scheduler.step = broken  # the first scheduler's steps fail; the worker then starts a fresh one
    worker.start()
    body = {"model": "m", "messages": [{"role": "user", "content": QUESTIONS[0]}], "temperature": 0, "max_tokens": 5}
    try:
        with TestClient(build_app(served, worker)) as client:
            r = client.post("/v1/chat/completions", json=body)
            assert r.status_code == 500 and "a broken step" in r.json()["error"]["message"]
            r = client.post("/v1/chat/completions", json=body)
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
            assert client.get("/health").json()["requests"]["failed"] == 1
    finally:
        worker.close()


def test_an_exported_folder_is_served_as_its_checkpoint(models, tmp_path):
    from llmctl.model.generate import Engine, SamplingParams
    from llmctl.serve.model import load_served

    llmctl("export", models["chat"], "-o", tmp_path / "hf", check=True)
    before = set(Path(tempfile.gettempdir()).glob("llmctl-serve-*"))
    exported, ours = load_served(tmp_path / "hf", "hf"), load_served(models["chat"], "ck")
    assert set(Path(tempfile.gettempdir()).glob("llmctl-serve-*")) == before  # its temporary checkpoint is gone
    assert exported.source == "export" and exported.chat is not None and exported.context == CONTEXT
    prompts = [ours.chat.prompt_ids([{"role": "user", "content": q}]) for q in QUESTIONS]
    assert [exported.chat.prompt_ids([{"role": "user", "content": q}]) for q in QUESTIONS] == prompts
    params = SamplingParams(max_new_tokens=30)
    texts = [[g.text for g in Engine.for_vocab(m.model, m.vocab, chat=True).generate(prompts, params)] for m in (exported, ours)]
    assert texts[0] == texts[1]
