"""What the commands read from the user, checked once: a spec file and ``NAME=VALUE`` options.

Each reader returns the value or exits 2 (``EXIT_BAD_INPUT``) with the problem on stderr, so a
command never starts on bad input. ``spec_description`` reads only a spec's one line for humans
(``spectune examples``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich.markup import escape

from orchestrator.cli.console import stderr_console
from orchestrator.errors import SpecError
from orchestrator.exit_codes import EXIT_BAD_INPUT
from orchestrator.spec import SweepSpec

__all__ = ["MAX_SHOWN_PROBLEMS", "SpecPath", "load_spec", "parse_pairs", "spec_description"]

SpecPath = Annotated[Path, typer.Argument(help="Sweep spec YAML (see experiments/).", show_default=False)]
"""The spec argument of ``validate`` and ``engine-cmd``."""

MAX_SHOWN_PROBLEMS = 100
"""The most problems of one spec printed; a generated file can have thousands, and the first
hundred say what is wrong (the rest are counted)."""


def load_spec(path: Path) -> SweepSpec:
    """Load a spec or exit 2 with its problems listed (the first ``MAX_SHOWN_PROBLEMS``)."""
    try:
        return SweepSpec.from_yaml(path)
    except SpecError as exc:
        err = stderr_console()
        err.print(f"[bold red]invalid spec[/] {escape(str(path))}:")
        for problem in exc.problems[:MAX_SHOWN_PROBLEMS]:
            # field names and messages quote the user's YAML: never let it be read as markup
            where = f"[bold]{escape(problem.field)}[/]: " if problem.field else ""
            err.print(f"  - {where}{escape(problem.message)}", soft_wrap=True)
        hidden = len(exc.problems) - MAX_SHOWN_PROBLEMS
        if hidden > 0:
            err.print(f"  ... and {hidden} more problem{'s' if hidden != 1 else ''}")
        raise typer.Exit(EXIT_BAD_INPUT) from None


def spec_description(path: Path) -> str:
    """A spec file's ``description:`` (its one line for humans), read without validating the spec;
    empty when the file has none or cannot be read."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return ""
    description = data.get("description") if isinstance(data, dict) else None
    return " ".join(description.split()) if isinstance(description, str) else ""


def parse_pairs(items: list[str], *, option: str) -> dict[str, str]:
    """``["A=1", "B=2"]`` -> ``{"A": "1", "B": "2"}``, or exit 2 naming the bad item."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            stderr_console().print(f"{option} {item!r}: expected NAME=VALUE")
            raise typer.Exit(EXIT_BAD_INPUT)
        out[name.strip()] = value
    return out
