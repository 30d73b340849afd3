"""EngineSession's verdicts that need no engine: the audit check and what a teardown left behind."""

from __future__ import annotations

import pytest
import ray

from orchestrator.sweep.records.results import FAILURE_REASONS
from orchestrator.sweep.execution.session import EngineSession, TrialFailure, launch_failure_reason
from serving.engine.config import EngineConfig
from serving.engine.placement import engine_placement
from serving.errors import (
    EngineDied, EngineLaunchError, EngineNotReady, EngineStartTimeout, EngineStopError,
)


def _session(timings: dict[str, float] | None = None) -> EngineSession:
    return EngineSession(
        EngineConfig(kind="reference", model_path="tiny"), session_id="t1", label="trial 1", sweep_name="s",
        placement=engine_placement(gpus=0, cpus=1), start_timeout_s=10.0, timings=timings,
    )


@pytest.mark.parametrize(("error", "reason"), [
    (EngineStartTimeout("not healthy after 600 s"), "not_healthy"),
    (EngineNotReady("503"), "not_healthy"),
    (EngineLaunchError("exit 1"), "launch_failed"),
    (EngineDied("gone"), "launch_failed"),
    (RuntimeError("placement group removed"), "launch_failed"),
])
def test_an_engine_that_never_served_has_one_reason_for_trials_and_visits(error: Exception, reason: str) -> None:
    """``timeout`` means the trial's own time limit (FAILURE_REASONS): an engine's start deadline is
    ``not_healthy``, for a trial and a confirmation visit alike (both go through EngineSession.open)."""
    assert launch_failure_reason(error) == reason and reason in FAILURE_REASONS


def test_a_failed_audit_is_env_audit_with_its_summary() -> None:
    session = _session()
    session.info = {"audit": {"ok": True, "summary": "env audit passed"}}
    session.check_audit()
    session.info = {"audit": {"ok": False, "summary": "env audit FAILED for 1 of 2 processes"}}
    with pytest.raises(TrialFailure) as failure:
        session.check_audit()
    assert (failure.value.reason, failure.value.message) == ("env_audit", "env audit FAILED for 1 of 2 processes")


def test_teardown_problem_names_a_failed_stop_but_not_a_host_already_gone() -> None:
    session = _session()
    assert session.teardown_problem is None
    session.stop_error = ray.exceptions.RayActorError()  # killed at the time limit: nothing to stop
    assert session.teardown_problem is None
    session.stop_error = EngineStopError("engine processes survived SIGKILL: [12]", survivors=(12,))
    assert session.teardown_problem == "engine teardown failed: engine processes survived SIGKILL: [12]"


def test_closing_a_session_never_opened_does_nothing() -> None:
    timings: dict[str, float] = {}
    session = _session(timings)
    session.close()
    assert timings == {} and session.stop_error is None and not session.timed_out
