"""dedup's last phase: one task per input file, through the sharded driver. Kept rows get
dup_cluster_id (the survivor's id) and dup_cluster_size, the span methods' cuts (removed_spans)
and, with --lines, lose their frequent lines; removed rows go to rejected/ with reason and dup_of."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from llmctl.artifacts.docs import DocsSource
from llmctl.artifacts.docs_shard import ShardInput, ShardOutput
from llmctl.data.dedup.config import METHODS, DedupConfig
from llmctl.data.dedup.spans import SPANS_TYPE, SpanCuts
from llmctl.hashing import h64
from llmctl.runtime.executor import Task


@dataclass
class Filter:
    cfg: DedupConfig

    def __call__(self, task: Task, out: Path, report) -> dict:
        return filter_shard(task, out, report, self.cfg)


def _cut(row: dict, cuts: SpanCuts, i: int, text: str, cfg: DedupConfig) -> tuple[dict | None, dict | None]:
    """A surviving row after the span methods: (the row to keep or None, a row for rejected/:
    the whole document when the cut left it too short, else its cut text, or None)."""
    new, spans, blame, removed = cuts.apply(i, text)
    row["removed_spans"] = spans
    if not spans or cfg.annotate_only:
        return row, None
    if blame is not None:
        row["reason"] = f"dedup.{blame}"
        return None, row
    cut_text = {**row, "text": removed, "reason": "dedup.spans.cut"} if cfg.keep_rejected else None
    row["text"] = new
    return row, cut_text


def filter_shard(task: Task, out: Path, report, cfg: DedupConfig) -> dict:
    work = Path(task.payload["work"])
    with np.load(work / "clusters" / f"{task.index:05d}.npz") as z:  # this file's documents only
        size, removed_by, survivor_ids = z["size"], z["removed_by"], z["survivor_ids"]
    with np.load(work / "clusters.npz") as z:
        frequent = z["frequent"]
    inp = ShardInput(DocsSource(**task.payload["source"]))  # it leaves out what the sign phase left out
    if inp.schema is None:  # the file does not open: nothing to write, the damage is counted
        return inp.stats([], {"in": 0, "out": 0})
    schema = inp.schema
    new_cols = [("dup_cluster_id", pa.string()), ("dup_cluster_size", pa.int64())] + [("removed_spans", SPANS_TYPE)] * cfg.spans
    cuts = SpanCuts(cfg, work, task.index, task.payload["n_refs"] + task.index) if cfg.spans else None
    for name, typ in new_cols:
        if name not in schema.names:
            schema = schema.append(pa.field(name, typ))
    removed = {m: {"docs": 0, "chars": 0} for m in METHODS if m != "semantic" or cfg.semantic}
    lines_removed = line_chars = 0
    n_in = n_out = 0
    with ShardOutput(out, task.name, schema, rejected=[("dup_of", pa.string())] if cfg.keep_rejected else None) as shard:
        i = 0
        for batch in inp.batches():
            kept, dropped = [], []
            for row in batch.to_pylist():
                text = row.get("text") or ""
                row["dup_cluster_id"] = str(survivor_ids[i])
                row["dup_cluster_size"] = int(size[i])
                if removed_by[i]:
                    m = METHODS[removed_by[i] - 1]
                    removed[m]["docs"] += 1
                    removed[m]["chars"] += len(text)
                    row["reason"], row["dup_of"] = f"dedup.{m}", str(survivor_ids[i])
                    dropped.append(row)
                else:
                    if cuts is not None:
                        kept_row, rejected_row = _cut(row, cuts, i, text, cfg)
                        dropped += [rejected_row] if rejected_row is not None else []
                        if kept_row is None:
                            i += 1
                            continue
                        text = row["text"] or ""
                    if len(frequent) and text:
                        lines = text.split("\n")
                        keep = [ln for ln in lines if not (ln.strip() and _is_frequent(h64(ln.strip()), frequent))]
                        if len(keep) != len(lines):
                            lines_removed += len(lines) - len(keep)
                            new = "\n".join(keep)
                            line_chars += len(text) - len(new)
                            row["text"] = new
                    kept.append(row)
                i += 1
            n_in += batch.num_rows
            n_out += len(kept)
            shard.write_rows(kept, dropped)
            report(batch.num_rows)
    counts = {"in": n_in, "out": n_out, "removed": removed, "lines": {"removed": lines_removed, "chars": line_chars}}
    if cuts is not None:
        counts["spans"] = cuts.finish()
    return inp.stats(shard.outputs, counts)


def _is_frequent(h: int, frequent: np.ndarray) -> bool:
    j = np.searchsorted(frequent, np.uint64(h))
    return j < len(frequent) and frequent[j] == np.uint64(h)
