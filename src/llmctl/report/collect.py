"""Walk an artifact's lineage into the list of artifacts a report describes, and find the evals.

The lineage is the `inputs` of each manifest (artifacts/manifest.py). Two kinds of input name an
artifact without pointing at its manifest, and both are followed here:
  - a file an artifact wrote, such as TOKENIZER/tokenizer.json given to `tokenize --tokenizer`:
    the file's folder is that artifact when its manifest lists the file with the same sha256;
  - a checkpoint folder, RUN/checkpoints/step-N, given to `eval` or `train --init`: the run.

Evals are not in a model's lineage: they point at the model, not the other way round. They come
in two ways: named (`--eval DIR`), or found — an eval artifact in a folder beside any artifact of
the lineage (the demo's out/demo/eval-rl beside out/demo/rl) whose inputs name a run of the
lineage. A found eval of some other model is not taken.

Control runs (`llmctl rl --control`) are not in the lineage either: they sit beside the real run.
An rl run of the lineage takes as its controls the rl control runs in its own folder that started
from the same model, and those named (`--control DIR`); the evals of a control are found in its
own folder (or named with `--eval`), the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from llmctl.artifacts.manifest import MANIFEST, Manifest, file_sha256, has_manifest, read_manifest
from llmctl.errors import UsageError


@dataclass
class Artifact:
    path: Path
    manifest: Manifest
    changed: bool = False  # its manifest no longer matches the sha256 its user recorded

    @property
    def stage(self) -> str:
        return self.manifest.stage

    @property
    def kind(self) -> str:
        return self.manifest.kind


@dataclass
class Lineage:
    root: Path
    artifacts: list[Artifact]  # inputs before the artifacts made from them; the root last
    raw_inputs: list[dict] = field(default_factory=list)  # `inputs` entries that are plain files (WARCs, JSONL)
    evals: list[Artifact] = field(default_factory=list)
    controls: list[Artifact] = field(default_factory=list)  # rl control runs of the lineage's rl runs
    control_evals: list[Artifact] = field(default_factory=list)  # the evals that measured one of them

    def stage(self, *names: str) -> list[Artifact]:
        return [a for a in self.artifacts if a.stage in names]

    def find(self, path: Path) -> Artifact | None:
        key = path.resolve()
        return next((a for a in (*self.artifacts, *self.evals) if a.path.resolve() == key), None)


def artifact_of(ref: dict) -> Path | None:
    """The artifact folder an `inputs` entry names, or None for a raw input (see the module doc)."""
    p = Path(ref.get("path", ""))
    if not ref.get("path") or ref.get("path") == "-":
        return None
    if ref.get("manifest_sha256") is not None and has_manifest(p):
        return p
    if ref.get("kind") == "file" and has_manifest(p.parent):
        try:
            m = read_manifest(p.parent)
        except UsageError:
            return None
        if any(o["file"] == p.name and o.get("sha256") == ref.get("sha256") for o in m.outputs):
            return p.parent
        return None
    if ref.get("kind") == "dir" and p.parent.name == "checkpoints" and has_manifest(p.parent.parent):
        return p.parent.parent
    return None


def collect(root: str | Path, evals: list[str] | None = None, discover: bool = True,
            controls: list[str] | None = None) -> Lineage:
    """The lineage of `root`, oldest first, with the evals named in `evals` and (`discover`) those
    found beside it, and the control runs of its rl runs (named in `controls`, and found beside
    them). UsageError when `root`, a named eval or a named control is not what it is said to be."""
    root = Path(root)
    if not has_manifest(root):
        raise UsageError(f"{root} is not an artifact (no {MANIFEST})")
    order: list[Artifact] = []
    raw: list[dict] = []
    seen: set[Path] = set()

    def visit(p: Path, recorded_sha: str | None) -> None:
        key = p.resolve()
        if key in seen:
            return
        seen.add(key)
        m = read_manifest(p)
        for ref in m.inputs:
            parent = artifact_of(ref)
            if parent is not None:
                visit(parent, ref.get("manifest_sha256"))
            elif ref.get("kind") == "file" and not any(r.get("path") == ref.get("path") for r in raw):
                raw.append(ref)
        changed = recorded_sha is not None and file_sha256(p / MANIFEST) != recorded_sha
        order.append(Artifact(p, m, changed))

    visit(root, None)
    lineage = Lineage(root, order, raw)
    runs = {a.path.resolve() for a in order if a.kind == "run"}
    found: dict[Path, Artifact] = {}
    for e in evals or []:
        p = Path(e)
        m = read_manifest(p)  # UsageError when not an artifact
        if m.kind != "eval":
            raise UsageError(f"--eval {e}: a {m.kind} artifact, not eval results")
        found[p.resolve()] = Artifact(p, m)
    lineage.controls = _controls(lineage, controls or [], discover)
    measured = {c.path.resolve() for c in lineage.controls}
    if discover:  # evals of the lineage's runs beside its artifacts, evals of a control beside it
        for folders, models in (({a.path.parent for a in order}, runs), ({c.path.parent for c in lineage.controls}, measured)):
            for folder in sorted(folders):
                for p in sorted(folder.iterdir()):
                    ev = None if p.resolve() in found else _artifact_at(p)
                    if ev is not None and ev.kind == "eval" and _measures(ev, models):
                        found[p.resolve()] = ev
    by_age = sorted(found.values(), key=lambda a: (a.manifest.created, str(a.path)))
    lineage.evals = [a for a in by_age if not _measures(a, measured) or _measures(a, runs)]
    lineage.control_evals = [a for a in by_age if _measures(a, measured)]
    return lineage


def _artifact_at(p: Path) -> Artifact | None:
    """The artifact in folder p, None when p is none or its manifest is damaged (a damaged neighbour
    is not this report's business)."""
    if not has_manifest(p):
        return None
    try:
        return Artifact(p, read_manifest(p))
    except UsageError:
        return None


def _measures(ev: Artifact, runs: set[Path]) -> bool:
    return any((q := artifact_of(ref)) is not None and q.resolve() in runs for ref in ev.manifest.inputs)


def is_control(a: Artifact) -> bool:
    return a.stage == "rl" and a.manifest.config.get("control", "none") != "none"


def _controls(lineage: Lineage, named: list[str], discover: bool) -> list[Artifact]:
    """The control runs of the lineage's real rl runs: named ones (each must be an rl control run
    that started from the model one of them started from) and, with `discover`, those in the
    folder of a real run that started from its model."""
    real = [a for a in lineage.stage("rl") if not is_control(a)]
    starts = {s.resolve() for a in real if (s := model_of(a)) is not None}
    out: dict[Path, Artifact] = {}
    for c in named:
        p = Path(c)
        a = Artifact(p, read_manifest(p))  # UsageError when not an artifact
        if not is_control(a):
            raise UsageError(f"--control {c}: not a control run (an `llmctl rl --control random-reward|shuffled-answers` output)")
        if (s := model_of(a)) is None or s.resolve() not in starts:
            raise UsageError(f"--control {c}: started from {s or 'no run'}, not from the model the lineage's rl run started from")
        out[p.resolve()] = a
    for r in real if discover else []:
        start = model_of(r)
        for p in sorted(r.path.parent.iterdir()):
            a = None if p.resolve() in out or start is None else _artifact_at(p)
            if a is not None and is_control(a) and (s := model_of(a)) is not None and s.resolve() == start.resolve():
                out[p.resolve()] = a
    return list(out.values())


def model_of(ev: Artifact) -> Path | None:
    """The run an artifact's inputs name: the model an eval measured (its checkpoint's run), the
    model an rl run started from; None when they name none."""
    for ref in ev.manifest.inputs:
        p = artifact_of(ref)
        if p is not None and has_manifest(p) and read_manifest(p).kind == "run":
            return p
    return None
