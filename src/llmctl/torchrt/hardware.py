"""The accelerator table (spec 001-compute-appendix §D), extensible by file: `plan` reads peaks,
memory and bandwidth from it, `train` the MFU peak of a known GPU (torchrt/mfu.py). It lives in the
torch runtime's room, below both, and needs no torch itself.

Peaks are dense (the MFU reference: dense BF16, never a 2:4-sparse figure; §E). The ridge point
F_peak/W of the roofline (§B16) is derived, not stored.
"""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from llmctl.errors import UsageError

BUILTIN = Path(__file__).with_name("hardware.toml")
GIB = 2**30

_KEYS = {"name", "bf16_tflops", "fp8_tflops", "memory_gb", "memory_gib", "bandwidth_tbs", "power_w",
         "scale_up", "aliases", "note", "source"}


@dataclass(frozen=True)
class Hardware:
    key: str
    name: str
    bf16_flops: float  # dense 16-bit peak, FLOP/s
    fp8_flops: float | None
    memory_bytes: float
    bandwidth: float  # HBM bytes/s
    power_w: float | None = None
    scale_up: int | None = None
    aliases: tuple[str, ...] = field(default_factory=tuple)
    note: str = ""
    source: str = ""

    @property
    def ridge(self) -> float:
        """Roofline ridge I* = F_peak/W in FLOP/byte (compute §B16; H100 BF16 295)."""
        return self.bf16_flops / self.bandwidth

    def summary(self) -> dict[str, Any]:
        d = asdict(self)
        d["aliases"] = list(self.aliases)
        d["ridge_flop_per_byte"] = round(self.ridge, 1)
        return d


def _entry(key: str, row: Any, where: str) -> Hardware:
    if not isinstance(row, dict):
        raise UsageError(f"{where}: [{key}] must be a table")
    unknown = sorted(set(row) - _KEYS)
    if unknown:
        hint = " (give dense peaks: bf16_tflops, fp8_tflops)" if any("sparse" in u for u in unknown) else ""
        raise UsageError(f"{where}: [{key}] unknown key(s) {', '.join(unknown)}{hint}")

    def num(k: str, required: bool = True) -> float | None:
        v = row.get(k)
        if v is None:
            if required:
                raise UsageError(f"{where}: [{key}] needs {k}")
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise UsageError(f"{where}: [{key}] {k} must be a positive number, got {v!r}")
        return float(v)

    if ("memory_gb" in row) == ("memory_gib" in row):
        raise UsageError(f"{where}: [{key}] needs exactly one of memory_gb, memory_gib")
    mem = num("memory_gb") * 1e9 if "memory_gb" in row else num("memory_gib") * GIB
    fp8 = num("fp8_tflops", False)
    aliases = row.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise UsageError(f"{where}: [{key}] aliases must be a list of strings")
    scale = num("scale_up", False)
    return Hardware(
        key=key.lower(), name=str(row.get("name", key)), bf16_flops=num("bf16_tflops") * 1e12,
        fp8_flops=fp8 * 1e12 if fp8 else None, memory_bytes=mem, bandwidth=num("bandwidth_tbs") * 1e12,
        power_w=num("power_w", False), scale_up=int(scale) if scale else None,
        aliases=tuple(a.lower() for a in aliases), note=str(row.get("note", "")), source=str(row.get("source", where)),
    )


def read_table(path: str | Path) -> dict[str, Hardware]:
    p = Path(path)
    try:
        with open(p, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise UsageError(f"cannot read hardware file {p}: {e.strerror or e}") from e
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{p}: invalid TOML ({e})") from e
    return {k.lower(): _entry(k, v, str(p)) for k, v in data.items()}


def load_table(extra: str | Path | None = None) -> dict[str, Hardware]:
    """The built-in table, with the rows of `extra` added (a row with the same key replaces one)."""
    table = read_table(BUILTIN)
    if extra:
        table.update(read_table(extra))
    return table


def lookup(key: str, table: dict[str, Hardware]) -> Hardware:
    k = key.lower().strip()
    if k in table:
        return table[k]
    for hw in table.values():
        if k in hw.aliases:
            return hw
    raise UsageError(f"unknown accelerator {key!r}; known: {', '.join(table)} (add one with --hardware-file)")


def match_device_name(device_name: str, table: dict[str, Hardware] | None = None) -> Hardware | None:
    """The row a CUDA device name refers to ("NVIDIA H100 80GB HBM3" → h100), or None.
    The longest key or alias found as a word of the name wins, so "h100-pcie" beats "h100"."""
    import re

    table = table if table is not None else load_table()
    words = set(re.split(r"[\s_]+", device_name.lower()))
    text = " ".join(words)
    best, best_len = None, 0
    for hw in table.values():
        for name in (hw.key, *hw.aliases):
            if (name in words or re.search(rf"(^|[\s-]){re.escape(name)}($|[\s-])", text)) and len(name) > best_len:
                best, best_len = hw, len(name)
    return best
