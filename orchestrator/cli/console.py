"""Where the commands' messages go: one stderr console, made the same way everywhere.

A command's result (a table, JSON, an engine command) goes to stdout and can be piped; what it
says besides (errors, warnings, notes, the progress bar, log records) goes to stderr through
:func:`stderr_console`.
"""

from __future__ import annotations

from rich.console import Console

__all__ = ["stderr_console"]


def stderr_console() -> Console:
    """A console on stderr that does not highlight.

    Messages quote paths, numbers, URLs and servers' replies; rich's highlighter would colour
    parts of them at random. Markup stays on: callers ``escape`` what they quote, or pass
    ``markup=False``. Log records are unaffected (``RichHandler`` highlights them itself).
    """
    return Console(stderr=True, highlight=False)
