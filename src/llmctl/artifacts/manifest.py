"""manifest.json: what an artifact is, how it was made, and from what (docs/design.md §2).

Every artifact directory carries one. Inputs are recorded with the sha256 of their own manifest
(for artifacts) or of the file itself (for raw inputs such as WARC files), so following
`inputs` walks the lineage from a model back to the crawl it came from.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from llmctl.artifacts.atomic import MANIFEST, write_text
from llmctl.artifacts.card import write_docs_card
from llmctl.artifacts.files import shown, utf8_safe
from llmctl.errors import UsageError
from llmctl import __version__


@dataclass
class Manifest:
    kind: str  # docs | tokens | tokenizer | run | eval ...
    stage: str  # the command that wrote it: crawl-extract, filter, cat ...
    config: dict = field(default_factory=dict)
    command: list[str] = field(default_factory=list)
    inputs: list[dict] = field(default_factory=list)
    outputs: list[dict] = field(default_factory=list)
    counts: dict = field(default_factory=dict)
    errors: list[dict] = field(default_factory=list)
    wall_seconds: float = 0.0
    llmctl_version: str = __version__
    created: str = ""

    def to_json(self) -> str:
        text = json.dumps(asdict(self), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # a path that is not UTF-8 (the command, an input): named as files.shown names it
            text = json.dumps(utf8_safe(asdict(self)), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        return text


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def output_entry(path: Path, rows: int | None, root: Path) -> dict:
    """One `outputs` row: file name relative to the artifact, rows, bytes, sha256."""
    return {
        "file": str(path.relative_to(root)),
        "rows": rows,
        "bytes": path.stat().st_size,
        "sha256": file_sha256(path),
    }


def input_ref(path: str | os.PathLike) -> dict:
    """How an input is named in a manifest: an artifact by its manifest, a raw file by its bytes."""
    p = Path(path)
    if str(path) == "-":
        return {"path": "-", "kind": "stream"}
    if p.is_dir() and (p / MANIFEST).exists():
        m = read_manifest(p)
        return {
            "path": str(p.resolve()),
            "kind": m.kind,
            "manifest_sha256": file_sha256(p / MANIFEST),
        }
    if p.is_file():
        return {"path": str(p.resolve()), "kind": "file", "bytes": p.stat().st_size, "sha256": _content_sha256(p)}
    if p.is_dir():  # a folder of files (Parquet, JSONL, a save_to_disk dataset): named by its files' contents
        files = sorted(f for f in p.rglob("*") if f.is_file() and not any(part.startswith(".") for part in f.relative_to(p).parts))
        listing = hashlib.sha256("".join(f"{shown(f.relative_to(p))}\0{_content_sha256(f)}\n" for f in files).encode()).hexdigest()
        return {"path": str(p.resolve()), "kind": "dir", "files": len(files), "listing_sha256": listing}
    return {"path": str(p.resolve()), "kind": "dir"}


def _content_sha256(path: Path) -> str:
    """A raw input's sha256; for one that does not read, why (its reader counts it as damage)."""
    try:
        return file_sha256(path)
    except OSError as e:
        return f"unreadable ({e.strerror or type(e).__name__})"


def input_identity(ref: dict) -> dict:
    """What names an input's content in an `inputs` entry: its path and its hash (a manifest's,
    a file's, or a folder's listing). A resumed run must have the same (runtime/sharded.py, train)."""
    keep = ("path", "kind", "manifest_sha256", "sha256", "listing_sha256")
    return {k: ref[k] for k in keep if k in ref}


def write_manifest(out_dir: str | os.PathLike, manifest: Manifest) -> Path:
    """Atomically write OUT/manifest.json; its presence is what marks an artifact complete.

    Every docs stage finishes here, so this is also where a docs artifact gets its dataset card
    (artifacts/card.py: what makes `datasets.load_dataset(OUT)` work), written just before."""
    out = Path(out_dir)
    if not manifest.created:
        manifest.created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if not manifest.command:
        manifest.command = list(sys.argv)
    if manifest.kind == "docs":
        write_docs_card(out, manifest.stage, manifest.outputs)
    return write_text(out / MANIFEST, manifest.to_json())


def read_manifest(path: str | os.PathLike) -> Manifest:
    """The manifest of an artifact (or a manifest.json path). Every command that reads an input
    artifact comes through here, so a manifest that is not JSON, or not a manifest's shape, is
    one usage error naming the file, never a traceback."""
    p = Path(path)
    if p.is_dir():
        p = p / MANIFEST
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{p.parent} is not an artifact (no {MANIFEST})") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UsageError(f"{p}: corrupt manifest ({type(e).__name__}: {e})") from e
    problem = _shape_problem(data)
    if problem:
        raise UsageError(f"{p}: corrupt manifest ({problem})")
    for i, o in enumerate(data.get("outputs", [])):
        if (why := outside_name(o["file"])) is not None:
            raise UsageError(f"{p}: outputs[{i}].file {o['file']!r} {why}{CLOSED}")
    known = {k: v for k, v in data.items() if k in Manifest.__dataclass_fields__}
    return Manifest(**known)


def _shape_problem(data) -> str | None:
    """What makes parsed JSON unusable as a manifest (the keys readers index without looking)."""
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not an object"
    for key in ("kind", "stage"):
        if not isinstance(data.get(key), str):
            return f"no {key!r}"
    for key, typ in (("config", dict), ("counts", dict), ("inputs", list), ("outputs", list), ("errors", list), ("command", list)):
        if key in data and not isinstance(data[key], typ):
            return f"{key!r} is not a JSON {'object' if typ is dict else 'array'}"
    if not all(isinstance(o, dict) and isinstance(o.get("file"), str) for o in data.get("outputs", [])):
        return "an 'outputs' entry without a 'file'"
    if not all(isinstance(i, dict) for i in data.get("inputs", [])):
        return "an 'inputs' entry that is not an object"
    return None


CLOSED = "; an artifact names only its own files, by paths inside it"


def outside_name(name: str) -> str | None:
    """Why `name`, a file an artifact names of itself, could reach outside it: absolute, through
    `..`, or empty; None when it stays inside. An artifact is closed over itself: a manifest or a
    pointer that names another place would make a reader copy, train on or load what the artifact
    never held (a planted `../other/part.parquet`, `/etc/shadow`)."""
    if not name or name.strip() in ("", "."):
        return "is empty"
    if "\0" in name:
        return "holds a NUL byte"
    p = Path(name)
    if p.is_absolute():
        return "is an absolute path, outside the artifact"
    if ".." in p.parts:
        return "leaves the artifact through '..'"
    return None


def artifact_file(root: str | os.PathLike, name: str, where: str) -> Path:
    """`root/name` for a file an artifact names of itself (`where`: the file and field that name
    it, for the message), checked to lie inside `root` by its name and, after following links,
    by where it really is; a usage error naming `where` otherwise."""
    why = outside_name(name)
    if why is not None:
        raise UsageError(f"{where}: {name!r} {why}{CLOSED}")
    root = Path(root)
    path = root / name
    try:
        real, real_root = path.resolve(), root.resolve()
    except (OSError, RuntimeError) as e:  # a symlink loop
        raise UsageError(f"{where}: {name!r} cannot be resolved ({type(e).__name__}: {e})") from e
    if not real.is_relative_to(real_root):
        raise UsageError(f"{where}: {name!r} is a link to {real}, outside the artifact {root}{CLOSED}")
    return path


def error_place(e: dict) -> str:
    """Where a damaged spot is, in words, from an `errors` entry: the line (and byte) of a JSONL
    line, the row of a Parquet/Arrow row group, the byte of a WARC record, or just the file."""
    where = e.get("file", e.get("shard", "?"))
    if "line" in e:
        return f"{where} line {e['line']}" + (f" (byte {e['offset']})" if "offset" in e else "")
    if "row" in e:
        return f"{where} row {e['row']}"
    if "offset" in e:
        return f"{where} at byte {e['offset']}"
    return str(where)


def has_manifest(path: str | os.PathLike) -> bool:
    return (Path(path) / MANIFEST).is_file()


def lineage(path: str | os.PathLike) -> dict:
    """The tree of manifests from `path` back to its raw inputs.

    Each node: {path, kind, stage, command, counts, inputs: [node...]}. A raw input is a leaf
    with its recorded sha256, plus `changed: true` when the file on disk no longer matches.
    """
    p = Path(path)
    if not has_manifest(p):
        raise FileNotFoundError(f"{p} has no {MANIFEST}")
    return _node(p, seen=set())


def _node(p: Path, seen: set[str]) -> dict:
    m = read_manifest(p)
    node = {
        "path": str(p),
        "kind": m.kind,
        "stage": m.stage,
        "command": m.command,
        "created": m.created,
        "counts": m.counts,
        "inputs": [],
    }
    key = str(p.resolve())
    if key in seen:  # a cycle can only come from hand-edited manifests; do not loop forever
        return node
    seen.add(key)
    for ref in m.inputs:
        ip = Path(ref.get("path", ""))
        if ref.get("manifest_sha256") is not None and has_manifest(ip):
            child = _node(ip, seen)
            child["changed"] = file_sha256(ip / MANIFEST) != ref["manifest_sha256"]
        else:
            child = dict(ref)
            if ref.get("sha256") and ip.is_file():
                child["changed"] = ip.stat().st_size != ref.get("bytes") or file_sha256(ip) != ref["sha256"]
            elif ref.get("path") not in (None, "-"):
                child["missing"] = not ip.exists()
        node["inputs"].append(child)
    return node
