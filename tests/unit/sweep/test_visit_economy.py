"""The visit economy acts on evidence (orchestrator.sweep.confirmation.economy): a between-visit
spread estimated from too few degrees of freedom never moves the repetitions per visit (the engine
kind's prior does, said as a prior), more of them are read through an upper bound, and the time
left caps what a visit may run."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from orchestrator.sweep.confirmation.economy import (
    MIN_BETWEEN_DF,
    between_upper_bound,
    choose_repetitions,
    time_cap,
    visit_economy,
)

REPO = Path(__file__).resolve().parents[3]

# the held-out CPU sweep of issue 57: a start costs 9 s, a repetition 19 s; repetitions spread ~5%
VISITS = [{"status": "ok", "values": [100.0, 105.0, 95.0], "timings": {"engine_start": 9.0, "bench": 57.0}}] * 12
FLAT = ([0.0, 0.0, 0.0], [3, 3, 3])  # three pairs whose log ratios agree: a between-visit spread of 0, 2 df


def test_a_spread_of_zero_from_few_degrees_of_freedom_does_not_raise_the_repetitions() -> None:
    """Four comparisons of three rounds each (8 df if they were added, 2 each): the old rule read the
    spread as 0 and went to 8 repetitions per visit; the prior keeps it at 1."""
    economy = visit_economy(records=[], visits=VISITS, paired_diffs=[FLAT] * 4, fixed=None, prior_cv=0.045,
                            prior_name="the reference prior")
    assert economy.between_cv == 0.0 and economy.between_df == 2 < MIN_BETWEEN_DF
    assert economy.start_s == 9.0 and economy.repetition_s == 19.0
    assert economy.repetitions_per_visit == 1
    assert economy.acted_between_cv == 0.045 and "the reference prior 4.5%" in economy.line()
    assert "too few to act on" in economy.basis
    # without a prior the between-visit spread is taken as the within-visit one: sqrt(9 / 19) -> 1
    assert visit_economy(records=[], visits=VISITS, paired_diffs=[FLAT] * 4, fixed=None).repetitions_per_visit == 1


def test_from_enough_degrees_of_freedom_the_choice_reads_the_upper_bound() -> None:
    """Five pairs (4 df) whose spread the within-visit share nearly explains: the estimate, 0.4%,
    would ask for the cap of 8; its 90% chi-square upper bound, 4.9%, asks for 1."""
    pairs = ([0.05, -0.05, 0.03, -0.03, 0.0], [3] * 5)
    economy = visit_economy(records=[], visits=VISITS, paired_diffs=[pairs], fixed=None, prior_cv=0.045)
    assert economy.between_df == 4 and economy.between_cv < 0.01
    assert choose_repetitions(within=economy.within_cv**2, between=economy.between_cv**2, start_s=9.0,
                              repetition_s=19.0) == 8, "what acting on the estimate would do"
    assert economy.acted_between_cv == pytest.approx(0.049, abs=0.002) and "90% upper bound" in economy.acted_on
    assert economy.repetitions_per_visit == 1
    # pairs steadier than the repetitions: the components cannot be told apart, the prior decides
    steady = visit_economy(records=[], visits=VISITS, paired_diffs=[([0.01, -0.01, 0.0, 0.01, -0.01], [3] * 5)],
                           fixed=None, prior_cv=0.045)
    assert steady.acted_between_cv == 0.045 and steady.repetitions_per_visit == 1
    # the bound: variance x df / chi2_0.10(df); chi2_0.10(4) = 1.0636
    assert between_upper_bound(1.0, 4) == pytest.approx(4 / 1.0636, rel=1e-3)


def test_the_time_left_caps_the_repetitions_per_visit() -> None:
    """A slow start (5 min), 30 s repetitions and a prior of 0.3% between visits ask for the cap of 8
    repetitions; 400 s a visit left hold the start and 3 of them; 2 minutes still one."""
    slow = [{"status": "ok", "values": [100.0, 110.0, 90.0], "timings": {"engine_start": 300.0, "bench": 90.0}}] * 8
    few = ([0.001, -0.001, 0.0005], [3] * 3)
    free = visit_economy(records=[], visits=slow, paired_diffs=[few], fixed=None, prior_cv=0.003)
    assert free.repetitions_per_visit == 8 and free.time_cap is None
    tight = visit_economy(records=[], visits=slow, paired_diffs=[few], fixed=None, prior_cv=0.003,
                          seconds_per_visit=400.0)
    assert tight.time_cap == 3 and tight.repetitions_per_visit == 3 and "by the time left" in tight.basis
    assert time_cap(seconds_per_visit=120.0, start_s=300.0, repetition_s=30.0) == 1, "always one repetition"
    assert time_cap(seconds_per_visit=None, start_s=300.0, repetition_s=30.0) is None


def test_a_confirmation_with_no_between_visit_spread_keeps_one_repetition_per_visit() -> None:
    """Through run_confirmation (the benchmark's simulator, the issue's CPU costs, equal speeds, no
    spread between visits at all): every visit runs one repetition, as the reference prior says."""
    path = REPO / "benchmarks" / "verdict_operating_characteristic.py"
    spec = importlib.util.spec_from_file_location("verdict_oc_economy", path)
    oc = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(oc)
    settings = oc.spec(margin=0.05, repetitions="auto", max_visits=6, top_k=3)
    out = oc.simulate(ratio=1.0, between_cv=0.0, contenders=3, seed=11, settings=settings, within_cv=0.05,
                      start_s=9.0, rep_s=19.0, drift_cv=0.0)
    assert out["visits"] >= 3 and out["repetitions"] == out["starts"], "one repetition a visit"
    assert math.isfinite(out["seconds"])
