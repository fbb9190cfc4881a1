"""Fault injection: the conventions hold when runs are killed, raced and starved of disk.

- kill -9 at random moments: each data stage and train is killed --trials times in a row (each
  re-run resumes what the last one left, and is killed again), then run to the end; the artifact
  equals an uninterrupted run's, byte for byte.
- two writers on one OUT: exactly one runs, the other exits 2 naming the first's pid, and the
  artifact is the winner's.
- a full disk (RLIMIT_FSIZE, which Python turns into EFBIG on the write that crosses it): every
  writing command exits 1 with one line and leaves nothing partial under a final name; run again
  with room, it ends with the same artifact as a run that never failed.
- a resume over other inputs is exit 2 naming the input that changed.

`pytest tests/test_faults.py --trials 50` kills more often.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import CRAWL, ROOT
from test_train import sentences

ENV = {**os.environ, "COLUMNS": "200", "OMP_NUM_THREADS": "1"}
TRAIN = ["--set", "model.n_layers=1", "--set", "model.d_model=32", "--set", "model.n_heads=2", "--set", "model.d_ff=64",
         "--seq-len", "32", "--batch-tokens", "256", "--micro-batch", "8", "--max-steps", "16", "--checkpoint-every", "2",
         "--eval-every", "0", "--threads", "1", "--lr", "3e-3"]


def cmd(*args) -> list[str]:
    return [sys.executable, "-m", "llmctl", *map(str, args)]


def run(args, fsize: int | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    def limit():
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    return subprocess.run(cmd(*args), capture_output=True, env=ENV, timeout=timeout, preexec_fn=limit)


def visible(out: Path) -> dict[str, str]:
    """sha256 of every file a user sees in OUT (not hidden ones, not the manifest's run-specific header)."""
    files = {}
    for p in sorted(out.rglob("*")):
        rel = p.relative_to(out)
        if p.is_file() and not any(part.startswith(".") for part in rel.parts) and rel.name != "manifest.json":
            files[str(rel)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return files


def manifest_core(out: Path) -> dict:
    m = json.loads((out / "manifest.json").read_text())
    return {"outputs": m["outputs"], "counts": {k: v for k, v in m["counts"].items() if k != "wall_seconds"}}


def same_artifact(out: Path, ref: Path, train: bool = False) -> None:
    if train:  # the last checkpoint's weights and every step's loss
        final = lambda d: (d / "checkpoints" / (d / "checkpoints" / "latest").read_text().strip() / "model.safetensors").read_bytes()  # noqa: E731
        losses = lambda d: [(r["step"], r["loss"]) for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines()) if "loss" in r]  # noqa: E731
        assert final(out) == final(ref) and losses(out) == losses(ref)
        return
    assert visible(out) == visible(ref)
    assert manifest_core(out) == manifest_core(ref)


WARC = sorted(CRAWL.glob("*.warc.gz"))[0]  # one file of the example crawl: 4 byte ranges, ~600 captures


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Docs of one example WARC, 200 of them as two files (filter's input), filtered docs, a
    tokenizer and its tokens."""
    d = tmp_path_factory.mktemp("faults")
    assert run(["crawl-extract", WARC, "-o", d / "all", "--workers", "2"]).returncode == 0
    table = pa.concat_tables([pq.read_table(p) for p in sorted((d / "all").glob("part-*.parquet"))]).slice(0, 200)
    (d / "docs").mkdir()
    pq.write_table(table.slice(0, 100), d / "docs" / "a.parquet")
    pq.write_table(table.slice(100), d / "docs" / "b.parquet")
    assert run(["filter", d / "docs", "-o", d / "filtered", "--workers", "2"]).returncode == 0
    rng = random.Random(0)
    pq.write_table(pa.table({"text": [sentences(rng, 12) for _ in range(400)]}), d / "corpus.parquet")
    assert run(["tokenize", "train", d / "corpus.parquet", "-o", d / "tok", "--vocab-size", "300"]).returncode == 0
    assert run(["tokenize", d / "corpus.parquet", "-o", d / "tokens", "-t", d / "tok"]).returncode == 0
    return d


def stages(d: Path) -> dict[str, list]:
    return {
        "crawl-extract": ["crawl-extract", WARC, "--workers", "2"],
        "filter": ["filter", d / "docs", "--workers", "2", "--keep-rejected"],
        "dedup": ["dedup", d / "filtered", "--workers", "2", "--url", "--exact", "--minhash"],
        "tokenize": ["tokenize", d / "filtered", "-t", d / "tok", "--workers", "2"],
        "train": ["train", d / "tokens", *TRAIN],
    }


@pytest.fixture(scope="module")
def refs(inputs, run_dir, tmp_path_factory):
    """Each stage run once, uninterrupted, with its wall time: what every fault must end in."""
    root, cache = tmp_path_factory.mktemp("refs"), {}

    def ref(stage: str, args: list) -> tuple[Path, float]:
        if stage not in cache:
            t0 = time.perf_counter()
            p = run([*args, "-o", root / stage.replace(" ", "-")])
            assert p.returncode == 0, p.stderr.decode()[-2000:]
            cache[stage] = (root / stage.replace(" ", "-"), time.perf_counter() - t0)
        return cache[stage]

    return ref


def killed(args, out: Path, delay: float) -> None:
    p = subprocess.Popen(cmd(*args, "-o", out), env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    time.sleep(delay)
    try:
        os.killpg(p.pid, signal.SIGKILL)  # the command and its pool workers
    except ProcessLookupError:
        pass
    p.wait()


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


def resume_flag(out: Path) -> list[str]:
    """What a user passes to go on after a crash: --resume with a checkpoint, else start over."""
    if (out / "checkpoints" / "latest").is_file() and (out / "metrics.jsonl").is_file():
        return ["--resume"]
    return ["--overwrite"] if out.exists() else []


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


def disk_cases(d: Path) -> dict[str, tuple[list, list]]:
    """stage: (args, what a user adds to run again once there is room)."""
    s = stages(d)
    return {
        "crawl-extract": (s["crawl-extract"], []),
        "filter": (s["filter"], []),
        "dedup": (s["dedup"], []),
        "tokenize": (s["tokenize"], []),
        "tokenize train": (["tokenize", "train", d / "corpus.parquet", "--vocab-size", "300"], ["--overwrite"]),
        "cat": (["cat", d / "filtered"], ["--overwrite"]),
        "train": (s["train"], None),  # resume_flag decides
        "export": (["export", d / "run"], ["--overwrite"]),
        "import": (["import", d / "hf"], ["--overwrite"]),
        "eval": (["eval", d / "run", "-t", f"loss:{d / 'tokens'}"], ["--overwrite"]),
        "decontam": (["decontam", d / "filtered", "--against", ROOT / "examples/tasks/arithmetic.jsonl", "--workers", "2"], []),
        "rl": (["rl", d / "run", "--prompts", d / "sums.jsonl", "--steps", "2", "--prompts-per-step", "2", "-G", "2",
                "--max-new-tokens", "4", "--headroom-limit", "0", "--device", "cpu"], None),
    }


@pytest.fixture(scope="module")
def run_dir(inputs):
    """A trained run, its export (import's input) and sums to RL on."""
    assert run([*stages(inputs)["train"], "-o", inputs / "run"]).returncode == 0
    assert run(["export", inputs / "run", "-o", inputs / "hf"]).returncode == 0
    (inputs / "sums.jsonl").write_text("".join(json.dumps({"question": f"What is {a} plus 1?", "answer": f"#### {a + 1}"}) + "\n"
                                               for a in range(8)))
    return inputs / "run"


@pytest.mark.parametrize("stage", ["crawl-extract", "filter", "dedup", "tokenize", "tokenize train", "cat", "decontam",
                                   "train", "rl", "export", "import", "eval"])
def test_full_disk_is_one_line_nothing_partial_and_a_rerun_completes(inputs, refs, tmp_path, stage):
    args, again = disk_cases(inputs)[stage]
    ref, _ = refs(stage, args)
    biggest = max(p.stat().st_size for p in ref.rglob("*") if p.is_file())
    out = tmp_path / "out"
    p = run([*args, "-o", out], fsize=biggest // 2)
    err = p.stderr.decode().strip()
    last = err.splitlines()[-1] if err else ""  # train logs its progress lines before
    assert p.returncode == 1 and "Traceback" not in err and last.startswith("llmctl: error: ") and \
        err.count("llmctl: error") == 1, err
    assert "too large" in last or "no space" in last, err
    if out.exists():  # nothing partial in view: no manifest, and every visible file whole
        assert not (out / "manifest.json").exists()
        for f in (f for f in out.rglob("*") if f.is_file() and not any(x.startswith(".") for x in f.relative_to(out).parts)):
            assert f.stat().st_size < biggest // 2 or f.suffix not in (".parquet", ".bin", ".safetensors"), f
            if f.suffix == ".parquet":
                pq.read_table(f)
    again = resume_flag(out) if again is None else again
    p = run([*args, "-o", out, *(again if out.exists() else [])])
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    if stage in ("train", "rl"):
        same_artifact(out, ref, train=True)
    elif stage in ("export", "import", "eval", "tokenize train"):
        assert {k: v for k, v in visible(out).items() if k != "results.json"} == \
               {k: v for k, v in visible(ref).items() if k != "results.json"}
    else:
        same_artifact(out, ref)


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
