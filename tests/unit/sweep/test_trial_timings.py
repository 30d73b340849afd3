"""A trial's timings are a typed value whose total is derived: the trial's own record gives the budget, the
plan and the limits its wall time once, never its total added to its parts again."""

from __future__ import annotations

import json
from typing import Any

import pytest

from orchestrator.space import BASELINE_AUTO, Candidate, SpeculativeTriple, TrialPlan
from orchestrator.spec import SweepSpec
from orchestrator.sweep.execution.time_budget import TimeBudget
from orchestrator.sweep.execution.time_limits import TrialLimits, trial_limits
from orchestrator.sweep.execution.trial import _final_record, _TrialState
from orchestrator.sweep.output.cost import trial_cost
from orchestrator.sweep.output.night_plan import night_plan
from orchestrator.sweep.records.results import TrialRecord
from orchestrator.sweep.records.timings import TrialTimings

# the demo's trial the issue quotes: 41.8 s of wall clock, read as 83.5 s by a sum over the stored dict
TIMED = {"engine_start": 20.0, "contract": 1.0, "probe": 5.0, "bench": 14.0, "teardown": 0.8, "wall": 41.8}


def _spec(**budget: Any) -> SweepSpec:
    return SweepSpec.from_dict({"name": "t", "engine": {"kind": "reference", "model_path": "ref-tiny",
                                                        "draft_model_path": "ref-tiny-draft",
                                                        "speculative_algorithm": "EAGLE3"},
                                "budget": {"time_limit_s": 3600, **budget}})


def _produced(number: int) -> TrialRecord:
    """A record as ``execution.trial`` ends one: its timer's dict through ``_final_record``."""
    record = TrialRecord(trial_id=f"t{number}", number=number, kind="search", label="x", params={}, status="running",
                         node_id="n1", started_at=f"2026-12-05T20:{number:02d}:00+00:00")
    state = _TrialState(plan=TrialPlan(BASELINE_AUTO, Candidate(SpeculativeTriple(None, None, None))), record=record,
                        limits=TrialLimits(600.0, 3600.0, "budget"), timings=dict(TIMED))
    return _final_record(_spec(), state, status="ok", reason=None, message="")


def test_the_producers_record_counts_its_wall_time_once() -> None:
    record = _produced(2)
    assert record.timings_s.total == pytest.approx(41.8)
    assert record.timings_s.other == pytest.approx(1.0)  # the wall clock beyond the timed phases
    records = [_produced(1), record, _produced(3)]
    assert TimeBudget(_spec(), records=lambda: records).trial_s(records) == pytest.approx(41.8)  # not 83.6
    assert trial_cost(_spec(), records).total_s == pytest.approx(41.8)
    plan = night_plan(_spec(), records)
    assert plan.trial_s == pytest.approx(41.8)
    limits = trial_limits(_spec(), records)
    assert "longest run 21s" in limits.basis  # contract + probe + bench + other: 21.0 s, not 62.8


def test_records_on_disk_load_with_or_without_a_total() -> None:
    written = json.loads(_produced(1).model_dump_json())["timings_s"]
    assert written == {**{k: v for k, v in TIMED.items() if k != "wall"}, "other": 1.0, "total": 41.8}
    assert TrialTimings.model_validate(written).total == pytest.approx(41.8)  # read back: the same trial
    old = TrialTimings.model_validate({"engine_start": 20.0, "bench": 14.0, "total": 41.8})  # before this type
    assert (old.other, old.total) == (pytest.approx(7.8), pytest.approx(41.8))
    bare = TrialTimings.model_validate({"engine_start": 20.0, "bench": 14.0})  # no wall clock: the parts
    assert (bare.other, bare.total, bare.run) == (None, 34.0, 14.0)
    assert bare.teardown is None and "engine_start" in bare.parts() and "teardown" not in bare.parts()
    with pytest.raises(ValueError):
        TrialTimings.model_validate({"engine_start": 1.0, "warm_up": 2.0})  # a misspelt phase fails loudly
