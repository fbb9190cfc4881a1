"""totals: wall time and compute per stage, and the bytes of every artifact on disk (the whole
folder: shards, rejected/, checkpoints, rollouts), for the lineage and its evals."""

from __future__ import annotations

from pathlib import Path

from llmctl.report.collect import Lineage
from llmctl.report.page import Section, Table
from llmctl.report.sections.common import Images, read_json
from llmctl.report.sections.train import training_flops


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def ranks(path: Path) -> int | None:
    """The processes a run ran in (torchrun's world size, from its config.json); None for a data stage."""
    size = read_json(path / "config.json").get("world_size")
    return size if isinstance(size, int) else None


def sections(lineage: Lineage, images: Images) -> list[Section]:
    rows, total_s, total_flops, total_bytes = [], 0.0, 0.0, 0
    for a in (*lineage.artifacts, *lineage.evals):
        m = a.manifest
        flops = None
        model, train = m.config.get("model", {}), m.config.get("train", {})
        if m.stage == "train" and model and train.get("seq_len") and m.counts.get("tokens"):
            flops = training_flops(model, train["seq_len"], m.counts["tokens"])[1]
        size = folder_bytes(a.path)
        rows.append([m.stage, str(a.path), m.created, m.wall_seconds, ranks(a.path) if m.kind == "run" else None, flops, size])
        total_s += m.wall_seconds or 0.0
        total_flops += flops or 0.0
        total_bytes += size
    raw = sum(r.get("bytes", 0) for r in lineage.raw_inputs)
    rows.append(["total", "", "", round(total_s, 3), None, total_flops or None, total_bytes])
    s = Section("totals", "totals", [str(lineage.root)])
    s.facts = {"artifacts": len(rows) - 1, "wall seconds, all stages": round(total_s, 3), "training FLOPs": total_flops or None,
               "bytes on disk": total_bytes, "raw inputs (files)": len(lineage.raw_inputs), "raw input bytes": raw}
    s.tables.append(Table(["stage", "artifact", "created", "wall seconds", "ranks", "training FLOPs", "bytes"], rows,
                          "every artifact of the lineage (inputs first) and its evals"))
    s.notes.append("Compute is counted for training runs (the planner's C_token · D); the other stages record no FLOPs.")
    return [s]
