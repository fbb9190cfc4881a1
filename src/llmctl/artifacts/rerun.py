"""What a single-process command does when it finds its OUT already there: the one rule cat,
head, eval, import and filter train-classifier keep across re-runs (`claim_out`), so that a command killed at any point and run
again (by hand, by a Makefile) ends as if it had never been killed (docs/design.md §3). report
claims its folder with the same run file (`start`) but, being a view of the artifacts as they are
now, writes it again whether the earlier report finished or not.

Such a command writes `OUT/.llmctl-run.json` before anything else — its *run identity*: the
command, its config's digest and each input's identity (`manifest.input_identity`: a manifest's,
a file's or a folder's sha256) — and its manifest last. Run again into the same OUT it finds:

- nothing (no OUT, an empty one): it starts;
- its own unfinished output (the same identity, no manifest: a kill, a full disk): it starts over,
  first clearing what it writes (its `own` names, temporaries, the run file); an entry it does not
  write is refused, naming it, and left alone;
- its own finished output (the same identity and a manifest): there is nothing to do — the command
  returns the manifest there, exit 0, and touches nothing. Where the identity cannot vouch for the
  inputs' bytes (stdin, a path that names no file or folder) it refuses instead, as for anything
  else: it cannot tell the finished output is this input's;
- anything else — another command's output, the same command's with another config or other
  inputs, someone's files — the usual refusal (exit 2, naming what differs), unless --overwrite,
  which replaces an output llmctl wrote and refuses one it did not (`atomic.check_overwrite`).

An OUT that is one of the inputs, holds one or lies inside one is refused with or without
--overwrite: clearing it would delete what the command is about to read.

The sharded stages keep the same rule with their own record, `.shards/run.json`
(runtime/sharded.py), which resumes shard by shard instead of starting over.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from llmctl.artifacts.atomic import (
    MANIFEST, RUN_FILE, STDIO, check_overwrite, clear_dir, entries, is_llmctl_manifest, is_temp, remove_entry, unowned_entries,
    write_text,
)
from llmctl.artifacts.manifest import input_identity
from llmctl.errors import UsageError

CONTENT_KEYS = ("manifest_sha256", "sha256", "listing_sha256")  # what vouches for an input's bytes


def run_identity(stage: str, config: dict, inputs: list[dict]) -> dict:
    """What a run of `stage` is made of: its config's digest and its inputs' identities (each an
    `inputs` entry of a manifest, `manifest.input_ref`, with the `role` it plays where it has one:
    a classifier's positive or negative side), with a digest of the whole."""
    digest = hashlib.sha256(json.dumps([stage, config], sort_keys=True, default=str).encode()).hexdigest()
    ident = {"stage": stage, "config": digest,
             "inputs": [{**input_identity(r), **({"role": r["role"]} if "role" in r else {})} for r in inputs]}
    ident["digest"] = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()
    return ident


def recorded_run(out: str | os.PathLike) -> dict | None:
    """OUT's run identity as its command wrote it; None when OUT has none; {} when the file does not
    read as one (a run with any identity differs from it)."""
    path = Path(out) / RUN_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def check_out(out: str | os.PathLike, overwrite: bool, own: Iterable[str] = ()) -> None:
    """The refusals that need no run identity, touching nothing: what a command checks before its
    costly start (loading a model) so a wrong -o fails at once. `-` (a stream) needs nothing."""
    if str(out) == STDIO:
        return
    p = Path(out)
    if p.exists() and not p.is_dir():
        if overwrite:
            check_overwrite(p)  # the message that says --overwrite replaces only llmctl's outputs
        raise UsageError(f"output {p} exists and is not a directory; remove it or pick another -o")
    if not p.exists():
        return
    if overwrite:
        check_overwrite(p, (*own, RUN_FILE))
    elif [e for e in entries(p) if not is_temp(e)] and recorded_run(p) is None:  # a kill's temporaries are not files
        check_overwrite(p, own)  # someone's files: --overwrite would not remove them either
        raise UsageError(f"output {p} already exists; use --overwrite to replace it")


def claim_out(out: str | os.PathLike, ident: dict, overwrite: bool, own: Iterable[str] = ()) -> bool:
    """Make OUT this run's, by the rule of the module doc: True when OUT already holds this run's
    finished output (the caller returns its manifest and writes nothing); else OUT is ready, holding
    only the run file. `own`: glob patterns of the entries the command writes before its manifest."""
    if str(out) == STDIO:
        return False
    p = Path(out)
    own = (*own, MANIFEST, RUN_FILE)
    check_out(p, overwrite, own)
    check_apart(p, ident["inputs"])
    if overwrite and p.exists():
        clear_dir(p, own)
    recorded = recorded_run(p)
    if recorded is not None:
        if recorded.get("digest") != ident["digest"]:
            raise UsageError(f"output {p} holds {_what_differs(recorded, ident)}; use --overwrite to replace it, "
                             "or another -o")
        if (p / MANIFEST).is_file() and is_llmctl_manifest(p / MANIFEST):
            if not vouched(ident):
                raise UsageError(f"output {p} holds a finished llmctl {ident['stage']} of {_unvouched(ident)}, which "
                                 "llmctl cannot tell is the same as this run's; use --overwrite to replace it")
            return True
    start(p, ident, own)
    return False


def start(out: Path, ident: dict, own: Iterable[str], keep_others: bool = False) -> None:
    """Begin a run in OUT: remove the entries the command writes (`own` patterns, temporaries, an
    earlier run file), then write this run's identity. An entry it does not write is refused,
    naming it (`keep_others`: left where it is, for a folder such as a report's that others share)."""
    out.mkdir(parents=True, exist_ok=True)
    own = (*own, RUN_FILE)
    others = unowned_entries(out, own)
    if others and not keep_others:
        shown = ", ".join(others[:5]) + (", …" if len(others) > 5 else "")
        raise UsageError(f"output {out} holds an unfinished llmctl {ident['stage']} and {len(others)} entr"
                         f"{'y' if len(others) == 1 else 'ies'} it did not write ({shown}); remove them or pick another -o")
    for name in entries(out):
        # the run file goes last (replaced whole below): a kill half-way through leaves OUT still
        # marked as this command's, for the re-run to clear
        if name not in others and name != RUN_FILE:
            remove_entry(out / name)
    write_text(out / RUN_FILE, json.dumps(ident, sort_keys=True) + "\n")


@contextmanager
def running(out: str | os.PathLike) -> Iterator[None]:
    """The block that writes a claimed OUT: when it fails having written nothing but the run file
    (a usage error found in the inputs, a full disk at the first write), the run file goes too, so
    OUT is as the command found it and a corrected command is not refused. Whatever else it
    wrote stays, for a re-run to clear."""
    try:
        yield
    except BaseException:
        p = Path(out)
        if str(out) != STDIO and entries(p) == [RUN_FILE]:
            (p / RUN_FILE).unlink(missing_ok=True)
        raise


def check_apart(out: Path, inputs: list[dict]) -> None:
    """Refuse an OUT that is an input, holds one or lies inside one (see the module doc)."""
    here = out.resolve()
    for ref in inputs:
        path = ref.get("path")
        if not path or path == STDIO or not Path(path).exists():
            continue
        there = Path(path).resolve()
        if here == there or there.is_relative_to(here) or here.is_relative_to(there):
            raise UsageError(f"output {out} {'is' if here == there else 'holds' if there.is_relative_to(here) else 'lies inside'} "
                             f"the input {path}; write the output elsewhere")


def vouched(ident: dict) -> bool:
    """Whether every input of a run identity is named by the hash of its bytes."""
    return all(any(k in i for k in CONTENT_KEYS) for i in ident["inputs"])


def _unvouched(ident: dict) -> str:
    i = next(i for i in ident["inputs"] if not any(k in i for k in CONTENT_KEYS))
    return "stdin" if i.get("path") == STDIO else str(i.get("path"))


def _what_differs(recorded: dict, ident: dict) -> str:
    stage = recorded.get("stage")
    if not stage:
        return f"an unreadable {RUN_FILE}"
    if stage != ident["stage"]:
        return f"the output of llmctl {stage}, not of {ident['stage']}"
    if recorded.get("config") != ident["config"]:
        return f"the output of llmctl {stage} with another config"
    old, new = recorded.get("inputs") or [], ident["inputs"]
    if len(old) != len(new):
        return f"the output of llmctl {stage} of {len(old)} input(s), not these {len(new)}"
    for i, (a, b) in enumerate(zip(old, new), 1):
        if a != b:
            how = "another input" if a.get("path") != b.get("path") else "the same path with other content"
            return f"the output of llmctl {stage} of {how}: input {i} was {a.get('path')}, now {b.get('path')}"
    return f"the output of llmctl {stage} of other inputs"
