"""OpenAI's API as `llmctl serve` speaks it: a request body checked and turned into a Job (prompt
ids, sampling settings, a seed per sample), and the response and stream-chunk shapes
(https://platform.openai.com/docs/api-reference/completions, …/chat).

Every field is checked for type and range before anything runs (the ranges of bounds.py's
"serve request" table: those of `llmctl generate`, and ceilings on n and on the prompts of one
request); a prompt and its max_tokens must fit the model's context. A field this server does not
implement (penalties, logit bias, tools, echo, …) is refused by name, never silently ignored;
fields it does not know are ignored, as OpenAI's own clients send some of their own. A mistake is
an ApiError: a 4xx with OpenAI's error object {"error": {message, type, param, code}}.
"""

from __future__ import annotations

import secrets
import time
import uuid
from dataclasses import dataclass, field

from llmctl.bounds import check_value
from llmctl.errors import UsageError
from llmctl.model.generate import SamplingParams, row_seed

MAX_STOP = 4  # OpenAI's API takes up to 4 stop sequences
COMPLETION_MAX_TOKENS = 16  # /v1/completions' documented default for max_tokens
# fields with a meaning this server does not compute, and the value that asks nothing of it
UNSUPPORTED = {"echo": (False, None), "suffix": (None,), "best_of": (None, 1), "presence_penalty": (None, 0),
               "frequency_penalty": (None, 0), "logit_bias": (None, {}), "tools": (None, []), "tool_choice": (None, "none"),
               "functions": (None, []), "function_call": (None, "none"), "response_format": (None, {"type": "text"}),
               "prediction": (None,), "audio": (None,), "modalities": (None, ["text"])}


class ApiError(Exception):
    """A request the server refuses: HTTP `status` with OpenAI's error object."""

    def __init__(self, status: int, message: str, param: str | None = None, type: str = "invalid_request_error",
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param, code=code)


@dataclass
class Job:
    """One API request as the engine runs it: each prompt a scheduler request of n samples."""

    kind: str  # "completion" or "chat"
    model: str
    prompts: list[list[int]]
    params: SamplingParams
    n: int
    seeds: list[list[int]]  # per prompt, one per sample
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage
    logprobs: bool = False
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def choice(self, prompt: int, sample: int) -> int:
        """A choice's index: prompt-major, as OpenAI orders the choices of a list of prompts."""
        return prompt * self.n + sample


# -- fields ------------------------------------------------------------------------------------


def _range(key: str, value, param: str | None = None, where: str | None = None) -> None:
    """`value` in the range of `key` in bounds.py's "serve request" table, or a 400 naming `param`."""
    try:
        check_value("serve request", key, value, where or param or key)
    except UsageError as e:
        raise bad(str(e), param or key) from None


def _int(body: dict, key: str, default: int | None, bound: str | None = None) -> int | None:
    """body[key] as an integer in the range of `bound` (default: its own key's)."""
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool):
        raise bad(f"{key} must be an integer, got {v!r}", key)
    _range(bound or key, v, key)
    return v


def _number(body: dict, key: str, default: float) -> float:
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise bad(f"{key} must be a number, got {v!r}", key)
    _range(key, v)
    return float(v)


def _bool(body: dict, key: str, default: bool = False) -> bool:
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad(f"{key} must be true or false, got {v!r}", key)
    return v


def _stop(body: dict) -> tuple[str, ...]:
    v = body.get("stop")
    if v is None:
        return ()
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad(f"stop must be a string or a list of strings, got {v!r}", "stop")
    if len(stops) > MAX_STOP:
        raise bad(f"stop takes at most {MAX_STOP} strings, got {len(stops)}", "stop")
    if any(s == "" for s in stops):
        raise bad("stop strings must not be empty (an empty one would end every answer before it starts)", "stop")
    return tuple(stops)


def _refuse_unsupported(body: dict) -> None:
    for key, neutral in UNSUPPORTED.items():
        if key in body and body[key] not in neutral:
            raise bad(f"{key} is not supported by this server", key, "unsupported_parameter")


def _model(body: dict, name: str) -> str:
    v = body.get("model")
    if not isinstance(v, str):
        raise bad("model must be given: the name /v1/models lists", "model")
    if v != name:
        raise ApiError(404, f"The model `{v}` does not exist; this server serves `{name}`", "model",
                       code="model_not_found")
    return v


def _seeds(body: dict, prompts: int, n: int) -> list[list[int]]:
    """A seed per sample: with `seed` S, choice c draws from row_seed(S, c) (`llmctl generate
    --seed S -n N` draws row c from the same); without, from a fresh S drawn for this request."""
    s = _int(body, "seed", None)
    base = secrets.randbits(63) if s is None else s
    return [[row_seed(base, p * n + i) for i in range(n)] for p in range(prompts)]


def _sampling(body: dict, prompts: list[list[int]], context: int, default_max: int | None, max_keys: tuple[str, ...]) -> SamplingParams:
    longest = max(len(p) for p in prompts)
    if longest >= context:
        raise bad(f"This model's maximum context length is {context} tokens; the prompt has {longest}", None,
                  "context_length_exceeded")
    max_key = next((k for k in max_keys if body.get(k) is not None), max_keys[0])
    max_tokens = _int(body, max_key, None, "max_tokens")
    if max_tokens is None:
        max_tokens = min(default_max, context - longest) if default_max else context - longest
    elif longest + max_tokens > context:
        raise bad(f"This model's maximum context length is {context} tokens; you requested {longest + max_tokens} "
                  f"({longest} in the prompt, {max_tokens} in {max_key})", max_key, "context_length_exceeded")
    top_k = _int(body, "top_k", 0)  # not OpenAI's; vLLM's extension, as `llmctl generate --top-k`
    return SamplingParams(max_new_tokens=max_tokens, temperature=_number(body, "temperature", 1.0),
                          top_k=top_k, top_p=_number(body, "top_p", 1.0), stop=_stop(body))


def _common(body: dict, kind: str, name: str, prompts: list[list[int]], context: int, default_max: int | None,
            max_keys: tuple[str, ...], logprobs: bool) -> Job:
    n = _int(body, "n", 1)
    params = _sampling(body, prompts, context, default_max, max_keys)
    stream = _bool(body, "stream")
    options = body.get("stream_options")
    if options is not None and not (isinstance(options, dict) and stream):
        raise bad("stream_options must be an object, with stream true", "stream_options")
    include_usage = _bool(options or {}, "include_usage")
    if logprobs and stream:
        raise bad("logprobs are given with whole answers only: the engine streams token ids, their "
                  "log-probs come when a sample ends", "logprobs")
    prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
    return Job(kind, name, prompts, params, n, _seeds(body, len(prompts), n), stream, include_usage, logprobs,
               id=prefix + uuid.uuid4().hex)


# -- the two endpoints ---------------------------------------------------------------------------


def completion_job(body: dict, served) -> Job:
    """POST /v1/completions: `prompt` is a string, a list of strings, a list of token ids or a
    list of such lists; a text prompt is encoded as `llmctl generate` encodes a plain prompt
    (the tokenizer's BOS rule)."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    name = _model(body, served.name)
    _refuse_unsupported(body)
    prompts = _prompts(body.get("prompt"), served.vocab)
    _range("prompts", len(prompts), "prompt", "the number of prompts")
    logprobs = _int(body, "logprobs", None)
    if logprobs not in (None, 0):
        raise bad("logprobs: only 0 (each chosen token's own log-prob) is computed, not alternatives", "logprobs")
    return _common(body, "completion", name, prompts, served.context, COMPLETION_MAX_TOKENS, ("max_tokens",),
                   logprobs == 0)


def _prompts(v, vocab) -> list[list[int]]:
    def ids(x: list) -> list[int]:
        if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab.size for i in x):
            raise bad(f"prompt token ids must be integers in [0, {vocab.size})", "prompt")
        return list(x)

    if isinstance(v, str):
        return [vocab.prompt_ids(v)]
    if isinstance(v, list) and v:
        if all(isinstance(x, str) for x in v):
            return [vocab.prompt_ids(x) for x in v]
        if all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            return [ids(v)]
        if all(isinstance(x, list) and x for x in v):
            return [ids(x) for x in v]
    raise bad("prompt must be a string, a list of strings, a list of token ids or a list of such lists "
              "(none empty)", "prompt")


def chat_job(body: dict, served) -> Job:
    """POST /v1/chat/completions: `messages` rendered by the checkpoint's chat template, ending
    with the assistant's turn opened; a model without one is refused."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    name = _model(body, served.name)
    if served.chat is None:
        raise bad(f"`{name}` is not a chat model (its checkpoint was not trained or imported as one): "
                  "use /v1/completions", "messages", "not_a_chat_model")
    _refuse_unsupported(body)
    messages = _messages(body.get("messages"))
    try:
        prompt = served.chat.prompt_ids(messages)
    except UsageError as e:
        raise bad(str(e), "messages") from None
    logprobs = _bool(body, "logprobs")
    if _int(body, "top_logprobs", None) not in (None, 0):
        raise bad("top_logprobs: alternatives to the chosen tokens are not computed", "top_logprobs")
    return _common(body, "chat", name, [prompt], served.context, None, ("max_completion_tokens", "max_tokens"), logprobs)


def _messages(v) -> list[dict]:
    if not isinstance(v, list) or not v:
        raise bad("messages must be a non-empty list of {role, content} objects", "messages")
    out = []
    for i, m in enumerate(v):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad(f"messages[{i}] must be an object with a role", "messages")
        content = m.get("content")
        if isinstance(content, list):  # content parts: the text ones, in order
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
                raise bad(f"messages[{i}].content: only text parts are supported", "messages")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise bad(f"messages[{i}].content must be a string or a list of text parts", "messages")
        out.append({"role": m["role"], "content": content})
    return out


# -- responses ---------------------------------------------------------------------------------


FINISH = {"eos": "stop", "stop": "stop", "length": "length"}  # the engine's finish -> OpenAI's finish_reason


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def token_logprobs(job: Job, gen, decode) -> dict:
    """The chosen tokens' log-probs of a whole answer, in the endpoint's shape; the tokens are
    those of the returned text (a stop string's tokens and what followed are not in it)."""
    ids, shown = gen.ids, ""
    k = 0
    while k < len(ids) and len(shown) < len(gen.text):
        k += 1
        shown = decode(ids[:k])
    pieces = [decode([i]) for i in ids[:k]]
    lps = gen.logprobs[:k]
    if job.kind == "chat":
        return {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                            for t, lp in zip(pieces, lps)]}
    offsets, at = [], 0
    for t in pieces:
        offsets.append(at)
        at += len(t)
    return {"tokens": pieces, "token_logprobs": lps, "top_logprobs": None, "text_offset": offsets}


def response(job: Job, gens: dict[int, object], decode) -> dict:
    """The whole answer: one choice per (prompt, sample), in choice order."""
    choices = []
    for c in sorted(gens):
        g = gens[c]
        lp = token_logprobs(job, g, decode) if job.logprobs else None
        if job.kind == "chat":
            choices.append({"index": c, "message": {"role": "assistant", "content": g.text}, "logprobs": lp,
                            "finish_reason": FINISH[g.finish]})
        else:
            choices.append({"index": c, "text": g.text, "logprobs": lp, "finish_reason": FINISH[g.finish]})
    return {"id": job.id, "object": "chat.completion" if job.kind == "chat" else "text_completion",
            "created": job.created, "model": job.model, "choices": choices,
            "usage": usage(sum(len(p) for p in job.prompts), sum(len(g.ids) for g in gens.values()))}


def chunk(job: Job, choice: int, text: str | None = None, finish: str | None = None, role: bool = False) -> dict:
    """One stream event of one choice: a text delta, the role (chat's first), or the finish."""
    if job.kind == "chat":
        delta = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
        c = {"index": choice, "delta": delta, "logprobs": None, "finish_reason": finish and FINISH[finish]}
    else:
        c = {"index": choice, "text": text or "", "logprobs": None, "finish_reason": finish and FINISH[finish]}
    return {"id": job.id, "object": "chat.completion.chunk" if job.kind == "chat" else "text_completion",
            "created": job.created, "model": job.model, "choices": [c]}


def usage_chunk(job: Job, completion_tokens: int) -> dict:
    return {"id": job.id, "object": "chat.completion.chunk" if job.kind == "chat" else "text_completion",
            "created": job.created, "model": job.model, "choices": [],
            "usage": usage(sum(len(p) for p in job.prompts), completion_tokens)}
