"""spectune reaches Ray, Optuna and MLflow through their public API: no private attribute of theirs
(``searcher._ot_study``, ``self._completed_trials`` of a subclassed searcher) is read or set, and no
private module of theirs is imported, but for the listed exceptions, each guarded by an
``ImportError`` fallback so that another Ray still runs."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("orchestrator", "serving")
THIRD_PARTY = ("ray", "optuna", "mlflow")

PRIVATE_IMPORT_EXCEPTIONS = {
    "ray._private.services": "whether ray.init(address=None) starts a cluster (orchestrator/sweep/execution/ray_connection.py); "
                             "without it: treated as joining one",
    "ray._private.authentication.authentication_token_setup": "token auth chosen for a local cluster without "
                                                              "Ray's warning (serving/ray_auth.py); without it: "
                                                              "Ray's own default, token, with its warning",
    "ray.serve.context": "where an already running Serve listens (serving/serve/cluster.py); without it: "
                         "the requested host and port are assumed",
}

STDLIB_PRIVATE = {"_exit": "os._exit (documented)", "_replace": "a namedtuple's (documented)",
                  "_actions": "argparse's parser (stdlib)", "_HelpAction": "argparse (stdlib)"}
"""Private names of the standard library the project uses; this test is about Ray, Optuna and MLflow."""


def _sources() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(encoding="utf-8"))
            for pkg in PACKAGES for path in sorted((ROOT / pkg).rglob("*.py"))}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _defined_private_names(trees: dict[Path, ast.Module]) -> set[str]:
    """Every private name the project defines: functions, classes, assigned attributes and
    variables, class-level annotations, import aliases, keyword arguments of its own calls."""
    names: set[str] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
            elif isinstance(node, ast.alias):
                names.add(node.asname or node.name.split(".")[0])
    return {name for name in names if _private(name)}


def test_no_private_attribute_of_a_library_is_touched() -> None:
    trees = _sources()
    ours = _defined_private_names(trees)
    touched = sorted(
        f"{path.relative_to(ROOT)}:{node.lineno} .{node.attr}"
        for path, tree in trees.items() for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in ours | set(STDLIB_PRIVATE)
    )
    assert not touched, "private attributes the project does not define (a library's internals):\n" + "\n".join(touched)


def test_the_searcher_keeps_no_state_of_optuna_search() -> None:
    """The searcher is Ray Tune's public ``Searcher`` over an Optuna study of its own."""
    from ray.tune.search import Searcher
    from ray.tune.search.optuna import OptunaSearch

    from orchestrator.sweep.search.searcher import SweepSearcher

    assert SweepSearcher.__bases__ == (Searcher,) and not issubclass(SweepSearcher, OptunaSearch)


def _guarded_by_import_error(tree: ast.Module, target: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(target is inner for stmt in node.body for inner in ast.walk(stmt)):
            return any(isinstance(h.type, ast.Name) and h.type.id == "ImportError" for h in node.handlers)
    return False


def test_no_private_module_of_a_library_is_imported_but_the_listed_ones() -> None:
    unexpected, unguarded = [], []
    for path, tree in _sources().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported = [(node.module, a.name) for a in node.names]
            elif isinstance(node, ast.Import):
                imported = [(a.name, "") for a in node.names]
            else:
                continue
            for module, name in imported:
                parts = module.split(".")
                if parts[0] not in THIRD_PARTY or not any(_private(p) for p in [*parts[1:], name]):
                    continue
                where = f"{path.relative_to(ROOT)}:{node.lineno} {module} {name}".rstrip()
                if module not in PRIVATE_IMPORT_EXCEPTIONS:
                    unexpected.append(where)
                elif not _guarded_by_import_error(tree, node):
                    unguarded.append(where)
    assert not unexpected, "private modules of a library imported:\n" + "\n".join(unexpected)
    assert not unguarded, "listed, but without an ImportError fallback:\n" + "\n".join(unguarded)
