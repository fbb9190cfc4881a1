"""The dataset card (README.md) of a docs artifact: what makes `datasets.load_dataset(DIR)` open
the artifact as exactly its kept rows.

Without a card, `load_dataset(DIR)` guesses the data files: every Parquet file under DIR, so the
rows in rejected/ (which have more columns) join the train split and the load fails. The card's
YAML `configs:` block names the files instead: `part-*.parquet` is the default config (split
"train"), and `rejected/part-*.parquet` a second config, `rejected`, when there are rejected rows
(datasets refuses a split without rows, so an empty one is left out). The paths are relative and
the card holds no time or absolute path, so a moved or copied artifact still opens and the same
run writes the same bytes.

Two artifacts still do not open, by datasets' rules rather than the card's: one with no kept
rows (it refuses an empty split; the card says so), and one whose parts have different columns
(a stage run over inputs whose columns differ: datasets takes the first part's columns and fails
on a part with a column the first lacks).

`load_dataset("parquet", data_dir=DIR)` never reads a card: that loader takes every file under
DIR whose name it does not know, manifest.json included, and fails on it as Parquet. Give it
`data_files=f"{DIR}/part-*.parquet"` instead (README.md says so for users).
"""

from __future__ import annotations

import os
from pathlib import Path

from llmctl.artifacts.atomic import write_text

CARD = "README.md"
KEPT_GLOB = "part-*.parquet"  # every docs writer names its shards part-NNNNN.parquet (docs.part_name)
REJECTED_DIR = "rejected/"


def docs_card(stage: str, outputs: list[dict]) -> str:
    """The card's text for a docs artifact whose manifest lists `outputs` ({file, rows, ...})."""
    parquet = [o for o in outputs if o["file"].endswith(".parquet")]
    kept = sum(o.get("rows") or 0 for o in parquet if not o["file"].startswith(REJECTED_DIR))
    rejected = sum(o.get("rows") or 0 for o in parquet if o["file"].startswith(REJECTED_DIR))
    configs = [
        "configs:",
        "- config_name: default",
        "  default: true",
        "  data_files:",
        "  - split: train",
        f'    path: "{KEPT_GLOB}"',
    ]
    if rejected:
        configs += [
            "- config_name: rejected",
            "  data_files:",
            "  - split: train",
            f'    path: "{REJECTED_DIR}{KEPT_GLOB}"',
        ]
    lines = [
        "---",
        *configs,
        "---",
        "",
        f"# llmctl docs: {stage}",
        "",
        f"Written by `llmctl {stage}`. Kept: {_docs(kept)}, `{KEPT_GLOB}` (the default config).",
    ]
    if not kept:
        lines.append("`datasets` refuses a split without rows, so `load_dataset` on this directory fails.")
    if rejected:
        lines.append(f"Rejected: {_docs(rejected)} with a `reason`, `{REJECTED_DIR}{KEPT_GLOB}` (config `rejected`).")
    lines += [
        "`manifest.json` records the command, the config, the inputs and every file's sha256.",
        "",
        "```python",
        "from datasets import load_dataset",
        'docs = load_dataset("path/to/this/directory", split="train")',
    ]
    if rejected:
        lines.append('rejected = load_dataset("path/to/this/directory", "rejected", split="train")')
    lines += ["```", ""]
    return "\n".join(lines)


def _docs(n: int) -> str:
    return f"{n:,} document{'' if n == 1 else 's'}"


def write_docs_card(out_dir: str | os.PathLike, stage: str, outputs: list[dict]) -> Path:
    """Atomically write OUT/README.md (before the manifest, which marks the artifact complete)."""
    return write_text(Path(out_dir) / CARD, docs_card(stage, outputs))
