"""Every benchmark metric, defined once: pure functions over per-request records.

Each function's docstring is its formula. Tokens are the server's ``completion_tokens``, never
streamed chunks; failed requests are counted, not measured; a speculative figure the server does
not report is ``None``, never 0; latency starts when the request was due (its send in closed
loop, its scheduled arrival in open loop). :data:`METRICS` is the one table of every scalar a
repetition yields. The three accept-length sources are explained in
docs/design/bench-and-spec.md.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.statistics import log_interval

if TYPE_CHECKING:  # pragma: no cover
    from orchestrator.bench.loadgen import RequestRecord

__all__ = [
    "METRICS",
    "Distribution",
    "Metric",
    "RepetitionMetrics",
    "accept_length_agrees",
    "accept_length_requests",
    "accepted_drafts_per_cycle",
    "compute_repetition_metrics",
    "cycle_ms",
    "e2e_ms",
    "error_counts",
    "ok_records",
    "output_tok_per_s",
    "output_tokens",
    "percentile",
    "queue_delay_ms",
    "request_per_s",
    "spec_accept_length_meta",
    "spec_accept_rate_requests",
    "tokens_per_chunk",
    "tpot_ms",
    "ttft_ms",
]


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between closest ranks (numpy's default).

    Raises:
        ValueError: ``sorted_values`` is empty.
    """
    if not sorted_values:
        raise ValueError("percentile of an empty sample")
    position = (len(sorted_values) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (position - low) * (sorted_values[high] - sorted_values[low])


class Distribution(BaseModel):
    """The one summary used for every sample, per-request latencies or per-repetition results.

    All fields are ``None`` for an empty sample; ``stdev`` and ``cv`` need two values. ``geomean``
    and its 95% interval (:func:`orchestrator.statistics.log_interval`, on the log scale) need
    every value positive, the interval also :data:`~orchestrator.statistics.MIN_VALUES` values;
    otherwise they are ``None``. ``median`` is the p50.
    """

    model_config = ConfigDict(frozen=True)

    count: int = Field(description="Number of values.")
    mean: float | None = Field(default=None, description="Arithmetic mean.")
    median: float | None = Field(default=None, description="p50, linear interpolation.")
    p90: float | None = Field(default=None, description="90th percentile, linear interpolation.")
    p99: float | None = Field(default=None, description="99th percentile, linear interpolation.")
    min: float | None = Field(default=None, description="Smallest value.")
    max: float | None = Field(default=None, description="Largest value.")
    stdev: float | None = Field(default=None, description="Sample standard deviation (n - 1).")
    mad: float | None = Field(
        default=None, description="Median absolute deviation: median(|x - median|), unscaled."
    )
    cv: float | None = Field(
        default=None, description="Coefficient of variation: stdev / mean (None if mean is 0)."
    )
    geomean: float | None = Field(
        default=None,
        description="Geometric mean exp(mean(log x)), the centre of the 95% interval on the log scale (None unless "
        "every value is positive).",
    )
    ci95_low: float | None = Field(
        default=None,
        description="Lower end of the 95% interval of the geometric mean, exp(m - t(0.975, n-1) * s / sqrt(n)) with m, "
        "s the mean and sample stdev of log x (orchestrator.statistics.log_interval); never negative. None from "
        "fewer than 3 values or when a value is not positive.",
    )
    ci95_high: float | None = Field(
        default=None,
        description="Upper end of the 95% interval of the geometric mean, exp(m + t(0.975, n-1) * s / sqrt(n)); "
        "None where ci95_low is.",
    )

    @classmethod
    def of(cls, values: Iterable[float]) -> "Distribution":
        """Summarise ``values`` (order does not matter); the fields' descriptions give the formulas."""
        data = sorted(float(v) for v in values)
        n = len(data)
        if n == 0:
            return cls(count=0)
        mean = math.fsum(data) / n
        median = percentile(data, 50)
        fields: dict[str, float | None] = {
            "mean": mean,
            "median": median,
            "p90": percentile(data, 90),
            "p99": percentile(data, 99),
            "min": data[0],
            "max": data[-1],
            "mad": statistics.median(abs(v - median) for v in data),
        }
        if n >= 2:
            stdev = statistics.stdev(data)
            fields.update(stdev=stdev, cv=stdev / abs(mean) if mean != 0 else None)
        if all(v > 0 and math.isfinite(v) for v in data):
            fields["geomean"] = math.exp(statistics.fmean(math.log(v) for v in data))
            interval = log_interval(data)  # None from fewer than MIN_VALUES values
            if interval is not None:
                fields.update(ci95_low=interval[0], ci95_high=interval[1])
        return cls(count=n, **fields)


# --- per-request selections -------------------------------------------------------------------


def ok_records(records: Iterable["RequestRecord"]) -> list["RequestRecord"]:
    """The successful requests: ``error is None``."""
    return [r for r in records if r.error is None]


def error_counts(records: Iterable["RequestRecord"]) -> dict[str, int]:
    """Failed requests by ``error_kind`` (``http_5xx``, ``timeout``, ``dropped_stream``, ...)."""
    return dict(sorted(Counter(r.error_kind or "unknown" for r in records if r.error is not None).items()))


# --- throughput -------------------------------------------------------------------------------


def output_tokens(records: Iterable["RequestRecord"]) -> int | None:
    """sum(completion_tokens) over successful requests: the server's count, never chunks.

    ``None`` when any successful request lacks a count (a server that reports no usage): a
    partial sum would understate throughput silently.
    """
    total = 0
    for record in ok_records(records):
        if record.output_tokens is None:
            return None
        total += record.output_tokens
    return total


def output_tok_per_s(records: Sequence["RequestRecord"], duration_s: float) -> float | None:
    """output_tokens / duration_s, where duration_s is the wall time of the whole repetition
    (first request sent to last response finished) and failed requests contribute no tokens."""
    tokens = output_tokens(records)
    if tokens is None or duration_s <= 0:
        return None
    return tokens / duration_s


def request_per_s(records: Sequence["RequestRecord"], duration_s: float) -> float | None:
    """Successful requests / duration_s (the repetition's wall time)."""
    if duration_s <= 0:
        return None
    return len(ok_records(records)) / duration_s


# --- latency ----------------------------------------------------------------------------------


def ttft_ms(records: Iterable["RequestRecord"]) -> Distribution:
    """Time to first token per successful streamed request, in ms: first chunk carrying output minus
    the request's start (its send in closed loop, its scheduled arrival in open loop)."""
    return Distribution.of(r.ttft_ms for r in ok_records(records) if r.ttft_ms is not None)


def e2e_ms(records: Iterable["RequestRecord"]) -> Distribution:
    """End-to-end latency per successful request, in ms: last byte received minus the request's
    start (sent in closed loop, scheduled arrival in open loop, as for :func:`ttft_ms`)."""
    return Distribution.of(r.e2e_ms for r in ok_records(records) if r.e2e_ms is not None)


def queue_delay_ms(records: Iterable["RequestRecord"]) -> Distribution:
    """Open loop only: sent minus scheduled arrival per successful request, in ms (already inside
    :func:`ttft_ms` and :func:`e2e_ms`); empty in closed loop."""
    return Distribution.of(r.queue_delay_ms for r in ok_records(records) if r.queue_delay_ms is not None)


def tpot_ms(records: Iterable["RequestRecord"]) -> Distribution:
    """Time per output token after the first, per successful streamed request:
    (e2e_ms - ttft_ms) / (completion_tokens - 1), for requests with at least 2 tokens (not
    chunk-to-chunk gaps: under speculation one chunk carries several tokens)."""
    values = [
        (r.e2e_ms - r.ttft_ms) / (r.output_tokens - 1)
        for r in ok_records(records)
        if r.e2e_ms is not None and r.ttft_ms is not None and r.output_tokens is not None and r.output_tokens >= 2
    ]
    return Distribution.of(values)


def tokens_per_chunk(records: Iterable["RequestRecord"]) -> float | None:
    """sum(completion_tokens) / sum(streamed chunks that carried output), over successful
    streamed requests. 1.0 without speculation; about accept_length with it."""
    tokens = chunks = 0
    for record in ok_records(records):
        if record.num_chunks and record.output_tokens is not None:
            tokens += record.output_tokens
            chunks += record.num_chunks
    return tokens / chunks if chunks else None


# --- speculative decoding ---------------------------------------------------------------------


def _spec_records(records: Iterable["RequestRecord"]) -> list["RequestRecord"]:
    return [r for r in ok_records(records) if r.spec_verify_ct is not None and r.output_tokens is not None]


def accept_length_requests(records: Iterable["RequestRecord"]) -> float | None:
    """Tokens per verify cycle, bonus token included, prefill token excluded:
    (sum(completion_tokens) - N) / sum(spec_verify_ct) over the N successful requests that
    report ``spec_verify_ct``; ``None`` when none does or none had a verify cycle."""
    spec = _spec_records(records)
    cycles = sum(r.spec_verify_ct for r in spec)  # type: ignore[misc]
    if not spec or cycles == 0:
        return None
    return (sum(r.output_tokens for r in spec) - len(spec)) / cycles  # type: ignore[misc]


def spec_accept_length_meta(records: Iterable["RequestRecord"]) -> float | None:
    """sum(completion_tokens) / sum(spec_verify_ct) over successful requests reporting
    ``spec_verify_ct``: SGLang's ``meta_info.spec_accept_length``, aggregated (counts the prefill
    token). For comparison with SGLang's tools only."""
    spec = _spec_records(records)
    cycles = sum(r.spec_verify_ct for r in spec)  # type: ignore[misc]
    if not spec or cycles == 0:
        return None
    return sum(r.output_tokens for r in spec) / cycles  # type: ignore[misc]


def spec_accept_rate_requests(records: Iterable["RequestRecord"]) -> float | None:
    """sum(spec_correct_drafts) / sum(spec_proposed_drafts) over successful requests reporting both:
    the share of proposed draft tokens accepted, bonus excluded (SGLang's ``spec_accept_rate``,
    weighted). ``None`` when no request reports both or none proposed a draft."""
    correct = proposed = 0
    seen = False
    for record in ok_records(records):
        if record.spec_correct_drafts is None or record.spec_proposed_drafts is None:
            continue
        seen = True
        correct += record.spec_correct_drafts
        proposed += record.spec_proposed_drafts
    if not seen or proposed == 0:
        return None
    return correct / proposed


def accepted_drafts_per_cycle(accept_length: float | None) -> float | None:
    """accept_length - 1: draft tokens accepted per verify cycle (the bonus token taken out)."""
    return None if accept_length is None else accept_length - 1.0


def sum_histograms(histograms: Iterable[list[int] | None]) -> list[int] | None:
    """Accepted-draft histograms summed element-wise (their lengths differ: each grows to the most
    drafts one of its cycles accepted); None where there is none."""
    present = [h for h in histograms if h]
    if not present:
        return None
    total = [0] * max(len(h) for h in present)
    for histogram in present:
        for k, count in enumerate(histogram):
            total[k] += count
    return total


def accept_histogram(records: Sequence[RequestRecord]) -> list[int] | None:
    """The requests' ``spec_correct_drafts_histogram`` summed (:func:`sum_histograms`)."""
    return sum_histograms(r.spec_correct_drafts_histogram for r in records)


def cycle_ms(records: Iterable["RequestRecord"]) -> float | None:
    """Wall time of one (batched) verify cycle as requests experience it:
    sum(e2e_ms - ttft_ms) / sum(spec_verify_ct) over successful streamed requests that report
    ``spec_verify_ct`` > 0."""
    decode = cycles = 0.0
    for record in _spec_records(records):
        if record.ttft_ms is None or record.e2e_ms is None or not record.spec_verify_ct:
            continue
        decode += record.e2e_ms - record.ttft_ms
        cycles += record.spec_verify_ct
    return decode / cycles if cycles else None


_NO_MOVEMENT = 1e-9
"""Relative change of the server's lifetime mean below which it counts as not having moved."""


def accept_length_agrees(
    *,
    server: float | None,
    requests: float | None,
    tolerance: float,
    server_before: float | None = None,
    lifetime: bool = False,
    decode_steps: int | None = None,
    update_interval: int | None = None,
) -> bool | None:
    """Whether the server's accept length is consistent with the per-request one.

    With S = ``server``, R = ``requests``, B = ``server_before`` and slack = tolerance * |R|:
    counters reset before the repetition need |S - R| <= slack; lifetime counters need S within
    [min(B, R) - slack, max(B, R) + slack] and moved from B towards R (unless B already agreed).
    The full rule is in docs/design/bench-and-spec.md.

    Args:
        server: S, read after the repetition.
        requests: R, the per-request accept length.
        tolerance: Relative slack.
        server_before: B, read just before the repetition (lifetime counters only).
        lifetime: Whether the server's counters survive ``/flush_cache``.
        decode_steps: A lower bound on the server's decode steps during the repetition (the most
            verify cycles of any one request).
        update_interval: The server's ``decode_log_interval``, where it reports one.

    Returns:
        True (agrees), False (mismatch), or None: not checkable (lifetime counters that did not
        move in a repetition possibly too short to fold) or either figure absent.
    """
    if server is None or requests is None:
        return None
    slack = tolerance * abs(requests)
    if not lifetime or server_before is None:
        return abs(server - requests) <= slack
    before = server_before
    if not min(before, requests) - slack <= server <= max(before, requests) + slack:
        return False
    if abs(before - requests) <= slack:
        return True
    moved = (server - before) * (1.0 if requests > before else -1.0)
    eps = _NO_MOVEMENT * max(1.0, abs(before))
    if moved > eps:
        return True
    if moved < -eps:
        return False
    if decode_steps is not None and update_interval is not None and decode_steps >= update_interval:
        return False
    return None


# --- one repetition ---------------------------------------------------------------------------


class RepetitionMetrics(BaseModel):
    """Every metric of one (concurrency, repetition): what ``on_repetition`` receives."""

    model_config = ConfigDict(frozen=True)

    concurrency: int = Field(description="Closed-loop concurrency (or the in-flight cap in open loop).")
    repetition: int = Field(description="Repetition index, from 0.")
    request_rate: float | None = Field(description="Open-loop arrival rate (requests/s); None = closed loop.")
    num_requests: int = Field(description="Requests in this repetition (sent or not).")
    num_ok: int = Field(description="Requests that finished without error.")
    num_errors: int = Field(description="Requests that failed; see errors_by_kind.")
    errors_by_kind: dict[str, int] = Field(description="Failed requests by kind.")
    error_samples: list[str] = Field(description="The first few error messages, for the report.")
    duration_s: float = Field(description="Wall time from the first request sent to the last one finished.")
    output_tokens: int | None = Field(description="sum(completion_tokens) of successful requests.")
    prompt_tokens: int | None = Field(description="sum(prompt_tokens) of successful requests, if reported.")
    output_tok_per_s: float | None = Field(description="output_tokens / duration_s.")
    request_per_s: float | None = Field(description="Successful requests / duration_s.")
    ttft_ms: Distribution = Field(description="Time to first token per request (ms).")
    tpot_ms: Distribution = Field(description="(e2e - TTFT) / (tokens - 1) per request (ms).")
    e2e_ms: Distribution = Field(description="End-to-end latency per request (ms).")
    queue_delay_ms: Distribution = Field(
        default_factory=lambda: Distribution(count=0),
        description="Open loop: scheduled arrival to send per request (ms), already inside ttft_ms and e2e_ms; "
        "empty in closed loop.",
    )
    host_cpu_steal: float | None = Field(
        default=None, description="Share of the bench host's CPU time the hypervisor gave to other guests during "
        "the repetition (0-1, /proc/stat steal; None off Linux): a CPU-bound engine on that host slowed by it "
        "(orchestrator/bench/host_cpu.py).")
    tokens_per_chunk: float | None = Field(description="Tokens per streamed chunk (absent when not streamed).")
    spec_verify_ct: int | None = Field(description="sum(spec_verify_ct): verify cycles (absent without speculation).")
    accept_length: float | None = Field(
        description="Tokens per verify cycle incl. bonus: accept_length_requests if present, else the server's."
    )
    accept_length_requests: float | None = Field(
        description="(sum(completion_tokens) - N) / sum(spec_verify_ct) from per-request meta_info."
    )
    accept_length_server: float | None = Field(
        description="/server_info avg_spec_accept_length after this repetition, when /flush_cache reset the "
        "server's counters before it (absent otherwise: a lifetime mean is not this repetition's figure)."
    )
    accept_length_server_lifetime: float | None = Field(
        default=None,
        description="/server_info avg_spec_accept_length after this repetition when the server's counters "
        "survive /flush_cache (some older SGLang versions; 0.5.23 resets them): the mean over the server's whole "
        "life, for the cross-check only.",
    )
    spec_accept_length_meta: float | None = Field(
        description="sum(completion_tokens) / sum(spec_verify_ct): SGLang's per-request definition (counts prefill)."
    )
    accepted_drafts_per_cycle: float | None = Field(description="accept_length - 1.")
    spec_correct_drafts: int | None = Field(
        default=None, description="sum(meta_info accepted draft tokens) over requests reporting it (any spelling)."
    )
    spec_proposed_drafts: int | None = Field(
        default=None, description="sum(meta_info proposed draft tokens) over requests reporting it (any spelling)."
    )
    spec_accept_rate: float | None = Field(
        default=None, description="spec_correct_drafts / spec_proposed_drafts (bonus tokens excluded)."
    )
    accept_histogram: list[int] | None = Field(
        default=None, description="Element-wise sum of the requests' spec_correct_drafts_histogram: [k] = verify "
        "cycles that accepted k drafts (bonus excluded); None where no request reported one.")
    cycle_ms: float | None = Field(description="sum(e2e - TTFT) / sum(spec_verify_ct) (ms per verify cycle).")
    accept_length_mismatch: bool | None = Field(
        description="True if server and per-request accept lengths disagree beyond tolerance; None if not "
        "checked (see accept_length_check for why)."
    )
    accept_length_check: Literal["agrees", "mismatch", "not_checkable"] | None = Field(
        default=None,
        description="Outcome of the cross-check: agrees, mismatch, not_checkable (both figures present but the "
        "server's lifetime counters did not move and the repetition may have been too short for them to), "
        "or None when one of the two figures is absent.",
    )

    def flat(self) -> dict[str, float | None]:
        """Scalar metrics by name (``ttft_ms_p50``, ``output_tok_per_s``, ...), for objectives and MLflow.

        One entry per name of :data:`METRICS`, in its order; absent values stay None.
        """
        return {name: metric.read(self) for name, metric in METRICS.items()}


@dataclass(frozen=True)
class Metric:
    """One scalar metric: how it is read from a repetition.

    Attributes:
        read: The repetition's value (None: absent, e.g. no speculation).
    """

    read: Callable[[RepetitionMetrics], float | None]


def _count(value: int | None) -> float | None:
    return None if value is None else float(value)


def _latency(name: str) -> dict[str, Metric]:
    """``{name}_mean``, ``_p50``, ``_p90``, ``_p99`` of one per-request distribution."""

    def stat(field: str) -> Callable[[RepetitionMetrics], float | None]:
        return lambda rep: getattr(getattr(rep, name), field)

    return {
        f"{name}_mean": Metric(stat("mean")),
        f"{name}_p50": Metric(stat("median")),
        f"{name}_p90": Metric(stat("p90")),
        f"{name}_p99": Metric(stat("p99")),
    }


METRICS: dict[str, Metric] = {
    "output_tok_per_s": Metric(lambda rep: rep.output_tok_per_s),
    "request_per_s": Metric(lambda rep: rep.request_per_s),
    "output_tokens": Metric(lambda rep: _count(rep.output_tokens)),
    "num_errors": Metric(lambda rep: float(rep.num_errors)),
    "error_rate": Metric(lambda rep: rep.num_errors / rep.num_requests if rep.num_requests else None),
    "tokens_per_chunk": Metric(lambda rep: rep.tokens_per_chunk),
    "accept_length": Metric(lambda rep: rep.accept_length),
    "accept_length_requests": Metric(lambda rep: rep.accept_length_requests),
    "accept_length_server": Metric(lambda rep: rep.accept_length_server),
    "accept_length_server_lifetime": Metric(lambda rep: rep.accept_length_server_lifetime),
    "accepted_drafts_per_cycle": Metric(lambda rep: rep.accepted_drafts_per_cycle),
    "spec_accept_rate": Metric(lambda rep: rep.spec_accept_rate),
    **_latency("ttft_ms"),
    **_latency("tpot_ms"),
    **_latency("e2e_ms"),
    **_latency("queue_delay_ms"),  # already inside ttft_ms and e2e_ms
    "cycle_ms": Metric(lambda rep: rep.cycle_ms),
    "host_cpu_steal": Metric(lambda rep: rep.host_cpu_steal),
}
"""Every scalar metric of a repetition, by name: the one table behind ``RepetitionMetrics.flat()``,
a level's summary and ``BenchResult.flat()``; which of them a sweep may optimise, and which way is
better, is the spec's (``orchestrator.spec_benchmark.OBJECTIVE_METRICS``)."""


def _sum_reported(records: Sequence["RequestRecord"], field: str) -> int | None:
    """Sum of an optional per-request count over the records that report it; None if none does."""
    values = [getattr(r, field) for r in records if getattr(r, field) is not None]
    return sum(values) if values else None


def compute_repetition_metrics(
    *,
    records: Sequence["RequestRecord"],
    duration_s: float,
    concurrency: int,
    repetition: int,
    request_rate: float | None,
    accept_length_server: float | None,
    accept_length_tolerance: float,
    accept_length_server_before: float | None = None,
    server_counters_reset: bool = True,
    server_update_interval: int | None = None,
    host_cpu_steal: float | None = None,
) -> RepetitionMetrics:
    """Every metric of one repetition from its records and the server's accept length.

    Args:
        accept_length_server: ``avg_spec_accept_length`` read after the repetition (None: absent).
        accept_length_server_before: The same, read just before the repetition.
        server_counters_reset: Whether ``/flush_cache`` was seen to reset the server's counters; if
            not, the value read after is reported as ``accept_length_server_lifetime``.
        server_update_interval: The server's ``decode_log_interval``, where reported.
        host_cpu_steal: The host's CPU steal over the repetition (``host_cpu.steal_fraction``).
    """
    ok = ok_records(records)
    errors = [r for r in records if r.error is not None]
    prompt_counts = [r.prompt_tokens for r in ok]
    from_requests = accept_length_requests(ok)
    server_rep = accept_length_server if server_counters_reset else None
    server_lifetime = None if server_counters_reset else accept_length_server
    accept = from_requests if from_requests is not None else server_rep
    spec = _spec_records(ok)
    agrees = accept_length_agrees(
        server=accept_length_server,
        requests=from_requests,
        tolerance=accept_length_tolerance,
        server_before=None if server_counters_reset else accept_length_server_before,
        lifetime=not server_counters_reset,
        decode_steps=max((r.spec_verify_ct for r in spec), default=None),  # type: ignore[type-var]
        update_interval=server_update_interval,
    )
    check: Literal["agrees", "mismatch", "not_checkable"] | None
    if agrees is None:
        both = accept_length_server is not None and from_requests is not None
        check = "not_checkable" if both else None
    else:
        check = "agrees" if agrees else "mismatch"
    return RepetitionMetrics(
        concurrency=concurrency,
        repetition=repetition,
        request_rate=request_rate,
        num_requests=len(records),
        num_ok=len(ok),
        num_errors=len(errors),
        errors_by_kind=error_counts(records),
        error_samples=[f"{r.error_kind}: {r.error}" for r in errors[:5]],
        duration_s=duration_s,
        output_tokens=output_tokens(ok),
        prompt_tokens=None if not ok or None in prompt_counts else sum(prompt_counts),  # type: ignore[arg-type]
        output_tok_per_s=output_tok_per_s(records, duration_s),
        request_per_s=request_per_s(records, duration_s),
        ttft_ms=ttft_ms(ok),
        tpot_ms=tpot_ms(ok),
        e2e_ms=e2e_ms(ok),
        queue_delay_ms=queue_delay_ms(ok),
        host_cpu_steal=host_cpu_steal,
        tokens_per_chunk=tokens_per_chunk(ok),
        spec_verify_ct=sum(r.spec_verify_ct for r in spec) if spec else None,  # type: ignore[misc]
        accept_length=accept,
        accept_length_requests=from_requests,
        accept_length_server=server_rep,
        accept_length_server_lifetime=server_lifetime,
        spec_accept_length_meta=spec_accept_length_meta(ok),
        accepted_drafts_per_cycle=accepted_drafts_per_cycle(accept),
        spec_correct_drafts=_sum_reported(ok, "spec_correct_drafts"),
        spec_proposed_drafts=_sum_reported(ok, "spec_proposed_drafts"),
        spec_accept_rate=spec_accept_rate_requests(ok),
        accept_histogram=accept_histogram(ok),
        cycle_ms=cycle_ms(ok),
        accept_length_mismatch=None if agrees is None else not agrees,
        accept_length_check=check,
    )
