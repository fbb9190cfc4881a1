"""Scale-out (issue 10): the data stages on Ray and as Slurm arrays give the local run's bytes.

One local run of crawl-extract -> filter -> dedup -> tokenize on the example crawl is the
reference. The Ray tests start a 2-CPU Ray head inside this process (Ray maps 127.0.0.1 to this
machine's address; the head is token-authenticated and shut down at the end) and run the same
stages with `--executor ray --ray-address ADDR`, killing a Ray worker process (os._exit) once per
stage in the middle of a task; the Slurm test runs examples/slurm/extract.sbatch once per array
index, concurrently, as Slurm would, and under a fake `sbatch` for examples/slurm/submit.sh.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conftest import CRAWL, ROOT, llmctl
from llmctl.cli import main

try:
    import ray  # the optional extra: pip install 'llmctl[ray]'

    HAVE_RAY = True
except ImportError:
    ray = None
    HAVE_RAY = False
needs_ray = pytest.mark.skipif(not HAVE_RAY, reason="ray is not installed (pip install 'llmctl[ray]')")
WARCS = sorted(CRAWL.glob("*.warc.gz"))
# the per-page time limit is wall-clock: on a loaded machine (a demo beside the tests) one page of
# either run can pass it and be skipped, and the runs differ by that page; no limit here
NO_TIMEOUT = "0"
SLURM = ROOT / "examples" / "slurm"


def outputs(artifact: Path) -> list[dict]:
    """What a manifest says its files are: name, rows, bytes, sha256 (the byte-identity check)."""
    return json.loads((artifact / "manifest.json").read_text())["outputs"]


def counts(artifact: Path) -> dict:
    return json.loads((artifact / "manifest.json").read_text())["counts"]


def temps(artifact: Path) -> list[str]:
    return sorted(str(p.relative_to(artifact)) for p in artifact.rglob(".*.tmp-*"))


@pytest.fixture(scope="module")
def local(tmp_path_factory) -> Path:
    """The reference: every stage with the local process pool."""
    d = tmp_path_factory.mktemp("local")
    llmctl("crawl-extract", *WARCS, "-o", d / "docs", "--workers", "2", "--timeout", NO_TIMEOUT, "-q", check=True)
    llmctl("filter", d / "docs", "-o", d / "filtered", "--keep-rejected", "--workers", "2", "-q", check=True)
    llmctl("dedup", d / "filtered", "-o", d / "dedup", "--config", "minhash", "--keep-rejected", "--workers", "2", "-q", check=True)
    llmctl("tokenize", "train", d / "dedup", "-o", d / "tok", "--vocab-size", "512", "-q", check=True)
    llmctl("tokenize", d / "dedup", "-o", d / "tokens", "--tokenizer", d / "tok", "--workers", "2", "-q", check=True)
    assert counts(d / "docs")["shards"] >= 4 and counts(d / "dedup")["removed"]["minhash"]["docs"] > 0
    return d


@pytest.fixture(scope="module")
def ray_cluster():
    """A 2-CPU Ray head started by this test process; yields its address."""
    if not HAVE_RAY:
        pytest.skip("ray is not installed")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=80 * 1024 * 1024, logging_level="warning", _node_ip_address="127.0.0.1")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # this module's task functions travel by value
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@dataclass
class CrashOnce:
    """Wraps a stage's task function: on the first attempt of task `name` the Ray worker process
    dies (os._exit, no cleanup) either at the task's first progress report, i.e. in the middle
    of the shard ("mid"), or right after the shard was committed and before its result got back
    ("after"). A file in `marks` records the attempt (and the temp files present when it died)."""

    fn: Any
    name: str
    mode: str
    marks: str

    def __call__(self, task, report):
        mark = Path(self.marks) / task.name
        if task.name != self.name or mark.exists():
            return self.fn(task, report)
        work = getattr(self.fn, "work_dir", None)
        if self.mode == "after":
            self.fn(task, report)
            mark.write_text(json.dumps({"pid": os.getpid(), "temps": []}))
            os._exit(1)

        def die(n):
            mark.write_text(json.dumps({"pid": os.getpid(), "temps": temps(work) if work else []}))
            os._exit(1)

        return self.fn(task, die)


@needs_ray
def test_ray_pipeline_with_killed_workers_is_byte_identical(local, ray_cluster, tmp_path, monkeypatch):
    """All four stages through the CLI with --executor ray; in each stage one task's worker
    process dies once. Ray retries it; the artifacts are complete and byte-identical to local."""
    from llmctl.runtime.ray_executor import RayBackend

    marks = tmp_path / "marks"
    marks.mkdir()
    plan: dict = {}
    real_run = RayBackend.run

    def crashing_run(self, fn, tasks, **kw):
        return real_run(self, CrashOnce(fn, plan["name"], plan["mode"], str(marks)), tasks, **kw)

    monkeypatch.setattr(RayBackend, "run", crashing_run)
    out = tmp_path / "ray"
    flags = ["--executor", "ray", "--ray-address", ray_cluster, "--cpus-per-task", "1", "--memory-per-task", "256M", "-q"]
    stages = [
        ("docs", ["crawl-extract", *WARCS, "-o", out / "docs", "--timeout", NO_TIMEOUT], "part-00002", "mid"),
        # dies with its Parquet temp file half written
        ("filtered", ["filter", out / "docs", "-o", out / "filtered", "--keep-rejected"], "part-00001", "mid"),
        # dies in dedup's first phase (signatures), a phase outside the sharded driver
        ("dedup", ["dedup", out / "filtered", "-o", out / "dedup", "--config", "minhash", "--keep-rejected"], "sign-00003", "mid"),
        # dies after its shard and marker were committed: the retry must reuse, not duplicate
        ("tokens", ["tokenize", out / "dedup", "-o", out / "tokens", "--tokenizer", local / "tok"], "tokens-00000", "after"),
    ]
    for name, args, task, mode in stages:
        plan.update(name=task, mode=mode)
        main([str(a) for a in args] + flags)
        assert (marks / task).exists(), f"{name}: the planted worker death did not happen"
        assert outputs(out / name) == outputs(local / name), f"{name}: not byte-identical to the local run"
        c, ref = counts(out / name), counts(local / name)
        assert c == ref, f"{name}: counts differ"
        assert temps(out / name) == [], f"{name}: a killed attempt left temporary files"
        assert len(list((out / name / ".shards").glob("*.json"))) == c["shards"] + 1  # + run.json
    died_mid_write = json.loads((marks / "part-00001").read_text())["temps"]
    assert any(t.startswith(".part-00001.parquet.tmp-") for t in died_mid_write), died_mid_write
    assert not (out / "dedup" / "_work").exists()


def toy(task, report):
    """A task function for the executor contract: fails, dies or reports, as its payload says."""
    if task.payload == "raise":
        raise ValueError("planted")
    if task.payload == "die":
        os._exit(1)
    report(task.weight)
    return {"n": task.index}


@needs_ray
def test_ray_backend_keeps_the_executor_contract(ray_cluster):
    """Results in task order (on_result too), progress in task units, a task's exception is its
    error (not retried), and a worker that dies on every attempt fails the run, naming the task."""
    from llmctl.errors import StageFailed
    from llmctl.runtime.executor import Task, run_tasks
    from conftest import RecordingProgress
    from llmctl.runtime.ray_executor import ray_session

    tasks = [Task(i, f"t{i}", "raise" if i == 3 else "ok", weight=10 + i) for i in range(6)]
    seen, progress = [], RecordingProgress()
    with ray_session(ray_cluster, cpus_per_task=0.5, max_retries=1):
        results = run_tasks(toy, tasks, workers=3, progress=progress, on_result=lambda r: seen.append(r.index))
        assert [r.index for r in results] == seen == list(range(6))
        assert [r.stats for r in results if r.ok] == [{"n": i} for i in (0, 1, 2, 4, 5)]
        assert results[3].error.startswith("ValueError: planted")
        assert progress.done == sum(t.weight for t in tasks) - tasks[3].weight
        with pytest.raises(StageFailed, match="Ray could not run t1 .*retried 1 times"):
            run_tasks(toy, [Task(0, "t0", "ok"), Task(1, "t1", "die")])


@needs_ray
def test_cli_joins_a_running_cluster_by_address(local, ray_cluster, tmp_path):
    """A separate llmctl process connects with --ray-address (its own Ray job and workers)."""
    r = llmctl("tokenize", local / "dedup", "-o", tmp_path / "tokens", "--tokenizer", local / "tok", "--executor", "ray", "--ray-address", ray_cluster, "--workers", "1", "-q", check=True)
    assert r.returncode == 0
    assert outputs(tmp_path / "tokens") == outputs(local / "tokens")


def test_executor_flags_are_checked(tmp_path, monkeypatch, capsys):
    docs = tmp_path / "in.jsonl"
    docs.write_text('{"id": "a", "text": "x"}\n')
    cases = [
        (["--executor", "dask"], "--executor must be one of local, ray"),
        (["--ray-address", "10.0.0.1:6379"], "--ray-address needs --executor ray"),
        (["--executor", "ray", "--memory-per-task", "lots"], "--memory-per-task takes bytes"),
        (["--executor", "ray", "--cpus-per-task", "0"], "--cpus-per-task must be > 0, got 0.0"),
    ]
    monkeypatch.setitem(sys.modules, "ray", None)  # and without Ray installed:
    cases.append((["--executor", "ray"], "--executor ray needs Ray, which is not installed: pip install 'llmctl[ray]'"))
    for flags, message in cases:
        with pytest.raises(SystemExit) as e:
            main(["filter", str(docs), "-o", str(tmp_path / "out"), *flags])
        assert e.value.code == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_slurm_array_shards_add_up_to_the_local_run(local, tmp_path):
    """examples/slurm/extract.sbatch run for each array index at once, as Slurm would start them
    (only the index variables set): together they commit the local run's artifact."""
    paths = tmp_path / "warc.paths"
    paths.write_text("".join(f"{w}\n" for w in WARCS))
    out = tmp_path / "pipeline"
    env = {**os.environ, "WARC_LIST": str(paths), "OUT": str(out), "LLMCTL": f"{sys.executable} -m llmctl", "SLURM_ARRAY_TASK_COUNT": "3", "SLURM_CPUS_PER_TASK": "1", "EXTRACT_ARGS": "-q"}
    procs = [subprocess.Popen(["bash", str(SLURM / "extract.sbatch")], env={**env, "SLURM_ARRAY_TASK_ID": str(i)}, stderr=subprocess.PIPE) for i in range(3)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()
    assert outputs(out / "docs") == outputs(local / "docs")
    assert counts(out / "docs") == counts(local / "docs")
    assert temps(out / "docs") == []


def test_submit_chains_the_array_jobs_with_dependencies(tmp_path):
    """examples/slurm/submit.sh under a fake sbatch: arrays sized by the path list, each stage
    submitted afterok on the one before."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "sbatch.log"
    fake = bin_dir / "sbatch"
    fake.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$*" >> "$SBATCH_LOG"\necho $((100 + $(wc -l < "$SBATCH_LOG")))\n')
    fake.chmod(0o755)
    paths = tmp_path / "warc.paths"
    paths.write_text("".join(f"crawl-data/CC-MAIN-2024-10/segments/x/warc/f{i}.warc.gz\n" for i in range(10)))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SBATCH_LOG": str(log), "WARC_LIST": str(paths), "OUT": str(tmp_path / "out"), "WARCS_PER_TASK": "4"}
    r = subprocess.run(["bash", str(SLURM / "submit.sh")], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    jobs = log.read_text().splitlines()
    scripts = [re.search(r"(\S+\.sbatch|--wrap)", j).group(1) for j in jobs]
    assert [Path(s).name for s in scripts] == ["extract.sbatch", "stage.sbatch", "dedup.sbatch", "--wrap", "stage.sbatch"]
    assert "--array=0-2" in jobs[0] and "--dependency" not in jobs[0]  # 10 WARCs, 4 a task
    for k in range(1, 5):
        assert f"--dependency=afterok:{100 + k}" in jobs[k], jobs[k]
    assert "--array=" in jobs[1] and "--array=" in jobs[4] and "--array=" not in jobs[2]
    assert "https://data.commoncrawl.org/crawl-data/" in (tmp_path / "out" / "warc.urls").read_text()


def test_example_scripts_parse():
    for script in [*SLURM.glob("*.sbatch"), *SLURM.glob("*.sh"), *(ROOT / "examples" / "ray").glob("*.sh")]:
        r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert r.returncode == 0, f"{script}: {r.stderr}"
