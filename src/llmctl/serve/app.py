"""The HTTP side of `llmctl serve`: a Starlette (ASGI) app with OpenAI's routes, over one
EngineWorker (serve/worker.py) that batches every request in flight continuously.

    GET  /v1/models              the one model served
    POST /v1/completions         text (or token-id) prompts
    POST /v1/chat/completions    messages, through the checkpoint's chat template
    GET  /health                 200 while the server runs, with its counts of requests by outcome

A handler checks its request (serve/protocol.py), submits one scheduler Request per prompt (n
samples each, a seed each) and waits on an asyncio queue that the engine thread fills through
`loop.call_soon_threadsafe`. A whole answer is one JSON object; with `stream` it is Server-Sent
Events, `data: {chunk}` per text delta (serve/text.py) and `data: [DONE]` at the end. A client that
goes away aborts its requests, which leave the batch at the next step.

Every failure is OpenAI's error object with its status: 400 for a request the server refuses
(bad JSON, a missing or ill-typed field, a value out of range, a prompt past the context), 404 for
an unknown route or model, 405 for a wrong method, 500 when the engine fails (that request's, and
the server goes on), 503 while stopping. No request can end the server.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from llmctl.errors import UsageError
from llmctl.model.scheduler import Request
from llmctl.serve import protocol
from llmctl.serve.protocol import ApiError, Job
from llmctl.serve.text import DeltaText
from llmctl.serve.worker import ACCEPTED, Closed, EngineWorker

MAX_BODY = 16 << 20  # bytes of a request body: a prompt past the largest context is refused long before


def error_response(e: Exception) -> JSONResponse:
    return JSONResponse(as_api_error(e).body(), status_code=as_api_error(e).status)


def as_api_error(e: Exception) -> ApiError:
    if isinstance(e, ApiError):
        return e
    if isinstance(e, UsageError):  # the scheduler's refusal (the KV budget cannot hold the request)
        return ApiError(400, str(e))
    if isinstance(e, Closed):
        return ApiError(503, str(e), type="server_error", code="shutting_down")
    return ApiError(500, f"the engine failed on this request: {type(e).__name__}: {e}", type="server_error")


class Handlers:
    def __init__(self, served, worker: EngineWorker, log: Callable[[str], None]):
        self.served, self.worker, self.log = served, worker, log
        self.created = int(time.time())

    async def models(self, request: HttpRequest) -> Response:
        card = {"id": self.served.name, "object": "model", "created": self.created, "owned_by": "llmctl",
                "max_model_len": self.served.context}
        return JSONResponse({"object": "list", "data": [card]})

    async def health(self, request: HttpRequest) -> Response:
        return JSONResponse({"status": "ok", "requests": {"running": self.worker.running(), **self.worker.counts}})

    async def completions(self, request: HttpRequest) -> Response:
        return await self._answer(request, protocol.completion_job)

    async def chat_completions(self, request: HttpRequest) -> Response:
        return await self._answer(request, protocol.chat_job)

    # -- one request ---------------------------------------------------------------------------

    async def _answer(self, request: HttpRequest, parse) -> Response:
        try:
            job = parse(await _json_body(request), self.served)
            return await self._run(request, job)
        except Exception as e:  # every failure is an answer; none reaches the server
            if not isinstance(e, (ApiError, UsageError, Closed)):
                self.log(f"{request.url.path}: {type(e).__name__}: {e}")
            return error_response(e)

    async def _run(self, request: HttpRequest, job: Job) -> Response:
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue = asyncio.Queue()
        ids = [f"{job.id}-{k}" for k in range(len(job.prompts))]
        requests = [Request(rid, p, job.params, seeds) for rid, p, seeds in zip(ids, job.prompts, job.seeds)]
        self.worker.submit(requests, lambda item: loop.call_soon_threadsafe(inbox.put_nowait, item))
        first = await inbox.get()
        if first is not ACCEPTED:
            raise first
        run = Run(job, ids, inbox, self.worker, self.served.vocab.decode)
        if job.stream:
            return StreamingResponse(run.events(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await run.whole(request)


class Run:
    """One job's requests in flight: the updates they receive, turned into the answer."""

    def __init__(self, job: Job, ids: list[str], inbox: asyncio.Queue, worker: EngineWorker, decode):
        self.job, self.inbox, self.worker, self.decode = job, inbox, worker, decode
        self.ids = ids
        self.prompt_of = {rid: k for k, rid in enumerate(ids)}
        self.done: dict[int, object] = {}  # choice -> its Generation
        self.total = len(ids) * job.n

    def _updates(self, item) -> list:
        if isinstance(item, BaseException):
            raise item
        return item

    async def whole(self, request: HttpRequest) -> Response:
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            while len(self.done) < self.total:
                get = asyncio.ensure_future(self.inbox.get())
                await asyncio.wait({get, gone}, return_when=asyncio.FIRST_COMPLETED)
                if not get.done():  # the client went away: nobody reads the answer
                    get.cancel()
                    return Response(status_code=499)
                for u in self._updates(get.result()):
                    if u.done is not None:
                        self.done[self.job.choice(self.prompt_of[u.request_id], u.index)] = u.done
            return JSONResponse(protocol.response(self.job, self.done, self.decode))
        finally:
            gone.cancel()
            self._abort_unfinished()

    async def events(self):
        job = self.job
        texts = {c: DeltaText(self.decode, job.params.stop) for c in range(self.total)}
        completion_tokens = 0
        try:
            if job.kind == "chat":
                for c in range(self.total):
                    yield _event(protocol.chunk(job, c, role=True))
            while len(self.done) < self.total:
                item = await self.inbox.get()
                if isinstance(item, BaseException):
                    yield _event(as_api_error(item).body())
                    break
                for u in item:
                    c = job.choice(self.prompt_of[u.request_id], u.index)
                    delta = texts[c].add(u.new_ids) if u.done is None else texts[c].finish(u.done.text)
                    if delta:
                        yield _event(protocol.chunk(job, c, text=delta))
                    if u.done is not None:
                        self.done[c] = u.done
                        completion_tokens += len(u.done.ids)
                        yield _event(protocol.chunk(job, c, finish=u.done.finish))
            else:
                if job.include_usage:
                    yield _event(protocol.usage_chunk(job, completion_tokens))
            yield "data: [DONE]\n\n"
        finally:  # also when the client went away and the stream was cancelled
            self._abort_unfinished()

    def _abort_unfinished(self) -> None:
        ended = [sum(1 for c in self.done if c // self.job.n == k) == self.job.n for k in range(len(self.ids))]
        left = [rid for rid, end in zip(self.ids, ended) if not end]
        if left:
            self.worker.abort(left)


def _event(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def _disconnected(request: HttpRequest) -> None:
    """Returns when the client has gone away (the body was read: what comes next is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        continue


async def _json_body(request: HttpRequest) -> dict:
    """The body as a JSON object, read at most MAX_BODY bytes of it."""
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > MAX_BODY:
            raise ApiError(413, f"the request body is over {MAX_BODY >> 20} MiB")
    try:
        value = json.loads(body)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError; nesting past the stack a RecursionError
        raise protocol.bad(f"the request body is not valid JSON: {type(e).__name__}: {e}") from None
    if not isinstance(value, dict):
        raise protocol.bad("the request body must be a JSON object")
    return value


async def _http_error(request: HttpRequest, e: HTTPException) -> Response:
    kind = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code)
    message = {404: f"no route {request.url.path} (the API is under /v1: models, completions, chat/completions)",
               405: f"{request.method} is not allowed on {request.url.path}"}.get(e.status_code, str(e.detail))
    return JSONResponse(ApiError(e.status_code, message, type="invalid_request_error", code=kind).body(),
                        status_code=e.status_code)


def build_app(served, worker: EngineWorker, log: Callable[[str], None] = lambda message: None) -> Starlette:
    h = Handlers(served, worker, log)
    routes = [Route("/v1/models", h.models, methods=["GET"]), Route("/health", h.health, methods=["GET"]),
              Route("/v1/completions", h.completions, methods=["POST"]),
              Route("/v1/chat/completions", h.chat_completions, methods=["POST"])]
    return Starlette(routes=routes, exception_handlers={HTTPException: _http_error})
