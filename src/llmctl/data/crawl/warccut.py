"""`sample --warc`: a WARC cut down to its first N `response` records, for a CI job's own pipeline.

The cut of a file is a *prefix* of it, byte for byte: everything from its first byte (the
`warcinfo` record) up to and including the Nth response and the records after it that belong to
that response, and nothing after. Common Crawl writes a capture as request, response, metadata,
each record its own gzip member, so the cut is whole members (the original ones, never
re-compressed), holds every response's request and metadata, and is a valid WARC; since it is a
prefix, the rows crawl-extract makes of it have the same ids and `warc_offset`s as the original's.
Records between the responses that are not responses (revisits, resources, dns) are copied as they
stand, since they are part of the prefix; they are not counted as responses, and crawl-extract
skips them as `not_response`.

A record after the Nth response belongs to it when it is not itself a request, response, revisit
or warcinfo record and it names the response in `WARC-Concurrent-To` or `WARC-Refers-To`, or has
its `WARC-Target-URI` (Common Crawl's metadata records name it; some writers' only share its URI).
A gzip member that holds several records (not Common Crawl's way) is copied whole, so it can bring
more than N responses; the counts say how many there are.

Several inputs are cut in order, each into its own part (`part-00000.warc.gz`, …, a prefix of the
input at that place in the list), until N responses are copied in all; a file with fewer gives all
of its own. A plain (uncompressed) WARC is cut the same way at record boundaries (`.warc` parts).
Damage (a corrupt or truncated gzip member, an unparsable record) ends the cut of that file just
before the damaged member: what comes before it is whole, the damage is counted under `errors`
with its file and byte offset and named in a log line, and the next input, if any, goes on. A
legacy ARC file, or a path that is not a regular file, is counted the same way and not cut.

OUT is an artifact like every other command's: the parts and a manifest (kind `warc`: inputs,
config, counts of responses, records and bytes), resumed and re-run as cat's are
(artifacts/rerun.py). `-o -` writes the cut parts one after the other on stdout, a WARC that
`crawl-extract -` reads.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from llmctl.artifacts.atomic import STDIO, atomic_path
from llmctl.artifacts.files import problem, shown
from llmctl.artifacts.lock import output_lock
from llmctl.artifacts.manifest import Manifest, input_ref, output_entry, read_manifest, write_manifest
from llmctl.artifacts.rerun import claim_out, run_identity, running
from llmctl.data.crawl.extract import expand_inputs
from llmctl.data.crawl.warc import WarcError, file_size, iter_records, open_binary, sniff, splittable
from llmctl.errors import StageFailed, UsageError
from llmctl.runtime.progress import Progress

STAGE = "sample"
PARTS = ("part-*.warc.gz", "part-*.warc")  # what the cut writes before its manifest
COPY_BLOCK = 1 << 20
OWN_RECORDS = ("request", "response", "revisit", "warcinfo")  # records that never belong to another


@dataclass
class WarcCutConfig:
    n: int = 10  # response records to copy
    overwrite: bool = False
    strict: bool = False  # damaged input fails the run (exit 1) instead of being cut before and counted


@dataclass
class FileCut:
    """Where one file's cut ends: its first `end` bytes hold `records` records, `responses` of them
    responses. `error`: the damage the cut stopped at, if any."""

    end: int
    records: int
    responses: int
    error: WarcError | None = None


def _ids(rec, name: str) -> list[str]:
    return [v for k, v in rec.rec_headers.headers if k.lower() == name.lower()]


def _belongs(rec, response) -> bool:
    """Whether `rec`, read after `response`, is one of its records (the module doc's rule)."""
    if rec.rec_type in OWN_RECORDS:
        return False
    rid = response.rec_headers.get_header("WARC-Record-ID")
    uri = response.rec_headers.get_header("WARC-Target-URI")
    named = rid is not None and rid in _ids(rec, "WARC-Concurrent-To") + _ids(rec, "WARC-Refers-To")
    return named or (uri is not None and rec.rec_headers.get_header("WARC-Target-URI") == uri)


def plan_cut(path: str, want: int) -> FileCut:
    """The prefix of `path` that holds its first `want` responses (all of them when it has fewer),
    ending before any damage."""
    kept: list[tuple[int, bool]] = []  # (offset, is a response) of each record in the cut
    responses = 0
    last = None  # the `want`th response, once met: only its own records may follow
    end = None
    error = None
    with contextlib.closing(iter_records(path)) as items:
        for item in items:
            if isinstance(item, WarcError):
                kept = [k for k in kept if k[0] < item.offset]  # a damaged member is not copied, not even in part
                end, error = item.offset, item
                break
            rec = item.record
            if last is not None and item.offset != kept[-1][0] and not _belongs(rec, last):
                end = item.offset  # the first record past the cut (a member of several records is copied whole)
                break
            kept.append((item.offset, rec.rec_type == "response"))
            responses += rec.rec_type == "response"
            if last is None and rec.rec_type == "response" and responses >= want:
                last = rec
    if end is None:
        end = file_size(path)
    return FileCut(end, len(kept), sum(r for _, r in kept), error)


def run_warc_cut(inputs: list[str], out: str, cfg: WarcCutConfig, progress: Progress | None = None, stdout=None) -> Manifest:
    with output_lock(out):
        return _run(inputs, out, cfg, progress or Progress(), stdout)


def _run(inputs: list[str], out: str, cfg: WarcCutConfig, progress: Progress, stdout) -> Manifest:
    if cfg.n < 1:
        raise UsageError(f"-n must be >= 1, got {cfg.n}")
    if STDIO in inputs:
        raise UsageError("sample --warc reads WARC files, not stdin: give the file (or an s3:// or https:// path)")
    t0 = time.perf_counter()
    paths = expand_inputs(inputs)
    local = [p for p in paths if "://" not in p]
    if local and len(local) == len(paths) and all(problem(p) for p in local):  # nothing to read: a usage error
        raise UsageError(f"{shown(local[0])}: {problem(local[0])}")
    refs = [input_ref(p) for p in paths]
    config = {"n": cfg.n, "warc": True}
    if claim_out(out, run_identity(STAGE, config, refs), cfg.overwrite, own=PARTS):
        progress.log(f"{STAGE}: {out} already holds this cut's finished output; nothing to do")
        return _strict(read_manifest(out), cfg)
    with running(out):
        progress.start(cfg.n, "responses", STAGE)
        errors: list[dict] = []
        outputs: list[dict] = []
        counts = {"responses": 0, "records": 0, "bytes": 0}
        for path in paths:
            left = cfg.n - counts["responses"]
            if left <= 0:
                break
            why = None if "://" in path else problem(path)
            fmt = None if why else sniff(path)
            if why is None and not splittable(fmt):
                why = "not a WARC file (a legacy ARC file, or no crawl file at all): not cut"
            if why is not None:
                errors.append({"file": shown(path), "error": why})
                progress.log(f"{STAGE}: skipped {shown(path)}: {why}")
                continue
            cut = plan_cut(path, left)
            if cut.error is not None:
                errors.append({"file": shown(path), "offset": cut.error.offset, "error": cut.error.message})
                progress.log(f"{STAGE}: {shown(path)}: cut before damage at byte {cut.error.offset} "
                             f"({cut.responses} response(s) before it): {cut.error.message}")
            if cut.end == 0:
                continue
            part = f"part-{len(outputs):05d}.{fmt}"
            if out == STDIO:
                _copy(path, cut.end, stdout if stdout is not None else sys.stdout.buffer)
                outputs.append({"file": part, "rows": cut.records, "bytes": cut.end})
            else:
                with atomic_path(Path(out) / part) as tmp, open(tmp, "wb") as f:
                    _copy(path, cut.end, f)
                outputs.append({**output_entry(Path(out) / part, cut.records, Path(out)), "source": shown(path)})
            counts["responses"] += cut.responses
            counts["records"] += cut.records
            counts["bytes"] += cut.end
            progress.advance(cut.responses)
        progress.finish()
        manifest = Manifest(kind="warc", stage=STAGE, config=config, inputs=refs, outputs=outputs,
                            counts={**counts, "errors": len(errors)}, errors=errors,
                            wall_seconds=round(time.perf_counter() - t0, 3))
        if out != STDIO:
            write_manifest(out, manifest)
    return _strict(manifest, cfg)


def _copy(path: str, size: int, dst) -> None:
    """The first `size` bytes of `path` into the open binary file `dst`."""
    with open_binary(path) as src:
        left = size
        while left > 0:
            block = src.read(min(COPY_BLOCK, left))
            if not block:
                raise StageFailed(f"{shown(path)} changed while it was cut (it ends before byte {size})")
            dst.write(block)
            left -= len(block)
    dst.flush()


def _strict(manifest: Manifest, cfg: WarcCutConfig) -> Manifest:
    if cfg.strict and manifest.counts.get("errors"):
        raise StageFailed(f"{manifest.counts['errors']} damaged or unreadable input(s): the cut stopped before the damage (--strict)")
    return manifest
