"""Early stopping: Ray Tune's ASHA stops a search trial that is behind at a rung, never a baseline."""

from __future__ import annotations

from types import SimpleNamespace

from ray.tune.schedulers import TrialScheduler

from orchestrator.space import BASELINE_AUTO, BASELINE_PLAIN, Candidate, SpeculativeTriple, TrialPlan
from orchestrator.spec_search import EarlyStoppingSpec
from orchestrator.sweep.records.results import OBJECTIVE_KEY, OBJECTIVE_REPETITION_KEY
from orchestrator.sweep.search.early_stopping import early_stopping_scheduler


def _trial(trial_id: str, kind: str) -> SimpleNamespace:
    plan = TrialPlan(kind, Candidate(SpeculativeTriple(3, 1, 4)))
    return SimpleNamespace(trial_id=trial_id, config={"plan": plan.to_config()})


def test_a_baseline_behind_at_a_rung_goes_on_a_search_trial_stops() -> None:
    scheduler = early_stopping_scheduler(early=EarlyStoppingSpec(enabled=True, grace_repetitions=1, reduction_factor=2),
                                         direction="max", repetitions=3)
    ahead = [_trial(f"s{i}", "search") for i in range(3)]
    behind = {kind: _trial(kind, kind) for kind in ("search", BASELINE_PLAIN, BASELINE_AUTO)}
    for trial in [*ahead, *behind.values()]:
        scheduler.on_trial_add(None, trial)
    for trial in ahead:  # the rung's record: three trials well ahead
        assert scheduler.on_trial_result(None, trial, {OBJECTIVE_REPETITION_KEY: 1, OBJECTIVE_KEY: 200.0}) == "CONTINUE"
    # a report without a repetition number (the engine is up, another level, the final one) is no rung
    assert scheduler.on_trial_result(None, behind["search"], {"training_iteration": 1, OBJECTIVE_KEY: 1.0}) == "CONTINUE"
    decisions = {kind: scheduler.on_trial_result(None, trial, {OBJECTIVE_REPETITION_KEY: 1, OBJECTIVE_KEY: 10.0})
                 for kind, trial in behind.items()}
    assert decisions == {"search": TrialScheduler.STOP, BASELINE_PLAIN: TrialScheduler.CONTINUE,
                         BASELINE_AUTO: TrialScheduler.CONTINUE}
