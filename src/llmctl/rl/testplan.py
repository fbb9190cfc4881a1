"""Which part of a test the sandboxed code evaluates, and which part the judge decides.

A test is Python source: statements, at least one a top-level ``assert``. Run as it is inside
the process that ran the policy's code, its verdict would be the code's to forge (an ``__eq__``
that is always true, a harness patched to report a pass). So each assert is split:

- **leaves**, the smallest parts that need the code (a call of its function, a name it defines,
  an attribute or method of something it made), are evaluated in the sandbox and come back as
  plain values (``llmctl.rl.plain``);
- the rest — the comparison and the expected values — never reaches that process: the parent
  decides a plain comparison of leaves and literals itself (``judge_here``), and anything more
  (``math.isclose``, ``sorted(...)``, a comprehension) goes to a second sandbox, the judge, which
  runs no code of the policy's.

What counts as the expected side ("pure"): expressions whose names are all value builtins
(``PURE_BUILTINS``) or names bound by pure setup statements of the tests (imports of
``PURE_MODULES``, assignments of pure expressions). It does not depend on the code: a completion
that defines its own ``sorted`` does not move ``sorted([3, 1, 2])`` into its process (a
function under test named like a builtin is therefore judged as that builtin: name it
otherwise). Non-assert statements run in the sandbox when they are not pure, or when a leaf
needs what a pure one binds (never otherwise: an ``expected = [...]`` stays out of its reach).

What the judge still trusts: the tests themselves (written by the task author), and expected
values that the author computed with the code's own names (``assert f(2) == helper(2)`` with
``helper`` defined by a test statement runs ``helper`` in the sandbox, so the code can redefine
it). An ``assert`` inside a loop, ``with`` or function would be judged by the code's process:
such a test is refused as unusable.

Leaves are evaluated eagerly, each once, in order; one that raised only fails an assert whose
outcome needs it (``x is None or f(x) > 0`` keeps its short-circuit).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

VALUE = "__llmctl_value"  # the judge's name for leaf k's value: __llmctl_value(k)

# Builtins that compute a value from values (no I/O, no introspection, no code execution)
PURE_BUILTINS = frozenset({
    "abs", "all", "any", "ascii", "bin", "bool", "bytearray", "bytes", "chr", "complex", "dict", "divmod",
    "enumerate", "filter", "float", "format", "frozenset", "hash", "hex", "int", "isinstance", "len", "list",
    "map", "max", "min", "oct", "ord", "pow", "range", "repr", "reversed", "round", "set", "slice", "sorted",
    "str", "sum", "tuple", "zip", "True", "False", "None", "Ellipsis", "NotImplemented",
    "ArithmeticError", "AssertionError", "Exception", "IndexError", "KeyError", "TypeError", "ValueError",
    "ZeroDivisionError",
})
# Standard-library modules of values that a test may import for its expected side
PURE_MODULES = frozenset({
    "bisect", "cmath", "collections", "decimal", "fractions", "functools", "heapq", "itertools", "math",
    "operator", "re", "statistics", "string",
})
# Nodes the judge can put together from leaves; anything else that needs the code is a leaf whole
_SPLITTABLE = (ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Compare, ast.IfExp, ast.Tuple, ast.List, ast.Set,
               ast.Dict, ast.Subscript, ast.Slice, ast.Starred, ast.JoinedStr, ast.FormattedValue)
# Children that cannot travel as a value: their parent must be evaluated in the sandbox whole
_UNSENDABLE = (ast.GeneratorExp, ast.Lambda, ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom)
_SIMPLE_OPS = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn)


class BadTest(ValueError):
    """A test the verifier cannot use (the dataset's fault: the sample is masked, never scored 0)."""


@dataclass
class Assert:
    test: int  # which test it belongs to
    expr: ast.expr  # the judged expression; leaf k appears as __llmctl_value(k)
    source: str  # the assert as written, for failure messages
    leaves: list[int] = field(default_factory=list)


@dataclass
class TestPlan:
    """``child``: the sandbox's steps in order, ``[test, "exec", source]`` or ``[test, "eval", k,
    source]``; ``judge``: the judge's steps in order, ``[test, "exec", source]`` (pure setup) or
    ``[test, "assert", index into asserts]``; ``asserts``: every assert of every test."""

    n_tests: int
    child: list[list] = field(default_factory=list)
    judge: list[list] = field(default_factory=list)
    asserts: list[Assert] = field(default_factory=list)
    n_leaves: int = 0


def _bound_inside(node: ast.AST) -> set[str]:
    """Names a node binds for itself (comprehension targets, lambda arguments)."""
    names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return names | {a.arg for n in ast.walk(node) if isinstance(n, ast.Lambda) for a in ast.walk(n.args) if isinstance(a, ast.arg)}


def free_names(node: ast.AST) -> set[str]:
    loads = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return loads - _bound_inside(node)


def is_pure(node: ast.AST, pure: set[str]) -> bool:
    """The judge can evaluate it without the code: only pure names, no dunder attribute, nothing
    that binds outside itself or suspends."""
    for n in ast.walk(node):
        if isinstance(n, (ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom)):
            return False
        if isinstance(n, ast.Attribute) and n.attr.startswith("__"):
            return False
    return free_names(node) <= pure


class _Splitter:
    def __init__(self, pure: set[str], plan: TestPlan, test: int):
        self.pure, self.plan, self.test, self.leaves = pure, plan, test, []

    def split(self, node: ast.expr) -> ast.expr:
        if is_pure(node, self.pure):
            return node
        call_of_pure = isinstance(node, ast.Call) and is_pure(node.func, self.pure)
        if isinstance(node, _SPLITTABLE) or call_of_pure:
            children = [c for c in ast.iter_child_nodes(node) if isinstance(c, ast.expr)]
            if not any(isinstance(c, _UNSENDABLE) and not is_pure(c, self.pure) for c in children):
                return self._rebuild(node)
        return self._leaf(node)

    def _rebuild(self, node: ast.expr) -> ast.expr:
        for name, value in ast.iter_fields(node):
            if isinstance(value, ast.expr) and name != "func":
                setattr(node, name, self.split(value))
            elif isinstance(value, list):
                setattr(node, name, [self._keyword(v) if isinstance(v, ast.keyword) else
                                     self.split(v) if isinstance(v, ast.expr) else v for v in value])
        return node

    def _keyword(self, kw: ast.keyword) -> ast.keyword:
        kw.value = self.split(kw.value)
        return kw

    def _leaf(self, node: ast.expr) -> ast.expr:
        k = self.plan.n_leaves
        self.plan.n_leaves += 1
        self.plan.child.append([self.test, "eval", k, ast.unparse(node)])
        self.leaves.append(k)
        return ast.copy_location(ast.Call(ast.Name(VALUE, ast.Load()), [ast.Constant(k)], []), node)


def _pure_statement(stmt: ast.stmt, pure: set[str]) -> set[str] | None:
    """The names a pure setup statement binds, or None when it is not pure."""
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        mod = stmt.module if isinstance(stmt, ast.ImportFrom) else None
        roots = [mod] if mod is not None else [a.name for a in stmt.names]
        if isinstance(stmt, ast.ImportFrom) and stmt.level:
            return None
        if not all(r.split(".")[0] in PURE_MODULES for r in roots) or any(a.name == "*" for a in stmt.names):
            return None
        return {(a.asname or a.name).split(".")[0] for a in stmt.names}
    if isinstance(stmt, ast.Assign) and is_pure(stmt.value, pure):
        targets = [n for t in stmt.targets for n in ast.walk(t)]
        if all(isinstance(n, (ast.Name, ast.Tuple, ast.List, ast.Store)) for n in targets):
            return {n.id for n in targets if isinstance(n, ast.Name)}
    return None


def _binds(stmt: ast.stmt) -> set[str]:
    """Every name a statement may bind (to stop treating it as pure after an impure rebinding)."""
    names = {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    for n in ast.walk(stmt):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in n.names}
    return names


def plan_tests(tests: list[str]) -> TestPlan:
    """Split every test (raises BadTest for one that does not parse, has no top-level assert,
    has an assert the sandbox would judge, or uses the judge's reserved name)."""
    plan = TestPlan(n_tests=len(tests))
    pure = set(PURE_BUILTINS)
    pending: list[tuple[int, list, set[str], set[str]]] = []  # pure assignments: (position, step, binds, needs)
    for i, source in enumerate(tests):
        try:
            tree = ast.parse(source, f"<test {i + 1}>")
        except SyntaxError as e:
            raise BadTest(f"test {i + 1}: {type(e).__name__}: {e.msg} (line {e.lineno})") from e
        if any(isinstance(n, ast.Name) and n.id == VALUE for n in ast.walk(tree)):
            raise BadTest(f"test {i + 1} uses the judge's reserved name {VALUE}")
        n_asserts = 0
        for stmt in tree.body:
            if isinstance(stmt, ast.Assert):
                splitter, written = _Splitter(pure, plan, i), ast.unparse(stmt)  # split rebuilds the nodes in place
                expr = splitter.split(stmt.test)
                plan.asserts.append(Assert(i, expr, written, splitter.leaves))
                plan.judge.append([i, "assert", len(plan.asserts) - 1])
                n_asserts += 1
                continue
            if any(isinstance(n, ast.Assert) for n in ast.walk(stmt)):
                raise BadTest(f"test {i + 1}: an assert inside a block or function would be judged by the code's own "
                              "process; write each assert as a top-level statement")
            src = ast.unparse(stmt)
            binds = _pure_statement(stmt, pure)
            if binds is None:
                plan.child.append([i, "exec", src])
                pure -= _binds(stmt)
                continue
            plan.judge.append([i, "exec", src])
            pure |= binds
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):  # nothing to hide in an import
                plan.child.append([i, "exec", src])
            else:  # into the sandbox only if something there needs it (below)
                step = [i, "exec", src]
                pending.append((len(plan.child), step, binds, free_names(stmt.value)))
        if not n_asserts:
            raise BadTest(f"test {i + 1} has no top-level assert: nothing to judge")
    _place_needed(plan, pending)
    return plan


def _place_needed(plan: TestPlan, pending: list[tuple[int, list, set[str], set[str]]]) -> None:
    """Put into the sandbox's steps the pure assignments whose names its steps use (and, in turn,
    what those use), each at its place in order."""
    needed: set[str] = set()
    for step in plan.child:
        needed |= free_names(ast.parse(step[-1]))
    chosen = []
    for position, step, binds, needs in reversed(pending):
        if binds & needed:
            chosen.append((position, step))
            needed |= needs
    for position, step in sorted(chosen, key=lambda x: x[0], reverse=True):
        plan.child.insert(position, step)


# ---------------------------------------------------------------------------------------------
# The parent's own verdicts: a comparison of leaves and literals


def _literal(node: ast.expr):
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _singleton(node: ast.expr) -> bool:
    ok, v = _literal(node)
    return ok and (v is None or v is True or v is False)


def _leaf_index(node: ast.expr) -> int | None:
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == VALUE
            and len(node.args) == 1 and isinstance(node.args[0], ast.Constant)):
        return node.args[0].value
    return None


def _decidable(node: ast.expr) -> bool:
    """Whether judge_here decides this expression (a shape, before anything is evaluated)."""
    if _leaf_index(node) is not None:
        return True
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return _decidable(node.operand)
    if isinstance(node, ast.BoolOp):
        return all(map(_decidable, node.values))
    if isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
        if not all(_leaf_index(x) is not None or _literal(x)[0] for x in operands):
            return False
        for op, a, b in zip(node.ops, operands, operands[1:]):
            if isinstance(op, (ast.Is, ast.IsNot)):  # identity is meaningful for the singletons only
                if not (_singleton(a) or _singleton(b)):
                    return False
            elif not isinstance(op, _SIMPLE_OPS):
                return False
        return True
    return _literal(node)[0]


def judge_here(expr: ast.expr, value):
    """The verdict of a judged expression when it is a comparison of leaves and literals (``==``,
    ``<``, ``in``, ``is None``, ``not``, ``and``/``or`` of those, a leaf's truth), given
    ``value(k)`` (raises for a leaf that raised): True/False, or None when the judge must decide."""
    if not _decidable(expr):
        return None
    try:
        return bool(_eval(expr, value))
    except Exception:  # noqa: BLE001 - a leaf that raised, or plain values that do not compare (1 < "a"): the assert fails
        return False


def _eval(node: ast.expr, value):
    k = _leaf_index(node)
    if k is not None:
        return value(k)
    if isinstance(node, ast.UnaryOp):
        return not _eval(node.operand, value)
    if isinstance(node, ast.BoolOp):
        result = None
        for v in node.values:  # short-circuit, as Python does: a leaf not needed is not looked at
            result = _eval(v, value)
            if (not result) if isinstance(node.op, ast.And) else result:
                return result
        return result
    if isinstance(node, ast.Compare):
        got = [_eval(x, value) for x in [node.left, *node.comparators]]
        return all(_compare(op, a, b) for op, a, b in zip(node.ops, got, got[1:]))
    return ast.literal_eval(node)


def _compare(op: ast.cmpop, a, b) -> bool:
    if isinstance(op, ast.Eq):
        return a == b
    if isinstance(op, ast.NotEq):
        return a != b
    if isinstance(op, ast.Lt):
        return a < b
    if isinstance(op, ast.LtE):
        return a <= b
    if isinstance(op, ast.Gt):
        return a > b
    if isinstance(op, ast.GtE):
        return a >= b
    if isinstance(op, ast.In):
        return a in b
    if isinstance(op, ast.NotIn):
        return a not in b
    if isinstance(op, ast.Is):
        return a is b
    return a is not b
