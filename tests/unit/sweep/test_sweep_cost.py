"""A sweep's cost in engine starts: trials plus the confirmation's most visits, times the start time."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.spec import SweepSpec
from orchestrator.sweep.output.cost import (
    cold_starts,
    cost_line,
    format_duration,
    planned_starts,
    start_time,
    visit_estimate_s,
)
from orchestrator.sweep.output.display import Display
from orchestrator.sweep.records.results import TrialRecord
from helpers.timings import produced


def _spec(kind: str = "sglang", **sections: Any) -> SweepSpec:
    data: dict[str, Any] = {"name": "t", "engine": {"kind": kind, "model_path": "m", "draft_model_path": "d"}}
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    return SweepSpec.from_dict(data)


def _record(number: int, *, start: float, teardown: float = 2.0, bench: float = 60.0, reps: int = 3,
            node: str | None = "n1", status: str = "ok") -> TrialRecord:
    return TrialRecord(trial_id=f"t{number}", number=number, kind="search", label=f"c{number}", params={},
                       status=status, node_id=node, level_values={"8": [1.0] * reps},
                       started_at=f"2026-12-05T20:{number:02d}:00+00:00",
                       timings_s=produced(engine_start=start, teardown=teardown, bench=bench))


def test_starts_are_the_trials_plus_contenders_times_max_visits() -> None:
    plan = planned_starts(_spec(budget={"num_trials": 40}, confirmation={"top_k": 3, "max_visits": 16}))
    # the 3 best search trials, SGLang's default and no speculation, 16 visits each at most
    assert (plan.trials, plan.contenders, plan.visits, plan.total) == (40, 5, 80, 120)


def test_a_search_smaller_than_top_k_has_fewer_contenders() -> None:
    plan = planned_starts(_spec(budget={"num_trials": 3}, confirmation={"top_k": 3, "max_visits": 4}))
    assert (plan.contenders, plan.total) == (1 + 2, 3 + 12)  # one search trial after the two baselines


def test_no_speculation_switched_off_is_one_contender_fewer() -> None:
    on = planned_starts(_spec(budget={"num_trials": 40}, confirmation={"top_k": 1, "max_visits": 6}))
    off = planned_starts(_spec(budget={"num_trials": 40}, confirmation={"top_k": 1, "max_visits": 6,
                                                                       "no_speculation": False}))
    assert (on.contenders, off.contenders) == (3, 2) and off.visits == 12


def test_no_confirmation_visits_when_it_is_off_or_cannot_run() -> None:
    assert planned_starts(_spec(budget={"num_trials": 5}, confirmation={"enabled": False})).total == 5
    plain = _spec(engine={"speculative_algorithm": None, "draft_model_path": None}, budget={"num_trials": 5})
    assert planned_starts(plain).visits == 0, "without speculation there is no SGLang default to judge against"


def test_start_time_is_measured_once_a_start_is_known_else_estimated() -> None:
    assert start_time(_spec())[0] == 600.0
    assert start_time(_spec("reference"))[0] == 10.0
    assert start_time(_spec(budget={"engine_start_estimate_s": 90}))[0] == 90.0
    records = [_record(1, start=100.0), _record(2, start=300.0), _record(3, start=140.0), _record(5, start=120.0),
               _record(4, start=1.0, node=None)]  # an engine that never came up says nothing about a start
    seconds, basis = start_time(_spec(budget={"engine_start_estimate_s": 90}), records)
    assert seconds == 140.0 and basis == "measured, median of 3 warm starts (node n1, 2026-12-05)"  # trial 1's start was cold


def test_a_nodes_first_start_is_cold_and_not_the_norm() -> None:
    """The first start on each node (page cache, JIT caches empty) is told apart: the plan's start
    time is the warm starts' median, with the cold one named."""
    records = [_record(1, start=1260.0), _record(2, start=590.0), _record(3, start=610.0, node="n2"),
               _record(4, start=600.0), _record(5, start=2.0, node=None)]
    assert cold_starts(records) == {"t1", "t3"}  # the first on n1 and the first on n2
    seconds, basis = start_time(_spec(), records)
    assert seconds == 595.0 and basis == ("measured, median of 2 warm starts (nodes n1, n2, 2026-12-05); the cold first starts took 21m00s")
    only_cold = start_time(_spec(), records[:1])
    assert only_cold == (1260.0, "measured, median of 1 cold first start (node n1, 2026-12-05): later ones are often faster")
    spread = TrialRecord(trial_id="t6", number=6, kind="search", label="x", params={}, status="ok", node_id="n1",
                         started_at="2026-12-05T20:06:00+00:00", timings_s={"engine_start": 700.0},
                         engine_nodes=[{"node_rank": 0, "node_id": "n1"}, {"node_rank": 1, "node_id": "n3"}])
    assert "t6" in cold_starts([*records, spread])  # an engine across nodes is cold on its new node


def test_a_visit_is_a_start_a_teardown_and_its_repetitions_at_the_trials_pace() -> None:
    spec = _spec(confirmation={"repetitions_per_visit": 2})
    assert visit_estimate_s(spec, [_record(1, start=100.0, teardown=4.0, bench=60.0, reps=3)]) == 100 + 4 + 2 * 20
    assert visit_estimate_s(spec) == 600.0 + 2 * spec.benchmark.min_repetition_s


def test_the_cost_line_states_starts_times_start_time() -> None:
    spec = _spec(budget={"num_trials": 40, "time_limit_s": 21600}, confirmation={"top_k": 3, "max_visits": 16})
    assert cost_line(spec, fits=False) == (
        "cost: 120 engine starts (40 trials + up to 80 confirmation visits: 5 contenders x 16) x 10m00s per start "
        "(assumed: the default for sglang (spec.DEFAULT_ENGINE_START_S); budget.engine_start_estimate_s sets it) = "
        "~20h00m of engine starts; the night does not fit budget.time_limit_s (6h00m): the plan says what it cuts")
    off = _spec("reference", budget={"num_trials": 4}, confirmation={"enabled": False})
    assert cost_line(off, [_record(1, start=8.0)]) == (
        "cost: 4 engine starts (4 trials; confirmation off) x 8s per start (measured, median of 1 cold first start "
        "(node n1, 2026-12-05): later ones are often faster) = ~32s of engine starts")


@pytest.mark.parametrize(("seconds", "text"), [(42, "42s"), (425, "7m05s"), (12000, "3h20m")])
def test_durations_read_at_a_glance(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


class _Console:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def print(self, text: str, **_: Any) -> None:
        self.lines.append(text)


def test_the_running_sweeps_time_left_includes_the_confirmation() -> None:
    spec = _spec(budget={"num_trials": 4}, confirmation={"top_k": 1, "min_visits": 2, "max_visits": 2,
                                                     "repetitions_per_visit": 1})
    console = _Console()
    display = Display(console=console, spec=spec, total=4)  # type: ignore[arg-type]
    assert display.time_left_s() is None
    display.started -= 100.0  # one trial took 100 s of wall time
    display.ended(_record(1, start=50.0, teardown=0.0, bench=30.0, reps=3), 1, fallback="")
    visit = 50.0 + 10.0
    left = display.time_left_s()
    assert left == pytest.approx(3 * 100.0 + 3 * 2 * visit, rel=0.01)  # 3 trials + (1 + 2 contenders) x 2 visits
    assert any(line.startswith("cost: 10 engine starts") and "measured, median of 1 cold first start" in line
               for line in console.lines), console.lines
    display.confirmation_started(3)
    assert display.time_left_s() == pytest.approx(6 * visit)
    display.visit_ended()
    assert display.time_left_s() == pytest.approx(5 * visit)
    assert "confirmation cost: up to 6 engine starts (3 contenders x 2 visits)" in console.lines[-1]
