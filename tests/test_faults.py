"""Fault injection: the conventions hold when runs are killed and raced.

- kill -9 at random moments: each data stage and train is killed --trials times in a row (each
  re-run resumes what the last one left, and is killed again), then run to the end; the artifact
  equals an uninterrupted run's, byte for byte.
- two writers on one OUT: exactly one runs, the other exits 2 naming the first's pid, and the
  artifact is the winner's.
- a resume over other inputs is exit 2 naming the input that changed; shards of an earlier run
  that the manifest does not list are removed.

`pytest tests/test_faults.py --trials 50` kills more often. The full disk is tests/test_faults_disk.py.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import time

import pytest

from faultlib import ENV, cmd, inputs, killed, refs, resume_flag, run, same_artifact, stages  # noqa: F401  (fixtures)


@pytest.mark.parametrize("stage", ["crawl-extract", "filter", "dedup", "tokenize", "train"])
def test_kill_9_then_resume_gives_the_uninterrupted_artifact(inputs, refs, tmp_path, stage, request):
    args = stages(inputs)[stage]
    ref, took = refs(stage, args)
    rng = random.Random(f"{stage}/{request.config.getoption('--trials')}")
    out = tmp_path / "out"
    for _ in range(request.config.getoption("--trials")):
        killed([*args, *(resume_flag(out) if stage == "train" else [])], out, rng.uniform(0.05, 0.95) * took)
    p = run([*args, "-o", out, *(resume_flag(out) if stage == "train" else [])])
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    same_artifact(out, ref, train=stage == "train")


@pytest.mark.parametrize("stage", ["crawl-extract", "train"])
def test_two_writers_one_wins_the_other_exits_2(inputs, refs, tmp_path, stage):
    args = stages(inputs)[stage]
    out = tmp_path / "out"
    first = subprocess.Popen(cmd(*args, "-o", out), env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while not (out / ".llmctl.lock").exists() and first.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    second = run([*args, "-o", out])
    assert first.wait(120) == 0, first.stderr.read().decode()[-2000:]
    err = second.stderr.decode().strip()
    assert second.returncode == 2 and f"being written by pid {first.pid}" in err and len(err.splitlines()) == 1, err
    assert not (out / ".llmctl.lock").exists()  # the winner released it
    same_artifact(out, refs(stage, args)[0], train=stage == "train")


def test_resume_over_other_inputs_is_exit_2_naming_the_input(inputs, tmp_path):
    out = tmp_path / "out"
    assert run(["tokenize", inputs / "filtered", "-o", out, "-t", inputs / "tok"]).returncode == 0
    p = run(["tokenize", inputs / "docs", "-o", out, "-t", inputs / "tok"])
    err = p.stderr.decode().strip()
    assert p.returncode == 2 and "another input: input 1 was" in err and str(inputs / "filtered") in err, err
    (inputs / "docs2").mkdir()
    (inputs / "docs2" / "a.parquet").write_bytes((inputs / "docs" / "b.parquet").read_bytes())
    assert run(["tokenize", inputs / "docs2", "-o", tmp_path / "t", "-t", inputs / "tok"]).returncode == 0
    (inputs / "docs2" / "a.parquet").write_bytes((inputs / "docs" / "a.parquet").read_bytes())
    p = run(["tokenize", inputs / "docs2", "-o", tmp_path / "t", "-t", inputs / "tok"])
    assert p.returncode == 2 and "the same path with other content" in p.stderr.decode()
    assert run(["tokenize", inputs / "docs2", "-o", tmp_path / "t", "-t", inputs / "tok", "--overwrite"]).returncode == 0


def test_stale_shards_of_an_earlier_run_are_removed(inputs, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(inputs / "filtered", out)
    (out / "part-00099.parquet").write_bytes((out / "part-00000.parquet").read_bytes())
    (out / "manifest.json").unlink()  # as if the run had stopped before its manifest
    p = run(["filter", inputs / "docs", "-o", out, "--workers", "2"])
    assert p.returncode == 0 and not (out / "part-00099.parquet").exists()
    assert "part-00099.parquet" in p.stderr.decode()
