"""budget.time_limit_s bounds search and confirmation: the searcher stops starting trials in time for
the confirmation's least time, no trial is killed for it, and the confirmation gets what is left."""

from __future__ import annotations

from typing import Any

from ray.tune.search import Searcher

from orchestrator.space.define_by_run import DefineByRunSpace
from orchestrator.spec import SweepSpec
from orchestrator.sweep.execution.time_budget import TimeBudget
from orchestrator.sweep.records.results import TrialRecord
from helpers.timings import produced
from orchestrator.sweep.search.searcher import SweepSearcher


def _spec(**sections: Any) -> SweepSpec:
    data: dict[str, Any] = {"name": "t", "engine": {"kind": "sglang", "model_path": "m", "draft_model_path": "d",
                                                    "speculative_algorithm": "EAGLE3"}}
    data.update(sections)
    return SweepSpec.from_dict(data)


def _trial(number: int, seconds: float) -> TrialRecord:
    return TrialRecord(trial_id=f"t{number}", number=number, kind="search", label="x", params={}, status="ok",
                       node_id="n1", started_at=f"2026-12-05T20:{number:02d}:00+00:00",
                       level_values={"8": [1.0, 1.0, 1.0]},
                       timings_s=produced(engine_start=600.0, probe=60.0, bench=seconds - 660.0, teardown=0.0))


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_search_stops_starting_trials_in_time_for_the_confirmations_least_time() -> None:
    spec = _spec(budget={"num_trials": 40, "time_limit_s": 8 * 3600},
                 confirmation={"top_k": 1, "min_visits": 3, "max_visits": 8, "repetitions_per_visit": 2})
    records: list[TrialRecord] = [_trial(1, 900.0), _trial(2, 900.0), _trial(3, 960.0)]
    clock = _Clock()
    budget = TimeBudget(spec, records=lambda: records, clock=clock)
    reserve = budget.confirmation_reserve_s(records)
    # 3 contenders (the search's best, SGLang's default, no speculation) x 3 rounds x (start + 2 repetitions)
    assert reserve == 3 * 3 * (600.0 + 2 * (240.0 / 3))
    clock.now += 8 * 3600 - reserve - 900.0 - 1  # one 900 s trial still fits before the reserve
    assert budget.stop_reason() is None
    clock.now += 2
    reason = budget.stop_reason()
    assert reason is not None and reason.startswith("budget.time_limit_s (8h00m): ")
    assert "another trial takes about 15m00s" in reason and "no more trials are started" in reason
    assert budget.confirmation_minutes() == budget.left_s() / 60  # what is left (no max_minutes of its own)


def test_no_limit_no_stop_and_the_confirmations_own_limit_if_smaller() -> None:
    assert TimeBudget(_spec(), records=lambda: []).stop_reason() is None
    spec = _spec(budget={"time_limit_s": 3600}, confirmation={"max_minutes": 20})
    assert TimeBudget(spec, records=lambda: []).confirmation_minutes() == 20


def test_the_searcher_runs_the_baselines_then_stops_when_told() -> None:
    spec = _spec(search={"speculative": {"num_steps": [1, 2, 3], "eagle_topk": [1]}, "nccl_env": {}})
    stop: list[str] = []
    searcher = SweepSearcher(space=DefineByRunSpace(spec), mode="max", seed=0, slo=False,
                             stop_reason=lambda: stop[0] if stop else None)
    stop.append("out of time")
    first, second = searcher.suggest("a"), searcher.suggest("b")
    assert isinstance(first, dict) and isinstance(second, dict)  # the two baselines always run
    assert searcher.suggest("c") == Searcher.FINISHED


def test_the_searcher_with_its_budget_pickles_as_ray_tune_saves_it() -> None:
    """Ray Tune pickles the searcher (experiment state, --resume): the budget it asks must pickle too,
    and an unpickled one counts from its restore."""
    import pickle

    from orchestrator.sweep.execution.driver import WriterRecords
    from orchestrator.sweep.execution.coordinator import CoordinatorRef

    spec = _spec(budget={"time_limit_s": 3600}, search={"speculative": {"num_steps": [1, 2], "eagle_topk": [1]},
                                                        "nccl_env": {}})
    budget = TimeBudget(spec, records=WriterRecords(CoordinatorRef("spectune-test")))
    searcher = SweepSearcher(space=DefineByRunSpace(spec), mode="max", seed=0, slo=False, stop_reason=budget.stop_reason)
    restored = pickle.loads(pickle.dumps(searcher))
    assert restored._stop_reason.__self__.spec == spec  # noqa: SLF001 - the budget travelled with it
    clock = _Clock()
    counted = TimeBudget(spec, records=list, clock=clock)
    clock.now += 600
    assert pickle.loads(pickle.dumps(counted)).elapsed_s() == 0.0
