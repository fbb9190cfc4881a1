"""Running per-shard tasks: the executor, progress reporting and the sharded-stage driver."""
