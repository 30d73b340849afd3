"""``/metrics``: SGLang's Prometheus families, names, types, labels and buckets, via ``prometheus_client``.

Mirrors SGLang's ``TokenizerMetricsCollector`` and ``SchedulerMetricsCollector``
(``srt/observability/metrics_collector.py``); the families are listed in docs/reference-engine.md
("Metrics").
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = [
    "CONTENT_TYPE",
    "E2E_BUCKETS",
    "ITL_BUCKETS",
    "QUEUE_TIME_BUCKETS",
    "ReferenceMetrics",
    "TPOT_BUCKETS",
    "TTFT_BUCKETS",
]

CONTENT_TYPE = CONTENT_TYPE_LATEST
"""``text/plain; version=0.0.4; charset=utf-8`` (``prometheus_client``'s, which SGLang serves)."""

# SGLang's default buckets (TokenizerMetricsCollector / SchedulerMetricsCollector).
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060,
               0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200,
               1800, 2400)
QUEUE_TIME_BUCKETS = (0.0, 0.001, 0.005, 0.010, 0.050, 0.100, 0.200, 0.500, 1, 2, 3, 4, 5, 10, 15, 20,
                      30, 40, 50, 60, 70, 80, 90, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000,
                      1200, 1400, 1600, 1800, 2000, 2500, 3000)
TPOT_BUCKETS = ITL_BUCKETS
"""``request_time_per_output_token_seconds``: SGLang's list is not known; the inter-token buckets."""

REQUEST_LABELS = ("model_name", "engine_type", "is_streaming")
SCHEDULER_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")


class ReferenceMetrics:
    """The metrics one reference engine exports, under SGLang's names, types and labels.

    Args:
        model_name: ``--served-model-name`` (the ``model_name`` label).
        engine_type: SGLang's ``engine_type`` label (``unified``: no PD disaggregation).
        tp_rank: Rank whose scheduler reports the gauges.
    """

    def __init__(self, *, model_name: str, engine_type: str = "unified", tp_rank: int = 0) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.model_name = model_name
        self.engine_type = engine_type
        self._sched = {"model_name": model_name, "engine_type": engine_type, "tp_rank": str(tp_rank),
                       "pp_rank": "0", "moe_ep_rank": "0"}
        r = self.registry

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, labelnames=REQUEST_LABELS + extra, registry=r)

        def histogram(name: str, doc: str, buckets: tuple[float, ...], labels: tuple[str, ...] = REQUEST_LABELS) -> Histogram:
            return Histogram(name, doc, labelnames=labels, buckets=buckets, registry=r)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labelnames=SCHEDULER_LABELS, registry=r)

        # Request side (TokenizerMetricsCollector); prometheus_client adds counters' `_total`.
        self.prompt_tokens_total = counter("sglang:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens_total = counter("sglang:generation_tokens", "Number of generation tokens processed.")
        self.spec_verify_calls_total = counter(
            "sglang:spec_verify_calls", "Number of speculative decoding verification calls."
        )
        self.cached_tokens_total = counter(
            "sglang:cached_tokens", "Number of cached prompt tokens by source (device/host/storage).", ("cache_source",)
        )
        self.num_requests_total = counter("sglang:num_requests", "Number of requests processed.")
        self.num_aborted_requests_total = counter("sglang:num_aborted_requests", "Number of requests aborted.")
        self.time_to_first_token = histogram(
            "sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
        )
        self.inter_token_latency = histogram(
            "sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS
        )
        self.e2e_request_latency = histogram(
            "sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", E2E_BUCKETS
        )
        self.request_time_per_output_token = histogram(
            "sglang:request_time_per_output_token_seconds",
            "Histogram of time per output token in seconds (decode time / generated tokens, per request).",
            TPOT_BUCKETS,
        )

        # Scheduler side (SchedulerMetricsCollector).
        self.num_running_reqs = gauge("sglang:num_running_reqs", "The number of running requests.")
        self.num_queue_reqs = gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.")
        self.num_used_tokens = gauge("sglang:num_used_tokens", "The number of used tokens.")
        self.token_usage = gauge("sglang:token_usage", "The token usage.")
        self.gen_throughput = gauge("sglang:gen_throughput", "The generation throughput (token/s).")
        self.cache_hit_rate = gauge("sglang:cache_hit_rate", "The prefix cache hit rate.")
        self.max_total_num_tokens = gauge(
            "sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool."
        )
        self.spec_accept_length = gauge(
            "sglang:spec_accept_length",
            "Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward).",
        )
        self.spec_accept_rate = gauge(
            "sglang:spec_accept_rate", "Speculative acceptance rate (`accepted drafts / proposed drafts` in batch)."
        )
        self.num_retracted_reqs = gauge("sglang:num_retracted_reqs", "The number of retracted requests.")
        self.queue_time = histogram(
            "sglang:queue_time_seconds", "Histogram of queueing time in seconds.", QUEUE_TIME_BUCKETS, SCHEDULER_LABELS
        )
        # Every gauge exists from the start (0), before the first decode-log interval.
        for g in (self.num_running_reqs, self.num_queue_reqs, self.num_used_tokens, self.token_usage,
                  self.gen_throughput, self.cache_hit_rate, self.max_total_num_tokens, self.num_retracted_reqs):
            g.labels(**self._sched).set(0)

    def _req(self, is_streaming: bool) -> dict[str, str]:
        return {"model_name": self.model_name, "engine_type": self.engine_type,
                "is_streaming": "true" if is_streaming else "false"}

    def observe_time_to_first_token(self, seconds: float, *, is_streaming: bool) -> None:
        self.time_to_first_token.labels(**self._req(is_streaming)).observe(seconds)

    def observe_inter_token_latency(self, interval: float, num_new_tokens: int, *, is_streaming: bool) -> None:
        """SGLang's ``observe_inter_token_latency``: ``num_new_tokens`` observations of
        ``interval / num_new_tokens``."""
        if num_new_tokens <= 0:
            return
        hist = self.inter_token_latency.labels(**self._req(is_streaming))
        for _ in range(num_new_tokens):
            hist.observe(interval / num_new_tokens)

    def observe_finished_request(
        self,
        *,
        prompt_tokens: int,
        generation_tokens: int,
        cached_tokens: int,
        e2e_latency: float,
        spec_verify_ct: int,
        finish_type: Optional[str],
        decode_seconds: Optional[float],
        is_streaming: bool,
    ) -> None:
        """SGLang's ``observe_one_finished_request``, plus the per-request TPOT and the abort count."""
        labels = self._req(is_streaming)
        self.prompt_tokens_total.labels(**labels).inc(prompt_tokens)
        self.generation_tokens_total.labels(**labels).inc(generation_tokens)
        if spec_verify_ct > 0:
            self.spec_verify_calls_total.labels(**labels).inc(spec_verify_ct)
        if cached_tokens > 0:
            self.cached_tokens_total.labels(**labels, cache_source="total").inc(cached_tokens)
        self.num_requests_total.labels(**labels).inc()
        self.e2e_request_latency.labels(**labels).observe(e2e_latency)
        if finish_type == "abort":
            self.num_aborted_requests_total.labels(**labels).inc()
        elif (
            finish_type in ("stop", "length")
            and generation_tokens > 1
            and decode_seconds is not None
            and decode_seconds > 0
            and math.isfinite(decode_seconds)
        ):
            self.request_time_per_output_token.labels(**labels).observe(decode_seconds / generation_tokens)

    def set_queue_sizes(self, *, running: int, queued: int) -> None:
        self.num_running_reqs.labels(**self._sched).set(running)
        self.num_queue_reqs.labels(**self._sched).set(queued)

    def set_max_total_num_tokens(self, value: int) -> None:
        """SGLang's ``emit_constants``: the KV pool size, set once at start-up."""
        self.max_total_num_tokens.labels(**self._sched).set(value)

    def observe_queue_time(self, seconds: float) -> None:
        self.queue_time.labels(**self._sched).observe(seconds)

    def set_scheduler_state(self, state: Mapping[str, Any]) -> None:
        """Update the scheduler gauges from an internal-state report (``Scheduler.internal_state``)."""
        s = self._sched
        self.num_running_reqs.labels(**s).set(float(state.get("num_running_reqs", 0)))
        self.num_queue_reqs.labels(**s).set(float(state.get("num_queue_reqs", 0)))
        self.num_used_tokens.labels(**s).set(float(state.get("num_used_tokens", 0)))
        self.token_usage.labels(**s).set(float(state.get("token_usage", 0.0)))
        self.gen_throughput.labels(**s).set(float(state.get("last_gen_throughput", 0.0)))
        if "last_spec_accept_length" in state:
            self.spec_accept_length.labels(**s).set(float(state["last_spec_accept_length"]))
            self.spec_accept_rate.labels(**s).set(float(state.get("last_spec_accept_rate", 0.0)))

    def render(self) -> str:
        """The exposition text (``prometheus_client.generate_latest`` of this engine's registry)."""
        return generate_latest(self.registry).decode("utf-8")
