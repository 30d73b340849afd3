"""The user's guide's CPU commands run as written (issue 58).

``docs/guide.md`` marks the commands that run on any machine, GPU or not, as ``console`` blocks:
``$ spectune ...`` lines, each followed by output lines it must print (the guide quotes them; here
they are looked for in the real output, whitespace collapsed). Each command is run with exactly the
argv written after ``spectune`` (in-process, from the repository root, as a user in the checkout
types it), and must exit 0.

The full sweep (``spectune sweep experiments/reference-cpu.yaml``, the README quick start's main job,
minutes on two cores) stands in a ``bash`` block: CI does not run it as written (``make demo`` is not
part of ``.ci/run``); ``tests/integration/sweep/`` covers its path on smaller specs.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "guide.md"
NOT_RUN_HERE: dict[str, str] = {}  # every console command runs; the full sweep is in a bash block


def guide_commands() -> list[tuple[str, list[str]]]:
    """``(command, output lines the guide shows for it)`` for every ``$`` line of its ``console`` blocks."""
    commands: list[tuple[str, list[str]]] = []
    for block in re.findall(r"^```console\n(.*?)^```", GUIDE.read_text(encoding="utf-8"), re.MULTILINE | re.DOTALL):
        for line in block.splitlines():
            if line.startswith("$ "):
                commands.append((line[2:].strip(), []))
            elif line.strip():
                assert commands, f"console block output before any command: {line!r}"
                commands[-1][1].append(line)
    return commands


COMMANDS = guide_commands()
RUN = [(command, shown) for command, shown in COMMANDS if command not in NOT_RUN_HERE]


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_the_guide_marks_its_cpu_commands() -> None:
    commands = [command for command, _ in COMMANDS]
    assert all(command.startswith("spectune ") for command in commands), commands
    for cheap in ("spectune examples", "spectune validate experiments/reference-cpu.yaml",
                  "spectune sweep --dry-run experiments/reference-cpu.yaml",
                  "spectune engine-cmd experiments/reference-cpu.yaml"):
        assert any(command.startswith(cheap) for command in commands), f"the guide no longer shows {cheap!r}"
    assert set(NOT_RUN_HERE) <= set(commands), "a command left out here that the guide no longer shows"


@pytest.mark.parametrize(("command", "shown"), RUN, ids=[command for command, _ in RUN])
def test_a_guide_command_runs_as_written(command: str, shown: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    result = CliRunner().invoke(app, shlex.split(command)[1:])
    assert result.exit_code == 0, f"{command}: exit {result.exit_code}\n{result.output[-3000:]}"
    missing = [line for line in shown if _flat(line) not in _flat(result.output)]
    assert not missing, f"docs/guide.md shows lines `{command}` does not print: {missing}"


def test_the_guide_leads_with_the_smoke_run_then_watching_trial_1() -> None:
    """Issue 58's first minutes, watched: the smoke run before bed, then the night's log followed."""
    text = GUIDE.read_text(encoding="utf-8")
    smoke, follow = text.find("spectune sweep --smoke "), text.find("ray job logs -f ")
    assert 0 <= smoke < follow, "the guide shows `spectune sweep --smoke`, then `ray job logs -f`"
    quoted = [line for line in text.splitlines() if line.startswith(("[trial 1/5]", "cost: 17 engine starts"))]
    demo = _flat((REPO / "docs" / "measurements" / "demo-cpu-issue43" / "demo.out").read_text(encoding="utf-8"))
    assert len(quoted) >= 5 and all(_flat(line) in demo for line in quoted), \
        "a good first trial, as a CPU run printed it"


def test_the_readme_links_the_guide_first() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    docs_links = re.findall(r"\]\((docs/[^)#\s]+)", readme)
    assert docs_links and docs_links[0] == "docs/guide.md", docs_links[:3]
