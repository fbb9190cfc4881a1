"""Process-group set-up for runs under torchrun: DDP by default, FSDP2 with --fsdp.

Without torchrun's environment (WORLD_SIZE unset or 1) everything here is a no-op, so one code
path serves a laptop and a cluster. Backend: NCCL on GPUs, gloo on CPU (how the DDP parity test
runs two processes on this machine).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from llmctl.torchrt.device import pick_device


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init(device: str = "auto") -> Dist:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = pick_device(device, local_rank)
    if world <= 1:
        return Dist(device=dev)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    return Dist(dist.get_rank(), world, local_rank, dev)


def wrap(model: nn.Module, d: Dist, fsdp: bool) -> nn.Module:
    """DDP, or FSDP2 (`fully_shard` per block, then the root) for models that don't fit one device."""
    if not d.enabled and not fsdp:
        return model
    if fsdp:
        from torch.distributed.fsdp import fully_shard

        for block in model.layers:
            fully_shard(block)
        fully_shard(model)
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model, device_ids=[d.device.index] if d.device.type == "cuda" else None)


def unwrap(model: nn.Module) -> nn.Module:
    return getattr(model, "module", model)


def all_reduce_sum(values: list[float], d: Dist) -> list[float]:
    if not d.enabled:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=d.device)
    dist.all_reduce(t)
    return t.tolist()


def all_reduce_max(values: list[float], d: Dist) -> list[float]:
    """The elementwise maximum over ranks (exact: a max rounds nothing)."""
    if not d.enabled:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=d.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def all_reduce_grads(params: list[nn.Parameter], d: Dist) -> None:
    """Sum the parameters' gradients over ranks, in one flat buffer per dtype. A rank that did no
    backward (no samples this step) contributes zeros, so ranks may run different numbers of
    micro-batches (rl's manual alternative to DDP, whose hooks need the same passes on every rank)."""
    if not d.enabled:
        return
    params = [p for p in params if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for p in params:
        by_dtype.setdefault(p.grad.dtype, []).append(p.grad)
    for grads in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()


def gather_objects(obj, d: Dist) -> list | None:
    """Every rank's picklable `obj`, in rank order, on rank 0 (None on the other ranks)."""
    if not d.enabled:
        return [obj]
    out = [None] * d.world if d.is_main else None
    dist.gather_object(obj, out, dst=0)
    return out


def broadcast_flag(flag: bool, d: Dist) -> bool:
    """True on every rank when any rank says so (a signal seen by one rank stops all of them)."""
    if not d.enabled:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=d.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def barrier(d: Dist) -> None:
    if d.enabled:
        dist.barrier()


def shutdown(d: Dist) -> None:
    if d.enabled and dist.is_initialized():
        dist.destroy_process_group()


@contextmanager
def session(d: Dist):
    """Around a whole train or rl run: on success every rank waits for the others before the
    process group is torn down (rank 0 writes the manifest after the last collective; a gloo rank
    whose peer closes its sockets meanwhile can abort — SIGABRT, seen once in the two-rank FSDP
    test); on an error no barrier, so a failing rank exits and torchrun stops the rest."""
    try:
        yield
        barrier(d)
    finally:
        shutdown(d)
