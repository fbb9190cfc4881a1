"""The torch runtime train, rl and eval share: device choice (device), process groups (distributed),
the CPU allocator (alloc), AdamW and schedules (optim), a run directory's lifecycle (rundir), the
accelerator table (hardware, which plan reads too) and model FLOPs utilization (mfu)."""
