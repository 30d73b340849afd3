"""The ``spectune`` command line: the typer ``app`` (script ``orchestrator.cli:main``), one module
per command group (``specs``, ``sweep``, ``serve``, ``bench``, ``audit``).

Exit codes (``orchestrator.exit_codes``): 0 success, 1 the command ran and failed, 2 bad input.
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
    rich_markup_mode=None,  # click's plain help: it wraps to any width; rich's tables cut option names at 80 columns
)


def _configure_logging(verbose: bool) -> None:
    """Send spectune's own records (loggers ``orchestrator.*``, ``serving.*``) to stderr, not
    propagated to the root logger (whose handlers would print them twice)."""
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
