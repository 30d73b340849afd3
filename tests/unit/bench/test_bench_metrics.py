"""Metric math against hand-computed values, and the shape of what the sweep reads."""

from __future__ import annotations

import math
import statistics

import pytest

from orchestrator.bench.loadgen import RequestRecord
from orchestrator.bench.metrics import (
    METRICS,
    Distribution,
    accept_length_agrees,
    accept_length_requests,
    accepted_drafts_per_cycle,
    compute_repetition_metrics,
    cycle_ms,
    error_counts,
    output_tok_per_s,
    output_tokens,
    percentile,
    request_per_s,
    spec_accept_length_meta,
    tokens_per_chunk,
    tpot_ms,
)
from orchestrator.spec_benchmark import OBJECTIVE_METRICS
from orchestrator.statistics import t975


def rec(index: int = 0, **fields) -> RequestRecord:
    return RequestRecord(index=index, prompt_id=f"p{index}", **fields)


# Two speculative requests, hand-computed:
#   A: 11 tokens, 4 verify cycles, TTFT 100 ms, e2e 300 ms, 5 chunks
#   B: 21 tokens, 8 verify cycles, TTFT 200 ms, e2e 600 ms, 9 chunks
A = rec(0, output_tokens=11, spec_verify_ct=4, ttft_ms=100.0, e2e_ms=300.0, num_chunks=5, prompt_tokens=7)
B = rec(1, output_tokens=21, spec_verify_ct=8, ttft_ms=200.0, e2e_ms=600.0, num_chunks=9, prompt_tokens=9)
FAILED = rec(2, error="HTTP 500: boom", error_kind="http_5xx", output_tokens=5, e2e_ms=5.0)
DROPPED = rec(3, error="cut", error_kind="dropped_stream", e2e_ms=50.0)


def test_percentile_interpolates_linearly() -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 50) == 2.5
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 4.0
    assert percentile(values, 90) == pytest.approx(3.7)  # position 2.7
    assert percentile([5.0], 99) == 5.0


def test_distribution_by_hand() -> None:
    d = Distribution.of([2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0])
    assert d.count == 8 and d.mean == 5.0 and d.median == 4.5
    assert d.min == 2.0 and d.max == 9.0
    stdev = math.sqrt(32 / 7)
    assert d.stdev == pytest.approx(stdev)
    assert d.cv == pytest.approx(stdev / 5.0)
    assert d.mad == pytest.approx(0.5)  # |x - 4.5| = 2.5 .5 .5 .5 .5 .5 2.5 4.5 -> median 0.5
    # the interval is of the geometric mean, on the logs: mean(log x) = log 4.603216, stdev(log x) = 0.446091
    half = 2.364624 * 0.446091 / math.sqrt(8)  # t(0.975, 7), exact to 6 decimals (tables round it to 2.365)
    assert d.geomean == pytest.approx(4.603216, rel=1e-6)
    assert d.ci95_low == pytest.approx(4.603216 * math.exp(-half), rel=1e-5)  # 3.170259
    assert d.ci95_high == pytest.approx(4.603216 * math.exp(half), rel=1e-5)  # 6.683868


def test_interval_of_the_geometric_mean_by_hand() -> None:
    """100, 110, 121: log x = log 100 + (0, 1, 2) * log 1.1, so the geometric mean is 110 and
    stdev(log x) = log 1.1; half-width t(0.975, 2) * log 1.1 / sqrt(3) = 4.302653 * 0.0953102 / 1.7320508
    = 0.236764 on the log scale: [110 / e^0.236764, 110 * e^0.236764] = [86.80956, 139.38557]."""
    d = Distribution.of([121.0, 100.0, 110.0])
    assert d.geomean == pytest.approx(110.0)
    assert d.ci95_low == pytest.approx(86.80956, rel=1e-6) and d.ci95_high == pytest.approx(139.38557, rel=1e-6)
    assert d.ci95_low * d.ci95_high == pytest.approx(110.0**2)  # symmetric about the geometric mean in ratio terms
    assert d.mean == pytest.approx(110.333333) and d.median == 110.0  # the plain summaries are unchanged


def test_no_interval_from_two_values() -> None:
    """Two repetitions of 266 and 222 tok/s once gave the arithmetic interval [-35.2, 523.4]."""
    two = Distribution.of([266.0, 222.0])
    assert two.ci95_low is None and two.ci95_high is None
    assert two.stdev == pytest.approx(math.sqrt(968.0)) and two.geomean == pytest.approx(math.sqrt(266.0 * 222.0))


@pytest.mark.parametrize(
    "values",
    [[266.0, 222.0, 240.0], [1.0, 1000.0, 1.0], [0.001, 50.0, 3.0, 7.0], [5.0, 5.0, 5.0], [1e-9, 1e9, 1.0]],
)
def test_a_positive_metric_never_gets_a_negative_lower_end(values: list[float]) -> None:
    """Spreads where mean - t * stdev / sqrt(n) is far below 0 (e.g. [1, 1000, 1]: 334 - 4.30 * 576.5 / 1.73)."""
    d = Distribution.of(values)
    assert d.ci95_low is not None and d.ci95_high is not None
    assert 0 < d.ci95_low <= d.geomean <= d.ci95_high


def test_a_sample_with_a_zero_or_negative_value_gets_no_interval() -> None:
    """No geometric mean exists; an interval over the positive values only would describe another sample."""
    for values in ([0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 2.0, 3.0], [-1.0, 2.0, 3.0]):
        d = Distribution.of(values)
        assert d.geomean is None and d.ci95_low is None and d.ci95_high is None, values
        assert d.stdev is not None and d.median is not None  # the rest of the summary stands


@pytest.mark.parametrize(
    ("df", "expected"),
    [(1, 12.706), (7, 2.365), (30, 2.042), (31, 2.040), (40, 2.021), (60, 2.000), (120, 1.980), (1000, 1.962)],
)
def test_t_quantile_is_exact_beyond_the_old_table(df: int, expected: float) -> None:
    """t(0.975, df) from published tables (3 decimals); a table that stopped at df 30 gave 1.96 for 31+."""
    assert round(t975(df), 3) == expected


def test_interval_of_61_values_uses_t_60_not_the_normal_quantile() -> None:
    values = [float(i % 7 + 1) for i in range(61)]  # df = 60: t = 2.000, not 1.96
    d = Distribution.of(values)
    half = math.log(d.ci95_high / d.ci95_low) / 2  # on the log scale
    log_sd = statistics.stdev(math.log(v) for v in values)
    assert half == pytest.approx(2.000297821 * log_sd / math.sqrt(61))
    with pytest.raises(ValueError, match="df must be >= 1"):
        t975(0)


def test_distribution_small_samples() -> None:
    empty = Distribution.of([])
    assert empty.count == 0 and empty.median is None and empty.cv is None
    one = Distribution.of([3.0])
    assert one.median == one.p99 == 3.0 and one.mad == 0.0
    assert one.stdev is None and one.cv is None and one.ci95_low is None
    assert one.geomean == pytest.approx(3.0)
    zero_mean = Distribution.of([-1.0, 1.0])
    assert zero_mean.cv is None


def test_throughput_counts_server_tokens_of_successful_requests_only() -> None:
    records = [A, B, FAILED, DROPPED]
    assert output_tokens(records) == 32
    assert output_tok_per_s(records, 2.0) == 16.0
    assert request_per_s(records, 2.0) == 1.0
    assert error_counts(records) == {"dropped_stream": 1, "http_5xx": 1}


def test_unknown_token_count_is_absent_not_partial() -> None:
    assert output_tokens([A, rec(5, ttft_ms=1.0, e2e_ms=2.0)]) is None
    assert output_tok_per_s([A, rec(5)], 1.0) is None


def test_tpot_excludes_the_first_token() -> None:
    d = tpot_ms([A, B, FAILED, rec(6, output_tokens=1, ttft_ms=5.0, e2e_ms=5.0)])
    # A: (300 - 100) / 10 = 20; B: (600 - 200) / 20 = 20; 1-token request excluded
    assert d.count == 2 and d.median == 20.0


def test_tokens_per_chunk() -> None:
    assert tokens_per_chunk([A, B]) == pytest.approx(32 / 14)
    assert tokens_per_chunk([rec(0, output_tokens=3)]) is None  # not streamed


def test_accept_length_definitions() -> None:
    # ours: (11 + 21 - 2) / (4 + 8) = 2.5 ; SGLang's per-request one counts prefill: 32 / 12
    assert accept_length_requests([A, B, FAILED]) == pytest.approx(2.5)
    assert spec_accept_length_meta([A, B]) == pytest.approx(32 / 12)
    assert accepted_drafts_per_cycle(2.5) == pytest.approx(1.5)
    assert accepted_drafts_per_cycle(None) is None
    # cycle: (200 + 400) / 12 = 50 ms
    assert cycle_ms([A, B]) == pytest.approx(50.0)


def test_speculative_metrics_absent_without_spec_fields() -> None:
    plain = [rec(0, output_tokens=10, ttft_ms=1.0, e2e_ms=10.0, num_chunks=10)]
    assert accept_length_requests(plain) is None
    assert spec_accept_length_meta(plain) is None
    assert cycle_ms(plain) is None
    # a speculative request that never reached a verify cycle: nothing to divide by
    assert accept_length_requests([rec(0, output_tokens=1, spec_verify_ct=0)]) is None


def test_accept_length_agreement() -> None:
    assert accept_length_agrees(server=2.6, requests=2.5, tolerance=0.1) is True
    assert accept_length_agrees(server=3.0, requests=2.5, tolerance=0.1) is False
    assert accept_length_agrees(server=None, requests=2.5, tolerance=0.1) is None
    assert accept_length_agrees(server=2.5, requests=None, tolerance=0.1) is None
    # counters reset: server_before plays no part
    assert accept_length_agrees(server=3.0, requests=2.5, server_before=3.0, tolerance=0.1) is False
    # lifetime counters: the mean after moved from the mean before towards this repetition's
    lifetime = dict(requests=2.5, server_before=3.0, tolerance=0.1, lifetime=True)
    assert accept_length_agrees(server=2.7, **lifetime) is True
    assert accept_length_agrees(server=2.5, **lifetime) is True
    assert accept_length_agrees(server=2.3, **lifetime) is True  # within slack of 2.5
    assert accept_length_agrees(server=3.2, **lifetime) is False  # moved away from 2.5
    assert accept_length_agrees(server=3.6, **lifetime) is False
    assert accept_length_agrees(server=1.9, **lifetime) is False
    # the lifetime mean already agreed: it need not move
    assert accept_length_agrees(server=2.6, requests=2.5, server_before=2.6, tolerance=0.1, lifetime=True) is True
    # nothing counted before: the lifetime mean after covers this repetition
    assert accept_length_agrees(server=2.6, requests=2.5, server_before=None, tolerance=0.1, lifetime=True) is True
    assert accept_length_agrees(server=4.5, requests=2.5, server_before=None, tolerance=0.1, lifetime=True) is False


@pytest.mark.parametrize(("server", "requests"), [(4.5, 3.0), (0.92, 1.92)])
def test_lifetime_counters_that_never_move_never_agree(server: float, requests: float) -> None:
    """A server reporting the same wrong figure before and after is a mismatch once the repetition
    spanned a fold of its counters, and "not checkable" otherwise: never "agrees"."""
    same = dict(server=server, requests=requests, server_before=server, tolerance=0.1, lifetime=True)
    assert accept_length_agrees(**same) is None  # fold interval unknown
    assert accept_length_agrees(**same, decode_steps=39, update_interval=40) is None  # maybe no fold yet
    assert accept_length_agrees(**same, decode_steps=40, update_interval=40) is False
    # a change at float-noise level is no movement
    almost = dict(same, server=server + (requests - server) * 1e-12)
    assert accept_length_agrees(**almost, decode_steps=40, update_interval=40) is False
    assert accept_length_agrees(**almost) is None


def test_lifetime_server_value_is_never_the_repetitions_figure() -> None:
    m = compute_repetition_metrics(
        records=[A, B], duration_s=1.0, concurrency=1, repetition=0, request_rate=None,
        accept_length_server=2.6, accept_length_server_before=2.8, server_counters_reset=False,
        accept_length_tolerance=0.1,
    )
    assert m.accept_length_server is None and m.accept_length_server_lifetime == 2.6
    assert m.accept_length == pytest.approx(2.5) and m.accept_length_mismatch is False
    assert m.accept_length_check == "agrees"


def test_lifetime_server_value_that_did_not_move() -> None:
    """A (4.5 before, 4.5 after) lifetime mean against 2.5 from the requests: A and B had 4 and
    8 verify cycles, so the repetition had at least 8 decode steps."""
    common = dict(records=[A, B], duration_s=1.0, concurrency=1, repetition=0, request_rate=None,
                  accept_length_server=4.5, accept_length_server_before=4.5, server_counters_reset=False,
                  accept_length_tolerance=0.1)
    folded = compute_repetition_metrics(**common, server_update_interval=8)
    assert folded.accept_length_mismatch is True and folded.accept_length_check == "mismatch"
    unknown = compute_repetition_metrics(**common, server_update_interval=40)
    assert unknown.accept_length_mismatch is None and unknown.accept_length_check == "not_checkable"
    assert compute_repetition_metrics(**common).accept_length_check == "not_checkable"
    # one source absent: nothing to check, which is not "not checkable"
    absent = compute_repetition_metrics(**dict(common, accept_length_server=None))
    assert absent.accept_length_check is None and absent.accept_length_mismatch is None


def test_open_loop_queue_delay_is_reported_and_inside_the_latencies() -> None:
    queued = [rec(0, output_tokens=11, ttft_ms=130.0, e2e_ms=330.0, queue_delay_ms=30.0),
              rec(1, output_tokens=11, ttft_ms=110.0, e2e_ms=310.0, queue_delay_ms=10.0)]
    m = compute_repetition_metrics(records=queued, duration_s=1.0, concurrency=1, repetition=0, request_rate=50.0,
                                   accept_length_server=None, accept_length_tolerance=0.1)
    assert m.queue_delay_ms.median == 20.0 and m.flat()["queue_delay_ms_p50"] == 20.0
    assert m.tpot_ms.median == 20.0  # (e2e - TTFT) / 10: the shared start cancels out
    closed = compute_repetition_metrics(records=[A, B], duration_s=1.0, concurrency=1, repetition=0,
                                        request_rate=None, accept_length_server=None, accept_length_tolerance=0.1)
    assert closed.queue_delay_ms.count == 0 and closed.flat()["queue_delay_ms_p50"] is None


def test_repetition_metrics_and_flat_names() -> None:
    m = compute_repetition_metrics(
        records=[A, B, FAILED, DROPPED], duration_s=2.0, concurrency=4, repetition=1, request_rate=None,
        accept_length_server=3.2, accept_length_tolerance=0.1,
    )
    assert (m.num_requests, m.num_ok, m.num_errors) == (4, 2, 2)
    assert m.output_tokens == 32 and m.prompt_tokens == 16 and m.spec_verify_ct == 12
    assert m.accept_length == pytest.approx(2.5)  # the per-request figure is preferred
    assert m.accept_length_mismatch is True  # 3.2 vs 2.5
    assert m.ttft_ms.median == 150.0 and m.e2e_ms.median == 450.0
    flat = m.flat()
    assert list(flat) == list(METRICS)  # the table is the list of names
    assert set(OBJECTIVE_METRICS) <= set(flat)
    assert flat["ttft_ms_p50"] == 150.0 and flat["error_rate"] == 0.5
    assert m.error_samples[0] == "http_5xx: HTTP 500: boom"


def test_server_accept_length_used_when_requests_lack_it() -> None:
    plain = [rec(0, output_tokens=10, ttft_ms=1.0, e2e_ms=10.0, num_chunks=4)]
    m = compute_repetition_metrics(
        records=plain, duration_s=1.0, concurrency=1, repetition=0, request_rate=None,
        accept_length_server=2.0, accept_length_tolerance=0.1,
    )
    assert m.accept_length == 2.0 and m.accept_length_requests is None
    assert m.accept_length_mismatch is None
    assert m.accepted_drafts_per_cycle == 1.0


def test_one_table_names_every_metric_and_its_direction() -> None:
    """The spec names what a sweep may optimise and which way is better (OBJECTIVE_METRICS); the
    bench's one table computes each of them."""
    import orchestrator.spec as spec

    assert set(OBJECTIVE_METRICS) <= set(METRICS)
    assert OBJECTIVE_METRICS == {
        "output_tok_per_s": "max", "request_per_s": "max", "accept_length": "max",
        "ttft_ms_p50": "min", "ttft_ms_p99": "min", "tpot_ms_p50": "min", "tpot_ms_p99": "min",
        "e2e_ms_p50": "min", "e2e_ms_p99": "min", "cycle_ms": "min",
    }
    assert spec.ObjectiveSpec(metric="cycle_ms").direction == "min"
    m = compute_repetition_metrics(
        records=[A, B], duration_s=2.0, concurrency=2, repetition=0, request_rate=None,
        accept_length_server=None, accept_length_tolerance=0.1,
    )
    # each entry reads its own figure: p50 is the median, p99 the 99th percentile, cycle_ms the cycle
    assert METRICS["ttft_ms_p50"].read(m) == 150.0 and METRICS["ttft_ms_p99"].read(m) == pytest.approx(199.0)
    assert METRICS["cycle_ms"].read(m) == pytest.approx(50.0) and METRICS["output_tok_per_s"].read(m) == 16.0
