"""Verifiable rewards (spec 001-posttrain-rl §A5): one checker for RL training and for eval.

A verifier turns (completion, reference) into a ``Verdict``. The defaults follow §A5: canonical
answers (``llmctl.tasks.answers``: the same extraction rules and number canonicalization as eval),
one checker for training and eval, a small format reward, and masking — a sample the checker
could not judge (an infrastructure failure, an unusable reference) is ``masked`` and leaves the
loss; it is never scored 0. (Masking truncated samples is the rollout's job: it knows.)

    make_verifier("math")                       # 1/0 on the final number
    make_verifier("math", format_reward=0.1)    # + 0.1 when the answer is in '#### n' or \\boxed{}
    make_verifier("python", cpu_seconds=2)      # fraction of the tests the code passes
"""

from __future__ import annotations

import dataclasses
import re
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from llmctl.errors import UsageError
from llmctl.rl.sandbox import Limits, missing_protections, run_python
from llmctl.tasks.answers import DEFAULT_MATH_RULES, extract_answer, math_answer, reference_answer


@dataclass(frozen=True)
class Verdict:
    reward: float
    correct: bool | None  # None: the verifier does not judge correctness (format) or could not
    masked: bool = False  # leave the sample out of the loss (infrastructure failure, unverifiable)
    detail: str = ""


def _masked(detail: str) -> Verdict:
    return Verdict(0.0, None, True, detail)


class Verifier(ABC):
    """Common interface: ``verify(completion, reference) -> Verdict``. A bug or an unexpected
    error inside a verifier masks the sample (with the error in ``detail``) instead of raising."""

    name = "verifier"
    # True when the verdict is a function of one extracted answer (``answer``), so that samples can
    # be majority-voted (maj@k); regex with the reference as pattern, python and format have none
    extracts_answers = False

    def answer(self, completion: str) -> str | None:
        """The answer the verdict judges, as compared (canonical, normalized); None when none is found,
        and always for a verifier that does not extract one."""
        return None

    def check(self) -> str | None:
        """Once, before a run: raise UsageError when this verifier cannot work on this host; else
        return a line worth logging (what it will run with), or None."""
        return None

    def verify(self, completion: str, reference: Any) -> Verdict:
        try:
            return self._verify(completion, reference)
        except Exception as e:  # noqa: BLE001 - an infrastructure failure must never score 0
            return _masked(f"{self.name}: verifier error: {type(e).__name__}: {e}")

    @abstractmethod
    def _verify(self, completion: str, reference: Any) -> Verdict:
        """The check itself; each verifier defines it."""


# ---------------------------------------------------------------------------------------------
# math: the final number


@dataclass
class MathVerifier(Verifier):
    """Reward 1 when the completion's final number equals the reference's, else 0. ``rules`` is
    the extraction order (after_hash | boxed | last_number); given eval's strict rule alone
    (``GenScoring.extract``) it reads answers as eval's `acc` does (both call tasks/answers.math_answer)."""

    rules: tuple[str, ...] = DEFAULT_MATH_RULES
    name = "math"
    extracts_answers = True

    def __post_init__(self):
        self.rules = (self.rules,) if isinstance(self.rules, str) else tuple(self.rules)
        if not self.rules:
            raise UsageError("math verifier: no extraction rules")
        for rule in self.rules:
            extract_answer("", rule)  # UsageError naming the choices for an unknown rule

    def answer(self, completion: str) -> str | None:
        return math_answer(completion, self.rules)

    def _verify(self, completion, reference):
        ref = reference_answer(reference)
        if ref is None:
            return _masked(f"math: no answer in the reference {str(reference)[:80]!r}")
        got = self.answer(completion)
        if got is None:
            return Verdict(0.0, False, False, f"no answer found (reference {ref})")
        ok = got == ref
        return Verdict(float(ok), ok, False, f"answer {got} {'==' if ok else '!='} reference {ref}")


# ---------------------------------------------------------------------------------------------
# exact and regex


def _reference_strings(reference: Any) -> list[str] | None:
    if isinstance(reference, str):
        return [reference]
    if isinstance(reference, (list, tuple)) and reference and all(isinstance(r, str) for r in reference):
        return list(reference)
    return None


@dataclass
class ExactVerifier(Verifier):
    """Reward 1 when the stripped completion equals the stripped reference (or any of a list of
    accepted answers); ``ignore_case`` compares case-folded."""

    ignore_case: bool = False
    name = "exact"
    extracts_answers = True

    def _norm(self, s: str) -> str:
        return s.strip().casefold() if self.ignore_case else s.strip()

    def answer(self, completion: str) -> str | None:
        return self._norm(completion)

    def _verify(self, completion, reference):
        refs = _reference_strings(reference)
        if refs is None:
            return _masked(f"exact: the reference must be a string or a list of strings, got {type(reference).__name__}")
        ok = self._norm(completion) in {self._norm(r) for r in refs}
        return Verdict(float(ok), ok, False, "exact match" if ok else "no exact match")


@dataclass
class RegexVerifier(Verifier):
    """Two modes.

    - no ``pattern``: the reference is the pattern; reward 1 when it is found in the completion
      (``fullmatch=True``: when it matches the whole stripped completion).
    - ``pattern`` given: its ``group`` (default 1 if it has groups, else the whole match) in the
      LAST match must equal the reference (stripped; ``ignore_case`` applies to both)."""

    pattern: str | None = None
    group: int | str | None = None
    ignore_case: bool = False
    fullmatch: bool = False
    dotall: bool = False
    name = "regex"

    def __post_init__(self):
        self._compiled = self._compile(self.pattern) if self.pattern is not None else None
        if self._compiled is not None and isinstance(self._compiled, str):
            raise UsageError(f"regex verifier: {self._compiled}")

    def _flags(self) -> int:
        return (re.IGNORECASE if self.ignore_case else 0) | (re.DOTALL if self.dotall else 0)

    def _compile(self, pattern: str):
        try:
            return re.compile(pattern, self._flags())
        except re.error as e:
            return f"bad pattern {pattern!r}: {e}"

    def _verify(self, completion, reference):
        if self._compiled is None:
            if not isinstance(reference, str):
                return _masked(f"regex: the reference must be a pattern string, got {type(reference).__name__}")
            rx = self._compile(reference)
            if isinstance(rx, str):
                return _masked(f"regex: {rx}")
            m = rx.fullmatch(completion.strip()) if self.fullmatch else rx.search(completion)
            ok = m is not None
            return Verdict(float(ok), ok, False, "pattern matched" if ok else "pattern not found")
        refs = _reference_strings(reference)
        if refs is None:
            return _masked(f"regex: the reference must be a string, got {type(reference).__name__}")
        rx = self._compiled
        if self.fullmatch:
            matches = [m] if (m := rx.fullmatch(completion.strip())) else []
        else:
            matches = list(rx.finditer(completion))
        if not matches:
            return Verdict(0.0, False, False, "pattern not found")
        group = self.group if self.group is not None else (1 if rx.groups else 0)
        try:
            got = matches[-1].group(group)
        except (IndexError, re.error) as e:
            return _masked(f"regex: no group {group!r} in {self.pattern!r} ({e})")
        got = "" if got is None else got
        fold = (lambda s: s.strip().casefold()) if self.ignore_case else (lambda s: s.strip())
        ok = fold(got) in {fold(r) for r in refs}
        return Verdict(float(ok), ok, False, f"matched {got.strip()[:80]!r}")


# ---------------------------------------------------------------------------------------------
# python: run the code against tests


_FENCE = re.compile(r"```[ \t]*(python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


def extract_code(completion: str) -> str:
    """The last ```python (or ```py) fenced block; else the last plain ``` block; else the whole
    text. An unclosed last fence (a cut-off completion) runs to the end of the text."""
    blocks = [(m.group(1), m.group(2)) for m in _FENCE.finditer(completion)]
    tagged = [body for lang, body in blocks if lang]
    if tagged:
        return tagged[-1]
    if blocks:
        return blocks[-1][1]
    return completion


def reference_tests(reference: Any) -> list[str] | None:
    """Test cases of a reference: a list of test strings (top-level asserts, with setup lines
    before them if need be), {"tests": [...]}, or one string (a single test script)."""
    if isinstance(reference, dict):
        reference = reference.get("tests")
    if isinstance(reference, str):
        reference = [reference]
    if isinstance(reference, (list, tuple)) and reference and all(isinstance(t, str) for t in reference):
        return list(reference)
    return None


@dataclass
class PythonVerifier(Verifier):
    """Reward = the fraction of the tests the code passes (``all_or_nothing``: 1 only if all do).

    The code is the completion's last ```python block, else the whole text; it runs in
    ``llmctl.rl.sandbox`` with the limits below, which asks it only for values and decides the
    asserts outside its process (``llmctl.rl.testplan``). A timeout, crash or limit hit in the
    code is reward 0 (correct=False); an infrastructure failure (the sandbox or the judge could
    not start, the harness failed, a protection is missing, a test does not compile or has an
    assert the sandbox would decide, no tests) is masked.

    ``check()`` refuses (UsageError) on a host that lacks one of the sandbox's protections
    (Landlock, seccomp, Linux) unless ``unsafe_sandbox``, and runs one trivial solution to prove
    the sandbox starts and can import the standard library as its uid."""

    cpu_seconds: float = 5.0
    timeout: float = 10.0  # wall-clock seconds
    memory_mb: int = 512
    max_procs: int = 64
    max_file_bytes: int = 16 << 20
    max_output_bytes: int = 64 << 10
    all_or_nothing: bool = False
    python: str = sys.executable
    user: str | int | None = None  # the uid the code runs as; None: unchanged, or nobody/65534 when root
    unsafe_sandbox: bool = False  # run even where a protection is missing (the verdicts say what it had)
    name = "python"

    @property
    def limits(self) -> Limits:
        return Limits(cpu_seconds=self.cpu_seconds, wall_seconds=self.timeout, memory_mb=self.memory_mb,
                      max_procs=self.max_procs, max_file_bytes=self.max_file_bytes,
                      max_output_bytes=self.max_output_bytes)

    def check(self) -> str:
        missing = missing_protections()
        if missing and not self.unsafe_sandbox:
            raise UsageError(f"python verifier: this host cannot confine the code ({'; '.join(missing)}); "
                             "--unsafe-sandbox runs it anyway")
        # The probe imports modules the harness has not: a pure-Python one and an extension module,
        # so a standard library the sandbox uid cannot read fails here, not as a 0 on every sample.
        r = run_python("import fractions, decimal\nx = decimal.Decimal(1) + fractions.Fraction(1, 2).numerator",
                       ["assert x == 2"], Limits(cpu_seconds=5, wall_seconds=30, memory_mb=self.memory_mb),
                       python=self.python, user=self.user, unsafe=self.unsafe_sandbox)
        if not r.started:
            raise UsageError(f"python verifier: the sandbox does not start: {r.error}")
        if not r.finished or not all(r.passed):
            why = r.crash or (r.failures[0] if r.failures else f"exit {r.signal_name or r.returncode}")
            raise UsageError(f"python verifier: a trivial solution fails in the sandbox ({r.isolation}): {why}")
        return f"python verifier: sandbox {r.isolation}" + (" (--unsafe-sandbox)" if missing else "")

    def _verify(self, completion, reference):
        tests = reference_tests(reference)
        if tests is None:
            return _masked("python: the reference has no tests (need a list of assert strings or {'tests': [...]})")
        r = run_python(extract_code(completion), tests, self.limits, python=self.python, user=self.user,
                       unsafe=self.unsafe_sandbox)
        if not r.started:
            return _masked(f"python: {'unusable test' if r.bad_test else 'infrastructure failure'}: {r.error}")
        if r.timed_out:
            return Verdict(0.0, False, False, f"timeout: killed after {self.timeout:g} s wall-clock")
        if r.crash is not None:
            return Verdict(0.0, False, False, f"the code raised {r.crash}")
        if not r.finished:
            sig = r.signal_name
            why = {"SIGXCPU": f"CPU limit ({self.cpu_seconds:g} s)", "SIGKILL": "killed (CPU or memory limit)",
                   "SIGXFSZ": f"file size limit ({self.max_file_bytes} bytes)", "SIGSYS": "forbidden system call"}
            what = why.get(sig, sig) if sig else f"exit code {r.returncode}"
            return Verdict(0.0, False, False, f"the code stopped after {r.evaluated}/{len(tests)} tests: {what}")
        n_pass = sum(r.passed)
        ok = n_pass == len(tests)
        reward = float(ok) if self.all_or_nothing else n_pass / len(tests)
        detail = f"{n_pass}/{len(tests)} tests passed" + (f"; first failure {r.failures[0]}" if r.failures else "")
        return Verdict(reward, ok, False, detail)


# ---------------------------------------------------------------------------------------------
# format, and a main verifier plus a format reward


@dataclass
class FormatVerifier(Verifier):
    """A small reward (default 0.1) when the completion has the expected answer format: by
    default a number after ``####`` or a non-empty ``\\boxed{}``; or ``pattern`` (a regex,
    searched with DOTALL, e.g. ``r"<think>.+</think>"``). Farmable by design, so keep it small
    (§A5: any boxed answer earns it). ``correct`` is None: format is not correctness."""

    reward: float = 0.1
    pattern: str | None = None
    name = "format"

    def __post_init__(self):
        try:
            self._rx = re.compile(self.pattern, re.DOTALL) if self.pattern is not None else None
        except re.error as e:
            raise UsageError(f"format verifier: bad pattern {self.pattern!r}: {e}") from e

    def matches(self, completion: str) -> bool:
        if self._rx is not None:
            return self._rx.search(completion) is not None
        after = extract_answer(completion, "after_hash")
        if after is not None and math_answer(after, ("last_number",)) is not None:
            return True
        boxed = extract_answer(completion, "boxed")
        return boxed is not None and bool(boxed.strip())

    def _verify(self, completion, reference):
        ok = self.matches(completion)
        return Verdict(self.reward if ok else 0.0, None, False, "format ok" if ok else "format missing")


@dataclass
class CombinedVerifier(Verifier):
    """``main`` plus an optional format reward. Correctness and masking come from ``main``; a
    masked main verdict stays masked (reward 0) whatever the format."""

    main: Verifier
    format: FormatVerifier | None = None
    name = "combined"

    @property
    def extracts_answers(self) -> bool:
        return self.main.extracts_answers

    def answer(self, completion: str) -> str | None:
        return self.main.answer(completion)

    def check(self) -> str | None:
        return self.main.check()

    def _verify(self, completion, reference):
        v = self.main.verify(completion, reference)
        if v.masked or self.format is None:
            return v
        f = self.format.verify(completion, reference)
        return Verdict(v.reward + f.reward, v.correct, f.masked, f"{v.detail}; {f.detail}")


VERIFIERS: dict[str, type[Verifier]] = {
    "math": MathVerifier, "exact": ExactVerifier, "regex": RegexVerifier, "python": PythonVerifier,
    "format": FormatVerifier,
}


def make_verifier(name: str, format_reward: float = 0.0, format_pattern: str | None = None, **options) -> Verifier:
    """A verifier by name (math | exact | regex | python | format) with its options. A nonzero
    ``format_reward`` wraps it in a CombinedVerifier with a FormatVerifier of that reward (and
    ``format_pattern``). Unknown names or options raise UsageError."""
    cls = VERIFIERS.get(name)
    if cls is None:
        raise UsageError(f"unknown verifier {name!r} (choose from {', '.join(VERIFIERS)})")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise UsageError(f"verifier {name!r} has no option(s) {', '.join(unknown)} (options: {', '.join(sorted(known)) or 'none'})")
    main = cls(**options)
    if not format_reward:
        return main
    if name == "format":
        raise UsageError("format_reward applies to a main verifier, not to 'format' itself")
    return CombinedVerifier(main, FormatVerifier(reward=format_reward, pattern=format_pattern))

