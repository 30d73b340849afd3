"""Wait for a condition, bounded (stdlib only): "until this is true, or fail after so long"."""

from __future__ import annotations

import time
from typing import Callable

__all__ = ["wait_until"]


def wait_until(
    condition: Callable[[], object], *, timeout_s: float, what: str, poll_s: float = 0.05,
    detail: Callable[[], str] | None = None,
) -> None:
    """Return as soon as ``condition()`` is truthy; raise ``TimeoutError`` after ``timeout_s``.

    Args:
        condition: Checked first at once, then every ``poll_s`` seconds.
        timeout_s: Deadline from now.
        what: What is awaited, in words, for the error ("the engine to exit").
        poll_s: Interval between checks.
        detail: Called on timeout for context to append (e.g. an engine's log tail).
    """
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            extra = detail() if detail is not None else ""
            raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}" + (f"\n{extra}" if extra else ""))
        time.sleep(poll_s)
