"""The statistics a user acts on, against hand-computed values: log-scale intervals (never
negative), no interval from fewer than 3 values, unpaired ratios. The verdict's rule is tested in
test_sequential.py."""

from __future__ import annotations

import math
import statistics

import pytest

from orchestrator.statistics import MIN_VALUES, log_interval, unpaired_ratio


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


def test_an_unmistakable_speedup_from_few_values_is_said_as_what_it_is() -> None:
    # 266/222 vs 114/114 once read "not distinguishable (x2.13 [0.68, 6.71])": two values give no interval
    ratio = unpaired_ratio([266.1, 222.1], [113.8, 114.1])
    assert ratio is not None and not ratio.has_interval and 2.1 < ratio.ratio < 2.2
    three = unpaired_ratio([266.1, 222.1, 250.0], [113.8, 114.1, 114.0])
    assert three.ci95_low > 1.5
