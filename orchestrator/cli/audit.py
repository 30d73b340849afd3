"""``spectune audit``: prove a running engine's processes carry the expected environment."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from orchestrator.cli.console import stderr_console
from orchestrator.cli.inputs import parse_pairs
from orchestrator.exit_codes import EXIT_BAD_INPUT, EXIT_FAILED
from serving.engine.audit import audit_process_tree

__all__ = ["audit"]


def audit(
    pid: Annotated[
        int, typer.Option("--pid", min=1, help="PID of the engine's server process (the one launched).")
    ],
    expect: Annotated[
        Optional[list[str]],
        typer.Option("--expect", help="NAME=VALUE every process must carry (repeatable); NAME= for any value."),
    ] = None,
    worker_expect: Annotated[
        Optional[list[str]],
        typer.Option(
            "--worker-expect", help="NAME=VALUE only TP workers must carry (e.g. NCCL_CUMEM_ENABLE=0 under SGLang)."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Prove every process of a running engine (SGLang included) carries the expected environment.

    Reads /proc/<pid>/environ of the server and every descendant. Exit 0 if all carry every
    expected variable, 1 on any missing or different value, 2 if there is no such process.
    """
    expected = {k: (v or None) for k, v in parse_pairs(expect or [], option="--expect").items()}
    workers = {k: (v or None) for k, v in parse_pairs(worker_expect or [], option="--worker-expect").items()}
    if not expected and not workers:
        stderr_console().print("give at least one --expect NAME=VALUE")
        raise typer.Exit(EXIT_BAD_INPUT)
    report = audit_process_tree(root_pid=pid, expected=expected, worker_expected=workers)
    if report.processes[0].error == "no such process":
        stderr_console().print(f"no process with pid {pid}")
        raise typer.Exit(EXIT_BAD_INPUT)
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
    else:
        typer.echo(report.summary())
        if report.ok:
            for process in report.processes:
                typer.echo(f"  {process.describe()}")
    if not report.ok:
        raise typer.Exit(EXIT_FAILED)
