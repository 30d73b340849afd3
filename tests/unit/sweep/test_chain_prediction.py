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


def _chain(steps: int, cycle: float, *, tok: float = 100.0, rel: float = 0.02, hist=None, corr: float = 0.0) -> MeasuredChain:
    return MeasuredChain(steps=steps, accept_length=accept_length_from_histogram(HISTOGRAM, steps), cycle_ms=cycle,
                         cycle_rel_se=rel, tok_per_s=tok, tok_rel_se=rel, histogram=hist, tok_cycle_corr=corr)


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


def test_the_interval_is_the_delta_method_over_the_reference_and_every_measured_cycle() -> None:
    """Steps 5 from chains 1 (12 ms) and 6 (22 ms, the reference): the line's value at 6 is cycle(6) and
    at 5 is 0.2 cycle(1) + 0.8 cycle(6), so log line(6) - log line(5) moves with cycle(1) by -0.2/20 per ms
    and with cycle(6) by 1/22 - 0.8/20; the reference's throughput adds its own error, and where its
    repetitions were slow in both throughput and cycle time (correlation -1) the two partly cancel."""
    for corr in (0.0, -1.0):
        measured = [_chain(1, 12.0, tok=150.0), _chain(6, 22.0, tok=180.0, hist=HISTOGRAM, corr=corr)]
        p5 = next(p for p in predict_chains(measured, [5]) if p.steps == 5)
        g1, g6 = -0.2 / 20.0, 1 / 22.0 - 0.8 / 20.0
        ratio = 0.02 ** 2 + (g1 * 0.24) ** 2 + (g6 * 0.44) ** 2 + 2 * g6 * corr * 0.02 * 0.44
        half = 1.959964 * math.sqrt(ratio + ACCEPT_MODEL_REL ** 2 + 0.02 ** 2)
        assert p5.reference_steps == 6
        assert math.log(p5.high / p5.tok_per_s) == pytest.approx(half, rel=1e-9), corr


def test_a_reference_slow_in_both_throughput_and_cycle_time_gives_a_narrower_interval() -> None:
    independent = predict_chains([_chain(1, 12.0, tok=150.0), _chain(6, 22.0, tok=180.0, hist=HISTOGRAM)], [4])[0]
    paired = predict_chains([_chain(1, 12.0, tok=150.0, corr=-0.99),
                             _chain(6, 22.0, tok=180.0, hist=HISTOGRAM, corr=-0.99)], [4])[0]
    assert paired.tok_per_s == pytest.approx(independent.tok_per_s)  # the same prediction
    assert paired.half_width_rel < independent.half_width_rel


@pytest.mark.parametrize("steps", [1, 4])
def test_an_unknown_correlation_takes_the_wider_of_independent_and_paired(steps: int) -> None:
    """From chains 3 and 6: a chain between them (4) is narrower when its reference's errors are paired,
    one beyond them (1) wider (the loading on the reference's cycle changes sign); unknown takes the wider."""
    def half(corr):
        measured = [_chain(3, 16.0, tok=170.0, corr=corr), _chain(6, 22.0, tok=180.0, hist=HISTOGRAM, corr=corr)]
        return predict_chains(measured, [steps])[0].half_width_rel
    independent, paired, unknown = half(0.0), half(-1.0), half(None)
    assert unknown == pytest.approx(max(independent, paired))
    assert (paired < independent) if steps == 4 else (paired > independent)
