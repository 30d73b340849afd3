"""What Ray Tune calls back into during the search: progress lines, and the records of trials that
could not record themselves (ASHA stopped them, their worker died), via ``finalize_trial``.
"""

from __future__ import annotations

from typing import Any

from orchestrator.sweep.coordinator import CoordinatorRef
from orchestrator.sweep.display import Display
from orchestrator.sweep.results import TrialRecord
from orchestrator.space import TrialPlan

__all__ = ["tune_callbacks"]


def tune_callbacks(display: Display, ref: CoordinatorRef) -> list[Any]:
    """The callbacks of the sweep's Tuner: spectune's own, then the JSON and CSV loggers Tune's results need."""
    import ray
    from ray.tune import Callback

    class SweepCallback(Callback):
        """Progress lines, and the record of trials that could not record themselves."""

        def __init__(self) -> None:
            self.numbers: dict[str, int] = {}

        def _number(self, trial: Any) -> int:
            if trial.trial_id not in self.numbers:
                self.numbers[trial.trial_id] = ray.get(ref.get().reserve_number.remote(trial_id=trial.trial_id))
            return self.numbers[trial.trial_id]

        def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            display.started_trial(self._number(trial), TrialPlan.from_config(trial.config))

        def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
            if not result.get("final"):
                display.repetition(self._number(trial), result)

        def _ended(self, trial: Any, *, status: str, reason: str, message: str) -> None:
            number = self._number(trial)
            coordinator = ref.get()
            ray.get(coordinator.finalize_trial.remote(
                trial_id=trial.trial_id, status=status, reason=reason, message=message,
                last_result=dict(trial.last_result or {}),
            ))
            found = ray.get(coordinator.record_of.remote(trial_id=trial.trial_id))
            display.ended(TrialRecord.model_validate(found) if found else None, number, fallback=f"{status} ({reason})")

        def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self._ended(trial, status="early_stopped", reason="early_stopped",
                        message="ASHA stopped the trial after a repetition; it can never be the best")

        def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            error = getattr(trial, "error_message", None) or "the trial's worker failed (see the job log)"
            self._ended(trial, status="failed", reason="error", message=str(error)[-2000:])

    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

    return [SweepCallback(), JsonLoggerCallback(), CSVLoggerCallback()]
