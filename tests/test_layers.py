"""The layout of docs/design.md §4, held by reading every import of src/llmctl (lazy ones inside
functions and `if TYPE_CHECKING:` ones too): a room imports only from rooms above it in LAYERS,
no module imports another that imports it back, and no `_private` name crosses a module."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "llmctl"

# top to bottom, as design.md §4 lists them; one row's rooms are peers that never import each other
LAYERS = [
    ("errors", "hashing"), ("bounds",), ("config",), ("artifacts",), ("runtime",), ("tasks",), ("tokenizer",),
    ("data",), ("model",), ("torchrt",), ("eval",), ("train",), ("rl",), ("plan",), ("serve",), ("report",), ("cli",),
]
RANK = {room: i for i, row in enumerate(LAYERS) for room in row} | {"": -1}  # "": the package's own __init__ (__version__)


def modules() -> dict[str, Path]:
    out = {}
    for f in SRC.rglob("*.py"):
        name = ".".join(("llmctl", *f.relative_to(SRC).with_suffix("").parts)).removesuffix(".__init__")
        out[name] = f
    return out


def imports(f: Path, mods: dict[str, Path]):
    """(imported module, the names taken from it) for every llmctl import in `f`."""
    for node in ast.walk(ast.parse(f.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("llmctl."):
                    yield a.name, ()
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("llmctl"):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                yield (sub, ()) if sub in mods else (node.module, (a.name,))


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_rooms_import_only_downward():
    mods = modules()
    assert set(RANK) == {room(m) for m in mods} - {"__main__"}, "a room missing from LAYERS"
    up = []
    for name, f in mods.items():
        if room(name) == "__main__":
            continue
        for target, _ in imports(f, mods):
            a, b = room(name), room(target)
            if a != b and RANK[b] >= RANK[a]:
                up.append(f"{f.relative_to(SRC)} imports {target}")
    assert not up, "imports up the layers:\n" + "\n".join(up)


def test_no_private_name_crosses_a_module():
    mods = modules()
    found = [f"{f.relative_to(SRC)}: {target}.{n}" for name, f in mods.items() for target, names in imports(f, mods)
             for n in names if n.startswith("_") and not n.startswith("__") and target != name]
    assert not found, "private names imported from another module:\n" + "\n".join(found)


def test_no_import_cycle():
    mods = modules()
    graph = {m: {t for t, _ in imports(f, mods) if t in mods and t != m} for m, f in mods.items()}
    # a package's __init__ re-exporting its own modules is not a cycle through them
    graph = {m: {t for t in ts if not (t.startswith(m + ".") and mods[m].name == "__init__.py")} for m, ts in graph.items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycles.append(" -> ".join(path[path.index(t):] + [t]))
            elif t not in state:
                visit(t, path + [t])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)
