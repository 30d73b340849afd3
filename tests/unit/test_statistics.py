"""The statistics a user acts on, against hand-computed values: log-scale intervals (never
negative), no interval from fewer than 3 values, paired and unpaired ratios, decisions and the
visits a decision would need."""

from __future__ import annotations

import math
import statistics

import pytest

from orchestrator.statistics import (
    MIN_VALUES,
    decide,
    log_interval,
    paired_ratio,
    unpaired_ratio,
    visits_needed,
)


def test_log_interval_matches_hand_computation() -> None:
    values = [100.0, 121.0, 110.0]
    logs = [math.log(v) for v in values]
    mean, sd = statistics.fmean(logs), statistics.stdev(logs)
    half = 4.302653 * sd / math.sqrt(3)  # t(0.975, 2)
    low, high = log_interval(values)
    assert low == pytest.approx(math.exp(mean - half), rel=1e-5)
    assert high == pytest.approx(math.exp(mean + half), rel=1e-5)


def test_log_interval_is_positive_on_data_with_large_spread() -> None:
    # a t interval on the raw values of these is [-14.6, 386.6]: throughput is never negative
    values = [266.1, 222.1, 40.0]
    raw_mean, raw_sd = statistics.fmean(values), statistics.stdev(values)
    assert raw_mean - 4.302653 * raw_sd / math.sqrt(3) < 0
    low, high = log_interval(values)
    assert 0 < low < min(values) and high > max(values)


@pytest.mark.parametrize("values", [[], [120.0], [266.1, 222.1]])
def test_fewer_than_three_values_give_no_interval(values) -> None:
    assert MIN_VALUES == 3
    assert log_interval(values) is None
    ratio = unpaired_ratio(values or [1.0], [100.0, 101.0])
    assert ratio is None or not ratio.has_interval
    if values:
        assert "too few repetitions for an interval" in unpaired_ratio(values, values).text()


def test_paired_ratio_matches_hand_computation_and_drops_missing_pairs() -> None:
    a, b = [110.0, None, 118.0, 104.0], [100.0, 100.0, 105.0, 99.0]
    diffs = [math.log(110 / 100), math.log(118 / 105), math.log(104 / 99)]
    mean, sd = statistics.fmean(diffs), statistics.stdev(diffs)
    got = paired_ratio(a, b)
    assert got.visits == 3 and got.basis == "paired"
    assert got.ratio == pytest.approx(math.exp(mean))
    assert got.ci95_low == pytest.approx(math.exp(mean - 4.302653 * sd / math.sqrt(3)), rel=1e-5)
    assert got.ci95_high == pytest.approx(math.exp(mean + 4.302653 * sd / math.sqrt(3)), rel=1e-5)


def test_an_unmistakable_speedup_from_few_values_is_said_as_what_it_is() -> None:
    # 266/222 vs 114/114 once read "not distinguishable (x2.13 [0.68, 6.71])": two values give no interval
    ratio = unpaired_ratio([266.1, 222.1], [113.8, 114.1])
    assert ratio is not None and not ratio.has_interval and 2.1 < ratio.ratio < 2.2
    three = unpaired_ratio([266.1, 222.1, 250.0], [113.8, 114.1, 114.0])
    assert three.ci95_low > 1.5


def test_decisions_use_the_margin_on_both_sides() -> None:
    assert decide(None, margin=0.01) == "undecided"
    assert decide(paired_ratio([1.2, 1.21, 1.19], [1, 1, 1]), margin=0.01) == "better"
    assert decide(paired_ratio([1.005, 1.006, 1.004], [1, 1, 1]), margin=0.01) == "equivalent"
    assert decide(paired_ratio([1.005, 1.006, 1.004], [1, 1, 1]), margin=0.001) == "better"
    assert decide(paired_ratio([0.8, 0.81, 0.79], [1, 1, 1]), margin=0.01) == "worse"


def test_visits_needed_grow_with_the_spread() -> None:
    narrow = paired_ratio([1.05, 1.06, 1.04], [1, 1, 1])
    wide = paired_ratio([1.05, 1.10, 1.00], [1, 1, 1])
    n_narrow, n_wide = visits_needed(narrow, margin=0.01), visits_needed(wide, margin=0.01)
    assert n_narrow is not None and n_wide is not None and n_wide > n_narrow >= 3
    on_the_boundary = paired_ratio([1.01, 1.02, 1.0], [1, 1, 1])
    assert visits_needed(on_the_boundary, margin=0.01) is None
