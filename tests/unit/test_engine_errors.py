"""Engine errors: one machine-readable reason per class, and they survive a Ray actor boundary (pickle)."""

from __future__ import annotations

import pickle

import pytest

from serving.errors import (
    ENGINE_ERROR_REASONS,
    EngineAlreadyStarted,
    EngineConfigError,
    EngineDied,
    EngineError,
    EngineLaunchError,
    EngineNotReady,
    EngineStartTimeout,
    EngineStopError,
    SpectuneError,
)


@pytest.mark.parametrize(
    ("cls", "reason"),
    [
        (EngineLaunchError, "launch_failed"),
        (EngineStartTimeout, "timeout"),
        (EngineDied, "died"),
        (EngineNotReady, "not_healthy"),
        (EngineStopError, "stop_failed"),
    ],
)
def test_each_class_carries_its_reason(cls: type[EngineError], reason: str) -> None:
    error = cls("boom")
    assert error.reason == reason
    assert isinstance(error, EngineError) and isinstance(error, SpectuneError)


def test_the_reasons_are_the_documented_set() -> None:
    assert sorted(ENGINE_ERROR_REASONS) == ["died", "launch_failed", "not_healthy", "stop_failed", "timeout"]


def test_a_start_timeout_is_a_launch_error() -> None:
    # callers that catch "never came up" catch both; the reason tells them apart
    assert issubclass(EngineStartTimeout, EngineLaunchError)
    assert not issubclass(EngineDied, EngineLaunchError)


def test_message_quotes_the_log_tail() -> None:
    error = EngineLaunchError("engine exited with code 2", exit_code=2, log_tail="line 1\nerror: --bad-flag\n")
    assert str(error) == "engine exited with code 2\n--- last lines of the engine log ---\nline 1\nerror: --bad-flag"
    assert error.message == "engine exited with code 2"


@pytest.mark.parametrize(
    "error",
    [
        EngineLaunchError("exited", exit_code=2, log_tail="tail"),
        EngineStartTimeout("not healthy after 8 s", log_tail="waiting"),
        EngineDied("killed by signal 9", exit_code=-9, log_tail=""),
        EngineNotReady("engine not started"),
        EngineStopError("survived SIGKILL", survivors=(12, 34), port=31000, exit_code=-9, log_tail="t"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_errors_pickle_with_their_attributes(error: EngineError) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert (copy.reason, copy.message, copy.exit_code, copy.log_tail, str(copy)) == (
        error.reason, error.message, error.exit_code, error.log_tail, str(error),
    )
    if isinstance(error, EngineStopError):
        assert (copy.survivors, copy.port) == ((12, 34), 31000)


def test_already_started_is_a_caller_mistake_not_an_engine_failure() -> None:
    error = EngineAlreadyStarted("engine on port 1 already started (pid 2)")
    assert not isinstance(error, EngineError) and not isinstance(error, EngineNotReady)
    assert isinstance(error, SpectuneError) and isinstance(error, RuntimeError)
    assert str(pickle.loads(pickle.dumps(error))) == str(error)


def test_config_error_is_a_value_error() -> None:
    # so pydantic reports it as a validation error when raised in an EngineConfig validator
    assert issubclass(EngineConfigError, ValueError) and issubclass(EngineConfigError, SpectuneError)


class _TrialEngineError(EngineError):
    """A subclass with a required keyword argument: default exception pickling calls
    ``cls(*args)`` and fails on it; EngineError's ``__reduce__`` rebuilds from ``_fields()``."""

    reason = "launch_failed"

    def __init__(self, message: str, *, trial: str, **kwargs: object) -> None:
        self.trial = trial
        super().__init__(message, **kwargs)  # type: ignore[arg-type]

    def _fields(self) -> dict:
        return {**super()._fields(), "trial": self.trial}


def test_subclasses_with_required_arguments_pickle_through_fields() -> None:
    copy = pickle.loads(pickle.dumps(_TrialEngineError("x", trial="t-1", exit_code=3)))
    assert (type(copy), copy.trial, copy.exit_code, str(copy)) == (_TrialEngineError, "t-1", 3, "x")
