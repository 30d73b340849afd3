"""The import graph: data flows one way (serving never imports orchestrator; spec -> space ->
search) and has no cycle.

The graph is read from the source (every ``import``/``from ... import`` of a project module,
including those inside functions), and every module is also imported for real, so a module
that cannot be imported on its own fails here rather than in a Ray worker. Two seams of the sweep
are held here too: the confirmation's decisions never reach Ray (their visits are handed in), and
only the driver builds the Tuner.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import subprocess
import sys
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


def _importers(graph: dict[str, set[str]], target: str) -> set[str]:
    """The modules that import ``target`` or a module inside it."""
    return {m for m, targets in graph.items() if any(t == target or t.startswith(target + ".") for t in targets)}


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_command_line_code_lives_in_the_cli_package() -> None:
    """Commands (typer) are in ``orchestrator.cli`` only, and library modules never import it: the
    CLI parses and prints and calls the library, never the other way round. The one exception is
    ``python -m orchestrator.sweep``, the ``spectune sweep`` command under another name."""
    entry_points = {"orchestrator.sweep.__main__"}
    importers = {m for m in _importers(_graph(), "orchestrator.cli") if not _in(m, "orchestrator.cli")}
    assert importers <= entry_points, f"library modules import the CLI: {sorted(importers - entry_points)}"
    typer_users = set()
    for module, path in _modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level}
        if any(_in(name, "typer") for name in names) and not _in(module, "orchestrator.cli"):
            typer_users.add(module)
    assert not typer_users, f"command-line code outside orchestrator.cli: {sorted(typer_users)}"


def test_the_serve_pieces_never_import_the_application_they_make_up() -> None:
    """``serving.serve.app`` assembles the application from ``options``, ``replica``, ...: within
    ``serving`` only the foreground ``runner`` imports it (and ``serving.app``, the old import path
    kept for earlier Serve config files, re-exports it); nothing in ``serving`` imports ``runner``;
    nothing in the project imports the old path."""
    graph = _graph()
    serving_importers = {m for m in _importers(graph, "serving.serve.app") if _in(m, "serving")}
    assert serving_importers <= {"serving.serve.runner", "serving.app"}, sorted(serving_importers)
    assert not {m for m in _importers(graph, "serving.serve.runner") if _in(m, "serving")}
    assert not _importers(graph, "serving.app"), "import serving.serve.app; serving.app is for old config files"


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


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every project module ``start`` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


NEVER_REACHES = [
    # spec -> space -> search: the spec builds the space (SweepSpec.space()), the searcher walks it.
    ("orchestrator.space", "orchestrator.sweep"),
    ("orchestrator.space", "orchestrator.spec"),
    ("orchestrator.spec", "orchestrator.sweep"),
    # The spec (and spectune validate) needs the points only; the Optuna view is the searcher's.
    ("orchestrator.spec", "orchestrator.space.define_by_run"),
]
"""(source, target): no module in package ``source`` imports one in ``target``, even through others."""


@pytest.mark.parametrize(("source", "target"), NEVER_REACHES)
def test_data_flows_spec_space_search(source: str, target: str) -> None:
    graph = _graph()
    sources = [m for m in graph if _within(m, source)]
    assert sources, f"no module {source}: update NEVER_REACHES"
    offenders = {m: sorted(t for t in _reach(graph, m) if _within(t, target)) for m in sources}
    offenders = {m: t for m, t in offenders.items() if t}
    assert not offenders, f"{source} must not import {target} (directly or through others): {offenders}"


def test_the_searcher_imports_its_space() -> None:
    """The other half of spec -> space -> search: the searcher takes the space from orchestrator.space."""
    assert "orchestrator.space.define_by_run" in _graph()["orchestrator.sweep.search.searcher"]


def test_reach_follows_imports_through_others() -> None:
    """The checker itself: what a module reaches through another counts, what imports it does not."""
    graph = {"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a"}}
    assert _reach(graph, "a") == {"b", "c"}
    assert _within("a.b", "a") and _within("a", "a") and not _within("ab", "a")


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
    """``sweep.confirmation.confirm`` decides which contender to visit and what the visits mean; the visits
    are handed in (``sweep.execution.visit`` places them on the cluster, unit tests pass fakes). Neither it
    nor anything it imports, followed through the project, imports Ray."""
    modules = _modules()
    reached = _reached(_without_package_inits(_graph()), "orchestrator.sweep.confirmation.confirm")
    with_ray = sorted(m for m in reached if "ray" in _external_imports(modules[m]))
    assert not with_ray, f"orchestrator.sweep.confirmation.confirm reaches Ray through {with_ray}"


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
    assert users == {"orchestrator.sweep.execution.driver"}


def test_a_trial_worker_imports_no_optuna() -> None:
    """A Ray worker that runs a trial or a confirmation visit unpickles ``orchestrator.sweep.execution.trial``
    (and ``visit_worker``): that must not load Optuna, the searcher or the driver, which only the driver
    process uses. Imported for real in a fresh interpreter, so a lazy import inside a package's
    ``__init__`` counts too."""
    code = ("import json, sys, orchestrator.sweep.execution.trial, orchestrator.sweep.execution.visit_worker; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'optuna' "
            "or m in ('orchestrator.sweep.search.searcher', 'orchestrator.sweep.execution.driver', 'orchestrator.space.define_by_run'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded == [], f"a trial worker loads {loaded}"
