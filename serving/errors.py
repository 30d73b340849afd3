"""The root of spectune's error hierarchy, and the errors an engine can raise.

They live in ``serving`` (the lower layer) so that engine code can raise them without importing
``orchestrator``; ``orchestrator.errors`` re-exports them next to its own.
"""

from __future__ import annotations

__all__ = ["SpectuneError", "EngineConfigError", "EngineLaunchError", "EngineNotReady"]


class SpectuneError(Exception):
    """Base class of every error spectune raises on purpose (anything else is a bug)."""


class EngineConfigError(SpectuneError, ValueError):
    """An engine configuration breaks a rule of the engine (e.g. SGLang's speculative rules)."""


class EngineLaunchError(SpectuneError):
    """The engine process exited or never became healthy.

    Carries the exit code (``None`` if it was still running and had to be killed) and the tail of
    its log, because the reason an engine died is almost always in the last lines it printed.
    """

    def __init__(self, message: str, *, exit_code: int | None = None, log_tail: str = "") -> None:
        self.exit_code = exit_code
        self.log_tail = log_tail
        full = message
        if log_tail:
            full += "\n--- last lines of the engine log ---\n" + log_tail.rstrip()
        super().__init__(full)


class EngineNotReady(SpectuneError):
    """A request was made to an engine that is not (or no longer) healthy."""
