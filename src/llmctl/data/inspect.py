"""`llmctl inspect PATH`: what is this, how big, what does it look like.

Works on any artifact (via its manifest), on foreign docs (Parquet/JSONL without a manifest), on
an Arrow stream (`-`), and on raw WARC/ARC files or directories of them (record counts by type,
HTTP status and content type). Returns a plain dict; the CLI renders it.
"""

from __future__ import annotations

import glob
from collections import Counter
from pathlib import Path

import pyarrow.compute as pc

from llmctl.artifacts.docs import STDIO, open_docs_inputs
from llmctl.artifacts.files import problem, shown
from llmctl.artifacts.manifest import has_manifest, read_manifest
from llmctl.data.crawl.warc import WarcError, iter_records
from llmctl.errors import UsageError

WARC_SUFFIXES = (".warc", ".warc.gz", ".arc", ".arc.gz")
SAMPLE_CHARS = 200


def is_warc_path(path: str) -> bool:
    return path.lower().endswith(WARC_SUFFIXES) or path.lower().endswith(".warc.gz.bad")


def warc_files(path: Path) -> list[str]:
    """The WARC files of a folder, and what is named like one but is not a regular file (a FIFO, a
    link loop: artifacts/files.py), which the view counts and never opens."""
    if path.is_file():
        return [str(path)]
    return sorted(str(p) for p in path.rglob("*") if is_warc_path(p.name) and not p.is_dir())


def inspect_path(path: str, samples: int = 3, stdin=None) -> dict:
    if path != STDIO and not glob.has_magic(path) and not Path(path).exists():
        raise UsageError(f"not found: {path}")
    p = Path(path)
    if path != STDIO and p.is_dir() and has_manifest(p):
        m = read_manifest(p)
        info = {
            "path": path,
            "kind": m.kind,
            "stage": m.stage,
            "created": m.created,
            "command": m.command,
            "counts": m.counts,
            "files": len(m.outputs),
            "bytes": sum(o.get("bytes", 0) for o in m.outputs),
            "rows": sum(o.get("rows") or 0 for o in m.outputs if not o["file"].startswith("rejected/")),
            "errors": m.errors[:10],
        }
        if m.kind == "docs":
            info.update(_docs_view(path, samples, stdin))
        return info
    if path != STDIO and (is_warc_path(path) or (p.is_dir() and warc_files(p))):
        return _warc_view(p)
    info = {"path": path, "kind": "docs (no manifest)" if path != STDIO else "docs stream"}
    info.update(_docs_view(path, samples, stdin, count=True))
    return info


def document(path: str, doc_id: str) -> dict:
    """One document of a docs artifact or docs file, whole, with the spans dedup cut from it
    (`removed_spans`: UTF-8 byte ranges of the text as read) and, where the text of each is still
    at hand, that text: a kept text that was only annotated (--annotate-only), or the cut text
    dedup wrote to rejected/ (--keep-rejected). A document dedup dropped is found in rejected/."""
    if not Path(path).exists():
        raise UsageError(f"not found: {path}")
    found, cut_text = None, None
    rejected = Path(path) / "rejected"
    places = [path] + ([str(rejected)] if rejected.is_dir() else [])
    for place in places:
        for batch in open_docs_inputs([place]).batches:
            for row in batch.filter(pc.equal(batch.column("id"), doc_id)).to_pylist():
                if row.get("reason") == "dedup.spans.cut":
                    cut_text = row["text"]
                elif found is None:
                    found = row
    if found is None:
        raise UsageError(f"{path}: no document with id {doc_id!r}")
    spans = found.get("removed_spans") or []
    out = {"path": path, "id": doc_id, "row": found, "removed_spans": []}
    manifest = read_manifest(path) if Path(path).is_dir() and has_manifest(Path(path)) else None
    intact = bool(manifest and manifest.config.get("annotate_only")) or (found.get("reason") or "").startswith("dedup.")
    data = (found.get("text") or "").encode("utf-8", "surrogatepass")
    pieces = cut_text.split("\n") if cut_text is not None and len(cut_text.split("\n")) == len(spans) else None
    for k, (start, end) in enumerate(spans):
        text = data[start:end].decode("utf-8", "replace") if intact else (pieces[k] if pieces else None)
        out["removed_spans"].append({"start": start, "end": end, "bytes": end - start, "text": text})
    return out


def _docs_view(path: str, samples: int, stdin, count: bool = False) -> dict:
    docs = open_docs_inputs([path], stdin=stdin)
    rows: list[dict] = []
    n = 0
    for batch in docs.batches:
        if len(rows) < samples:
            rows.extend(batch.slice(0, samples - len(rows)).to_pylist())
        n += batch.num_rows
        if not count and len(rows) >= samples:
            break
    for r in rows:
        for k, v in r.items():
            if isinstance(v, str) and len(v) > SAMPLE_CHARS:
                r[k] = v[:SAMPLE_CHARS] + "…"
    out = {"schema": {f.name: str(f.type) for f in docs.schema}, "samples": rows}
    if count:  # read through: what the reader left out is known
        out["rows"] = n
        out["files"] = len(docs.sources)
        out["errors"] = docs.log.errors[:10]
        out["error_count"] = len(docs.log.errors)
    return out


def _warc_view(p: Path) -> dict:
    files = warc_files(p)
    types: Counter = Counter()
    status: Counter = Counter()
    ctypes: Counter = Counter()
    errors = []
    size = 0
    unread = 0
    for f in files:
        why = problem(f)
        if why is not None:
            errors.append({"file": shown(f), "error": why})
            unread += 1
            continue
        size += Path(f).stat().st_size
        for item in iter_records(f):
            if isinstance(item, WarcError):
                errors.append({"file": shown(f), "offset": item.offset, "error": item.message})
                continue
            rec = item.record
            types[rec.rec_type] += 1
            if rec.rec_type == "response" and rec.http_headers is not None:
                status[rec.http_headers.get_statuscode()] += 1
                ct = (rec.http_headers.get_header("Content-Type") or "(none)").split(";")[0].strip().lower()
                ctypes[ct] += 1
    return {
        "path": str(p),
        "kind": "warc",
        "files": len(files) - unread,
        "bytes": size,
        "records": dict(sorted(types.items(), key=lambda kv: str(kv[0]))),
        "http_status": dict(sorted(status.items())),
        "content_types": dict(ctypes.most_common(10)),
        "errors": errors[:10],
        "error_count": len(errors),
    }
