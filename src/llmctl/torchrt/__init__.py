"""The torch runtime train, rl and eval share: device choice (device), process groups (distributed),
the CPU allocator (alloc), AdamW and schedules (optim), and a run directory's lifecycle (rundir)."""
