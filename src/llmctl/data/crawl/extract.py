"""crawl-extract: Common Crawl WARC files -> the docs artifact.

Per response record, cheapest test first (spec 001-data-eval §A1: the URL filter runs first, it
needs only the address):

    not_response -> url (blocklist / banned words) -> status (HTTP 200 only) -> truncated
    -> too_large -> not_html -> decode -> extraction (timeout, empty) -> language ID

Each skipped record is counted under its reason. Extraction is trafilatura's, by default with
the FineWeb settings (favour precision, no comments, dedupe on; spec §A1, L1215; `fast` is
trafilatura's fast mode), or resiliparse's as DCLM ran it (data/crawl/extractors.py): everything before
and after the extractor is the same for both. Language ID is fastText lid.176 with the keep rule
of spec §A2.

Work is split into byte ranges of the input files (runtime/split.py), so one 1 GB WARC keeps
every core busy; the ranges depend only on the inputs, so the output is the same whatever
`--workers`. trafilatura's dedup cache is made fresh for each range for the same reason. A WARC
on stdin (`-`) is read by this process and cut into windows where a file's ranges would be cut
(data/crawl/warcstream.py); its rows' `warc_path` is `-`.
"""

from __future__ import annotations

import glob
import os
import re
import signal
import threading
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from html import unescape
from pathlib import Path

import pyarrow as pa
from warcio.statusandheaders import StatusAndHeadersParser, StatusAndHeadersParserException

from llmctl.artifacts.docs import STDIO, part_name
from llmctl.artifacts.files import problem, shown
from llmctl.artifacts.docs_shard import ShardOutput
from llmctl.artifacts.manifest import Manifest, input_ref
from llmctl.artifacts.stdin import StdinReader
from llmctl.data import langid
from llmctl.data.crawl import extractors
from llmctl.data.crawl.decode import UndecodableError, decode_html
from llmctl.data.urlfilter import UrlFilter
from llmctl.data.crawl.warc import WarcError, file_size, iter_records, iter_window, sniff, splittable
from llmctl.data.crawl.warcstream import WarcStream
from llmctl.errors import UsageError
from llmctl.runtime.executor import Task
from llmctl.runtime.progress import Progress
from llmctl.runtime.split import auto_chunk, byte_ranges
from llmctl.runtime.options import RunOptions
from llmctl.runtime.sharded import run_sharded
from llmctl.runtime.stage import stage_run

STAGE = "crawl-extract"
HTML_TYPES = ("text/html", "application/xhtml+xml")
SKIP_REASONS = ("not_response", "url", "status", "truncated", "too_large", "not_html", "decode", "timeout", "empty")

SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("text", pa.string()),
        ("url", pa.string()),
        ("date", pa.string()),
        ("title", pa.string()),
        ("lang", pa.string()),
        ("lang_score", pa.float32()),
        ("warc_path", pa.string()),
        ("warc_offset", pa.int64()),
    ]
)


@dataclass
class ExtractConfig:
    extractor: str = "trafilatura"  # or "resiliparse" (data/crawl/extractors.py)
    fast: bool = False  # trafilatura fast mode (no fallback extractors)
    favor_precision: bool = True  # trafilatura; FineWeb setting
    include_comments: bool = False  # both extractors: keep comment sections
    deduplicate: bool = True  # trafilatura
    include_tables: bool = True  # trafilatura
    # resiliparse's extract_plain_text options, at its own defaults except main_content
    main_content: bool = True
    preserve_formatting: bool = True
    list_bullets: bool = True
    alt_texts: bool = True
    links: bool = False
    form_fields: bool = False
    noscript: bool = False
    languages: list[str] = field(default_factory=list)  # empty: score only, keep all
    lang_threshold: float = 0.65  # FineWeb / RefinedWeb (spec §A2)
    langid_model: str | None = None
    max_bytes: int = 10 << 20  # HTTP payloads larger than this are skipped as too_large
    timeout: float = 5.0  # seconds per record; generous so only pathological pages hit it
    blocklist_files: list[str] = field(default_factory=list)
    banned_words_files: list[str] = field(default_factory=list)
    keep_rejected: bool = False

    def __post_init__(self):
        extractors.check_name(self.extractor)


# ---------------------------------------------------------------------------------------------
# Inputs and tasks


def expand_inputs(args: list[str]) -> list[str]:
    """Paths, globs, directories (their *.warc[.gz] files) and @list files, in order. What a glob
    or a folder lists that is not a regular file (a FIFO, a socket, a link that loops or dangles:
    artifacts/files.py) is kept, to be counted and named by its task and never opened; a path
    typed alone must be a file or a folder."""
    if not args:
        raise UsageError("no input WARC files given")
    out: list[str] = []
    for a in args:
        if a == STDIO:
            raise UsageError("'-' (stdin) cannot be combined with other inputs")
        if a.startswith("@"):
            listing = Path(a[1:])
            if not listing.is_file():
                raise UsageError(f"path list not found: {listing}")
            lines = [ln.strip() for ln in listing.read_text().splitlines()]
            out += expand_inputs([ln for ln in lines if ln and not ln.startswith("#")])
        elif "://" in a:
            out.append(a)
        elif glob.has_magic(a):
            found = sorted(glob.glob(a))
            if not found:
                raise UsageError(f"no file matches {a!r}")
            out += found
        elif Path(a).is_dir():
            found = sorted(str(p) for p in Path(a).iterdir() if p.name.endswith((".warc", ".warc.gz", ".arc", ".arc.gz")))
            if not found:
                raise UsageError(f"no .warc/.warc.gz files in {a}")
            out += found
        elif Path(a).is_file():
            out.append(a)
        elif os.path.lexists(a):
            raise UsageError(f"{shown(a)}: {problem(a)}")
        else:
            raise UsageError(f"input not found: {shown(a)}")
    return out


def plan_tasks(paths: list[str]) -> list[Task]:
    """Byte-range tasks over all inputs; the range size depends only on the total input size. A
    path that is not a regular file gets one task that only names it (`problem`); a name that is
    not UTF-8 is given to rows and errors as files.shown writes it (`label`)."""
    problems = [None if "://" in p else problem(p) for p in paths]
    if paths and all(problems):  # nothing to read: a usage error, as for the docs readers
        raise UsageError(f"{shown(paths[0])}: {problems[0]}")
    sizes = [0 if why else file_size(p) for p, why in zip(paths, problems)]
    chunk = auto_chunk(sum(sizes))
    tasks: list[Task] = []
    for path, size, why in zip(paths, sizes, problems):
        named = {} if shown(path) == path else {"label": shown(path)}
        if why:
            tasks.append(Task(len(tasks), part_name(len(tasks), ""), {"path": path, "start": 0, "end": 0, "problem": why, **named}))
            continue
        ranges = byte_ranges(size, chunk) if splittable(sniff(path)) else [(0, size)]
        for start, end in ranges:
            i = len(tasks)
            tasks.append(Task(i, part_name(i, ""), {"path": path, "start": start, "end": end, **named}, weight=max(1, end - start)))
    return tasks


# ---------------------------------------------------------------------------------------------
# One record


class RecordTimeout(Exception):
    pass


@contextmanager
def time_limit(seconds: float):
    """Interrupt the block after `seconds` (SIGALRM, so only on a process's main thread, which is
    where executor tasks run; an embedding program calling from another thread gets no limit)."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def fire(signum, frame):
        raise RecordTimeout()

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


_TITLE = re.compile(r"<title[^>]*>(.*?)</title\s*>", re.I | re.S)


def page_title(html: str) -> str | None:
    m = _TITLE.search(html, 0, 200_000)
    if not m:
        return None
    title = " ".join(unescape(m.group(1)).split())
    return title or None


def is_html(content_type: str | None, identified: str | None, body_head: bytes) -> bool:
    if content_type:
        return content_type.split(";")[0].strip().lower() in HTML_TYPES
    if identified:  # Common Crawl's own sniffing (WARC-Identified-Payload-Type)
        return identified.split(";")[0].strip().lower() in HTML_TYPES
    head = body_head[:1024].lstrip().lower()
    return any(tag in head for tag in (b"<!doctype html", b"<html", b"<head", b"<body", b"<title"))


def http_headers(rec, url: str):
    """The record's HTTP headers. warcio parses them only when the target URI is http(s):, so an
    entity-escaped URI hides them; parse them here and attach them to the record, so that
    content_stream() still undoes chunking and gzip."""
    if rec.http_headers is not None or not url.startswith(("http://", "https://")):
        return rec.http_headers
    if rec.rec_type != "response":
        return None
    try:
        rec.http_headers = StatusAndHeadersParser(["HTTP/1.0", "HTTP/1.1"], verify=False).parse(rec.raw_stream)
    except (StatusAndHeadersParserException, EOFError, ValueError):
        return None
    return rec.http_headers


class Extractor:
    """Turns one WARC record into (row, None) or (None, skip_reason)."""

    def __init__(self, cfg: ExtractConfig):
        self.cfg = cfg
        self.urls = UrlFilter.from_files(cfg.blocklist_files, cfg.banned_words_files)
        self._extract = extractors.make(cfg)  # one per task: trafilatura's dedup cache is per task

    def record(self, rec, path: str, offset: int, has_ids: bool = True) -> tuple[dict | None, str | None]:
        """`has_ids` False for legacy ARC, which has no record ids: warcio's conversion makes up a
        random one, and an id must be stable, so the row is named by its place (FILE@OFFSET)."""
        cfg = self.cfg
        if rec.rec_type != "response":
            return None, "not_response"
        url = rec.rec_headers.get_header("WARC-Target-URI") or ""
        if "://" not in url and "&#" in url:  # some crawlers entity-escape the target URI
            url = unescape(url)
        if self.urls.blocked(url):
            return None, "url"
        http = http_headers(rec, url)
        if http is None or http.get_statuscode() != "200":
            return None, "status"
        if rec.rec_headers.get_header("WARC-Truncated"):
            return None, "truncated"
        if rec.length is not None and rec.length > cfg.max_bytes:
            return None, "too_large"
        content_type = http.get_header("Content-Type")
        identified = rec.rec_headers.get_header("WARC-Identified-Payload-Type")
        if content_type and not is_html(content_type, None, b""):
            return None, "not_html"
        try:
            body = rec.content_stream().read(cfg.max_bytes + 1)
        except Exception:  # warcio surfaces broken chunking / gzip as assorted exceptions
            return None, "decode"
        if len(body) > cfg.max_bytes:
            return None, "too_large"
        if not content_type and not is_html(None, identified, body):
            return None, "not_html"
        try:
            html, _ = decode_html(body, content_type)
        except UndecodableError:
            return None, "decode"
        try:
            # a native extractor (resiliparse) is not interrupted mid-call: the alarm fires when
            # it returns, so a page over the limit is still skipped as timeout, just later
            with time_limit(cfg.timeout):
                text = self._extract(html)
        except RecordTimeout:
            return None, "timeout"
        if not text or not text.strip():
            return None, "empty"
        row = {
            "id": (has_ids and rec.rec_headers.get_header("WARC-Record-ID")) or f"{Path(path).name}@{offset}",
            "text": text,
            "url": url,
            "date": rec.rec_headers.get_header("WARC-Date"),
            "title": page_title(html),
            "warc_path": path,
            "warc_offset": offset,
        }
        return row, None


# ---------------------------------------------------------------------------------------------
# One shard (a byte range of one file, or a window of a stream)


def extract_shard(task: Task, out: Path, report, cfg: ExtractConfig) -> dict:
    p = task.payload
    path, start, end = p.get("label", p["path"]), p["start"], p["end"]  # path: what rows and errors name
    if "problem" in p:  # never opened: a FIFO would block, a device would never end
        items, has_ids = iter(()), True
    else:
        items = iter_window(p["data"], start, p["fmt"]) if "data" in p else iter_records(p["path"], start, end)
        has_ids = (p["fmt"] if "data" in p else sniff(p["path"])) not in ("arc", "arc.gz")
    ex = Extractor(cfg)
    model = langid.load(langid.find_model(cfg.langid_model))
    rows: list[dict] = []
    skipped = {r: 0 for r in SKIP_REASONS}
    errors: list[dict] = [{"file": path, "error": p["problem"]}] if "problem" in p else []
    records = 0
    reported = start
    for item in items:
        if isinstance(item, WarcError):
            errors.append({"file": path, "offset": item.offset, "error": item.message})
            continue
        records += 1
        try:
            row, reason = ex.record(item.record, path, item.offset, has_ids)
        except Exception as e:  # a record that breaks a library must not take the shard with it
            errors.append({"file": path, "offset": item.offset, "error": f"{type(e).__name__}: {e}"})
            row, reason = None, None
        if reason:
            skipped[reason] += 1
        elif row:
            rows.append(row)
        if item.offset > reported:
            report(min(item.offset, end) - reported)
            reported = min(item.offset, end)
    report(max(0, end - reported))

    for row, (lang, score) in zip(rows, langid.predict(model, [r["text"] for r in rows])):
        row["lang"], row["lang_score"] = lang, score
    keep = set(cfg.languages)
    kept = [r for r in rows if not keep or (r["lang"] in keep and r["lang_score"] >= cfg.lang_threshold)]
    rejected = [dict(r, reason="lang") for r in rows if keep and not (r["lang"] in keep and r["lang_score"] >= cfg.lang_threshold)]

    with ShardOutput(out, task.name, SCHEMA, rejected=[] if cfg.keep_rejected else None) as shard:
        shard.write_rows(kept, rejected)
    return {
        "outputs": shard.outputs,
        "counts": {
            "records": records,
            "in": len(rows) + sum(skipped.values()) - skipped["not_response"],
            "out": len(kept),
            "skipped": skipped,
            "rejected": {"lang": len(rejected)},
            "errors": len(errors),
        },
        "errors": errors,
    }


@dataclass
class _ShardFn:
    """Picklable binding of the config to the task function."""

    cfg: ExtractConfig

    def __call__(self, task, out, report):
        return extract_shard(task, out, report, self.cfg)


def run_crawl_extract(
    inputs: list[str],
    out: str,
    cfg: ExtractConfig,
    opts: RunOptions | None = None,
    progress: Progress | None = None,
    stdout=None,
    stdin=None,
) -> Manifest:
    opts = opts or RunOptions()
    if inputs == [STDIO] and opts.executor != "local":
        raise UsageError("--executor ray runs on files (or s3:// URLs) its workers can open; a stream on stdin is read here, give paths")
    with stage_run(opts, "llmctl-crawl-extract-") as run:
        if inputs == [STDIO]:
            stream = WarcStream(StdinReader(stdin, "a WARC file"), str(run.tmp))
            tasks, refs = stream, lambda: [stream.input_ref()]  # cut as it is read, named once read
        else:
            # absolute paths, so warc_path leads back to the record from wherever the docs are read
            paths = [p if "://" in p else str(Path(p).resolve()) if problem(p) is None else os.path.abspath(p) for p in expand_inputs(inputs)]
            refs = [{"path": p, "kind": "url"} if "://" in p else input_ref(p) if problem(p) is None else {"path": p, "kind": "skipped"}
                    for p in paths]
        if cfg.lang_threshold < 0 or cfg.lang_threshold > 1:
            raise UsageError("--lang-threshold must be between 0 and 1")
        model_path = langid.find_model(cfg.langid_model)
        langid.load(model_path)  # load before forking so workers share the pages, and fail early
        extractors.warm_up(cfg.extractor)
        # pyarrow imports pandas the first time it builds an array (~0.5 s of CPU): do it once here,
        # before the workers fork, not once in every worker
        pa.Table.from_pylist([], schema=SCHEMA)
        UrlFilter.from_files(cfg.blocklist_files, cfg.banned_words_files)  # an unreadable list fails here, once
        if inputs != [STDIO]:
            try:
                tasks = plan_tasks(paths)
            except OSError as e:
                raise UsageError(f"cannot read input: {e}") from e
        return run_sharded(
            stage=STAGE,
            kind="docs",
            out=out,
            tasks=tasks,
            fn=_ShardFn(cfg),
            config=asdict(cfg),
            inputs=refs,
            opts=opts,
            progress=progress,
            stdout=stdout,
            schema=SCHEMA,
            unit="bytes",  # task weights are byte ranges of the input
        )
