"""The three rules that decide under noise, against hand-computed values: warm-up stability, the
adaptive stop, the drift test; and the spec fields that configure them."""

from __future__ import annotations

import math

import pytest

from orchestrator.bench.loadgen import RequestRecord
from orchestrator.bench.metrics import compute_repetition_metrics
from orchestrator.bench.noise import ci_rel, detect_drift, relative_difference, repetition_verdict, windows_stable
from orchestrator.bench.report import summarise_level
from orchestrator.bench.settings import BenchSettings
from orchestrator.spec_benchmark import BenchmarkSpec, WarmupSpec
from orchestrator.errors import SpecError
from orchestrator.spec import SweepSpec

# --- warm-up stability -------------------------------------------------------------------------


def test_relative_difference_is_symmetric_and_relative_to_the_larger() -> None:
    assert relative_difference(100, 104) == pytest.approx(4 / 104)
    assert relative_difference(104, 100) == pytest.approx(4 / 104)
    assert relative_difference(0, 0) == 0.0


@pytest.mark.parametrize(
    ("throughputs", "stable"),
    [
        ([100.0, 104.0], True),  # 4 / 104 = 0.038 <= 0.05
        ([100.0, 106.0], False),  # 6 / 106 = 0.057 > 0.05
        ([100.0, 95.0], True),  # exactly 5 / 100 = 0.05: within
        ([50.0, 100.0, 103.0], True),  # only the last two count
        ([100.0, 103.0, 50.0], False),
        ([100.0], False),  # one window cannot agree with anything
        ([], False),
        ([None, 100.0], False),  # a window whose every request failed
        ([0.0, 0.0], False),  # nothing served is not warmth
    ],
)
def test_windows_stable(throughputs: list[float | None], stable: bool) -> None:
    assert windows_stable(throughputs, tolerance=0.05) is stable


def test_window_size_defaults_to_two_rounds_of_the_level() -> None:
    assert WarmupSpec().window_size(1) == 4 and WarmupSpec().window_size(2) == 4
    assert WarmupSpec().window_size(8) == 16
    assert WarmupSpec(window_requests=6).window_size(8) == 6


# --- the adaptive stop -------------------------------------------------------------------------


def test_ci_rel_by_hand() -> None:
    # 100, 110, 121: stdev(log x) = log 1.1 = 0.0953102, t(0.975, 2) = 4.302653:
    # exp(4.302653 * 0.0953102 / sqrt(3)) - 1 = exp(0.236764) - 1 = 0.267142
    assert ci_rel([100.0, 110.0, 121.0]) == pytest.approx(math.exp(4.302653 * math.log(1.1) / math.sqrt(3)) - 1, rel=1e-6)
    assert ci_rel([100.0, 110.0, 121.0]) == pytest.approx(0.267142, rel=1e-5)
    # stdev(log x) = 0.0200030 (about 2 / 100): exp(4.302653 * 0.0200030 / sqrt(3)) - 1 = 0.0509455
    assert ci_rel([100.0, 102.0, 98.0]) == pytest.approx(0.0509455, rel=1e-5)
    # stdev(log x) = 0.00707136, t(0.975, 4) = 2.776445: exp(2.776445 * 0.00707136 / sqrt(5)) - 1 = 0.0088189
    assert ci_rel([100.0, 101.0, 99.0, 100.0, 100.0]) == pytest.approx(0.0088189, rel=1e-4)
    assert ci_rel([100.0, None, 102.0, 98.0]) == ci_rel([100.0, 102.0, 98.0])  # absent values left out
    assert ci_rel([5.0, 5.0, 5.0]) == 0.0
    assert ci_rel([100.0]) is None and ci_rel([]) is None


def test_ci_rel_needs_three_positive_values() -> None:
    assert ci_rel([5.0, 5.0]) is None and ci_rel([266.0, 222.0]) is None  # no interval from 2 values
    assert ci_rel([100.0, None, 102.0]) is None  # two present values
    assert ci_rel([100.0, 0.0, 102.0]) is None  # a repetition that served nothing: no interval
    assert ci_rel([-1.0, 0.0, 1.0]) is None


def test_ci_rel_is_the_summary_interval_as_one_number() -> None:
    """The stopping rule and the level's ci95 in the JSON are one interval: [g / (1 + w), g * (1 + w)]."""
    from orchestrator.bench.metrics import Distribution

    values = [559.0, 646.0, 622.0, 637.0, 625.0]
    d, w = Distribution.of(values), ci_rel(values)
    assert d.ci95_high == pytest.approx(d.geomean * (1 + w)) and d.ci95_low == pytest.approx(d.geomean / (1 + w))


def test_a_level_goes_on_while_its_interval_is_wider_than_the_target() -> None:
    verdict = repetition_verdict([100.0, 102.0, 98.0], min_repetitions=3, max_repetitions=10, target_ci_rel=0.02)
    assert not verdict.stop and verdict.target_met is False
    assert verdict.ci_rel == pytest.approx(0.0509455, rel=1e-5)


def test_a_level_stops_at_the_target() -> None:
    verdict = repetition_verdict([100.0, 101.0, 99.0, 100.0, 100.0], min_repetitions=3, max_repetitions=10,
                                 target_ci_rel=0.02)
    assert verdict.stop and verdict.target_met is True and verdict.ci_rel == pytest.approx(0.0088189, rel=1e-4)


def test_a_level_never_stops_before_its_minimum() -> None:
    verdict = repetition_verdict([100.0] * 3, min_repetitions=4, max_repetitions=10, target_ci_rel=0.02)
    assert not verdict.stop and verdict.ci_rel == 0.0 and verdict.target_met is True


def test_a_level_never_stops_on_two_values_whatever_its_minimum() -> None:
    """Two equal values once gave a zero-width interval and stopped a level at min_repetitions 2."""
    verdict = repetition_verdict([100.0, 100.0], min_repetitions=1, max_repetitions=10, target_ci_rel=0.02)
    assert not verdict.stop and verdict.ci_rel is None and verdict.target_met is False
    third = repetition_verdict([100.0, 100.0, 100.0], min_repetitions=1, max_repetitions=10, target_ci_rel=0.02)
    assert third.stop and third.target_met is True


def test_a_repetition_without_throughput_keeps_the_level_going_to_the_cap() -> None:
    values = [100.0, 0.0, 100.0, 100.0]
    assert not repetition_verdict(values, min_repetitions=3, max_repetitions=5, target_ci_rel=0.02).stop
    capped = repetition_verdict([*values, 100.0], min_repetitions=3, max_repetitions=5, target_ci_rel=0.02)
    assert capped.stop and capped.target_met is False and capped.ci_rel is None


def test_a_level_stops_at_the_cap_with_the_target_not_met() -> None:
    verdict = repetition_verdict([100.0, 102.0, 98.0], min_repetitions=2, max_repetitions=3, target_ci_rel=0.02)
    assert verdict.stop and verdict.target_met is False
    absent = repetition_verdict([None, None, None], min_repetitions=2, max_repetitions=3, target_ci_rel=0.02)
    assert absent.stop and absent.ci_rel is None and absent.target_met is False


def test_without_a_target_the_count_is_fixed() -> None:
    assert not repetition_verdict([100.0] * 4, min_repetitions=3, max_repetitions=5, target_ci_rel=None).stop
    done = repetition_verdict([100.0] * 5, min_repetitions=3, max_repetitions=5, target_ci_rel=None)
    assert done.stop and done.target_met is None and done.ci_rel == 0.0


# --- drift -------------------------------------------------------------------------------------


def test_strictly_rising_repetitions_drift_up() -> None:
    # S = 10 of 10 pairs; two of the 5! orders are this extreme: p = 2/120
    drift = detect_drift([121.0, 128.0, 135.0, 141.0, 148.0], metric="output_tok_per_s")
    assert drift.direction == "up" and drift.tau == pytest.approx(1.0) and drift.p_value == pytest.approx(2 / 120)
    assert drift.drifts and drift.test == "mann-kendall" and drift.num_values == 5
    assert detect_drift([5.0, 4.0, 3.0, 2.0, 1.0], metric="m").direction == "down"


def test_one_inversion_in_six_still_drifts() -> None:
    # tau = (15 - 2 * 1) / 15; orders of 6 with at most one inversion: 1 + 5 = 6 of 720, both tails: 12/720
    drift = detect_drift([1.0, 3.0, 2.0, 4.0, 5.0, 6.0], metric="m")
    assert drift.tau == pytest.approx(13 / 15) and drift.p_value == pytest.approx(12 / 720)
    assert drift.direction == "up"


def test_a_cold_first_repetition_is_not_a_trend() -> None:
    # ref-gpu-comm on one H200, concurrency 8, 64 x 256-token repetitions (the first one cold):
    # S = 4 - 3 + 2 - 1 = 2, i.e. 4 inversions; P(k <= 4) = (1+4+9+15+20)/120, both tails
    drift = detect_drift([559.0, 646.0, 622.0, 637.0, 625.0], metric="output_tok_per_s")
    assert drift.tau == pytest.approx(0.2) and drift.p_value == pytest.approx(98 / 120)
    assert drift.direction is None and not drift.drifts


def test_too_few_or_equal_values_are_not_a_trend() -> None:
    four = detect_drift([1.0, 2.0, 3.0, 4.0], metric="m")  # its smallest p is 2/24 > 0.05: untested
    assert four.p_value is None and four.direction is None and four.num_values == 4
    assert detect_drift([1.0, None, 2.0, 3.0, 4.0], metric="m").p_value is None  # four present values
    flat = detect_drift([3.0] * 5, metric="m")
    assert flat.p_value == 1.0 and flat.tau is None and flat.direction is None


def test_a_level_summary_carries_the_target_and_the_drift() -> None:
    reps = [
        compute_repetition_metrics(
            records=[RequestRecord(index=0, prompt_id="p", output_tokens=100, ttft_ms=1.0, e2e_ms=10.0)],
            duration_s=100 / rate, concurrency=1, repetition=i, request_rate=None, accept_length_server=None,
            accept_length_tolerance=0.1,
        )
        for i, rate in enumerate([121.0, 128.0, 135.0, 141.0, 148.0])
    ]
    level = summarise_level(concurrency=1, request_rate=None, repetitions=reps, noise_metrics=[],
                            noisy_cv_threshold=0.05, target_metric="output_tok_per_s", target_ci_rel=0.02)
    assert level.repetitions_used == 5 and level.target_metric == "output_tok_per_s"
    assert level.ci_rel == pytest.approx(ci_rel([121.0, 128.0, 135.0, 141.0, 148.0]))
    assert level.target_met is False and level.ci_rel > 0.02
    assert level.drifts and level.drift.direction == "up"
    fixed = summarise_level(concurrency=1, request_rate=None, repetitions=reps[:2], noise_metrics=[],
                            noisy_cv_threshold=0.05)
    assert fixed.target_met is None and fixed.drift.p_value is None


# --- the spec fields ---------------------------------------------------------------------------


def test_repetitions_is_the_cap_and_min_repetitions_defaults_below_it() -> None:
    assert BenchmarkSpec().repetition_bounds() == (3, 10)
    assert BenchmarkSpec(repetitions=2).repetition_bounds() == (2, 2)  # the default minimum, capped
    assert BenchmarkSpec(repetitions=8, min_repetitions=5).repetition_bounds() == (5, 8)
    # an interval needs 3 values: a smaller minimum acts as 3 (capped at repetitions)
    assert BenchmarkSpec(repetitions=8, min_repetitions=1).repetition_bounds() == (3, 8)
    assert BenchmarkSpec(repetitions=2, min_repetitions=1).repetition_bounds() == (2, 2)
    assert BenchmarkSpec(repetitions=8, target_ci_rel=None).repetition_bounds() == (8, 8)  # fixed


def test_a_minimum_above_the_cap_is_refused_naming_both() -> None:
    with pytest.raises(ValueError, match=r"min_repetitions \(4\) is above repetitions \(3\), the most repetitions"):
        BenchmarkSpec(repetitions=3, min_repetitions=4)


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"target_ci_rel": 0}, "target_ci_rel"),
        ({"target_ci_rel": 1.5}, "target_ci_rel"),
        ({"min_repetitions": 0}, "min_repetitions"),
        ({"min_repetitions": True}, "min_repetitions"),  # strict: not read as 1
        ({"warmup": {"tolerance": 0}}, "tolerance"),
        ({"warmup": {"max_windows": 1}}, "max_windows"),  # one window cannot agree with another
        ({"warmup": {"window_requests": 0}}, "window_requests"),
        ({"warmup": {"windows": 3}}, "windows"),  # a typo
    ],
)
def test_new_fields_are_strict_and_bounded(fields: dict, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        BenchmarkSpec(**fields)


def test_target_metric_is_an_objective_metric() -> None:
    assert BenchSettings().target_metric == "output_tok_per_s"
    assert BenchSettings.from_spec(BenchmarkSpec(), target_metric="tpot_ms_p99").target_metric == "tpot_ms_p99"
    with pytest.raises(ValueError, match="unknown metric 'tok_per_s'; allowed: output_tok_per_s"):
        BenchSettings(target_metric="tok_per_s")


def test_every_new_field_has_a_description() -> None:
    for model in (BenchmarkSpec, BenchSettings, WarmupSpec):
        for name in ("warmup", "min_repetitions", "target_ci_rel", "target_metric", "window_requests", "tolerance",
                     "max_windows"):
            field = model.model_fields.get(name)
            if field is not None:
                assert field.description, f"{model.__name__}.{name}"


def test_the_shipped_experiments_still_validate() -> None:
    from pathlib import Path

    experiments = sorted((Path(__file__).resolve().parents[3] / "experiments").glob("*.yaml"))
    assert experiments
    for path in experiments:
        try:
            spec = SweepSpec.from_yaml(path)
        except SpecError as exc:  # pragma: no cover - the failure message is the point
            pytest.fail(f"{path.name}: {exc}")
        fewest, most = spec.benchmark.repetition_bounds()
        assert most == spec.benchmark.repetitions and fewest <= most
