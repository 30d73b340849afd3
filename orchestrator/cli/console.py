"""Where the commands' messages go: results to stdout, everything else (errors, warnings, progress,
log records) to stderr through :func:`stderr_console`."""

from __future__ import annotations

from rich.console import Console

__all__ = ["stderr_console"]


def stderr_console() -> Console:
    """A console on stderr that does not highlight (markup stays on: callers ``escape`` what they quote)."""
    return Console(stderr=True, highlight=False)
