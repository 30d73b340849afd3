"""The root of spectune's error hierarchy, and the errors an engine can raise.

Every ``EngineError`` carries a machine-readable ``reason``, one per class (``ENGINE_ERROR_REASONS``),
which the sweep maps to a trial reason. The errors pickle with their attributes, so they cross Ray
actor boundaries. ``orchestrator.errors`` re-exports them.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ENGINE_ERROR_REASONS",
    "EngineAlreadyStarted",
    "EngineConfigError",
    "EngineDied",
    "EngineError",
    "EngineLaunchError",
    "EngineNotReady",
    "EngineStartTimeout",
    "EngineStopError",
    "SpectuneError",
]


class SpectuneError(Exception):
    """Base class of every error spectune raises on purpose (anything else is a bug)."""


class EngineConfigError(SpectuneError, ValueError):
    """An engine configuration breaks a rule of the engine (e.g. SGLang's speculative rules).

    A ``ValueError``, so pydantic reports it as a validation error of the model.
    """


def _rebuild(cls: type["EngineError"], message: str, fields: dict[str, Any]) -> "EngineError":
    return cls(message, **fields)


class EngineError(SpectuneError):
    """An engine failed; ``reason`` says how.

    Attributes:
        reason: One of ``ENGINE_ERROR_REASONS``, fixed per class.
        message: The message without the log tail.
        exit_code: The engine's exit code (negative: killed by that signal); ``None`` if it was
            still running or never started.
        log_tail: The last lines of the engine log, appended to ``str(error)``.
    """

    reason: str = ""

    def __init__(self, message: str, *, exit_code: int | None = None, log_tail: str = "") -> None:
        self.message = message
        self.exit_code = exit_code
        self.log_tail = log_tail
        full = message
        if log_tail:
            full += "\n--- last lines of the engine log ---\n" + log_tail.rstrip()
        super().__init__(full)

    def _fields(self) -> dict[str, Any]:
        """The keyword arguments that rebuild this error (subclasses add theirs)."""
        return {"exit_code": self.exit_code, "log_tail": self.log_tail}

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, self._fields()))


class EngineLaunchError(EngineError):
    """The engine could not be run, or exited before it was ever healthy (``launch_failed``)."""

    reason = "launch_failed"


class EngineStartTimeout(EngineLaunchError):
    """The engine runs but was not healthy by the deadline (``timeout``); it is left running."""

    reason = "timeout"


class EngineDied(EngineError):
    """The engine exited after it had been healthy (``died``)."""

    reason = "died"


class EngineNotReady(EngineError):
    """A request was made to an engine that is not (or no longer) healthy (``not_healthy``)."""

    reason = "not_healthy"


class EngineStopError(EngineError):
    """Processes of the engine or its port survived ``stop()`` (``stop_failed``).

    Attributes:
        survivors: Pids still alive after SIGKILL (empty if only the port stayed open).
        port: The port that still accepts connections, or ``None``.
    """

    reason = "stop_failed"

    def __init__(
        self,
        message: str,
        *,
        survivors: tuple[int, ...] = (),
        port: int | None = None,
        exit_code: int | None = None,
        log_tail: str = "",
    ) -> None:
        self.survivors = tuple(survivors)
        self.port = port
        super().__init__(message, exit_code=exit_code, log_tail=log_tail)

    def _fields(self) -> dict[str, Any]:
        return {**super()._fields(), "survivors": self.survivors, "port": self.port}


ENGINE_ERROR_REASONS: tuple[str, ...] = tuple(
    cls.reason for cls in (EngineLaunchError, EngineStartTimeout, EngineDied, EngineNotReady, EngineStopError)
)
"""Every ``reason`` an EngineError can carry (what the sweep maps to trial reasons)."""


class EngineAlreadyStarted(SpectuneError, RuntimeError):
    """``start()`` was called on an engine (or host) already running: a caller's mistake, with no trial reason."""
