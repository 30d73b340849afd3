"""The sweep's early stopping: Ray Tune's ASHA, except that a baseline (every result's reference) is never stopped."""

from __future__ import annotations

from typing import Any

from ray.tune.schedulers import ASHAScheduler, TrialScheduler

from orchestrator.spec_search import EarlyStoppingSpec
from orchestrator.space import TrialPlan
from orchestrator.sweep.records.results import OBJECTIVE_KEY, OBJECTIVE_REPETITION_KEY

__all__ = ["BaselineSparingASHA", "early_stopping_scheduler"]


class BaselineSparingASHA(ASHAScheduler):
    """Ray Tune's ASHA that never stops a baseline: every result is stated against both."""

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict) -> str:
        decision = super().on_trial_result(tune_controller, trial, result)
        if decision == TrialScheduler.STOP and TrialPlan.from_config(trial.config).kind != "search":
            return TrialScheduler.CONTINUE
        return decision


def early_stopping_scheduler(*, early: EarlyStoppingSpec, direction: str, repetitions: int) -> BaselineSparingASHA:
    """ASHA over a trial's ``repetitions`` at the objective's level (its time: the repetition's
    number; other reports carry none), in the objective's ``direction``, with
    ``search.early_stopping``'s grace and reduction factor."""
    return BaselineSparingASHA(
        time_attr=OBJECTIVE_REPETITION_KEY, metric=OBJECTIVE_KEY, mode=direction,
        # Above the last repetition: never a stop for reaching it.
        max_t=repetitions + 1,
        grace_period=early.grace_repetitions, reduction_factor=early.reduction_factor,
    )
