"""annotate: an LLM scores each document with a rubric prompt, FineWeb-Edu style (Penedo et al.
2024: Llama-3-70B-Instruct rated 450k pages 0-5 for educational value, and a classifier trained on
those ratings filtered the corpus; data/filters/regression.py is that classifier's head).

The prompt is the built-in `edu` rubric (EDU_PROMPT: an additive 0-5 scale for educational value,
in our own words) or a template file holding `{text}` where the document goes (the only
placeholder; other braces are literal). A document longer than `max_chars` characters is cut to
them in the prompt. The model is asked to end its answer with a score line, and the answer is read
strictly (`parse_score`): the LAST line holding `score:` decides, and what follows the colon must
be a whole number in [min_score, max_score] and nothing else; any other answer is `unparseable`
(score null, the answer kept). Rows get `score` (int64, null when unparseable or failed) and
`annotation` (the raw answer; `keep_annotation = false` drops the column). Rows with a null or
empty text are skipped and counted, as every text stage does.

Backends (eval/annotate_backends.py): an OpenAI-compatible endpoint (chat completions,
temperature 0, bounded concurrency, retries with backoff) or a local checkpoint through llmctl's
own engine (greedy, batched). One task per input file through runtime/sharded.py (resume by
shard). Inside a shard every answer is appended to `OUT/.shards/NAME.answers.jsonl` as it comes,
so a shard cut short — the process killed, or the endpoint gone (a row that got no answer after
every retry leaves its shard unfinished, exit 1) — is resumed by running the same command again:
the rows answered are read back, only the others are asked. The caches go once every shard is
done, before the manifest.

The run's identity (what a resume must share) is what decides the answers: the prompt's sha256,
the backend and model (a checkpoint's weights by sha256), max_chars, max_tokens, the score range
and keep_annotation. Where the endpoint is and how it is driven (concurrency, retries, timeout,
backoff, batch size, device) may change between a run and its resume; the manifest records them
under config.run. Counts: scored, unparseable, failed (and why, `failures`), the histogram of
scores (`scores`), documents cut to max_chars (`docs_cut`), answers cut at max_tokens
(`answers_cut`), and rows whose answer came from an earlier, interrupted run (`resumed`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from llmctl.artifacts.atomic import SHARDS_DIR, STDIO
from llmctl.artifacts.docs import DocsSource
from llmctl.artifacts.docs_shard import ShardInput, ShardOutput, with_fields
from llmctl.artifacts.manifest import Manifest
from llmctl.errors import StageFailed, UsageError
from llmctl.eval.annotate_backends import DOWN, Answer, EndpointBackend, EndpointDown, LocalBackend, resolve_model
from llmctl.runtime.executor import Task
from llmctl.runtime.options import RunOptions
from llmctl.runtime.progress import Progress
from llmctl.runtime.sharded import RUN_FILE, run_sharded
from llmctl.runtime.stage import stage_run

STAGE = "annotate"
SCORE, ANNOTATION = "score", "annotation"
CACHE_SUFFIX = ".answers.jsonl"

EDU_PROMPT = """\
You are helping to build a library of teaching material. Read the document below and judge how \
much a pupil in primary or middle school could learn from it.

Score it on an additive scale from 0 to 5. Start from 0 and go through the five criteria; each \
one the document meets adds one point, and each builds on the ones before it.

1. It offers at least some basic information that bears on a school subject, even when ads, menus \
or other unrelated text surround it.
2. It treats matter that belongs in education and does so coherently, although it may be partial, \
loosely organised, or mixed with material of no use for learning.
3. A teacher could use it at school level: it brings in concepts that a curriculum covers, even \
if it is incomplete or carries some extraneous parts.
4. It is highly relevant and useful for learning at grade-school level and clearly written, like \
a good textbook section or tutorial, with little that is off the topic.
5. Its educational value is outstanding: it could be given to a class as it stands, explaining \
its subject step by step, in depth, and with nothing to distract from it.

Document (it may have been cut short):
<<<
{text}
>>>

In two or three sentences, say which criteria the document meets. Then write the total as the \
last line of your answer, in exactly this form, with a whole number from 0 to 5 and nothing after it:
Educational score: <number>
"""

PROMPTS = {"edu": EDU_PROMPT}
EDU_RANGE = (0, 5)


@dataclass
class AnnotateConfig:
    prompt: str = "edu"  # the built-in rubric, or a template file holding {text}
    endpoint: str | None = None  # an OpenAI-compatible server: its base URL (…/v1) or chat completions URL
    model: str | None = None  # the model the endpoint serves (None: the one it lists)
    checkpoint: str | None = None  # or a local checkpoint: a run dir, step dir or `llmctl import` output
    max_chars: int = 4000  # a document is cut to this many characters in the prompt (0: never cut)
    max_tokens: int = 256  # tokens of an answer at most (a short reasoning and the score line)
    min_score: int = 0  # the score line's number must lie in [min_score, max_score]
    max_score: int = 5
    keep_annotation: bool = True  # the `annotation` column: the raw answer
    # how the endpoint is driven (not part of the run's identity)
    concurrency: int = 8  # requests in flight at most (each worker)
    retries: int = 5  # tries after the first, on a connection error, timeout or 5xx
    backoff: float = 1.0  # seconds before the first retry, doubling each time
    timeout: float = 300.0  # seconds a request may take
    # how the checkpoint runs (not part of the run's identity)
    batch_size: int = 64  # prompts to a call of the engine
    weights: str = "auto"  # auto (EMA where there is one), ema or raw
    device: str = "auto"

    def check(self) -> None:
        if (self.endpoint is None) == (self.checkpoint is None):
            raise UsageError("annotate needs one backend: --endpoint URL (an OpenAI-compatible server) or --checkpoint PATH")
        if self.checkpoint is not None and self.model is not None:
            raise UsageError("--model names the endpoint's model; with --checkpoint the checkpoint is the model")
        if self.min_score >= self.max_score:
            raise UsageError(f"--min-score {self.min_score} must be below --max-score {self.max_score}")
        if self.prompt in PROMPTS and (self.min_score, self.max_score) != EDU_RANGE:
            raise UsageError(f"--prompt {self.prompt} scores {EDU_RANGE[0]} to {EDU_RANGE[1]}; "
                             "--min-score/--max-score go with a prompt file")


# ---------------------------------------------------------------------------------------------
# the prompt and the answer


def load_prompt(prompt: str) -> str:
    """The template `prompt` names: a built-in one, or a UTF-8 file holding `{text}`."""
    if prompt in PROMPTS:
        return PROMPTS[prompt]
    p = Path(prompt)
    if not p.is_file():
        raise UsageError(f"--prompt {prompt!r}: neither a built-in prompt ({', '.join(PROMPTS)}) nor a file")
    try:
        template = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--prompt {prompt}: cannot read it as UTF-8 text ({e})") from None
    if "{text}" not in template:
        raise UsageError(f"--prompt {prompt}: the template has no {{text}}, where the document goes")
    return template


def prompt_sha256(template: str) -> str:
    return hashlib.sha256(template.encode("utf-8")).hexdigest()


def build_prompt(template: str, text: str, max_chars: int) -> tuple[str, bool]:
    """(the prompt for `text`, whether the text was cut to max_chars)."""
    cut = 0 < max_chars < len(text)
    return template.replace("{text}", text[:max_chars] if cut else text), cut


_SCORE_AT = re.compile(r"\bscore\s*:", re.IGNORECASE)
_NUMBER = re.compile(r"[0-9]{1,6}")


def parse_score(answer: str | None, lo: int = 0, hi: int = 5) -> int | None:
    """The score an answer gives, read strictly: the last line holding `score:` (any label before
    it, any case) decides, and all that follows its colon must be a whole number in [lo, hi] (ASCII
    digits, spaces around). Anything else — no such line, a fraction, a range, text after the
    number, a number out of range — is None, even when an earlier line held a good one."""
    if not answer:
        return None
    value = None
    for line in answer.splitlines():
        marks = list(_SCORE_AT.finditer(line))
        if marks:
            value = line[marks[-1].end() :].strip()
    if value is None or not _NUMBER.fullmatch(value):
        return None
    n = int(value)
    return n if lo <= n <= hi else None


# ---------------------------------------------------------------------------------------------
# the answers a shard has received: what its re-run resumes from


class AnswerCache:
    """`OUT/.shards/NAME.answers.jsonl`: a header naming the run, then one line per answered row
    (its position among the shard's rows with text), appended as each answer comes. A line cut by a
    kill is dropped when the file is opened again; a cache of another run is started over."""

    def __init__(self, path: Path, header: dict):
        self.path, self.header = path, header
        self.f = None

    def load(self) -> dict[int, Answer]:
        got: dict[int, Answer] = {}
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return got
        good = data[: data.rfind(b"\n") + 1]  # the whole lines: a kill may have cut the last one
        lines = good.decode("utf-8", errors="replace").splitlines()
        try:
            if not lines or json.loads(lines[0]) != self.header:
                return got
        except ValueError:
            return got
        for line in lines[1:]:
            try:
                r = json.loads(line)
                got[int(r["i"])] = Answer(r["text"], r["failure"], bool(r["cut"]))
            except (ValueError, KeyError, TypeError):
                continue
        self.f = open(self.path, "r+b")
        self.f.truncate(len(good))
        self.f.seek(len(good))
        return got

    def add(self, i: int, a: Answer) -> None:
        if self.f is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.f = open(self.path, "wb")
            self._line(self.header)
        self._line({"i": i, "text": a.text, "failure": a.failure, "cut": a.cut})

    def _line(self, obj: dict) -> None:
        self.f.write((json.dumps(obj, ensure_ascii=False) + "\n").encode("utf-8"))
        self.f.flush()  # in the page cache: a killed process loses nothing written

    def close(self) -> None:
        if self.f is not None:
            os.fsync(self.f.fileno())
            self.f.close()
            self.f = None


def remove_caches(out: Path) -> None:
    for p in (out / SHARDS_DIR).glob(f"*{CACHE_SUFFIX}"):
        p.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------
# one shard


@dataclass
class Spec:
    """What a shard task needs (picklable: it goes to pool workers and Ray)."""

    template: str
    cfg: AnnotateConfig
    identity: str  # the digest of the run's identity config: the cache's header
    backend: EndpointBackend | LocalBackend

    def __call__(self, task: Task, out: Path, report) -> dict:
        return annotate_shard(task, out, report, self)


def _zero_counts(cfg: AnnotateConfig) -> dict:
    return {"in": 0, "out": 0, "scored": 0, "unparseable": 0, "failed": 0, "failures": {}, "docs_cut": 0,
            "answers_cut": 0, "resumed": 0, "scores": {str(s): 0 for s in range(cfg.min_score, cfg.max_score + 1)}}


def annotate_shard(task: Task, out: Path, report, spec: Spec) -> dict:
    cfg = spec.cfg
    inp = ShardInput(DocsSource(**task.payload))
    counts = _zero_counts(cfg)
    if inp.schema is None:  # the file does not open: nothing to write, the damage is counted
        return inp.stats([], counts)
    fields = [(SCORE, pa.int64())] + ([(ANNOTATION, pa.string())] if cfg.keep_annotation else [])
    cache = AnswerCache(out / SHARDS_DIR / f"{task.name}{CACHE_SUFFIX}", {"annotate": spec.identity, "key": task.key})
    known = cache.load()
    position = 0
    try:
        with ShardOutput(out, task.name, with_fields(inp.schema, fields)) as shard:
            for batch in inp.batches():
                rows = batch.to_pylist()
                first, position = position, position + len(rows)
                answers: list[Answer | None] = [known.get(first + j) for j in range(len(rows))]
                todo = [j for j, a in enumerate(answers) if a is None]
                counts["resumed"] += len(rows) - len(todo)
                report(len(rows) - len(todo))
                prompts = [build_prompt(spec.template, rows[j]["text"], cfg.max_chars)[0] for j in todo]
                counts["docs_cut"] += sum(0 < cfg.max_chars < len(row["text"]) for row in rows)

                def got(k: int, a: Answer, first=first, todo=todo, answers=answers) -> None:
                    answers[todo[k]] = a
                    cache.add(first + todo[k], a)
                    report(1)

                try:
                    spec.backend.answer(prompts, got)
                except EndpointDown as e:  # the answers in are kept (the cache): a re-run asks for the rest
                    kept = first + sum(a is not None for a in answers)
                    raise EndpointDown(f"{e}; {kept} answer(s) of {task.name} kept: run the same command again to resume") from None
                for row, a in zip(rows, answers):
                    _annotate_row(row, a, cfg, counts)
                shard.write_rows(rows)
    finally:
        cache.close()
    counts["in"] = counts["out"] = position
    return inp.stats(shard.outputs, counts)


def _annotate_row(row: dict, a: Answer, cfg: AnnotateConfig, counts: dict) -> None:
    score = None
    if a.failure is not None:
        counts["failed"] += 1
        counts["failures"][a.failure] = counts["failures"].get(a.failure, 0) + 1
    else:
        score = parse_score(a.text, cfg.min_score, cfg.max_score)
        if score is None:
            counts["unparseable"] += 1
        else:
            counts["scored"] += 1
            counts["scores"][str(score)] += 1
        counts["answers_cut"] += a.cut
    row[SCORE] = score
    if cfg.keep_annotation:
        row[ANNOTATION] = a.text


# ---------------------------------------------------------------------------------------------
# the stage


def identity_config(cfg: AnnotateConfig, template: str, backend: dict) -> dict:
    """What decides the answers: a resumed run must share it (the run identity, runtime/sharded.py)."""
    return {"prompt": cfg.prompt if cfg.prompt in PROMPTS else "file", "prompt_sha256": prompt_sha256(template), **backend,
            "max_chars": cfg.max_chars, "max_tokens": cfg.max_tokens, "min_score": cfg.min_score, "max_score": cfg.max_score,
            "keep_annotation": cfg.keep_annotation}


def _checkpoint_backend(cfg: AnnotateConfig) -> tuple[dict, dict]:
    """(identity part, LocalBackend arguments) of --checkpoint, found without loading the weights."""
    from llmctl.bounds import within_context
    from llmctl.model.load import base_identity, model_config
    from llmctl.artifacts.checkpoint import open_checkpoint
    from llmctl.torchrt.device import pick_device

    p = Path(cfg.checkpoint)
    if (p / "config.json").is_file() and not (p / "model.safetensors").is_file() and b'"model_type"' in (p / "config.json").read_bytes():
        raise UsageError(f"--checkpoint {p} is a Hugging Face folder: `llmctl import` it first, or `llmctl serve` it and use --endpoint")
    pick_device(cfg.device)  # a device this machine has not: one line now, not a failed shard later
    ck = open_checkpoint(p)
    if ck.tokenizer_file is None:
        raise UsageError(f"{ck.path} has no tokenizer.json: cannot turn prompts into tokens")
    context = model_config(ck).max_seq_len
    cfg.max_tokens = within_context("--max-tokens", cfg.max_tokens, context, AnnotateConfig.max_tokens)
    ident = base_identity(ck.path, cfg.weights)
    part = {"backend": "checkpoint", "model": ident["path"], "weights": ident["weights"], "weights_sha256": ident["sha256"]}
    return part, {"checkpoint": ident["path"], "weights": ident["weights"], "sha256": ident["sha256"]}


def run_annotate(inputs: list[str], out: str, cfg: AnnotateConfig, opts: RunOptions | None = None,
                 progress: Progress | None = None) -> Manifest:
    """Score every document of `inputs` into `out` (module docstring). A library caller's
    `opts.workers` None is one worker: the endpoint's concurrency, or the engine's batch, is where
    the parallelism is."""
    opts = opts or RunOptions()
    if opts.workers is None:
        opts = dataclasses.replace(opts, workers=1)
    cfg.check()
    template = load_prompt(cfg.prompt)
    with stage_run(opts, "llmctl-annotate-in-") as run:
        sources, refs = run.read_inputs(inputs)
        token = uuid.uuid4().hex
        if cfg.endpoint is not None:
            cfg.model = resolve_model(cfg.endpoint, cfg.model, cfg.retries, cfg.backoff, cfg.timeout)
            part = {"backend": "endpoint", "model": cfg.model}
            backend = EndpointBackend(cfg.endpoint, cfg.model, cfg.max_tokens, cfg.concurrency, cfg.retries, cfg.backoff,
                                      cfg.timeout, token)
            settings = {"endpoint": cfg.endpoint, "concurrency": cfg.concurrency, "retries": cfg.retries,
                        "backoff": cfg.backoff, "timeout": cfg.timeout}
        else:
            part, local = _checkpoint_backend(cfg)
            backend = LocalBackend(**local, device=cfg.device, max_tokens=cfg.max_tokens, batch_size=cfg.batch_size)
            settings = {"checkpoint": cfg.checkpoint, "batch_size": cfg.batch_size, "device": cfg.device}
        if cfg.prompt not in PROMPTS:
            settings["prompt_file"] = cfg.prompt
        config = identity_config(cfg, template, part)
        digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()

        def finish(m: Manifest) -> None:  # every shard is done: the caches go, the run's settings are recorded
            if out != STDIO:
                remove_caches(Path(out))
            m.config = {**m.config, "run": settings}

        tasks = run.tasks(key=run.stream_key)
        try:
            return run_sharded(stage=STAGE, kind="docs", out=out, tasks=tasks, fn=Spec(template, cfg, digest, backend),
                               config=config, inputs=refs, opts=opts, progress=progress, unit="docs", finish=finish)
        except StageFailed:
            down = DOWN.pop(token, None)  # this process's shards gave the endpoint up: say so, and what is kept
            if down is None or out == STDIO:
                raise
            raise StageFailed(f"{down}; {answers_kept(Path(out))} answer(s) of {sum(t.weight for t in tasks)} row(s) kept "
                              f"in {out}: run the same command again to resume") from None


def answers_kept(out: Path) -> int:
    """Rows of OUT answered so far: those of finished shards and those in the caches of the others."""
    n = 0
    for p in (out / SHARDS_DIR).glob("*.json"):
        if p.name != RUN_FILE:
            n += json.loads(p.read_text(encoding="utf-8")).get("counts", {}).get("in", 0)
    for p in (out / SHARDS_DIR).glob(f"*{CACHE_SUFFIX}"):
        n += max(0, p.read_bytes().count(b"\n") - 1)  # less the header
    return n


__all__ = ["AnnotateConfig", "EDU_PROMPT", "load_prompt", "build_prompt", "parse_score", "run_annotate"]
