"""Chains predicted from measured ones: the histogram's accept length, the cycle line, the throughput
interval on the log scale; a measured chain is never replaced and no chain past the histogram is guessed."""

from __future__ import annotations

import math

import pytest

from orchestrator.sweep.search.chain_prediction import (
    ACCEPT_MODEL_REL,
    MeasuredChain,
    accept_length_from_histogram,
    cycle_line,
    predict_chains,
)

# steps 6: 10 cycles accepted 0 drafts, 20 one, ..., 40 all six
HISTOGRAM = (10, 20, 15, 10, 5, 0, 40)


def test_the_histogram_predicts_every_shorter_chain() -> None:
    cycles = sum(HISTOGRAM)
    assert accept_length_from_histogram(HISTOGRAM, 6) == pytest.approx(1 + (20 + 30 + 30 + 20 + 0 + 240) / cycles)
    # a chain of 2 steps accepts min(k, 2) drafts of each cycle
    assert accept_length_from_histogram(HISTOGRAM, 2) == pytest.approx(1 + (20 * 1 + (15 + 10 + 5 + 0 + 40) * 2) / cycles)
    assert accept_length_from_histogram(HISTOGRAM, 1) == pytest.approx(1 + (cycles - 10) / cycles)
    with pytest.raises(ValueError):
        accept_length_from_histogram((), 3)


def _chain(steps: int, cycle: float, *, tok: float = 100.0, rel: float = 0.02, hist=None) -> MeasuredChain:
    return MeasuredChain(steps=steps, accept_length=accept_length_from_histogram(HISTOGRAM, steps), cycle_ms=cycle,
                         cycle_rel_se=rel, tok_per_s=tok, tok_rel_se=rel, histogram=hist)


def test_the_cycle_line_goes_through_two_chains_and_weighs_more() -> None:
    (a, b), cov = cycle_line([_chain(1, 12.0), _chain(6, 22.0)])
    assert (a, b) == pytest.approx((10.0, 2.0))
    assert cov[1][1] > 0 and cov[0][1] < 0  # slope and intercept trade off
    (a3, b3), _ = cycle_line([_chain(1, 12.0), _chain(3, 16.0), _chain(6, 22.0)])
    assert (a3, b3) == pytest.approx((10.0, 2.0))  # on the line: no residual to scale by
    with pytest.raises(ValueError, match="at least two lengths"):
        cycle_line([_chain(3, 16.0), _chain(3, 17.0)])


def test_predictions_scale_the_nearest_measured_chain_and_carry_an_interval() -> None:
    measured = [_chain(1, 12.0, tok=150.0), _chain(6, 22.0, tok=180.0, hist=HISTOGRAM)]
    predicted = {p.steps: p for p in predict_chains(measured, range(1, 9))}
    assert sorted(predicted) == [2, 3, 4, 5]  # 1 and 6 measured; 7 and 8 lie past the histogram
    p3 = predicted[3]
    expected = 150.0 * (accept_length_from_histogram(HISTOGRAM, 3) / accept_length_from_histogram(HISTOGRAM, 1)) \
        * (12.0 / 16.0)
    assert p3.reference_steps == 1 and p3.histogram_steps == 6 and p3.tok_per_s == pytest.approx(expected)
    assert 0 < p3.low < p3.tok_per_s < p3.high
    assert math.log(p3.high / p3.tok_per_s) == pytest.approx(math.log(p3.tok_per_s / p3.low))  # symmetric on logs
    assert p3.half_width_rel > 1.96 * ACCEPT_MODEL_REL * 0.99  # the model error alone gives this much
    assert predicted[5].reference_steps == 6  # the nearest measured chain


def test_no_histogram_no_prediction() -> None:
    with pytest.raises(ValueError, match="histogram"):
        predict_chains([_chain(1, 12.0), _chain(6, 22.0)], [3])
