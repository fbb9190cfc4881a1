"""Model FLOPs utilization: achieved model FLOP/s over the hardware's dense peak.

MFU = tokens/s · FLOPs/token / (ranks · peak), FLOPs/token = 6·N_matmul + causal attention
(spec 001-compute-appendix §B6; model/flops.py, through ModelConfig.flops_per_token). The peak
comes from `--peak-flops`, the accelerator table (torchrt/hardware.py, the one `llmctl plan`
reads) for a known GPU, or — on a CPU, which has no datasheet number worth trusting — a short
matmul benchmark in the run's own dtype and thread count.
"""

from __future__ import annotations

import time

import torch


def mfu(tokens_per_s: float, flops_per_token: float, ranks: int, peak: float) -> float:
    """MFU = tokens/s · FLOPs/token / (ranks · peak of one rank)  (compute §B6)."""
    return tokens_per_s * flops_per_token / (ranks * peak)


def measure_matmul_flops(dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                         n: int = 1024, seconds: float = 0.5) -> float:
    """Best FLOP/s of n×n @ n×n in `dtype` over ~`seconds` (2n³ FLOPs each, §B2)."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    for _ in range(3):  # warm-up: thread pools, oneDNN/cuBLAS kernel selection
        a @ b
    sync()
    best, spent = 0.0, 0.0
    while spent < seconds:
        t = time.perf_counter()
        for _ in range(4):
            a @ b
        sync()
        dt = time.perf_counter() - t
        spent += dt
        best = max(best, 4 * 2 * n**3 / dt)
    return best


def gpu_peak_flops(device: torch.device) -> float | None:
    """Dense BF16 peak of a known GPU from the hardware table, or None. MFU is measured against
    the BF16 peak whatever the run's dtype (spec 001-compute-appendix §B6)."""
    from llmctl.torchrt.hardware import match_device_name

    hw = match_device_name(torch.cuda.get_device_name(device))
    return hw.bf16_flops if hw else None


def peak_flops(device: torch.device, dtype: torch.dtype, override: float | None = None) -> tuple[float | None, str]:
    """(peak FLOP/s of one rank, where the number comes from)."""
    if override:
        return override, "--peak-flops"
    if device.type == "cuda":
        peak = gpu_peak_flops(device)
        return peak, "hardware table" if peak else "unknown GPU (pass --peak-flops)"
    return measure_matmul_flops(dtype, device), f"measured {str(dtype).removeprefix('torch.')} matmul"
