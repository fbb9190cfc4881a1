"""The executor and the sharded-stage driver: determinism, resume, error capture, killed workers."""

import itertools
import json
import os
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from llmctl.artifacts.docs import part_name
from llmctl.artifacts.docs_write import ShardWriter
from llmctl.artifacts.manifest import read_manifest
from llmctl.errors import StageFailed, UsageError
from conftest import CRAWL, RecordingProgress
from llmctl.runtime.executor import Task, run_tasks
from llmctl.runtime.lifeline import die_with_parent
from llmctl.runtime.split import MiB, auto_chunk, byte_ranges, select_shard, stream_range_starts
from llmctl.runtime.options import RunOptions
from llmctl.runtime.sharded import run_sharded

SCHEMA = pa.schema([("id", pa.string()), ("text", pa.string())])


def tasks(n=6, rows=50):
    return [Task(i, part_name(i, ""), {"start": i * rows, "rows": rows}, weight=rows) for i in range(n)]


def toy_shard(task, out, report):
    """Writes `rows` docs; behaviour switches come from the payload so they survive pickling."""
    p = task.payload
    if p.get("fail_at") == task.index:
        raise ValueError("planted failure")
    path = out / f"{task.name}.parquet"
    with ShardWriter(path, SCHEMA) as w:
        for k in range(p["start"], p["start"] + p["rows"], 10):
            ids = [f"doc-{j}" for j in range(k, k + 10)]
            w.write(pa.record_batch([ids, [f"text {j} ✓" for j in range(k, k + 10)]], schema=SCHEMA))
            report(10)
            kill = p.get("kill_file")
            if kill and task.index == 3 and k == p["start"] + 20 and os.path.exists(kill):
                os.unlink(kill)  # only the first run dies
                os.kill(os.getpid(), signal.SIGKILL)
    return {"outputs": [path.name], "counts": {"in": p["rows"], "out": p["rows"], "skipped": {"odd": 1}}}


def with_payload(ts, **extra):
    return [Task(t.index, t.name, {**t.payload, **extra}, t.weight) for t in ts]


def read_all(out):
    files = sorted(p for p in out.iterdir() if p.suffix == ".parquet")
    return [f.name for f in files], [pq.read_table(f).to_pylist() for f in files], [f.read_bytes() for f in files]


def run(out, ts, **kw):
    opts = RunOptions(**kw)
    return run_sharded(stage="toy", kind="docs", out=str(out), tasks=ts, fn=toy_shard, config={"x": 1}, inputs=[], opts=opts)


def test_same_bytes_whatever_the_worker_count(tmp_path):
    run(tmp_path / "w1", tasks(), workers=1)
    run(tmp_path / "w2", tasks(), workers=2)
    assert read_all(tmp_path / "w1") == read_all(tmp_path / "w2")
    m = read_manifest(tmp_path / "w2")
    assert m.counts == {"in": 300, "out": 300, "skipped": {"odd": 6}, "errors": 0, "shards": 6}
    assert [o["file"] for o in m.outputs] == [f"part-0000{i}.parquet" for i in range(6)]
    assert all(o["rows"] == 50 and len(o["sha256"]) == 64 for o in m.outputs)


def test_progress_from_all_workers_is_summed(tmp_path):
    prog = RecordingProgress()
    run_sharded(stage="toy", kind="docs", out=str(tmp_path / "o"), tasks=tasks(), fn=toy_shard, config={}, inputs=[], opts=RunOptions(workers=2), progress=prog)
    assert prog.total == 300 and prog.done == 300 and prog.finished


def test_a_failing_shard_is_recorded_the_rest_go_on_and_a_rerun_retries_it(tmp_path):
    with pytest.raises(StageFailed, match="1 of 6 shard.*part-00002.*planted failure"):
        run(tmp_path / "o", with_payload(tasks(), fail_at=2), workers=2)
    names, _, _ = read_all(tmp_path / "o")
    assert "part-00002.parquet" not in names and len(names) == 5
    assert not (tmp_path / "o" / "manifest.json").exists()  # incomplete: nothing downstream takes it
    prog = RecordingProgress()
    m = run_sharded(stage="toy", kind="docs", out=str(tmp_path / "o"), tasks=tasks(), fn=toy_shard, config={"x": 1}, inputs=[], opts=RunOptions(workers=2), progress=prog)
    assert prog.total == 50  # only the failed shard ran again
    assert m.counts["errors"] == 0 and len(m.outputs) == 6
    assert read_manifest(tmp_path / "o").counts["out"] == 300


def test_strict_fails_on_damage_counted_inside_shards(tmp_path):
    def damaged(task, out, report):
        stats = toy_shard(task, out, report)
        stats["counts"]["errors"] = 1
        stats["errors"] = [{"file": "x.warc.gz", "offset": 123, "error": "damaged gzip member"}]
        return stats

    prog = RecordingProgress()
    m = run_sharded(stage="toy", kind="docs", out=str(tmp_path / "a"), tasks=tasks(2), fn=damaged, config={}, inputs=[], opts=RunOptions(workers=1), progress=prog)
    assert m.counts["errors"] == 2 and m.errors[0] == {"file": "x.warc.gz", "offset": 123, "error": "damaged gzip member"}
    assert any("x.warc.gz at byte 123" in msg for msg in prog.messages)
    with pytest.raises(StageFailed, match="--strict"):
        run_sharded(stage="toy", kind="docs", out=str(tmp_path / "b"), tasks=tasks(2), fn=damaged, config={}, inputs=[], opts=RunOptions(workers=1, strict=True))


def test_killed_worker_leaves_no_visible_partial_shard_and_rerun_matches(tmp_path):
    kill = tmp_path / "kill-once"
    kill.write_text("1")
    out = tmp_path / "o"
    with pytest.raises(StageFailed, match="worker process died"):
        run(out, with_payload(tasks(), kill_file=str(kill)), workers=2)
    visible = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    assert "part-00003.parquet" not in visible
    assert "manifest.json" not in visible
    for name in visible:  # whatever is visible is complete and readable
        assert pq.read_table(out / name).num_rows == 50
    run(out, with_payload(tasks(), kill_file=str(kill)), workers=2)
    run(tmp_path / "clean", tasks(), workers=1)
    assert read_all(out) == read_all(tmp_path / "clean")
    assert not [p for p in out.rglob(".*tmp-*")]


def test_resume_skips_finished_shards(tmp_path):
    run(tmp_path / "o", tasks(), workers=1)
    before = (tmp_path / "o" / "part-00000.parquet").stat().st_mtime_ns
    prog = RecordingProgress()
    run_sharded(stage="toy", kind="docs", out=str(tmp_path / "o"), tasks=tasks(), fn=toy_shard, config={"x": 1}, inputs=[], opts=RunOptions(workers=1), progress=prog)
    assert prog.total == 0
    assert (tmp_path / "o" / "part-00000.parquet").stat().st_mtime_ns == before
    # a different config never silently mixes into the same output
    with pytest.raises(UsageError, match="different toy config"):
        run_sharded(stage="toy", kind="docs", out=str(tmp_path / "o"), tasks=tasks(), fn=toy_shard, config={"x": 2}, inputs=[], opts=RunOptions())
    run_sharded(stage="toy", kind="docs", out=str(tmp_path / "o"), tasks=tasks(), fn=toy_shard, config={"x": 2}, inputs=[], opts=RunOptions(overwrite=True))


def test_outside_scheduler_shards_complete_the_artifact_together(tmp_path):
    out = tmp_path / "o"
    run(out, tasks(), shard_index=0, num_shards=2)
    assert not (out / "manifest.json").exists()
    assert sorted(p.name for p in out.glob("*.parquet")) == ["part-00000.parquet", "part-00002.parquet", "part-00004.parquet"]
    run(out, tasks(), shard_index=1, num_shards=2)
    assert read_manifest(out).counts["out"] == 300
    run(tmp_path / "one", tasks(), workers=2)
    assert read_all(out) == read_all(tmp_path / "one")


def test_stream_output_is_in_task_order(tmp_path):
    import io

    buf = io.BytesIO()
    run_sharded(stage="toy", kind="docs", out="-", tasks=tasks(), fn=toy_shard, config={}, inputs=[], opts=RunOptions(workers=2), stdout=buf)
    buf.seek(0)
    ids = pa.ipc.open_stream(buf).read_all().column("id").to_pylist()
    assert ids == [f"doc-{j}" for j in range(300)]


def test_run_tasks_returns_in_order_and_captures_errors():
    def boom(task, report):
        if task.index == 1:
            raise RuntimeError("bad shard")
        return {"i": task.index}

    res = run_tasks(boom, [Task(i, str(i), None) for i in range(3)], workers=1)
    assert [r.ok for r in res] == [True, False, True]
    assert "RuntimeError: bad shard" in res[1].error


def test_splitting_and_selection():
    assert byte_ranges(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert byte_ranges(0, 4) == [(0, 0)]
    assert auto_chunk(14_000_000) == 1 << 20  # a small crawl: 1 MiB ranges
    assert auto_chunk(1 << 30) == 16 << 20  # one CC WARC: 64 ranges
    assert auto_chunk(1 << 40) == 64 << 20
    assert select_shard(list(range(7)), 1, 3) == [1, 4]
    with pytest.raises(ValueError):
        select_shard([1], 3, 3)


def test_stream_ranges_are_file_ranges_up_to_64_mib_then_grow():
    starts = list(itertools.islice(stream_range_starts(), 400))
    for size in (1, 3_300_000, 64 * MiB):  # a stream this long is cut exactly as a file of its size
        assert [s for s in starts if s < size] == [a for a, _ in byte_ranges(size, auto_chunk(size))]
    steps = [b - a for a, b in zip(starts, starts[1:])]
    assert steps[63] == MiB and steps[64] == 2 * MiB and max(steps) == 16 * MiB
    assert sum(1 for s in starts if s < 1 << 30) < 300  # a 1 GB stream: a few hundred parts


def sleepy(task, report):
    time.sleep(0.02)
    return {"i": task.index}


def test_a_lazy_task_source_is_pulled_only_as_the_pool_has_room():
    done: list[int] = []
    ahead: list[int] = []  # tasks handed out and not yet reported, when each next one is pulled

    def source():
        for i in range(20):
            ahead.append(i - len(done))
            yield Task(i, f"t{i}", None)

    res = run_tasks(sleepy, source(), workers=2, max_in_flight=3, on_result=lambda r: done.append(r.index))
    assert [r.stats["i"] for r in res] == list(range(20)) and done == list(range(20))
    assert max(ahead) <= 3 + 2  # the bound, plus results that wait for an earlier one to report in order
    assert [r.index for r in run_tasks(sleepy, iter(tasks(3)), workers=1)] == [0, 1, 2]


def test_die_with_parent_exits_when_the_parent_is_already_gone():
    pid = os.fork()
    if pid == 0:  # the child, as if its parent had died before it asked to die with it
        die_with_parent(os.getppid() + 1_000_000)
        os._exit(7)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 1


def children(pid: int) -> set[int]:
    kids: set[int] = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids |= {int(k) for k in f.read().split()}
        except FileNotFoundError:
            pass
    return kids


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_pool_workers_die_with_a_killed_parent(tmp_path):
    # crawl-extract of a WARC on stdin that never ends: the pool has started on the first window
    # and the parent waits for more input, so the workers outlive nothing but their parent
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmctl", "crawl-extract", "-", "-o", str(tmp_path / "out"), "--workers", "2", "-q"],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    kids: set[int] = set()
    try:
        proc.stdin.write((CRAWL / "CC-EXAMPLE-00000.warc.gz").read_bytes())
        proc.stdin.flush()
        deadline = time.monotonic() + 60
        while len(kids := children(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(kids) >= 2, "the pool did not start"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 2
        while any(alive(k) for k in kids) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not [k for k in kids if alive(k)]
    finally:
        proc.kill()
        proc.stdin.close()
        for k in kids:
            if alive(k):
                os.kill(k, signal.SIGKILL)
