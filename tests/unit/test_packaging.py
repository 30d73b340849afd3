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
