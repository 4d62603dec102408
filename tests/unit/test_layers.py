"""Packages are layered one way and the module graph has no cycles (imports inside functions count too).

    0  config, and the contracts: actors/events.py, actors/task_events.py, actors/messages.py, actors/lifecycles.py
    1  envs
    2  policies
    3  actors/bus.py, actors/actor.py
    4  the six actors, serve
    5  deploy
    6  main.py
A module imports only from its own layer or below; actors never import each other (DESIGN.md).
The subpackages of policies/ import one another one way too, and hold no code in their __init__.py.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("config", "actors", "envs", "policies", "serve", "deploy")
CONTRACTS = {"actors.events", "actors.task_events", "actors.messages", "actors.lifecycles"}
ACTORS = {f"actors.{n}" for n in ("explorer", "questioner", "navigator", "attributor", "learner", "broadcaster")}


def layer(module: str) -> int:
    top = module.split(".")[0]
    if top == "config" or module in CONTRACTS:
        return 0
    if module in ("actors.bus", "actors.actor"):
        return 3
    return {"envs": 1, "policies": 2, "actors": 4, "serve": 4, "deploy": 5, "main": 6}[top]


def modules() -> dict[str, Path]:
    """Every module by its dotted name, subpackages included (`policies.engines.engine`)."""
    out = {"main": ROOT / "main.py"}
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            if p.name != "__init__.py":
                out[".".join(p.relative_to(ROOT).with_suffix("").parts)] = p
    return out


def imports(path: Path, known: set[str]) -> set[str]:
    """Our modules that `path` imports, wherever the import statement is."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found.update(n for n in names if n in known)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {m: imports(p, set(mods)) - {m} for m, p in mods.items()}


def test_every_import_goes_to_the_same_layer_or_below():
    wrong = [
        f"{m} (layer {layer(m)}) imports {d} (layer {layer(d)})"
        for m, deps in graph().items()
        for d in sorted(deps)
        if layer(d) > layer(m)
    ]
    assert not wrong, "\n".join(wrong)


def test_actors_never_import_each_other():
    g = graph()
    wrong = [f"{m} imports {d}" for m in ACTORS for d in g[m] if d in ACTORS]
    assert not wrong, wrong


def test_the_module_graph_has_no_cycles():
    g, state, cycles = graph(), {}, []

    def visit(m: str, path: list[str]) -> None:
        state[m] = "open"
        for d in sorted(g[m]):
            if state.get(d) == "open":
                cycles.append(" -> ".join(path[path.index(d) :] + [d]))
            elif d not in state:
                visit(d, path + [d])
        state[m] = "done"

    for m in sorted(g):
        if m not in state:
            visit(m, [m])
    assert not cycles, "\n".join(cycles)


def test_every_module_is_readable_in_one_sitting():
    files = [*modules().values(), *sorted((ROOT / "tests").rglob("*.py"))]
    long = {str(p.relative_to(ROOT)): n for p in files if (n := len(p.read_text().splitlines())) > 300}
    assert not long, long


def test_only_main_writes_the_process_environment():
    wrong = []
    for m, p in modules().items():
        if m == "main":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            target = node.func.value if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) else None
            if isinstance(node, ast.Assign):
                target = next((t.value for t in node.targets if isinstance(t, ast.Subscript)), None)
            if (
                isinstance(target, ast.Attribute)
                and target.attr == "environ"
                and (isinstance(node, ast.Assign) or node.func.attr in ("update", "setdefault", "pop", "__setitem__"))
            ):
                wrong.append(f"{m}:{node.lineno}")
    assert not wrong, wrong


def test_policies_subpackages_import_one_way():
    """`policies.tasks` may use `policies.learning`, but then nothing in learning uses tasks; the modules at the top
    of policies/ use no subpackage."""

    def sub(m: str) -> str | None:
        parts = m.split(".")
        return parts[1] if parts[0] == "policies" and len(parts) > 2 else None

    g: dict[str, set[str]] = {}
    for m, deps in graph().items():
        if sub(m):
            g.setdefault(sub(m), set()).update(s for d in deps if (s := sub(d)) and s != sub(m))
    both = sorted(f"{a} <-> {b}" for a in g for b in g[a] if a < b and a in g.get(b, set()))
    reach = {a: set(g[a]) for a in g}
    for _ in g:
        for a in reach:
            reach[a] |= {c for b in list(reach[a]) for c in g.get(b, set())}
    cyclic = sorted(a for a in reach if a in reach[a])
    shared_up = sorted(
        f"{m} imports {d}"
        for m, deps in graph().items()  # policies/*.py: shared, below them all
        if m.count(".") == 1 and m.startswith("policies.")
        for d in deps
        if sub(d)
    )
    assert not both and not cyclic and not shared_up, (both, cyclic, shared_up)


def test_policies_subpackages_hold_no_code_in_init():
    """An __init__.py says what its subpackage holds; nothing is imported or re-exported through it."""
    wrong = [
        str(p.relative_to(ROOT))
        for p in sorted((ROOT / "policies").glob("*/__init__.py"))
        if any(not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)) for n in ast.parse(p.read_text()).body)
        or not ast.get_docstring(ast.parse(p.read_text()))
    ]
    assert not wrong, wrong
