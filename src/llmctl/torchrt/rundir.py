"""A run's output directory, from the first check to the manifest: one lifecycle for train, rl
and eval (docs/design.md §2 for the files, §3 for output preparation).

    config.json      the resolved configuration, written when the run starts
    metrics.jsonl    one JSON object per record, appended and flushed as the run goes
    checkpoints/     step-NNNNNN/ and `latest` (artifacts/checkpoint.py)
    manifest.json    written last: its presence marks the run complete

The caller holds OUT's lock around the whole run (`lock`: rank 0 only under torchrun).
A new run needs OUT to be new or empty, or --overwrite, which removes the entries this kind of
run writes (and nothing else in OUT), in an OUT that is llmctl's: its manifest, or only entries
such a run writes (atomic.check_overwrite). --resume needs a checkpoint, and a saved config.json that
agrees with this command's on the keys the caller names; resuming drops the metrics records past
the checkpoint, since those steps run again. Under torchrun every rank calls every method: rank 0
alone touches the disk, and barriers keep the other ranks from running ahead of it.
"""

from __future__ import annotations

import json
import os
import shutil
from contextlib import suppress
from pathlib import Path

from llmctl.artifacts import checkpoint as ckpt_io
from llmctl.artifacts.atomic import check_overwrite, directory_only, entries, write_text
from llmctl.artifacts.lock import output_lock
from llmctl.artifacts.manifest import Manifest, write_manifest
from llmctl.errors import UsageError
from llmctl.torchrt import distributed
from llmctl.torchrt.distributed import Dist

TRAINING_RUN = ("checkpoints", "metrics.jsonl", "manifest.json", "config.json")  # what train writes


def truncate_metrics(path: Path, step: int) -> None:
    """Drop a run's metrics records past `step` (on resume those steps are about to run again)."""
    if not path.is_file():
        return
    keep = []
    for line in path.read_text().splitlines():
        with suppress(json.JSONDecodeError, KeyError, TypeError):  # a line cut short by a crash or a full disk is dropped
            if json.loads(line)["step"] <= step:
                keep.append(line)
    write_text(path, "".join(line + "\n" for line in keep))


class Metrics:
    """metrics.jsonl open for appending on rank 0 (a no-op elsewhere); each record is flushed."""

    def __init__(self, path: Path | None):
        self._file = open(path, "a") if path is not None else None

    def log(self, record: dict) -> None:
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def __enter__(self) -> Metrics:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def lock(out: str | Path, what: str = "a run"):
    """OUT's lock for a train, rl or eval run: taken by rank 0 (torchrun's RANK), the one that
    writes. A run is a folder: `-o -` is refused here, before anything is made."""
    directory_only(out, what)
    return output_lock(out, enabled=int(os.environ.get("RANK", "0")) == 0)


def _changed(key: str, old, new) -> str:
    """What differs between a saved run's `key` and this command's, in words."""
    if key == "inputs" and isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new), 1):
            if a != b:
                what = "another input" if a.get("path") != b.get("path") else "the same path with other content"
                return f"{what}: input {i} was {a.get('path')}, now {b.get('path')}"
    return f"the {key} differs from this command's"


class RunDir:
    """OUT of one run. `entries`: what this kind of run writes, all that --overwrite removes;
    `resumable`: whether the command has --resume (eval's results directory has not)."""

    def __init__(self, out: str | Path, dist: Dist | None = None, entries: tuple[str, ...] = TRAINING_RUN,
                 resumable: bool = True):
        self.out, self.dist = Path(out), dist or Dist()
        self.entries, self.resumable = entries, resumable
        self.checkpoints = self.out / "checkpoints"

    def prepare(self, resume: bool = False, overwrite: bool = False, expect: dict | None = None) -> None:
        """`check`, then for a new run rank 0 empties OUT of this run's entries (and creates OUT)."""
        self.check(resume, overwrite, expect)
        if resume:
            return
        distributed.barrier(self.dist)  # every rank has looked at OUT before rank 0 empties it
        if self.dist.is_main:
            for name in self.entries:
                p = self.out / name
                shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
            self.out.mkdir(parents=True, exist_ok=True)
        distributed.barrier(self.dist)

    def check(self, resume: bool = False, overwrite: bool = False, expect: dict | None = None) -> None:
        """The usage errors, touching nothing: a new run needs OUT new, empty or --overwrite; --resume
        needs a checkpoint, and config.json's saved values of the keys in `expect` must be these."""
        if self.out.exists() and not self.out.is_dir():
            raise UsageError(f"output {self.out} exists and is not a directory; remove it or pick another -o")
        if not resume:
            if entries(self.out) and not overwrite:
                check_overwrite(self.out, self.entries)  # someone's files: --overwrite would not remove them either
                hint = ": pass --resume to continue it or --overwrite to start over" if self.resumable else " (pass --overwrite)"
                raise UsageError(f"{self.out} is not empty{hint}")
            check_overwrite(self.out, self.entries)  # a run started over replaces its own entries, in a run's folder
            return
        if not ckpt_io.list_checkpoints(self.checkpoints):
            raise UsageError(f"--resume: {self.checkpoints} holds no checkpoint")
        saved = self.out / "config.json"
        if expect and saved.is_file():
            prev = json.loads(saved.read_text())
            for key, value in expect.items():
                if prev.get(key) != value:
                    raise UsageError(f"--resume: {_changed(key, prev.get(key), value)} ({saved}); "
                                     "use --overwrite to start over, or another -o")

    def has_checkpoint(self) -> bool:
        return (self.checkpoints / ckpt_io.LATEST).is_file()

    def write_json(self, name: str, doc: dict, **dumps) -> None:
        """OUT/name, atomically, on rank 0 (config.json, eval's results.json)."""
        if self.dist.is_main:
            write_text(self.out / name, json.dumps(doc, indent=2, **dumps) + "\n")

    def metrics(self, step: int) -> Metrics:
        """metrics.jsonl for appending, records past `step` dropped first."""
        if not self.dist.is_main:
            return Metrics(None)
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / "metrics.jsonl"
        truncate_metrics(path, step)
        return Metrics(path)

    def checkpoint(self, step: int, model_cfg, model_state: dict, trainer_state: dict, **kw) -> None:
        """Rank 0 saves checkpoints/step-N atomically and then points `latest` at it
        (ckpt_io.save_checkpoint's keyword arguments pass through); every rank waits for it."""
        if self.dist.is_main:
            ckpt_io.save_checkpoint(self.checkpoints, step, model_cfg, model_state, trainer_state, **kw)
        distributed.barrier(self.dist)

    def finish(self, manifest: Manifest) -> Manifest:
        """The manifest, written last (after the final checkpoint) on rank 0."""
        if self.dist.is_main:
            write_manifest(self.out, manifest)
        return manifest
