"""Folders written by Hugging Face `datasets`' `save_to_disk`: which files hold the rows, in order.

A `Dataset.save_to_disk(DIR)` folder holds `data-NNNNN-of-NNNNN.arrow` (Arrow IPC *stream*
files), `dataset_info.json` and `state.json`, whose `_data_files` lists the shards in row order;
save_to_disk writes out any selection or shuffle first, so the files are exactly the rows. A
`DatasetDict.save_to_disk(DIR)` folder holds `dataset_dict.json` and one such folder per split.
We refuse the DatasetDict itself rather than pick a split or read them all: reading train and
test into one corpus would leak the test split into training, and picking one silently would
surprise. The user names the split folder instead.
"""

from __future__ import annotations

import json
from pathlib import Path

from llmctl.errors import UsageError

STATE = "state.json"
INFO = "dataset_info.json"
DICT = "dataset_dict.json"
# datasets' metadata, never documents: a directory walk must not read them as JSONL
METADATA_FILES = frozenset({STATE, INFO, DICT, "dataset_infos.json"})


def saved_dataset_files(d: Path) -> list[str] | None:
    """The data files of a save_to_disk folder, relative to it and in row order; None when `d`
    is not one. A DatasetDict folder is a UsageError naming its splits."""
    if (d / DICT).is_file():
        try:
            splits = json.loads((d / DICT).read_text(encoding="utf-8"))["splits"]
        except (OSError, ValueError, KeyError, TypeError):
            splits = sorted(p.name for p in d.iterdir() if (p / STATE).is_file())
        example = f", e.g. {d / splits[0]}" if splits else ""
        raise UsageError(
            f"{d} is a Hugging Face DatasetDict (splits: {', '.join(splits) or 'none'}); give one split's folder{example}"
        )
    if not ((d / STATE).is_file() and (d / INFO).is_file()):
        return None
    try:
        files = [f["filename"] for f in json.loads((d / STATE).read_text(encoding="utf-8"))["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UsageError(f"{d / STATE}: not a datasets state file ({type(e).__name__}: {e})") from e
    if not all(isinstance(f, str) and f and "/" not in f and "\\" not in f for f in files):
        raise UsageError(f"{d / STATE}: _data_files must name files in {d}")
    return files
