"""Who answers `llmctl annotate`'s prompts (eval/annotate.py): an OpenAI-compatible server
(`--endpoint`), or a checkpoint run here through llmctl's own engine (`--checkpoint`).

Both take a list of prompts and hand each answer back as it comes (`got(k, Answer)`), so the
stage can keep it at once (its answer cache is what a re-run resumes from). An `Answer` is either
the model's text (`cut` when it stopped at max_tokens) or a failure for good (`failure`: why), a
failure that asking again would not mend: the request was refused (HTTP 400: the prompt past the
model's context, `context_length_exceeded`), the server kept failing on it (HTTP 500 after every
retry) or answered something that is not a chat completion (`bad_response`).

The endpoint client (asyncio + httpx) keeps at most `concurrency` requests in flight and retries
a request with exponential backoff (honouring Retry-After) on a connection error, a timeout and a
5xx or 408/429. A server that is not there — no connection, no answer in time, 502/503/504/429
after every retry — is not a property of the document: the request raises `EndpointDown`, the
requests not yet sent are not sent (`DOWN` holds the reason for the rest of the run), the answers
already in are handed back, and the stage leaves the shard unfinished, so a re-run asks again for
exactly the rows that got no answer. 401/403/404/405 (a wrong key, model or URL) would fail every
row alike: they end the run at the first one (`EndpointDown` too).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from llmctl.errors import StageFailed, UsageError

KEY_ENV = "LLMCTL_API_KEY"  # the endpoint's API key, if it wants one: never in a config or manifest
PREFLIGHT_S = 30.0  # GET /v1/models lists names: a server that takes longer to answer it is not answering
MAX_WAIT_S = 60.0  # the longest wait between two tries of a request, Retry-After included
UNAVAILABLE = {408, 429, 502, 503, 504}  # the server is not there, or not now: retried, then the shard waits for a re-run
FATAL = {401, 403, 404, 405}  # a wrong key, model or URL: every row would fail alike
DOWN: dict[str, str] = {}  # run token -> why the endpoint was given up on (one process's shards skip it after)


class Answer(NamedTuple):
    text: str | None  # the model's answer; None when the row failed for good
    failure: str | None = None  # why the row failed for good (http_400, context_length_exceeded, http_500, bad_response)
    cut: bool = False  # the answer stopped at max_tokens


class EndpointDown(Exception):
    """The endpoint did not answer (or refused every request): the shard stays unfinished."""


Got = Callable[[int, Answer], None]


# ---------------------------------------------------------------------------------------------
# the endpoint


def need_httpx():
    """The httpx module (the `annotate` extra), or a one-line usage error saying how to get it."""
    try:
        import httpx
    except ImportError as e:
        raise UsageError(f"llmctl annotate --endpoint needs httpx: pip install 'llmctl[annotate]' ({e})") from None
    return httpx


def endpoint_urls(endpoint: str) -> tuple[str, str]:
    """(chat completions URL, models URL) of `endpoint`: a base URL (http://host:8000 or
    http://host:8000/v1, as OpenAI's clients take it) or the chat completions URL itself."""
    httpx = need_httpx()

    u = endpoint.strip().rstrip("/")
    try:
        url = httpx.URL(u)
    except (httpx.InvalidURL, TypeError) as e:
        raise UsageError(f"--endpoint {endpoint!r}: not a URL ({e})") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise UsageError(f"--endpoint {endpoint!r}: not an http(s) URL with a host (e.g. http://127.0.0.1:8000/v1)")
    if u.endswith("/chat/completions"):
        base = u[: -len("/chat/completions")]
    else:
        base = u if u.endswith("/v1") else u + "/v1"
    return base + "/chat/completions", base + "/models"


def tries(retries: int) -> str:
    return "1 try" if retries == 0 else f"{retries + 1} tries"


def _headers() -> dict:
    key = os.environ.get(KEY_ENV)
    return {"Authorization": f"Bearer {key}"} if key else {}


def wait_s(backoff: float, attempt: int, retry_after: float | None = None) -> float:
    """Seconds before try `attempt` (1, 2, …): backoff·2^(attempt-1) with a little jitter, or the
    server's Retry-After when it says more, at most MAX_WAIT_S."""
    base = min(MAX_WAIT_S, backoff * 2 ** (attempt - 1)) * (0.8 + 0.2 * random.random())
    return min(MAX_WAIT_S, max(base, retry_after or 0.0))


def _retry_after(r) -> float | None:
    try:
        return float(r.headers.get("retry-after", ""))
    except ValueError:
        return None


def _error_text(r) -> str:
    """OpenAI's error message of a refused request, else the start of its body."""
    try:
        body = r.json()
        msg = body.get("error", {}).get("message") if isinstance(body.get("error"), dict) else body.get("error")
        if msg:
            return str(msg)[:200]
    except (ValueError, AttributeError):
        pass
    return r.text[:200].replace("\n", " ")


def _refused(r) -> str:
    """Why a 4xx request failed for good, as a count's name."""
    text = r.text[:4000].lower()
    if "context_length_exceeded" in text or "maximum context length" in text:
        return "context_length_exceeded"
    return f"http_{r.status_code}"


def chat_answer(body: bytes) -> Answer:
    """The answer in a chat completion's JSON; `bad_response` when it is not one."""
    try:
        data = json.loads(body)
        choice = data["choices"][0]
        content = choice["message"].get("content")
        if content is not None and not isinstance(content, str):
            raise TypeError("content is not text")
        return Answer(content or "", None, choice.get("finish_reason") == "length")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return Answer(None, "bad_response")


def resolve_model(endpoint: str, model: str | None, retries: int, backoff: float, timeout: float) -> str:
    """The model to ask: `model`, or the one model the endpoint lists (GET /v1/models). Also
    what shows, before OUT is touched, that the endpoint answers at all: one that does not after
    every retry is a one-line StageFailed."""
    import httpx

    _, models_url = endpoint_urls(endpoint)
    why = ""
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(wait_s(backoff, attempt))
        try:
            r = httpx.get(models_url, headers=_headers(), timeout=min(timeout, PREFLIGHT_S))
        except httpx.HTTPError as e:
            why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            continue
        if r.status_code in UNAVAILABLE or r.status_code >= 500:
            why = f"HTTP {r.status_code}: {_error_text(r)}"
            continue
        if model:
            return model  # any HTTP answer shows the server is there; a wrong name is a 404 at the first request
        try:
            names = [m["id"] for m in r.json()["data"]] if r.status_code == 200 else []
        except (ValueError, KeyError, TypeError):
            names = []
        if len(names) == 1 and isinstance(names[0], str):
            return names[0]
        served = f"it serves {', '.join(map(str, names[:8]))}" if names else f"GET {models_url} did not list one"
        raise UsageError(f"--endpoint {endpoint}: name the model with --model ({served})")
    raise StageFailed(f"--endpoint {endpoint} did not answer after {tries(retries)} ({why}); nothing was written")


@dataclass
class EndpointBackend:
    endpoint: str
    model: str
    max_tokens: int
    concurrency: int
    retries: int
    backoff: float
    timeout: float
    token: str  # the run's: DOWN[token] once the endpoint was given up on

    def answer(self, prompts: list[str], got: Got) -> None:
        """Ask for every prompt, `concurrency` at a time; `got(k, answer)` as each comes. Raises
        EndpointDown once the requests in flight are over when the endpoint was given up on."""
        if self.token in DOWN:
            raise EndpointDown(f"not asked: {DOWN[self.token]}")
        if prompts:
            asyncio.run(self._all(prompts, got))
        if self.token in DOWN:
            raise EndpointDown(DOWN[self.token])

    async def _all(self, prompts: list[str], got: Got) -> None:
        import httpx

        url, _ = endpoint_urls(self.endpoint)
        gate = asyncio.Semaphore(self.concurrency)
        limits = httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)
        async with httpx.AsyncClient(timeout=self.timeout, limits=limits, headers=_headers()) as client:

            async def one(k: int, prompt: str) -> None:
                async with gate:
                    if self.token in DOWN:
                        return
                    try:
                        a = await self._ask(client, url, prompt)
                    except EndpointDown as e:
                        DOWN.setdefault(self.token, str(e))
                        return
                    got(k, a)

            await asyncio.gather(*(one(k, p) for k, p in enumerate(prompts)))

    async def _ask(self, client, url: str, prompt: str) -> Answer:
        import httpx

        body = {"model": self.model, "messages": [{"role": "user", "content": prompt}], "temperature": 0,
                "max_tokens": self.max_tokens}
        why, server_error, after = "", None, None
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(wait_s(self.backoff, attempt, after))
                if self.token in DOWN:
                    raise EndpointDown(DOWN[self.token])
            after = None
            try:
                r = await asyncio.wait_for(client.post(url, json=body), self.timeout)
            except (httpx.TimeoutException, asyncio.TimeoutError):
                why, server_error = f"no answer in {self.timeout:g} s", None
                continue
            except httpx.HTTPError as e:  # refused, reset, closed mid-answer: the server is not there
                why, server_error = (f"{type(e).__name__}: {e}" if str(e) else type(e).__name__), None
                continue
            code = r.status_code
            if code == 200:
                return chat_answer(r.content)
            if code in FATAL:
                raise EndpointDown(f"{url} refused the request with HTTP {code}: {_error_text(r)}")
            if code in UNAVAILABLE:
                why, server_error, after = f"HTTP {code}: {_error_text(r)}", None, _retry_after(r)
                continue
            if code >= 500:  # the server failed on this request: retried, then the row fails for good
                why, server_error = f"HTTP {code}: {_error_text(r)}", f"http_{code}"
                continue
            return Answer(None, _refused(r))
        if server_error:
            return Answer(None, server_error)
        raise EndpointDown(f"{self.endpoint} did not answer after {tries(self.retries)} ({why})")


# ---------------------------------------------------------------------------------------------
# a checkpoint, through llmctl's own engine

LOADED: dict[tuple, tuple] = {}  # (path, weights, device, sha256) -> (engine, vocab, chat, context): once a process


def load_engine(path: str, weights: str, device: str, sha256: str, batch_size: int):
    key = (path, weights, device, sha256, batch_size)
    if key not in LOADED:
        from llmctl.model.generate import Engine, EngineConfig
        from llmctl.model.load import load_model
        from llmctl.tokenizer.vocab import Vocab
        from llmctl.torchrt.device import pick_device

        LOADED.clear()  # one model at a time in a process
        model, ck = load_model(path, pick_device(device), weights)
        vocab = Vocab(ck.path)
        chat = vocab.require_chat() if ck.trainer_state.get("chat") else None  # as generate and eval decide it
        engine = Engine.for_vocab(model, vocab, chat=chat is not None, config=EngineConfig(max_rows=batch_size))
        LOADED[key] = (engine, vocab, chat, model.cfg.max_seq_len)
    return LOADED[key]


@dataclass
class LocalBackend:
    checkpoint: str  # the resolved checkpoint directory
    weights: str
    device: str
    sha256: str  # of its weights file: which model this is
    max_tokens: int
    batch_size: int

    def answer(self, prompts: list[str], got: Got) -> None:
        """Greedy answers, `batch_size` prompts to a call of the engine (which batches them
        continuously); a prompt that does not fit the context with max_tokens fails for good."""
        from llmctl.model.generate import SamplingParams

        if not prompts:
            return
        engine, vocab, chat, context = load_engine(self.checkpoint, self.weights, self.device, self.sha256, self.batch_size)
        ids = [chat.prompt_ids([{"role": "user", "content": p}]) if chat is not None else vocab.prompt_ids(p) for p in prompts]
        fits = []
        for k, x in enumerate(ids):
            if len(x) + self.max_tokens > context:  # what `llmctl serve` refuses (400 context_length_exceeded)
                got(k, Answer(None, "context_length_exceeded"))
            else:
                fits.append(k)
        params = SamplingParams(max_new_tokens=self.max_tokens, temperature=0.0)
        for start in range(0, len(fits), self.batch_size):
            chunk = fits[start : start + self.batch_size]
            for k, g in zip(chunk, engine.generate([ids[k] for k in chunk], params)):
                got(k, Answer(g.text, None, g.finish == "length"))
