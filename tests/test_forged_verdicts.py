"""The python verifier's verdict is not the code's to forge (issue 31).

Every program here either attacks the verdict or solves the task honestly. The attackers define
an ``add`` that does not add (or none at all): a reward above 0 would mean the attack worked.
The honest ones must keep scoring as they did when the tests ran inside the code's process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from llmctl.rl import plain
from llmctl.rl.rewards import PythonVerifier
from llmctl.rl.sandbox import Limits, missing_protections, run_python
from llmctl.rl.testplan import BadTest, plan_tests

needs_sandbox = pytest.mark.skipif(bool(missing_protections()), reason="this host lacks a sandbox protection")
V = dict(cpu_seconds=2, timeout=6)
TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(-5, 5) == 0"]

FORGERS = {
    # the first: the test's own == asks the policy's object
    "__eq__ always true": "class A:\n    def __eq__(s, o): return True\ndef add(a, b): return A()",
    "__eq__ and __hash__ and __bool__": ("class A:\n    def __eq__(s, o): return True\n    def __ne__(s, o): return False\n"
                                         "    def __hash__(s): return hash(3)\n    def __bool__(s): return True\n"
                                         "def add(a, b): return A()"),
    "a subclass of int that lies": ("class I(int):\n    def __eq__(s, o): return True\n    __hash__ = int.__hash__\n"
                                    "def add(a, b): return I(7)"),
    "a subclass of str that lies": ("class S(str):\n    def __eq__(s, o): return True\n    __hash__ = str.__hash__\n"
                                    "def add(a, b): return S('no')"),
    "a subclass of list that lies": ("class L(list):\n    def __eq__(s, o): return True\n"
                                     "def add(a, b): return L()"),
    "a class whose mro claims int": ("class M(type):\n    def mro(c): return [c, int, object]\n"
                                     "try:\n    class X(metaclass=M): pass\nexcept TypeError:\n    class X: pass\n"
                                     "def add(a, b): return X()"),
    # the second, as it would be written now: take the harness's reporting function from
    # the caller's frame, claim passes and the end, leave
    "the harness's emit from its frame": textwrap.dedent("""\
        import os, sys
        f = sys._getframe(1)
        emit = f.f_locals.get('emit') or f.f_globals.get('emit')
        if emit:
            for i in range(3):
                emit('pass', str(i)); emit('judged', f'{i} pass'); emit('value', f'{i} 99')
            emit('done')
        os._exit(0)
        """),
    "fake lines on every inherited descriptor": textwrap.dedent("""\
        import os
        for fd in range(0, 64):
            try:
                os.write(fd, b'ready x\\npass 0\\npass 1\\npass 2\\njudged 0 pass\\njudged 1 pass\\njudged 2 pass\\ndone\\n')
            except OSError:
                pass
        os._exit(0)
        """),
    "a harness patched to say pass": textwrap.dedent("""\
        import sys, builtins
        main = sys.modules['__main__']
        for name in ('_run', '_judge', 'emit', '_write_all'):
            if hasattr(main, name):
                setattr(main, name, lambda *a, **k: None)
        builtins.eval = lambda *a, **k: True
        builtins.bool = lambda *a: True
        def add(a, b): return True
        """),
    "SystemExit inside a test": "def add(a, b):\n    raise SystemExit(0)",
    "os._exit inside a test": "import os\ndef add(a, b):\n    os._exit(0)",
    "the answer is found in memory": textwrap.dedent("""\
        import gc, sys
        found = []
        def scan(o):
            if isinstance(o, str) and o.startswith('EXPECTED-'):
                found.append(o)
        for o in gc.get_objects():
            for x in (o.values() if isinstance(o, dict) else o if isinstance(o, (list, tuple, set)) else ()):
                scan(x)
        frame = sys._getframe()
        while frame is not None:
            for x in list(frame.f_locals.values()) + list(frame.f_code.co_consts):
                scan(x)
            frame = frame.f_back
        def add(a, b):
            return found[0] if found else None
        """),
}
SECRET_TESTS = ["assert add(1, 2) == 'EXPECTED-literal'", "assert add(2, 2) == 'EXPECTED-' + 'judged'",
                "expected = 'EXPECTED-setup'\nassert add(3, 3) == expected"]


@needs_sandbox
@pytest.mark.parametrize("name", FORGERS)
def test_a_forged_verdict_scores_0(name):
    v = PythonVerifier(**V)
    verdict = v.verify(FORGERS[name], TESTS)
    assert verdict.reward == 0.0 and not verdict.correct and not verdict.masked, verdict
    secret = v.verify(FORGERS[name], SECRET_TESTS)
    assert secret.reward == 0.0 and not secret.masked, secret


@needs_sandbox
def test_the_expected_values_never_reach_the_code():
    """An honest lookup of what the code's process holds: the literals, an expected value the
    judge computes and one a test statement binds are none of them there."""
    spy = "import gc, sys\nseen = repr([o for o in gc.get_objects() if isinstance(o, (list, tuple, dict))])\ndef add(a, b): return seen"
    r = run_python(spy, [*SECRET_TESTS, "assert 'EXPECTED' not in add(0, 0)"], Limits(cpu_seconds=5, wall_seconds=10))
    assert r.finished and r.passed == [False, False, False, True], r.failures


@needs_sandbox
def test_honest_solutions_still_score_with_every_kind_of_assert():
    code = textwrap.dedent("""\
        import math
        from collections import Counter, namedtuple
        from fractions import Fraction
        P = namedtuple('P', 'x y')
        def root(x): return math.sqrt(x)
        def evens(n): return [i for i in range(n) if i % 2 == 0]
        def counts(s): return Counter(s)
        def half(n): return Fraction(n, 2)
        def point(): return P(1, 2)
        def maybe(x): return None if x < 0 else x
        def boom(x): raise ValueError(x)
        class Box:
            def __init__(self, v): self.v = v
            def get(self): return self.v
        box = Box(7)
        """)
    tests = [
        "import math\nassert math.isclose(root(2), 1.41421, rel_tol=1e-4)",  # the judge decides
        "assert abs(root(2) - 1.41421) < 1e-4",
        "assert evens(7) == [0, 2, 4, 6]",  # here
        "assert sorted(evens(5), reverse=True) == [4, 2, 0]",
        "assert counts('aab') == {'a': 2, 'b': 1}",  # a dict subclass crosses as its items
        "assert half(3) == 1.5 and half(4) == 2",
        "assert point() == (1, 2)",  # a namedtuple crosses as a tuple
        "assert maybe(-1) is None",
        "assert maybe(-1) is None or maybe(-1) > 0",  # short-circuit: the second leaf is not needed
        "x = [2, 0, 5]\nassert evens(len(x)) == sorted(x)[:2] and box.get() == 7",
        "assert [evens(n) for n in range(3)] == [[], [0], [0]]",
        "assert not boom.__name__.startswith('x')",
        "expected = {'a': 2}\nassert dict(counts('aa')) == expected",
        "assert box.get() in (7, 8) and 6 < box.get() <= 7",
    ]
    r = run_python(code, tests, Limits(cpu_seconds=5, wall_seconds=15))
    assert r.finished and r.passed == [True] * len(tests), r.failures
    wrong = run_python(code.replace("return math.sqrt(x)", "return 1.5"), tests[:2], Limits(cpu_seconds=5, wall_seconds=15))
    assert wrong.passed == [False, False] and "root(2) gave 1.5" in wrong.failures[0], wrong.failures


@needs_sandbox
def test_a_leaf_that_raises_fails_its_assert_and_says_why():
    r = run_python("def f(x):\n    return 10 // x", ["assert f(0) == 1", "assert f(5) == 2", "y = f(0)\nassert y == 1"],
                   Limits(cpu_seconds=2, wall_seconds=6))
    assert r.finished and r.passed == [False, True, False]
    assert "f(0) raised ZeroDivisionError" in r.failures[0] and "test 3: ZeroDivisionError" in r.failures[1], r.failures


def test_unusable_tests_are_refused_before_anything_runs():
    for bad, why in [("for i in range(3):\n    assert f(i) == i", "top-level"), ("f(1)", "no top-level assert"),
                     ("assert __llmctl_value(0)", "reserved"), ("assert (", "SyntaxError"),
                     ("def check(c):\n    assert c(1) == 2\ncheck(f)", "top-level")]:
        with pytest.raises(BadTest, match=why):
            plan_tests([bad])
    r = run_python("def f(i): return i", ["for i in range(3):\n    assert f(i) == i"])
    assert not r.started and r.bad_test and "top-level" in r.error


def test_the_plan_keeps_expected_values_out_of_the_code_s_steps():
    plan = plan_tests(["expected = [1, 2]\nassert f(3) == expected", "x = [3, 1]\nassert f(x) == sorted(x)",
                       "import math\nassert math.isclose(f(2), 1.41)"])
    child = "\n".join(str(step) for step in plan.child)
    assert "expected = " not in child and "x = [3, 1]" in child and "1.41" not in child and "sorted" not in child
    assert [step[-1] for step in plan.child if step[1] == "eval"] == ["f(3)", "f(x)", "f(2)"]


def test_plain_values_cross_by_value_and_nothing_else_does():
    from collections import Counter, OrderedDict, namedtuple
    from decimal import Decimal
    from fractions import Fraction

    P = namedtuple("P", "a b")
    for value, back in [(1, 1), (2**200, 2**200), (-(2**70), -(2**70)), (float("inf"), float("inf")), (0.1, 0.1),
                        ("é\n", "é\n"), (b"\x00\xff", b"\x00\xff"), (bytearray(b"x"), bytearray(b"x")), (None, None),
                        (True, True), ([1, [2, (3,)]], [1, [2, (3,)]]), ({1, 2}, {1, 2}), (frozenset({1}), frozenset({1})),
                        ({(1, 2): {"a": None}}, {(1, 2): {"a": None}}), (1 + 2j, 1 + 2j), (range(1, 9, 2), range(1, 9, 2)),
                        (Fraction(1, 3), Fraction(1, 3)), (Decimal("1.10"), Decimal("1.10")), (Counter("aab"), {"a": 2, "b": 1}),
                        (OrderedDict(a=1), {"a": 1}), (P(1, 2), (1, 2))]:
        got = plain.loads(plain.dumps(value))
        assert got == back and type(got) is type(back), (value, got)
    nan = plain.loads(plain.dumps(float("nan")))
    assert nan != nan

    class Liar(int):
        def __eq__(self, other):
            return True
        __hash__ = int.__hash__

        def __repr__(self):
            return "3"
    assert type(plain.loads(plain.dumps(Liar(0)))) is int and plain.loads(plain.dumps(Liar(0))) == 0
    cyclic: list = []
    cyclic.append(cyclic)
    for not_plain in [object(), len, int, (x for x in ()), cyclic, _deep(plain.MAX_DEPTH + 5)]:
        with pytest.raises(plain.NotPlain):
            plain.dumps(not_plain)
    for garbage in ['{"x": 1}', '{"i": 5}', '[', '{"d": [[[1], 2]]}', '{"f": 1.5}', '{"t": 1}', "1" * 5000,
                    "[" * 100000 + "]" * 100000, '{"q": [1, 0]}', '{"r": [0, 1, 0]}']:
        with pytest.raises(plain.NotPlain):
            plain.loads(garbage)


def _deep(n: int) -> list:
    v: list = []
    for _ in range(n):
        v = [v]
    return v


@needs_sandbox
def test_the_parent_death_signal_cannot_be_cleared():
    code = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "rc = libc.prctl(1, ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))\n"
            "err = ctypes.get_errno()\n")
    r = run_python(code, ["assert (rc, err) == (-1, 1)"], Limits(cpu_seconds=2, wall_seconds=6))
    assert r.finished and r.passed == [True], (r.crash, r.failures)


VERIFIER = textwrap.dedent("""\
    import sys
    from llmctl.rl.sandbox import Limits, run_python
    code = '''
    import ctypes, time
    ctypes.CDLL(None).prctl(1, ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
    while True:
        time.sleep(0.05)
    '''
    run_python(code, ['assert True'], Limits(cpu_seconds=60, wall_seconds=60))
    """)


def _sandbox_children(parent: int) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid == parent and "llmctl-sandbox-" in os.readlink(f"/proc/{pid}/cwd"):
                found.append(int(pid))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@needs_sandbox
def test_a_sample_that_clears_its_death_signal_dies_with_a_killed_verifier():
    verifier = subprocess.Popen([sys.executable, "-c", VERIFIER])
    try:
        deadline, children = time.monotonic() + 30, []
        while not children and time.monotonic() < deadline and verifier.poll() is None:
            time.sleep(0.1)
            children = _sandbox_children(verifier.pid)
        assert children, "the sample never started"
        time.sleep(0.5)  # past its prctl: the loop is running
        os.kill(verifier.pid, signal.SIGKILL)
        verifier.wait()
        deadline = time.monotonic() + 10
        while any(map(_alive, children)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(map(_alive, children)), f"left behind: {children}"
    finally:
        if verifier.poll() is None:
            verifier.kill()
