"""Which device a command runs on, and the autocast context its dtype asks for.

`auto` is the first GPU when torch sees one, else the CPU; under torchrun each rank takes the GPU
of its LOCAL_RANK. Mixed precision is bf16 autocast with fp32 master weights (spec
001-arch-optim-scaling §A3), or nothing at all for float32.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from llmctl.errors import UsageError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def pick_device(name: str, local_rank: int = 0) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"device {name!r}: torch sees no CUDA GPU here (use --device cpu or auto)")
    if name == "cuda":
        return torch.device("cuda", local_rank)
    try:
        return torch.device(name)
    except RuntimeError as e:
        raise UsageError(f"device {name!r}: {e} (auto, cpu or cuda)") from e


def autocast(device: torch.device, dtype: str):
    """The context forward passes run in: bf16 autocast on `device`, or a no-op for float32."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if dtype == "bfloat16" else nullcontext()
