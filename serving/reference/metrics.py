"""``/metrics``: SGLang's Prometheus metric names, rendered in the text exposition format.

A few dozen lines instead of ``prometheus_client`` (the GPU image must need only torch and
aiohttp). Request-side metrics (tokens, TTFT, ITL, end-to-end latency) are observed in the HTTP
process like SGLang's TokenizerMetricsCollector; scheduler gauges (running/queued requests,
accept length, throughput) are set from the scheduler's reports, like SGLang's
SchedulerMetricsCollector, which also updates them only every decode-log interval.
"""

from __future__ import annotations

import bisect
import math
from typing import Iterable, Mapping, Optional

__all__ = ["Counter", "Gauge", "Histogram", "MetricsRegistry", "ReferenceMetrics"]


def _labels(labels: Mapping[str, str], extra: Optional[Mapping[str, str]] = None) -> str:
    items = dict(labels)
    if extra:
        items.update(extra)
    if not items:
        return ""
    body = ",".join(f'{k}="{_escape(str(v))}"' for k, v in items.items())
    return "{" + body + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


class _Metric:
    kind = ""

    def __init__(self, name: str, doc: str, labels: Mapping[str, str]) -> None:
        self.name = name
        self.doc = doc
        self.labels = dict(labels)

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.doc}", f"# TYPE {self.name} {self.kind}"]


class Counter(_Metric):
    kind = "counter"

    def __init__(self, name: str, doc: str, labels: Mapping[str, str]) -> None:
        super().__init__(name, doc, labels)
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def render(self) -> list[str]:
        return self.header() + [f"{self.name}{_labels(self.labels)} {_num(self.value)}"]


class Gauge(_Metric):
    kind = "gauge"

    def __init__(self, name: str, doc: str, labels: Mapping[str, str]) -> None:
        super().__init__(name, doc, labels)
        self.value = 0.0

    def set(self, value: float) -> None:
        self.value = float(value)

    def render(self) -> list[str]:
        return self.header() + [f"{self.name}{_labels(self.labels)} {_num(self.value)}"]


class Histogram(_Metric):
    kind = "histogram"

    def __init__(self, name: str, doc: str, labels: Mapping[str, str], buckets: Iterable[float]) -> None:
        super().__init__(name, doc, labels)
        self.bounds = sorted(buckets)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += times
        self.sum += value * times
        self.count += times

    def render(self) -> list[str]:
        lines = self.header()
        running = 0
        for bound, count in zip(self.bounds + [math.inf], self.counts):
            running += count
            lines.append(f"{self.name}_bucket{_labels(self.labels, {'le': _num(bound)})} {running}")
        lines.append(f"{self.name}_sum{_labels(self.labels)} {_num(self.sum)}")
        lines.append(f"{self.name}_count{_labels(self.labels)} {self.count}")
        return lines


class MetricsRegistry:
    """Metrics in registration order; ``render`` gives the exposition text."""

    def __init__(self) -> None:
        self._metrics: list[_Metric] = []

    def add(self, metric: _Metric) -> _Metric:
        self._metrics.append(metric)
        return metric

    def render(self) -> str:
        lines: list[str] = []
        for metric in self._metrics:
            lines.extend(metric.render())  # type: ignore[attr-defined]
        return "\n".join(lines) + "\n"


_TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                 10.0, 15.0, 20.0, 25.0, 30.0, 60.0, 120.0]
_ITL_BUCKETS = [0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060,
                0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000]
_E2E_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200,
                1800, 2400]


class ReferenceMetrics:
    """The metrics the reference engine exports, under SGLang's names and labels.

    Args:
        model_name: ``--served-model-name`` (the ``model_name`` label).
    """

    def __init__(self, *, model_name: str) -> None:
        tok = {"model_name": model_name}
        sched = {"model_name": model_name, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0"}
        r = self.registry = MetricsRegistry()
        self.prompt_tokens_total = r.add(Counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.", tok))
        self.generation_tokens_total = r.add(
            Counter("sglang:generation_tokens_total", "Number of generation tokens processed.", tok)
        )
        self.num_requests_total = r.add(Counter("sglang:num_requests_total", "Number of requests processed.", tok))
        self.num_aborted_requests_total = r.add(
            Counter("sglang:num_aborted_requests_total", "Number of requests aborted.", tok)
        )
        self.time_to_first_token = r.add(
            Histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", tok, _TTFT_BUCKETS)
        )
        self.inter_token_latency = r.add(
            Histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", tok, _ITL_BUCKETS)
        )
        self.e2e_request_latency = r.add(
            Histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", tok, _E2E_BUCKETS)
        )
        self.num_running_reqs = r.add(Gauge("sglang:num_running_reqs", "The number of running requests.", sched))
        self.num_queue_reqs = r.add(Gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", sched))
        self.num_used_tokens = r.add(Gauge("sglang:num_used_tokens", "The number of used tokens.", sched))
        self.token_usage = r.add(Gauge("sglang:token_usage", "The token usage.", sched))
        self.gen_throughput = r.add(Gauge("sglang:gen_throughput", "The generation throughput (token/s).", sched))
        self.cache_hit_rate = r.add(Gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", sched))
        self.spec_accept_length = r.add(
            Gauge(
                "sglang:spec_accept_length",
                "Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward).",
                sched,
            )
        )
        self.spec_accept_rate = r.add(
            Gauge("sglang:spec_accept_rate", "Speculative acceptance rate (`accepted drafts / proposed drafts` in batch).", sched)
        )

    def set_scheduler_state(self, state: Mapping[str, object]) -> None:
        """Update the scheduler gauges from an internal-state report."""
        self.num_running_reqs.set(float(state.get("num_running_reqs", 0)))  # type: ignore[arg-type]
        self.num_queue_reqs.set(float(state.get("num_queue_reqs", 0)))  # type: ignore[arg-type]
        self.num_used_tokens.set(float(state.get("num_used_tokens", 0)))  # type: ignore[arg-type]
        self.token_usage.set(float(state.get("token_usage", 0.0)))  # type: ignore[arg-type]
        self.gen_throughput.set(float(state.get("last_gen_throughput", 0.0)))  # type: ignore[arg-type]
        if "last_spec_accept_length" in state:
            self.spec_accept_length.set(float(state["last_spec_accept_length"]))  # type: ignore[arg-type]
            self.spec_accept_rate.set(float(state.get("last_spec_accept_rate", 0.0)))  # type: ignore[arg-type]

    def render(self) -> str:
        return self.registry.render()
