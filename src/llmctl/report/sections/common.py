"""What the stage modules share: where figures go, section keys, reading a run's records."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from typing import Callable

from llmctl.report.collect import Artifact
from llmctl.report.page import Section


@dataclass
class Images:
    root: Path  # the report directory; figures go under root/img/<section key>/

    def folder(self, key: str) -> Path:
        d = self.root / "img" / key
        d.mkdir(parents=True, exist_ok=True)
        return d

    def rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()


def keys(prefix: str, artifacts: list[Artifact]) -> list[str]:
    """Section keys: "rl", or "rl-1", "rl-2" when the lineage has several artifacts of the stage."""
    return [prefix] if len(artifacts) == 1 else [f"{prefix}-{i}" for i in range(1, len(artifacts) + 1)]


def per_artifact(found: list[Artifact], prefix: str, images: Images, fill: Callable[[Artifact, Section, Images], None]) -> list[Section]:
    """One section per artifact of a stage, keyed and titled for it; `fill` adds what it shows."""
    out = []
    for a, key in zip(found, keys(prefix, found)):
        s = Section(key, f"{prefix}: {a.path.name}", [str(a.path)], notes=changed_note(a))
        fill(a, s, images)
        out.append(s)
    return out


def per_second(count, seconds) -> float | None:
    return round(count / seconds, 1) if isinstance(count, (int, float)) and seconds else None


def changed_note(a: Artifact) -> list[str]:
    return [f"{a.path} changed after the next stage read it (its manifest's sha256 differs from the recorded one)."] if a.changed else []


def read_json(path: Path) -> dict:
    """A JSON object file a stage wrote beside its manifest (a run's config.json), or {} when absent."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
