"""pyproject.toml lists every code package (it must list them: experiments/ is a mapped data package)."""

from __future__ import annotations

import sys
from pathlib import Path

from setuptools import find_packages

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]


def test_every_code_package_is_packaged() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = set(find_packages(where=str(REPO), include=["orchestrator*", "serving*"]))
    assert found - listed == set(), "add these packages to [tool.setuptools] packages in pyproject.toml"
    assert config["package-dir"]["spectune_experiments"] == "experiments"


def test_every_data_folder_is_declared_so_the_install_is_quiet() -> None:
    """A folder of data files inside a code package is an importable (namespace) package to
    setuptools: unless it is listed, every install prints a screen of "Package would be ignored"
    warnings before anything of ours (issue 8, item 10)."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    data_suffixes = {".json", ".jsonl", ".yaml", ".yml", ".txt"}
    folders = {
        ".".join(path.parent.relative_to(REPO).parts)
        for top in ("orchestrator", "serving")
        for path in (REPO / top).rglob("*")
        if path.is_file() and path.suffix in data_suffixes and "__pycache__" not in path.parts
    }
    assert folders, "the prompt set ships as data; this test must see it"
    assert folders - listed == set(), "list these data folders under [tool.setuptools] packages"
    for folder in folders:
        assert folder in config["package-data"], f"declare {folder}'s files in [tool.setuptools.package-data]"
