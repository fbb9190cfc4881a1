"""Reading task files: JSONL (one object per line, optionally gzipped) or Parquet, as a list of
plain dicts — the one reader behind eval items, decontam's `--against` files, rl prompt files and
SFT chats files.

Task files come from many places (a benchmark's native release, a hand-written JSONL), so a bad
line is reported by file and line number, never as a traceback. Each JSONL record remembers its
line in `_line`, which `where` uses to name it in an error.
"""

from __future__ import annotations

import json
from pathlib import Path

from llmctl.errors import UsageError


def read_records(path: str | Path) -> list[dict]:
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"task file not found: {p}")
    if p.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            return pq.read_table(p).to_pylist()
        except (pa.ArrowInvalid, OSError) as e:
            raise UsageError(f"{p}: not a readable Parquet file ({e})") from e
    records = []
    opener = __import__("gzip").open if p.suffix == ".gz" else open
    with opener(p, "rt", encoding="utf-8", errors="strict") as f:
        try:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise UsageError(f"{p}:{n}: not valid JSON ({e.msg} at column {e.colno})") from e
                if not isinstance(rec, dict):
                    raise UsageError(f"{p}:{n}: expected a JSON object, got {type(rec).__name__}")
                rec["_line"] = n
                records.append(rec)
        except UnicodeDecodeError as e:
            raise UsageError(f"{p}: not UTF-8 ({e.reason} at byte {e.start})") from e
    return records


def where(path: str | Path, rec: dict, index: int) -> str:
    """How to name an item in an error: file:line for JSONL, file row N for Parquet."""
    return f"{path}:{rec['_line']}" if "_line" in rec else f"{path} row {index}"
