"""Verifiers (rl/rewards.py) and the python sandbox (rl/sandbox.py): spec 001-posttrain-rl §A5."""

from __future__ import annotations

import json
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import shared_file

from llmctl.errors import UsageError
from llmctl.rl.rewards import (
    CombinedVerifier,
    FormatVerifier,
    MathVerifier,
    PythonVerifier,
    Verdict,
    extract_code,
    make_verifier,
)
from llmctl.rl.sandbox import Limits, run_python
from llmctl.tasks.answers import GenScoring, math_answer


# Test helpers that lived in rl/rewards.py, which no command used
def from_scoring(scoring: GenScoring) -> MathVerifier:
    """A math verifier with eval's strict rule (``GenScoring.extract`` alone)."""
    return MathVerifier((scoring.extract,))


def verify_many(verifier, completions, references, workers: int = 1) -> list[Verdict]:
    """Verdicts for many (completion, reference) pairs, in order; ``workers > 1`` runs them on a
    thread pool (worth it for ``python``, whose time is spent in subprocesses)."""
    if len(completions) != len(references):
        raise UsageError(f"verify_many: {len(completions)} completions but {len(references)} references")
    if workers <= 1:
        return [verifier.verify(c, r) for c, r in zip(completions, references)]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(verifier.verify, completions, references))


def _gsm8k(n: int | None = None) -> list[dict]:
    lines = shared_file("gsm8k/test.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines[:n]]


# --- math -----------------------------------------------------------------------------------


def test_math_every_gsm8k_solution_verifies_against_itself_and_a_wrong_number_does_not():
    v = make_verifier("math")
    items = _gsm8k()
    assert len(items) == 1319
    for item in items:
        sol = item["answer"]
        right = v.verify(sol, sol)
        assert right == Verdict(1.0, True, False, right.detail), (sol, right)
        answer = math_answer(sol, ("after_hash",))
        wrong_number = str(int(float(answer)) + 1) if "/" not in answer else "0"
        wrong = v.verify(sol.rsplit("####", 1)[0] + "#### " + wrong_number, sol)
        assert wrong.reward == 0.0 and wrong.correct is False and not wrong.masked, (sol, wrong)


@pytest.mark.parametrize("completion", [
    "So she pays 10 * 100 = 1000 dollars. The answer is 1,000.",
    "The total is \\boxed{1000}",
    "Adding up: 600 + 400.\n#### 1000.00",
    "#### $1,000",
    "#### 1000 dollars",
    "\\boxed{1,000.0}",
])
def test_math_formats_of_the_same_number(completion):
    v = make_verifier("math")
    for reference in ("It costs 10 * 100 = 1000.\n#### 1000", "1000", "1,000", 1000, 1000.0):
        assert v.verify(completion, reference).correct is True, (completion, reference)


def test_math_rule_order_and_no_answer_and_unusable_reference():
    text = "\\boxed{7} and later 9"
    assert MathVerifier().answer(text) == "7"  # after_hash, boxed, last_number
    assert MathVerifier(("last_number",)).answer(text) == "9"
    boxed = GenScoring(extract="boxed")
    assert from_scoring(boxed).answer(text) == boxed.strict(text) == "7" and GenScoring().strict(text) is None  # eval's strict rule
    assert MathVerifier().answer("#### 3/4") == "0.75" and MathVerifier().answer("x \\boxed{\\frac{1}{3}}") == "1/3"
    none = make_verifier("math").verify("I do not know.", "#### 5")
    assert none == Verdict(0.0, False, False, none.detail) and "no answer" in none.detail
    for bad_ref in ("", None, ["5"]):
        assert make_verifier("math").verify("#### 5", bad_ref).masked
    with pytest.raises(UsageError, match="extraction rule"):
        make_verifier("math", rules=("first_number",))


# --- exact / regex / format / combined ------------------------------------------------------


def test_exact():
    v = make_verifier("exact")
    assert v.verify("  Paris\n", "Paris").correct is True
    assert v.verify("paris", "Paris").reward == 0.0
    assert make_verifier("exact", ignore_case=True).verify("PARIS ", "paris").reward == 1.0
    assert v.verify("Lyon", ["Paris", "Lyon"]).correct is True
    assert v.verify("Lyon", 42).masked


def test_regex_reference_is_the_pattern_or_the_group_must_equal_it():
    v = make_verifier("regex")
    assert v.verify("The code is AB-123.", r"[A-Z]{2}-\d{3}").reward == 1.0
    assert v.verify("The code is ab-123.", r"[A-Z]{2}-\d{3}").reward == 0.0
    assert make_verifier("regex", fullmatch=True).verify(" AB-123 ", r"[A-Z]{2}-\d{3}").reward == 1.0
    assert make_verifier("regex", fullmatch=True).verify("x AB-123", r"[A-Z]{2}-\d{3}").reward == 0.0
    assert v.verify("anything", "([unclosed").masked
    g = make_verifier("regex", pattern=r"Answer:\s*(\w+)")
    assert g.verify("Answer: no\nAnswer: yes", "yes").correct is True  # the last match counts
    assert g.verify("Answer: no", "yes").correct is False
    assert g.verify("nothing here", "yes").detail == "pattern not found"
    assert make_verifier("regex", pattern=r"Answer:\s*(\w+)", ignore_case=True).verify("answer: YES", "yes").reward == 1.0
    with pytest.raises(UsageError, match="bad pattern"):
        make_verifier("regex", pattern="(")


def test_format_reward_and_combined():
    f = make_verifier("format")
    assert f.verify("blah\n#### 42", None) == Verdict(0.1, None, False, "format ok")
    assert f.verify("so \\boxed{x+1}", None).reward == 0.1
    assert f.verify("the answer is 42", None).reward == 0.0
    assert f.verify("#### unknown", None).reward == 0.0
    think = FormatVerifier(reward=0.2, pattern=r"<think>.+</think>")
    assert think.verify("<think>\nhmm\n</think> 4", None).reward == 0.2
    c = make_verifier("math", format_reward=0.1)
    assert isinstance(c, CombinedVerifier)
    assert c.verify("#### 18", "#### 18").reward == pytest.approx(1.1)
    wrong = c.verify("#### 17", "#### 18")
    assert wrong.reward == pytest.approx(0.1) and wrong.correct is False
    assert c.verify("it is 18", "#### 18").reward == 1.0  # right, unformatted
    assert c.verify("#### 18", None).masked and c.verify("#### 18", None).reward == 0.0
    assert make_verifier("math", format_reward=0.0).__class__ is MathVerifier


def test_make_verifier_errors_and_verify_many():
    with pytest.raises(UsageError, match="unknown verifier"):
        make_verifier("rm")
    with pytest.raises(UsageError, match="no option"):
        make_verifier("exact", case="insensitive")
    v = make_verifier("math")
    got = verify_many(v, ["#### 1", "#### 2", "#### 3"], ["1", "1", "3"], workers=2)
    assert [x.reward for x in got] == [1.0, 0.0, 1.0]
    assert verify_many(v, ["#### 1"], ["1"]) == [v.verify("#### 1", "1")]


def test_a_verifier_bug_masks_the_sample_instead_of_raising():
    class Broken(MathVerifier):
        def answer(self, completion):
            raise RuntimeError("boom")

    v = Broken().verify("#### 1", "1")
    assert v.masked and "boom" in v.detail


# --- python ---------------------------------------------------------------------------------


def _leftovers() -> list[str]:
    """Processes still running inside a sandbox temp dir (there must be none after a run)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if "llmctl-sandbox-" in os.readlink(f"/proc/{pid}/cwd"):
                found.append(pid)
        except OSError:
            pass
    return found


FAST = {"cpu_seconds": 1, "timeout": 5}
TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4"]


def test_extract_code():
    assert extract_code("Here:\n```python\nx = 1\n```\nand\n```python\nx = 2\n```\ndone") == "x = 2\n"
    assert extract_code("```\ny = 1\n```") == "y = 1\n"
    assert extract_code("```py\nz = 1\n```\n```\nnot this\n```") == "z = 1\n"
    assert extract_code("```python\ndef f():\n    return 1") == "def f():\n    return 1"  # cut off
    assert extract_code("x = 3") == "x = 3"


def test_python_passing_failing_and_fraction():
    v = make_verifier("python", **FAST)
    good = v.verify("Sure.\n```python\ndef add(a, b):\n    return a + b\n```", TESTS)
    assert good == Verdict(1.0, True, False, "3/3 tests passed")
    bad = v.verify("def add(a, b):\n    return a * b", {"tests": TESTS})
    assert bad.reward == pytest.approx(1 / 3) and bad.correct is False and "test 1: AssertionError" in bad.detail
    strict = make_verifier("python", all_or_nothing=True, **FAST).verify("def add(a, b):\n    return a * b", TESTS)
    assert strict.reward == 0.0 and strict.correct is False
    crash = v.verify("def add(a, b):\n    return a +", TESTS)
    assert crash.reward == 0.0 and crash.correct is False and "SyntaxError" in crash.detail
    raised = v.verify("raise SystemExit(0)", TESTS)  # exiting before the tests is not a pass
    assert raised.reward == 0.0 and not raised.masked
    forged = v.verify("print('ready'); print('done')\ndef add(a, b):\n    return -1", TESTS)  # stdout is not the report
    assert forged.reward == 0.0
    threads = v.verify("import threading\nr = []\nt = threading.Thread(target=r.append, args=(1,))\nt.start(); t.join()\n"
                       "def add(a, b):\n    return a + b + len(r) - 1", TESTS)
    assert threads.reward == 1.0  # threads are allowed, processes are not


def test_python_unusable_reference_is_masked():
    v = make_verifier("python", **FAST)
    assert v.verify("x = 1", []).masked
    assert v.verify("x = 1", {"asserts": ["assert x"]}).masked
    bad_test = v.verify("x = 1", ["assert (x =="])
    assert bad_test.masked and "unusable test" in bad_test.detail


def test_python_infinite_loop_is_killed_within_its_limits():
    v = PythonVerifier(cpu_seconds=1, timeout=4)
    t0 = time.monotonic()
    r = v.verify("while True:\n    pass", TESTS)
    elapsed = time.monotonic() - t0
    assert r.reward == 0.0 and r.correct is False and not r.masked
    assert "CPU limit" in r.detail or "timeout" in r.detail
    assert elapsed < v.timeout + 2.0  # a limit, not a speed claim: the wall-clock deadline plus slack

    w = PythonVerifier(cpu_seconds=5, timeout=1.0)  # sleeping uses no CPU: the wall clock stops it
    t0 = time.monotonic()
    r = w.verify("import time\nwhile True:\n    time.sleep(0.05)", TESTS)
    assert r.reward == 0.0 and "timeout" in r.detail and time.monotonic() - t0 < w.timeout + 2.0
    assert _leftovers() == []


def test_python_fork_bomb_is_contained():
    v = PythonVerifier(cpu_seconds=1, timeout=3, max_procs=8)
    t0 = time.monotonic()
    r = v.verify("import os\nwhile True:\n    os.fork()", TESTS)
    assert r.reward == 0.0 and r.correct is False and not r.masked
    assert time.monotonic() - t0 < v.timeout + 2.0
    assert _leftovers() == []
    sub = v.verify("import subprocess\nsubprocess.run(['true'])\ndef add(a, b):\n    return a + b", TESTS)
    assert sub.reward == 0.0 and "BlockingIOError" in sub.detail


def test_python_memory_hog_is_stopped():
    v = PythonVerifier(cpu_seconds=2, timeout=5, memory_mb=256)
    t0 = time.monotonic()
    r = v.verify("hog = []\nwhile True:\n    hog.append(' ' * 2**20)", TESTS)
    assert r.reward == 0.0 and not r.masked and "MemoryError" in r.detail
    assert time.monotonic() - t0 < v.timeout + 2.0
    assert v.verify("x = bytearray(2**33)", TESTS).detail.endswith("MemoryError:")


def test_python_huge_output_is_capped_and_big_files_stopped():
    code = "import sys\nfor _ in range(50):\n    sys.stdout.write('x' * 2**20)\ndef add(a, b):\n    return a + b"
    r = run_python(code, TESTS, Limits(max_output_bytes=10_000))
    assert r.finished and all(r.passed) and len(r.stdout) == 10_000 and r.stdout_truncated
    assert PythonVerifier(**FAST).verify(code, TESTS).reward == 1.0  # output is capped, not fatal
    big = PythonVerifier(max_file_bytes=1 << 20, **FAST).verify("open('f', 'wb').write(b'0' * (8 << 20))", TESTS)
    assert big.reward == 0.0 and not big.masked and ("file size" in big.detail or "File too large" in big.detail)


def test_python_no_network_and_limits_cannot_be_raised():
    v = make_verifier("python", **FAST)
    net = v.verify("import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)", TESTS)
    assert net.reward == 0.0 and "PermissionError" in net.detail
    raise_cpu = v.verify("import resource\nresource.setrlimit(resource.RLIMIT_CPU, (100, 100))", TESTS)
    assert raise_cpu.reward == 0.0
    env = run_python("import os\nkeys = sorted(os.environ)", ["assert not any('proxy' in k.lower() for k in keys)",
                                                               "import os; assert os.getcwd() != '/'"])
    assert env.finished and env.passed == [True, True]


def test_python_infrastructure_failure_is_masked_not_zero(tmp_path):
    missing = make_verifier("python", python=str(tmp_path / "no-such-python"), **FAST)
    r = missing.verify("def add(a, b):\n    return a + b", TESTS)
    assert r.masked and r.reward == 0.0 and r.correct is None and "infrastructure" in r.detail
    not_python = tmp_path / "fake-python"  # starts, but is no Python: the harness never reports ready
    not_python.write_text("#!/bin/sh\nexit 3\n")
    not_python.chmod(0o755)
    r = make_verifier("python", python=str(not_python), **FAST).verify("x = 1", TESTS)
    assert r.masked and "exited with 3" in r.detail


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("python3", path="/usr/bin"),
                    reason="needs root and a /usr/bin/python3 that 'nobody' can run")
def test_python_as_nobody_cannot_write_outside_its_dir():
    v = make_verifier("python", python="/usr/bin/python3", user="nobody", **FAST)
    assert v.verify("import os\nuid = os.getuid()", ["assert uid != 0"]).reward == 1.0
    target = Path(__file__).with_name("should-not-exist")
    r = v.verify(f"open({str(target)!r}, 'w')", TESTS)
    assert r.reward == 0.0 and "PermissionError" in r.detail and not target.exists()
