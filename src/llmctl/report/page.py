"""What a report is made of, before it is rendered: sections of facts, tables and figures.

Every number a section shows is a value in one of these objects, so `report.json` (their JSON form)
holds every number that report.md and index.html show; the renderers only format them (`fmt`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Table:
    columns: list[str]
    rows: list[list[Any]]
    caption: str = ""


@dataclass
class Figure:
    file: str  # relative to the report directory (img/…png)
    caption: str


@dataclass
class Section:
    key: str  # anchor and file-name prefix: "crawl", "train-2", …
    title: str
    sources: list[str]  # the artifact directories the numbers come from
    facts: dict[str, Any] = field(default_factory=dict)  # label -> value, shown as a two-column table
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # sentences: what is absent, what a number means


@dataclass
class Report:
    root: str  # the artifact the report was asked for
    created: str
    llmctl_version: str
    sections: list[Section]

    def to_dict(self) -> dict:
        """As JSON-able data; a non-finite float (a skipped step's loss) becomes "nan" / "inf", which
        strict JSON readers (a browser's JSON.parse) accept where NaN is not JSON."""
        return _finite(asdict(self))


def _finite(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_finite(x) for x in v]
    return v


def fmt(v: Any) -> str:
    """A value as a person reads it: integers with thousands separators, floats to 4 significant
    digits (scientific past 1e6 or under 1e-3: FLOPs, tiny rates), None as a dash."""
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return str(v)
        if v == 0:
            return "0"
        if abs(v) >= 1e6 or abs(v) < 1e-3:
            return f"{v:.3e}"
        return f"{v:,.4g}" if abs(v) >= 1000 else f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return ", ".join(fmt(x) for x in v)
    return str(v)
