"""The import graph: data flows one way (serving never imports orchestrator) and has no cycle.

The graph is read from the source (every ``import``/``from ... import`` of a project module,
including those inside functions), and every module is also imported for real, so a module
that cannot be imported on its own fails here rather than in a Ray worker. Two seams of the sweep
are held here too: the confirmation's decisions never reach Ray (their visits are handed in), and
only the driver builds the Tuner.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("orchestrator", "serving")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _resolve(name: str, known: set[str]) -> str | None:
    """The project module ``name`` refers to (a package's ``__init__`` or a module), if any."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        for name in names:
            target = _resolve(name, known)
            if target is not None and target != module:
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def _without_package_inits(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Edges to a package's ``__init__`` only because a submodule was named through it are
    not dependencies of the package: keep module -> module edges."""
    return {m: {t for t in targets if not m.startswith(t + ".")} for m, targets in graph.items()}


def test_serving_never_imports_orchestrator() -> None:
    offenders = {
        module: sorted(t for t in targets if t.split(".")[0] == "orchestrator")
        for module, targets in _graph().items()
        if module.split(".")[0] == "serving"
    }
    offenders = {m: t for m, t in offenders.items() if t}
    assert not offenders, f"serving/ must not import orchestrator/: {offenders}"


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    WHITE, GREY, BLACK = 0, 1, 2
    colour = {m: WHITE for m in graph}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        colour[node] = GREY
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if colour.get(nxt) == GREY:
                return stack[stack.index(nxt):] + [nxt]
            if colour.get(nxt) == WHITE:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        colour[node] = BLACK
        return None

    for module in sorted(graph):
        if colour[module] == WHITE:
            found = visit(module)
            if found:
                return found
    return None


def test_no_import_cycle() -> None:
    cycle = _find_cycle(_without_package_inits(_graph()))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_cycle_finder_finds_a_cycle() -> None:
    """The checker itself: a graph with a cycle is reported, one without is not."""
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


@pytest.mark.parametrize("module", sorted(_modules()))
def test_every_module_imports_on_its_own(module: str) -> None:
    importlib.import_module(module)


def _external_imports(path: Path) -> set[str]:
    """Top-level names of the non-project packages a module imports (inside functions too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found - set(PACKAGES)


def _reached(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += graph.get(module, ())
    return seen


def test_the_confirmation_rounds_never_reach_ray() -> None:
    """``sweep.confirm`` decides which contender to visit and what the visits mean; the visits
    are handed in (``sweep.visit`` places them on the cluster, unit tests pass fakes). Neither it
    nor anything it imports, followed through the project, imports Ray."""
    modules = _modules()
    reached = _reached(_without_package_inits(_graph()), "orchestrator.sweep.confirm")
    with_ray = sorted(m for m in reached if "ray" in _external_imports(modules[m]))
    assert not with_ray, f"orchestrator.sweep.confirm reaches Ray through {with_ray}"


def test_only_the_driver_builds_a_tuner() -> None:
    """One sweep's Tuner is made in one place, in the driver's story; the other sweep modules
    hand it their parts (searcher, scheduler, callbacks, trainable)."""
    users = set()
    for module, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            named = (isinstance(node, ast.Attribute) and node.attr == "Tuner") or (
                isinstance(node, ast.Name) and node.id == "Tuner") or (
                isinstance(node, ast.ImportFrom) and any(alias.name == "Tuner" for alias in node.names))
            if named:
                users.add(module)
    assert users == {"orchestrator.sweep.driver"}
