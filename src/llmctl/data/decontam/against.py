"""The eval task files decontam checks against (`--against`): naming them, finding them, and
reading each record as passages.

A record's passages come from the task-family registry (`llmctl.tasks.record_passages`): each
family module (tasks/winogrande.py, tasks/piqa.py, tasks/arc.py, tasks/hellaswag.py, and the
free-form reader tasks/freeform.py for generic, GSM8K, MMLU, MATH … records) says how its records
are written out — the question/context followed by an answer or by each choice, the way the
item would appear in a web page or a dataset dump. A record no family can read raises
UsageError naming file:line.
"""

from __future__ import annotations

import glob
import re
from dataclasses import dataclass
from pathlib import Path

from llmctl.errors import UsageError
from llmctl.tasks import read_records, record_passages, where

TASK_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".ndjson", ".ndjson.gz", ".parquet")
SPLIT_NAMES = ("test", "train", "validation", "valid", "val", "dev", "eval")


def item_texts(records: list[dict], path: str | Path = "") -> list[list[str]]:
    """One list of passages per eval record (read with tasks.read_records); a record with no
    recognizable text field raises UsageError naming file:line."""
    out = []
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            raise UsageError(f"{where(path, {}, i)}: expected an object, got {type(rec).__name__}")
        out.append(record_passages(rec, where(path, rec, i)))
    return out


@dataclass
class EvalTask:
    name: str
    path: str
    passages: list[list[str]]
    lines: list[int | None]

    @classmethod
    def load(cls, name: str, path: str) -> EvalTask:
        records = read_records(path)
        if not records:
            raise UsageError(f"task file {path} holds no items")
        return cls(name, path, item_texts(records, path), [r.get("_line") for r in records])


def task_name(path: Path) -> str:
    """The file name without extensions, with its folder in front when it is only a split name
    (gsm8k/test.jsonl -> gsm8k-test)."""
    stem = path.name
    for suf in sorted(TASK_SUFFIXES, key=len, reverse=True):
        if stem.lower().endswith(suf):
            stem = stem[: -len(suf)]
            break
    if re.match(rf"^({'|'.join(SPLIT_NAMES)})([-_.]|$)", stem, re.I) and path.resolve().parent.name:
        return f"{path.resolve().parent.name}-{stem}"
    return stem


def resolve_task_files(args: list[str]) -> list[tuple[str, str]]:
    """(name, path) per task file, in order: paths, directories (their task files), globs,
    comma-separated lists, or NAME=PATH to name a task."""
    out: list[tuple[str, str]] = []
    for arg in (a for given in args for a in given.split(",") if a):
        name = None
        if "=" in arg and not Path(arg).exists():
            name, arg = arg.split("=", 1)
            if not re.fullmatch(r"[\w.+-]+", name):
                raise UsageError(f"task name {name!r} (in --against NAME=PATH) may use letters, digits, . _ + - only")
        matches = sorted(glob.glob(arg)) if glob.has_magic(arg) else [arg]
        if not matches:
            raise UsageError(f"no task file matches {arg!r}")
        files = []
        for m in matches:
            p = Path(m)
            if p.is_dir():
                files += sorted(str(f) for f in p.iterdir() if f.is_file() and f.name.lower().endswith(TASK_SUFFIXES) and not f.name.startswith("."))
            elif p.is_file():
                files.append(m)
            else:
                raise UsageError(f"task file not found: {m}")
        if not files:
            raise UsageError(f"no task files (.jsonl, .jsonl.gz, .parquet) in {arg}")
        if name and len(files) > 1:
            raise UsageError(f"--against {name}=... names one task but {arg} holds {len(files)} files")
        out += [(name or task_name(Path(f)), f) for f in files]
    if not out:
        raise UsageError("give the eval task files to check against with --against")
    seen: dict[str, str] = {}
    for name, f in out:
        if name in seen:
            raise UsageError(f"two task files are both named {name!r} ({seen[name]}, {f}); name them with --against NAME=PATH")
        seen[name] = f
    return out


__all__ = ["EvalTask", "item_texts", "resolve_task_files", "task_name"]
