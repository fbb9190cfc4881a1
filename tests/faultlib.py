"""What the fault-injection tests share (tests/test_faults.py, tests/test_faults_disk.py): small
real inputs, each stage's command, reference runs, and how an artifact is compared."""

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

import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import CRAWL, ROOT  # noqa: F401  (ROOT: disk_cases)
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


def report_view(out: Path) -> dict[str, str]:
    """`visible` for a report folder, whose files say when they were written (report.json's
    `created`, "Written <time>" atop report.md and index.html): that time is blanked, nothing else."""
    files = {}
    for rel in visible(out):
        data = (out / rel).read_bytes()
        if rel == "report.json":
            doc = json.loads(data)
            doc["created"] = ""
            data = json.dumps(doc, sort_keys=True).encode()
        elif rel in ("report.md", "index.html"):
            data, n = re.subn(rb"Written \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ by", b"Written - by", data, count=1)
            assert n == 1, rel
        files[rel] = hashlib.sha256(data).hexdigest()
    return files


def manifest_core(out: Path) -> dict:
    m = json.loads((out / "manifest.json").read_text())
    return {"outputs": m["outputs"], "counts": {k: v for k, v in m["counts"].items() if k != "wall_seconds"}}


def same_artifact(out: Path, ref: Path, train: bool = False) -> None:
    if (ref / "report.json").is_file() and not (ref / "manifest.json").exists():  # a report: no manifest
        assert report_view(out) == report_view(ref)
        return
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
    """Each stage's command without -o; eval, report and import need the `run_dir` fixture's run."""
    return {
        "crawl-extract": ["crawl-extract", WARC, "--workers", "2"],
        "filter": ["filter", d / "docs", "--workers", "2", "--keep-rejected"],
        # every phase, the span ones too: --memory 1M cuts the corpus into 10 shards (46 pair tasks)
        "dedup": ["dedup", d / "filtered", "--workers", "2", "--url", "--exact", "--minhash", "--substring", "--sentences",
                  "--min-len", "20", "--memory", "1M"],
        "tokenize": ["tokenize", d / "filtered", "-t", d / "tok", "--workers", "2"],
        "train": ["train", d / "tokens", *TRAIN],
        # the single-process commands: enough rows that a kill lands in the copy, not only at start-up
        "cat": ["cat", *[d / "all"] * 4, d / "filtered", "--rows-per-part", "100"],
        "head": ["head", "-n", "500", d / "all"],
        "eval": ["eval", d / "run", "-t", f"loss:{d / 'tokens'}", "-t", f"mc:{ROOT / 'examples/tasks/cloze.jsonl'}",
                 "--limit", "30", "--device", "cpu"],
        "report": ["report", d / "run"],
        "import": ["import", d / "hf"],
    }


@pytest.fixture(scope="module")
def refs(inputs, tmp_path_factory):
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


def killed(args, out: Path, delay: float) -> tuple[int, str]:
    """Run the command into OUT and kill -9 it (and its pool workers) after `delay` seconds: its
    exit status (-9 when the kill came first) and its stderr."""
    p = subprocess.Popen(cmd(*args, "-o", out), env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         start_new_session=True)
    try:
        _, err = p.communicate(timeout=delay)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # the command and its pool workers
        except ProcessLookupError:
            pass
        _, err = p.communicate()
    return p.returncode, err.decode(errors="replace")


def resume_flag(out: Path) -> list[str]:
    """What a user passes to go on after a crash: --resume with a checkpoint, else start over."""
    if (out / "checkpoints" / "latest").is_file() and (out / "metrics.jsonl").is_file():
        return ["--resume"]
    return ["--overwrite"] if out.exists() else []


def disk_cases(d: Path) -> dict[str, tuple[list, list]]:
    """stage: (args, what a user adds to run again once there is room)."""
    s = stages(d)
    return {
        "crawl-extract": (s["crawl-extract"], []),
        "filter": (s["filter"], []),
        "dedup": (s["dedup"], []),
        "tokenize": (s["tokenize"], []),
        "tokenize train": (["tokenize", "train", d / "corpus.parquet", "--vocab-size", "300"], ["--overwrite"]),
        "cat": (["cat", d / "filtered"], []),
        "train": (s["train"], None),  # resume_flag decides
        "export": (["export", d / "run"], ["--overwrite"]),
        "import": (["import", d / "hf"], []),
        "eval": (["eval", d / "run", "-t", f"loss:{d / 'tokens'}"], []),
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


