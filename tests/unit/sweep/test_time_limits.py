"""A trial's time limits: the budget's until a trial has ended ok, then derived from the measured
starts and runs, so a hang costs minutes; never above the budget's."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.spec import SweepSpec
from orchestrator.sweep.execution.time_limits import trial_limits
from orchestrator.sweep.records.results import TrialRecord
from helpers.timings import produced

KIMI_BUDGET = {"engine_start_timeout_s": 2400, "trial_timeout_s": 3600}


def _spec(**budget: Any) -> SweepSpec:
    return SweepSpec.from_dict({"name": "t", "engine": {"kind": "sglang", "model_path": "m", "draft_model_path": "d"},
                                "budget": {**KIMI_BUDGET, **budget}})


def _record(number: int, *, start: float, run: float = 300.0, status: str = "ok", node: str = "n1") -> TrialRecord:
    return TrialRecord(trial_id=f"t{number}", number=number, kind="search", label=f"c{number}", params={},
                       status=status, node_id=node, started_at=f"2026-12-05T20:{number:02d}:00+00:00",
                       timings_s=produced(engine_start=start, contract=5.0, probe=25.0, bench=run - 30.0,
                                          teardown=40.0))


def test_the_budget_until_a_trial_ended_ok() -> None:
    limits = trial_limits(_spec(), [])
    assert (limits.start_s, limits.trial_s, limits.derived) == (2400, 3600, False)
    failed = [_record(1, start=700.0, status="failed")]
    assert not trial_limits(_spec(), failed).derived  # no run measured to its end


def test_after_the_first_start_a_hang_costs_minutes() -> None:
    """Kimi on one node: a cold first start of 21 min, warm ones of 10; runs of 5 min."""
    first = [_record(1, start=1260.0)]
    cold_only = trial_limits(_spec(), first)
    assert cold_only.start_s == 2400  # 2 x 21 min is above the budget's 40: the cap
    assert "1 cold start" in cold_only.basis
    records = [*first, _record(2, start=600.0), _record(3, start=620.0, run=420.0)]
    limits = trial_limits(_spec(), records)
    assert limits.start_s == pytest.approx(1240.0)  # 2 x the longest warm start (620 s), not the cold one
    assert limits.trial_s == pytest.approx(1240.0 + 840.0 + 40.0 + 60.0)  # + 2 x the longest run + teardown + 1 min
    assert limits.derived and "2 warm starts (longest 10m20s)" in limits.basis
    assert "budget.trial_timeout_s=3600 cap them" in limits.basis


def test_short_starts_keep_a_margin_and_the_switch_turns_it_off() -> None:
    quick = [_record(1, start=4.0, run=20.0), _record(2, start=5.0, run=22.0)]
    limits = trial_limits(_spec(engine_start_timeout_s=120, trial_timeout_s=300), quick)
    assert limits.start_s == 120  # 5 s + 2 min margin = 125 s, capped by the budget's 120
    assert limits.trial_s == 300  # 120 + (22 + 5 min) + ...: the cap
    off = trial_limits(_spec(derive_time_limits=False), quick)
    assert (off.start_s, off.trial_s, off.derived) == (2400, 3600, False)
