"""examples/ci/: the GitHub workflow is one GitHub Actions accepts (its published schema, vendored
by check-jsonschema: no network), and the smoke script stops at a broken stage with exit 1 and
one line naming it. The whole chain runs in CI itself: .ci/run runs `make smoke` before the tests."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CI = ROOT / "examples" / "ci"
CHECK = Path(sys.executable).with_name("check-jsonschema")


def check_workflow(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(CHECK), "--builtin-schema", "vendor.github-workflows", str(path)], capture_output=True, text=True)


@pytest.mark.skipif(not CHECK.exists(), reason="check-jsonschema is not installed (the dev extra has it)")
def test_the_workflow_is_valid_github_actions(tmp_path):
    p = check_workflow(CI / "github-smoke.yml")
    assert p.returncode == 0, p.stdout + p.stderr
    broken = tmp_path / "broken.yml"
    broken.write_text((CI / "github-smoke.yml").read_text().replace("runs-on:", "runs_on:"))
    p = check_workflow(broken)
    assert p.returncode != 0 and "runs-on" in p.stdout + p.stderr  # the check can fail


def test_both_scripts_are_executable_bash():
    for name in ("smoke.sh", "ci.sh"):
        path = CI / name
        assert os.access(path, os.X_OK) and path.read_text().startswith("#!/usr/bin/env bash\n")
        assert subprocess.run(["bash", "-n", str(path)]).returncode == 0


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_a_broken_stage_stops_the_smoke_run_and_is_named(tmp_path):
    bad = tmp_path / "filter.toml"
    bad.write_text('[[steps]]\nname = "no_such_step"\n')
    env = {**os.environ, "SMOKE_OUT": str(tmp_path / "smoke"), "SMOKE_FILTER": str(bad), "SMOKE_RECORDS": "20",
           "LLMCTL": f"{sys.executable} -m llmctl"}
    p = subprocess.run([str(CI / "smoke.sh")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "smoke: stage 'filter' failed" in p.stderr and "unknown filter step 'no_such_step'" in p.stderr
    assert "crawl-extract  ok" in p.stdout and "dedup" not in p.stdout  # the stages before ran, none after
    assert (tmp_path / "smoke" / "docs" / "manifest.json").is_file() and not (tmp_path / "smoke" / "dedup").exists()
