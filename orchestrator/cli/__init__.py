"""The ``spectune`` command line: parse, configure logging, call one function per command.

Exit codes: 0 success, 1 the command ran and failed (e.g. an audit found a mismatch), 2 bad input
(an invalid spec, a bad option), 3 a command that this version does not implement yet.

This package holds the typer ``app`` (the ``spectune`` script is ``orchestrator.cli:main``) and
one module per command group:

* ``specs``   ``validate``, ``engine-cmd``, ``examples``: read a spec, start nothing;
* ``sweep``   ``sweep``: the tuning sweep on Ray;
* ``serve``   ``serve``: the best configuration behind Ray Serve;
* ``bench``   ``bench``, ``probe``: measure or check a running engine;
* ``audit``   ``audit``: a running engine's process-tree environment;
* ``inputs``  what the commands read from the user (a spec file, ``NAME=VALUE`` options).

Library packages (``orchestrator.bench``, ``orchestrator.sweep``, ``serving``) never import
this package; it imports them.
"""

from __future__ import annotations

import logging
from typing import Annotated

import typer
from rich.logging import RichHandler
from rich.markup import escape

from orchestrator.cli import audit, bench, serve, specs, sweep
from orchestrator.cli.console import stderr_console
from orchestrator.errors import SpectuneError
from orchestrator.exit_codes import EXIT_FAILED

__all__ = ["app", "main"]


app = typer.Typer(
    name="spectune",
    help="Find the fastest SGLang speculative-decoding + NCCL configuration, prove it is applied, serve it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _configure_logging(verbose: bool) -> None:
    """Send spectune's own records (loggers ``orchestrator.*``, ``serving.*``) to stderr.

    Only the CLI configures logging; records do not propagate to the root logger, so a host
    application's (or Ray's) handlers don't print them twice.
    """
    handler = RichHandler(console=stderr_console(), show_path=False, rich_tracebacks=False, markup=False)
    for name in ("orchestrator", "serving"):
        module_logger = logging.getLogger(name)
        module_logger.handlers[:] = [handler]
        module_logger.setLevel(logging.DEBUG if verbose else logging.INFO)
        module_logger.propagate = False


@app.callback()
def _root(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
) -> None:
    _configure_logging(verbose)


# In this order in `spectune --help`.
app.command(name="validate")(specs.validate)
app.command(name="sweep")(sweep.sweep)
app.command(name="serve")(serve.serve)
app.command(name="bench")(bench.bench)
app.command(name="probe")(bench.probe)
app.command(name="audit")(audit.audit)
app.command(name="engine-cmd")(specs.engine_cmd)
app.command(name="examples")(specs.examples)


def main() -> None:
    """Entry point of the ``spectune`` script."""
    try:
        app()
    except SpectuneError as exc:  # anything not handled by a command: one clear line, no traceback
        stderr_console().print(f"[bold red]error[/]: {escape(str(exc))}")
        raise SystemExit(EXIT_FAILED) from None
