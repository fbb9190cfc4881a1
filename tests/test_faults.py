"""Fault injection: the conventions hold when runs are killed and raced.

- kill -9 at random moments: each data stage, train, and the single-process commands cat, head,
  eval and report are killed --trials times in a row (each re-run — the same command, plain —
  resumes or starts over what the last one left, and is killed again), then run to the end; the
  artifact equals an uninterrupted run's, byte for byte (a report's time of writing excepted). A
  run that ends before its kill must exit 0 with that same artifact; the chain then starts afresh,
  so the later kills land on work, not on no-ops.
- two writers on one OUT: exactly one runs, the other exits 2 naming the first's pid, and the
  artifact is the winner's.
- a resume over other inputs is exit 2 naming the input that changed; shards of an earlier run
  that the manifest does not list are removed.

- a re-run over a finished output of cat, head or eval is a no-op, exit 0; another command's output,
  or the same command's with other inputs, is refused without --overwrite; what the command did not
  write is never removed.

`pytest tests/test_faults.py --trials 50` kills every command 50 times (default: 5 for the sharded
stages and train, 20 for the single-process commands). The full disk is tests/test_faults_disk.py.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from faultlib import ENV, cmd, inputs, killed, refs, resume_flag, run, run_dir, same_artifact, stages  # noqa: F401  (fixtures)

SINGLE = ("cat", "head", "eval", "report")  # single-process commands: a re-run starts over (artifacts/rerun.py)


@pytest.mark.parametrize("stage", ["crawl-extract", "filter", "dedup", "tokenize", "train", *SINGLE, "import"])
def test_kill_9_then_resume_gives_the_uninterrupted_artifact(inputs, refs, tmp_path, stage, request):
    if stage in ("eval", "report", "import"):
        request.getfixturevalue("run_dir")
    trials = request.config.getoption("--trials") or (20 if stage in SINGLE else 5)
    args = stages(inputs)[stage]
    ref, took = refs(stage, args)
    rng = random.Random(f"{stage}/{trials}")
    out = tmp_path / "out"
    for i in range(trials):
        rc, err = killed([*args, *(resume_flag(out) if stage == "train" else [])], out, rng.uniform(0.05, 0.95) * took)
        assert rc in (0, -9), f"re-run {i + 1} exited {rc}: {err[-2000:]}"
        if rc == 0:  # it ended before its kill: check what it made, and let the next kills land on work again
            same_artifact(out, ref, train=stage == "train")
            shutil.rmtree(out)
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
    # held still while the second tries: on a loaded machine it could otherwise finish first
    os.kill(first.pid, signal.SIGSTOP)
    try:
        second = run([*args, "-o", out])
    finally:
        os.kill(first.pid, signal.SIGCONT)
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


# ---------------------------------------------------------------------------------------------
# the re-run rule of the single-process commands (artifacts/rerun.py)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def refused(p: subprocess.CompletedProcess, *words: str) -> None:
    err = p.stderr.decode().strip()
    assert p.returncode == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert all(w in err for w in words), err


@pytest.mark.parametrize("stage", [*SINGLE, "import"])
def test_a_rerun_over_a_finished_output_is_a_no_op(inputs, run_dir, refs, tmp_path, stage):
    """The same command again (a Makefile re-run) exits 0 and leaves every byte as it was; a report
    is written again, the same but for its time of writing."""
    args = stages(inputs)[stage]
    out = tmp_path / "out"
    shutil.copytree(refs(stage, args)[0], out)
    before = snapshot(out)
    p = run([*args, "-o", out])
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    if stage == "report":
        same_artifact(out, refs(stage, args)[0])
    else:
        assert snapshot(out) == before
        assert stage == "import" or "nothing to do" in p.stderr.decode()  # import has no log to say it in


def test_another_commands_output_is_refused_without_overwrite(inputs, run_dir, refs, tmp_path):
    s = stages(inputs)
    cases = [  # (command, an output it did not make, words of the refusal)
        (s["cat"], inputs / "filtered", ["--overwrite"]),  # a sharded stage's
        (s["head"], refs("cat", s["cat"])[0], ["llmctl cat, not of head", "--overwrite"]),
        ([*s["cat"][:-3], inputs / "docs", *s["cat"][-2:]], refs("cat", s["cat"])[0], ["another input: input 5 was", "--overwrite"]),
        (s["eval"], run_dir, ["--overwrite"]),  # a training run
        (["eval", run_dir, "-t", f"loss:{inputs / 'tokens'}", "--device", "cpu"], refs("eval", s["eval"])[0], ["another config"]),
        (s["report"], refs("cat", s["cat"])[0], ["is an artifact"]),
    ]
    for i, (args, made, words) in enumerate(cases):
        out = tmp_path / f"out{i}"
        shutil.copytree(made, out)
        before = snapshot(out)
        refused(run([*args, "-o", out]), *words)
        assert snapshot(out) == before, args
    # an output that is, or holds, the command's input is refused even with --overwrite
    before = snapshot(run_dir)
    refused(run([*s["eval"], "-o", run_dir, "--overwrite"]), "holds the input")
    out = tmp_path / "self"
    shutil.copytree(inputs / "filtered", out)
    refused(run(["cat", out, "-o", out, "--overwrite"]), "is the input")
    assert snapshot(run_dir) == before and snapshot(out) == snapshot(inputs / "filtered")


def test_an_unfinished_output_is_finished_never_taken_and_foreign_files_stay(inputs, run_dir, refs, tmp_path):
    """An eval stopped between its results and its manifest is refused by `eval compare` and by
    another command, and finished by its own re-run; a file llmctl did not write in an unfinished
    output is named and kept; a report keeps what lies beside it."""
    s = stages(inputs)
    ref = refs("eval", s["eval"])[0]
    out = tmp_path / "eval"
    shutil.copytree(ref, out)
    (out / "manifest.json").unlink()  # killed after results.json and samples.parquet, before the manifest
    refused(run(["eval", "compare", out, ref]), "unfinished eval")
    refused(run([*s["report"], "-o", out]), "unfinished llmctl eval")
    refused(run([*s["cat"], "-o", out]), "llmctl eval, not of cat")
    p = run([*s["eval"], "-o", out])
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    same_artifact(out, ref)
    assert run(["eval", "compare", out, ref]).returncode == 0
    # someone's file in a cat stopped half-way: the re-run names it and removes nothing
    cat = tmp_path / "cat"
    shutil.copytree(refs("cat", s["cat"])[0], cat)
    (cat / "manifest.json").unlink()
    (cat / "notes.txt").write_text("mine")
    before = snapshot(cat)
    refused(run([*s["cat"], "-o", cat]), "notes.txt", "did not write")
    assert snapshot(cat) == before
    # a report folder: what lies beside the report stays when it is written again
    rep = tmp_path / "report"
    shutil.copytree(refs("report", s["report"])[0], rep)
    (rep / "notes.txt").write_text("mine")
    assert run([*s["report"], "-o", rep]).returncode == 0 and (rep / "notes.txt").read_text() == "mine"


def test_a_finished_output_of_stdin_is_refused_not_assumed(inputs, tmp_path):
    """A stream cannot be told the same as the one a finished output was made of: the re-run is the
    usual refusal; one stopped half-way starts over."""
    stream = subprocess.run(cmd("cat", inputs / "filtered", "-o", "-"), capture_output=True, env=ENV, check=True).stdout
    out = tmp_path / "head"
    args = cmd("head", "-n", "5", "-", "-o", out)
    assert subprocess.run(args, input=stream, capture_output=True, env=ENV).returncode == 0
    refused(subprocess.run(args, input=stream, capture_output=True, env=ENV), "stdin", "--overwrite")
    (out / "manifest.json").unlink()
    assert subprocess.run(args, input=stream, capture_output=True, env=ENV).returncode == 0
