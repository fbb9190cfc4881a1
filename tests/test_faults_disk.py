"""Fault injection, a full disk: RLIMIT_FSIZE (Python turns the write that crosses it into EFBIG)
below the largest file of each writing command's output. The command exits 1 with one line and
leaves nothing partial under a final name; run again with room, it ends with the artifact of a run
that never failed."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from faultlib import disk_cases, inputs, refs, resume_flag, run, run_dir, same_artifact, visible  # noqa: F401  (fixtures)


@pytest.mark.parametrize("stage", ["crawl-extract", "filter", "dedup", "tokenize", "tokenize train", "cat", "decontam",
                                   "train", "rl", "export", "import", "eval"])
def test_full_disk_is_one_line_nothing_partial_and_a_rerun_completes(inputs, run_dir, refs, tmp_path, stage):
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
    elif stage in ("export", "import", "tokenize train"):
        assert {k: v for k, v in visible(out).items() if k != "results.json"} == \
               {k: v for k, v in visible(ref).items() if k != "results.json"}
    else:
        same_artifact(out, ref)
