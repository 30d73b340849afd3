"""Chains predicted from measured ones: the histogram's accept length, the cycle line, the throughput
interval on the log scale; a measured chain is never replaced and no chain past the histogram is guessed."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from orchestrator.statistics import t975

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


def _time_line(measured, steps):
    """By hand: ms per output token = fixed + slope x decode ms per token (the cycle line's value / accept
    length), through the two measured chains; the prediction at ``steps`` and the fit's parts."""
    line = lambda s: 10.0 + 2.0 * s  # through (1, 12) and (6, 22)
    u = [line(c.steps) / accept_length_from_histogram(HISTOGRAM, c.steps) for c in measured]
    t = [1000.0 / c.tok_per_s for c in measured]
    slope = (t[1] - t[0]) / (u[1] - u[0])
    fixed = t[0] - slope * u[0]
    u_s = line(steps) / accept_length_from_histogram(HISTOGRAM, steps)
    return fixed, slope, u, t, u_s, fixed + slope * u_s


def test_time_per_token_is_a_line_in_decode_time_through_the_measured_chains() -> None:
    """Part of a token's time does not scale with the cycle (prefill, scheduling): ms per token is fitted
    as fixed + slope x (cycle / accept length), so a chain between the measured ones is interpolated, not
    scaled from one of them as if all of its time were decode."""
    measured = [_chain(1, 12.0, tok=150.0), _chain(6, 22.0, tok=180.0, hist=HISTOGRAM)]
    predicted = {p.steps: p for p in predict_chains(measured, range(1, 9))}
    assert sorted(predicted) == [2, 3, 4, 5]  # 1 and 6 measured; 7 and 8 lie past the histogram
    fixed, _slope, _u, _t, _u_s, time_3 = _time_line(measured, 3)
    p3 = predicted[3]
    assert fixed > 0
    assert p3.tok_per_s == pytest.approx(1000.0 / time_3) and p3.fixed_share == pytest.approx(fixed / time_3)
    assert p3.reference_steps == 1 and p3.histogram_steps == 6 and p3.cycle_ms == pytest.approx(16.0)
    scaled = 150.0 * (accept_length_from_histogram(HISTOGRAM, 3) / accept_length_from_histogram(HISTOGRAM, 1)) * (12.0 / 16.0)
    assert p3.tok_per_s < scaled  # the fixed part keeps a shorter chain's gain smaller than the cycle ratio says
    assert 0 < p3.low < p3.tok_per_s < p3.high
    assert math.log(p3.high / p3.tok_per_s) == pytest.approx(math.log(p3.tok_per_s / p3.low))  # symmetric on logs
    assert predicted[5].reference_steps == 6  # the nearest measured chain


def test_a_negative_fixed_part_is_kept_and_no_slope_falls_back_to_scaling_the_nearest_chain() -> None:
    """The fixed part is an estimate: through noisy chains it may come out below zero and is used as fitted
    (a clamp chosen on the estimate would bias the prediction without widening its interval). A fit whose
    slope is not positive (a longer decode time per token that costs no time) describes nothing: the
    throughput is then the nearest measured chain's, scaled by accept length and cycle time."""
    below = [_chain(1, 12.0, tok=100.0), _chain(6, 22.0, tok=300.0, hist=HISTOGRAM)]
    fixed, _slope, _u, _t, _u_s, time_3 = _time_line(below, 3)
    assert fixed < 0
    p3 = predict_chains(below, [3])[0]
    assert p3.tok_per_s == pytest.approx(1000.0 / time_3) and p3.fixed_share == pytest.approx(fixed / time_3)
    no_slope = [_chain(1, 12.0, tok=200.0), _chain(6, 22.0, tok=150.0, hist=HISTOGRAM)]
    assert _time_line(no_slope, 3)[1] < 0
    q3 = predict_chains(no_slope, [3])[0]
    scaled = 200.0 * (accept_length_from_histogram(HISTOGRAM, 3) / accept_length_from_histogram(HISTOGRAM, 1)) * (12.0 / 16.0)
    assert q3.tok_per_s == pytest.approx(scaled) and q3.fixed_share == 0.0
    assert q3.half_width_rel > 1.96 * ACCEPT_MODEL_REL * 0.99  # the model error alone gives this much


def test_three_chains_off_one_line_widen_the_interval_by_their_lack_of_fit() -> None:
    on = [_chain(1, 12.0, tok=150.0), _chain(3, 16.0, tok=1000.0 / _time_line(
        [_chain(1, 12.0, tok=150.0), _chain(6, 22.0, tok=180.0)], 3)[5]), _chain(6, 22.0, tok=180.0, hist=HISTOGRAM)]
    off = [on[0], MeasuredChain(**{**on[1].__dict__, "tok_per_s": on[1].tok_per_s * 1.15}), on[2]]
    width_on = predict_chains(on, [4])[0].half_width_rel
    width_off = predict_chains(off, [4])[0].half_width_rel
    assert width_off > 1.5 * width_on


def test_no_histogram_no_prediction() -> None:
    with pytest.raises(ValueError, match="histogram"):
        predict_chains([_chain(1, 12.0), _chain(6, 22.0)], [3])


def test_the_interval_is_the_delta_method_over_every_measured_chain() -> None:
    """Only chain 6's throughput uncertain (2%): the prediction at 4 moves with log tok(6) by
    (t6 / t(4)) x w, w = (u4 - u1) / (u6 - u1) its weight in the interpolation; the accept model's error
    reaches it through the share of the token's time that scales with the cycle; a new measurement's noise
    is the measured chains' RMS spread."""
    measured = [_chain(1, 12.0, tok=150.0, rel=0.0), _chain(6, 22.0, tok=180.0, hist=HISTOGRAM, rel=0.0)]
    measured[1] = MeasuredChain(**{**measured[1].__dict__, "tok_rel_se": 0.02})
    fixed, slope, u, t, u_s, time_s = _time_line(measured, 4)
    p4 = predict_chains(measured, [4])[0]
    weight = (u_s - u[0]) / (u[1] - u[0])
    chains = (t[1] / time_s * weight * 0.02) ** 2
    accept = (slope * u_s / time_s * ACCEPT_MODEL_REL) ** 2
    noise = (0.02 ** 2 + 0.0) / 2
    dof = (chains + accept + noise) ** 2 / (chains ** 2 / 2 + noise ** 2 / 4)  # Welch-Satterthwaite: 2 per chain
    assert p4.dof == pytest.approx(dof, rel=1e-4)
    assert math.log(p4.high / p4.tok_per_s) == pytest.approx(t975(dof) * math.sqrt(chains + accept + noise), rel=1e-4)


def test_a_chain_slow_in_both_throughput_and_cycle_time_gives_a_narrower_interval_between_them() -> None:
    independent = predict_chains([_chain(1, 12.0, tok=150.0), _chain(6, 22.0, tok=180.0, hist=HISTOGRAM)], [4])[0]
    paired = predict_chains([_chain(1, 12.0, tok=150.0, corr=-0.99),
                             _chain(6, 22.0, tok=180.0, hist=HISTOGRAM, corr=-0.99)], [4])[0]
    assert paired.tok_per_s == pytest.approx(independent.tok_per_s)  # the same prediction
    assert paired.half_width_rel < independent.half_width_rel


@pytest.mark.parametrize("steps", [4, 5])
def test_an_unknown_correlation_takes_the_wider_of_independent_and_paired(steps: int) -> None:
    """From chains 3 and 6 (throughputs on a token-time line: 1 ms fixed + decode time per token) the chains
    between them: unknown takes the wider of independent and fully paired."""
    def tok(steps_: int, cycle: float) -> float:
        return 1000.0 / (1.0 + cycle / accept_length_from_histogram(HISTOGRAM, steps_))

    def half(corr):
        measured = [_chain(3, 11.0, tok=tok(3, 11.0), corr=corr), _chain(6, 14.0, tok=tok(6, 14.0), hist=HISTOGRAM, corr=corr)]
        return predict_chains(measured, [steps])[0].half_width_rel
    independent, paired, unknown = half(0.0), half(-1.0), half(None)
    assert unknown == pytest.approx(max(independent, paired))
    assert independent != pytest.approx(paired)


def test_a_measured_start_to_start_spread_widens_the_interval_by_every_start_it_rests_on() -> None:
    """Each measured chain is one engine start and so is the start the interval is for: a known spread
    between starts (the confirmation's) adds at least the new start's own, and the measured chains' through
    the prediction's loading on them (an engine landing faster moves its throughput up and its cycle down)."""
    measured = [_chain(1, 12.0, tok=150.0), _chain(6, 22.0, tok=180.0, hist=HISTOGRAM)]
    base = predict_chains(measured, [3])[0]
    wide = predict_chains(measured, [3], start_rel=0.05)[0]
    assert wide.tok_per_s == pytest.approx(base.tok_per_s)
    grown = math.log(wide.high / wide.tok_per_s) ** 2 - math.log(base.high / base.tok_per_s) ** 2
    assert grown > (1.959964 * 0.05) ** 2 * 1.2  # the new start's, and the measured chains' on top
    assert predict_chains(measured, [3], start_rel=0.0)[0].half_width_rel == pytest.approx(base.half_width_rel)


def test_nothing_is_predicted_below_the_shortest_measured_chain() -> None:
    """From chains 3 and 6 the line and the nearest chain scaled whole both pass through the measured chains,
    and the two cannot say which holds below them: steps 1 and 2 are not predicted (the opening measures the
    shortest chain instead); steps 4 and 5, between them, are."""
    measured = [_chain(3, 16.0, tok=178.5, rel=0.005), _chain(6, 22.0, tok=180.0, rel=0.005, hist=HISTOGRAM)]
    assert sorted(p.steps for p in predict_chains(measured, range(1, 7))) == [4, 5]


def test_the_interval_takes_t_at_the_degrees_of_freedom_of_its_variance() -> None:
    """Chains of 3 repetitions give their spread 2 degrees of freedom each: with no start spread and a
    negligible model error the interval's quantile is t at the Welch-Satterthwaite df of a few such parts,
    far above 1.96; a prior start spread (known) dominating the variance takes the quantile toward 1.96."""
    measured = [_chain(1, 12.0, tok=150.0), _chain(6, 22.0, tok=180.0, hist=HISTOGRAM)]
    alone = predict_chains(measured, [3], accept_model_rel=0.0)[0]
    assert 2.0 <= alone.dof <= 8.0
    with_prior = predict_chains(measured, [3], accept_model_rel=0.0, start_rel=0.2)[0]
    assert with_prior.dof > 50 * alone.dof
    rel = [math.log(p.high / p.tok_per_s) for p in (alone, with_prior)]
    assert rel[1] > rel[0]  # the start's spread is carried
    few = [replace(c, dof=1.0) for c in measured]
    assert predict_chains(few, [3], accept_model_rel=0.0)[0].half_width_rel > alone.half_width_rel
