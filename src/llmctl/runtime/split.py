"""Splitting inputs into tasks whose number depends on the data, never on the worker count.

Output shard names come from task indexes, so the task list must be the same whether a run has
1 worker or 64, or is cut by an outside scheduler (`--shard-index/--num-shards`). That is what
makes the output byte-identical whatever the parallelism.
"""

from __future__ import annotations

from collections.abc import Iterator

MiB = 1 << 20


def byte_ranges(size: int, chunk: int) -> list[tuple[int, int]]:
    """[start, end) ranges covering `size` bytes, each `chunk` long except maybe the last."""
    if size <= 0:
        return [(0, 0)]
    chunk = max(1, chunk)
    return [(s, min(s + chunk, size)) for s in range(0, size, chunk)]


def auto_chunk(total_bytes: int, target_tasks: int = 64, min_chunk: int = 1 * MiB, max_chunk: int = 64 * MiB) -> int:
    """A range size giving about `target_tasks` tasks for the whole input, within bounds.

    Small crawls get ~1 MiB ranges so even one file feeds every core; a 1 GB Common Crawl WARC
    gets ~16 MiB ranges (64 output parts per file), and very large jobs cap at 64 MiB so the
    number of output parts stays manageable.
    """
    return max(min_chunk, min(max_chunk, -(-total_bytes // target_tasks)))


def select_shard(items: list, shard_index: int, num_shards: int) -> list:
    """The items an outside scheduler's job `shard_index` of `num_shards` owns (round robin)."""
    if num_shards < 1 or not 0 <= shard_index < num_shards:
        raise ValueError(f"shard index {shard_index} is outside 0..{num_shards - 1}")
    return [x for i, x in enumerate(items) if i % num_shards == shard_index]


def stream_range_starts(min_chunk: int = 1 * MiB, per_size: int = 64, max_chunk: int = 16 * MiB) -> Iterator[int]:
    """Where a stream of unknown length is cut: 0, then range starts forever.

    The first `per_size` ranges are `min_chunk` long, as `auto_chunk` cuts any file up to 64 MiB,
    so a stream that short is cut exactly like a file holding its bytes (and gives the same
    output). A file's ranges grow with its size, which a stream does not know in advance; so
    after every `per_size` ranges the length doubles, up to `max_chunk`: a 1 GB Common Crawl
    WARC gives ~260 parts rather than ~1,000, and no range holds more than 16 MiB in memory.
    """
    pos, chunk, k = 0, min_chunk, 0
    while True:
        yield pos
        pos += chunk
        k += 1
        if k % per_size == 0:
            chunk = min(max_chunk, chunk * 2)
