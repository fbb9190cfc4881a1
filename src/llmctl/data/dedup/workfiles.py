"""How every dedup phase writes its files under OUT/_work/: whole or not at all (a temporary name,
then a rename), so a killed task leaves either its finished file, which marks it done, or nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from llmctl.artifacts.atomic import atomic_path


def save_npz(path: Path, **arrays) -> None:
    with atomic_path(path, ".npz") as tmp:  # numpy appends .npz to a name without it
        np.savez(tmp, **arrays)


def save_npy(path: Path, array: np.ndarray) -> None:
    with atomic_path(path, ".npy") as tmp:
        np.save(tmp, array)
