"""Keep freed memory in the process during CPU training (glibc only).

By default glibc serves every allocation above its mmap threshold with a fresh mmap and returns it
on free, so each step re-faults the logits, their log-softmax and gradient, every weight gradient
and the optimizer's temporaries page by page: measured ~760,000 page faults and 1.2 s of kernel
time per step of the `small` preset (benchmarks/RESULTS.md, train). Turning off mmap'd chunks and
heap trimming keeps the peak heap, which the next step needs again anyway.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1  # glibc mallopt parameters (malloc.h)
M_MMAP_MAX = -4


def keep_freed_memory(device="cpu") -> bool:
    """Apply the settings when `device` is the CPU (train, rl and eval call it with theirs); False
    on an accelerator or where the C library is not glibc (nothing changes then)."""
    if getattr(device, "type", device) != "cpu":
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1))
