"""What Ray Tune calls back into during the search, on the driver: progress lines, and the
trials' records, handed from each result to the sweep's writer (the coordinator): the record a
result carries updates the trial's MLflow run, the final one is its line in ``trials.jsonl``, and
a trial that ended without one (ASHA stopped it, its worker died) is recorded from its last.
"""

from __future__ import annotations

import json
from typing import Any

from orchestrator.sweep.execution.coordinator import CoordinatorRef
from orchestrator.sweep.output.display import Display
from orchestrator.sweep.records.results import TrialRecord
from orchestrator.space import TrialPlan

__all__ = ["tune_callbacks"]


def tune_callbacks(display: Display, ref: CoordinatorRef) -> list[Any]:
    """The callbacks of the sweep's Tuner: spectune's own, then the JSON and CSV loggers Tune's results need."""
    import ray
    from ray.tune import Callback

    class SweepCallback(Callback):
        """Progress lines, and each result's record to the writer."""

        def __init__(self) -> None:
            self.numbers: dict[str, int] = {}
            self.shown: set[str] = set()  # trials whose end is on the console

        def _show_end(self, trial: Any, record: TrialRecord | None, fallback: str = "") -> None:
            self.shown.add(trial.trial_id)
            display.ended(record, self._number(trial), fallback=fallback)

        def _number(self, trial: Any) -> int:
            if trial.trial_id not in self.numbers:
                self.numbers[trial.trial_id] = ray.get(ref.get().reserve_number.remote(trial_id=trial.trial_id))
            return self.numbers[trial.trial_id]

        def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            display.started_trial(self._number(trial), TrialPlan.from_config(trial.config))

        def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
            record = result.get("record")
            if record is None:
                return
            writer = ref.get()
            if result.get("final"):
                ended = TrialRecord.model_validate_json(record)
                ray.get(writer.finish_trial.remote(ended.model_dump()))
                self._show_end(trial, ended)
                return
            ray.get(writer.update_trial.remote(json.loads(record), step=result.get("repetition"),
                                               metrics=result.get("repetition_metrics")))
            display.repetition(self._number(trial), result)

        def _ended(self, trial: Any, *, status: str, reason: str, message: str) -> None:
            """A trial that ended without its final report: recorded from its last report."""
            ended = ray.get(ref.get().end_running.remote(trial_id=trial.trial_id, status=status, reason=reason,
                                                         message=message))
            if ended is not None:
                self._show_end(trial, TrialRecord.model_validate(ended))
            elif trial.trial_id not in self.shown:  # it died before it started: no record to show
                self._show_end(trial, None, fallback=f"{status} ({reason})")

        def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self._ended(trial, status="early_stopped", reason="early_stopped",
                        message="ASHA stopped the trial after a repetition; it can never be the best")

        def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            error = getattr(trial, "error_message", None) or "the trial's worker failed (see the job log)"
            self._ended(trial, status="failed", reason="error", message=str(error)[-2000:])

    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

    return [SweepCallback(), JsonLoggerCallback(), CSVLoggerCallback()]
