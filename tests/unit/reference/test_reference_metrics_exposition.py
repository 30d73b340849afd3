"""``/metrics`` text: SGLang's families, types, label names and buckets, parsed as Prometheus parses it.

The expected names, types, labels and buckets are SGLang's
(``python/sglang/srt/observability/metrics_collector.py``: ``TokenizerMetricsCollector``,
``SchedulerMetricsCollector``); the request-side label set ``{model_name, engine_type,
is_streaming}`` and the scheduler's ``{model_name, engine_type, tp_rank, pp_rank, moe_ep_rank}``
are what a live SGLang 0.5.x exposes.
"""

from __future__ import annotations

import re

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from serving.reference.metrics import E2E_BUCKETS, ITL_BUCKETS, QUEUE_TIME_BUCKETS, TTFT_BUCKETS, ReferenceMetrics

REQUEST_LABELS = {"model_name", "engine_type", "is_streaming"}
SCHEDULER_LABELS = {"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"}


def families(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def busy_metrics() -> ReferenceMetrics:
    """One streamed speculative request and one plain aborted one, as the engine client records them."""
    m = ReferenceMetrics(model_name="ref-tiny")
    m.set_max_total_num_tokens(4096)
    m.observe_time_to_first_token(0.05, is_streaming=True)
    m.observe_inter_token_latency(0.03, 3, is_streaming=True)  # one chunk of 3 tokens after 30 ms
    m.observe_finished_request(prompt_tokens=7, generation_tokens=4, cached_tokens=0, e2e_latency=0.2,
                               spec_verify_ct=2, finish_type="length", decode_seconds=0.12, is_streaming=True)
    m.observe_finished_request(prompt_tokens=5, generation_tokens=1, cached_tokens=0, e2e_latency=0.1,
                               spec_verify_ct=0, finish_type="abort", decode_seconds=0.0, is_streaming=False)
    m.set_scheduler_state({"num_running_reqs": 1, "num_queue_reqs": 0, "num_used_tokens": 9,
                           "token_usage": 0.01, "last_gen_throughput": 55.0,
                           "last_spec_accept_length": 2.5, "last_spec_accept_rate": 0.5})
    return m


@pytest.mark.parametrize("name, kind, labels", [
    ("sglang:prompt_tokens", "counter", REQUEST_LABELS),
    ("sglang:generation_tokens", "counter", REQUEST_LABELS),
    ("sglang:num_requests", "counter", REQUEST_LABELS),
    ("sglang:num_aborted_requests", "counter", REQUEST_LABELS),
    ("sglang:spec_verify_calls", "counter", REQUEST_LABELS),
    ("sglang:time_to_first_token_seconds", "histogram", REQUEST_LABELS | {"le"}),
    ("sglang:inter_token_latency_seconds", "histogram", REQUEST_LABELS | {"le"}),
    ("sglang:e2e_request_latency_seconds", "histogram", REQUEST_LABELS | {"le"}),
    ("sglang:request_time_per_output_token_seconds", "histogram", REQUEST_LABELS | {"le"}),
    ("sglang:num_running_reqs", "gauge", SCHEDULER_LABELS),
    ("sglang:num_queue_reqs", "gauge", SCHEDULER_LABELS),
    ("sglang:num_used_tokens", "gauge", SCHEDULER_LABELS),
    ("sglang:token_usage", "gauge", SCHEDULER_LABELS),
    ("sglang:gen_throughput", "gauge", SCHEDULER_LABELS),
    ("sglang:cache_hit_rate", "gauge", SCHEDULER_LABELS),
    ("sglang:max_total_num_tokens", "gauge", SCHEDULER_LABELS),
    ("sglang:num_retracted_reqs", "gauge", SCHEDULER_LABELS),
    ("sglang:spec_accept_length", "gauge", SCHEDULER_LABELS),
    ("sglang:spec_accept_rate", "gauge", SCHEDULER_LABELS),
])
def test_family_type_and_label_names(name: str, kind: str, labels: set[str]) -> None:
    fams = families(busy_metrics().render())
    family = fams[name]
    assert family.type == kind  # type: ignore[attr-defined]
    samples = [s for s in family.samples if not s.name.endswith("_created")]  # type: ignore[attr-defined]
    assert samples, name
    assert all(set(s.labels) == (labels if s.name.endswith("_bucket") else labels - {"le"}) for s in samples)


def test_families_without_samples_are_still_declared() -> None:
    """SGLang increments ``cached_tokens_total`` only for a positive count (no prefix cache here)
    and observes ``queue_time_seconds`` on the scheduler: both families exist with their types."""
    text = ReferenceMetrics(model_name="ref-tiny").render()
    assert "# TYPE sglang:cached_tokens_total counter" in text
    assert "# TYPE sglang:queue_time_seconds histogram" in text
    assert families(text)["sglang:cached_tokens"].samples == []  # type: ignore[attr-defined]


@pytest.mark.parametrize("name, buckets", [
    ("sglang:time_to_first_token_seconds", TTFT_BUCKETS),
    ("sglang:inter_token_latency_seconds", ITL_BUCKETS),
    ("sglang:e2e_request_latency_seconds", E2E_BUCKETS),
])
def test_histogram_buckets_are_sglangs(name: str, buckets: tuple[float, ...]) -> None:
    family = families(busy_metrics().render())[name]
    bounds = [float(s.labels["le"]) for s in family.samples  # type: ignore[attr-defined]
              if s.name.endswith("_bucket") and s.labels["is_streaming"] == "true"]
    assert bounds == [float(b) for b in buckets] + [float("inf")]


def test_sglang_bucket_lists() -> None:
    """Copied from SGLang's collector defaults, so a drift in either is a visible diff."""
    assert TTFT_BUCKETS[:3] == (0.1, 0.2, 0.4) and TTFT_BUCKETS[-1] == 400 and len(TTFT_BUCKETS) == 18
    assert len(ITL_BUCKETS) == 23 and ITL_BUCKETS[0] == 0.002 and ITL_BUCKETS[-1] == 8.0
    assert len(E2E_BUCKETS) == 22 and E2E_BUCKETS[-1] == 2400
    assert QUEUE_TIME_BUCKETS[:4] == (0.0, 0.001, 0.005, 0.010) and QUEUE_TIME_BUCKETS[-1] == 3000


def value(text: str, name: str, **labels: str) -> float:
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def test_request_values() -> None:
    text = busy_metrics().render()
    assert value(text, "sglang:prompt_tokens_total") == 12
    assert value(text, "sglang:generation_tokens_total", is_streaming="true") == 4
    assert value(text, "sglang:num_requests_total") == 2
    assert value(text, "sglang:num_aborted_requests_total", is_streaming="false") == 1
    # only the request that ran verify cycles adds to it, by its spec_verify_ct
    assert value(text, "sglang:spec_verify_calls_total") == 2
    # a 3-token chunk 30 ms after the last: 3 observations of 10 ms, sum 30 ms (SGLang's rule)
    assert value(text, "sglang:inter_token_latency_seconds_count") == 3
    assert value(text, "sglang:inter_token_latency_seconds_sum") == pytest.approx(0.03)
    assert value(text, "sglang:inter_token_latency_seconds_bucket", le="0.01") == 3
    # TPOT: the finished-by-length request only (decode 0.12 s / 4 tokens); not the abort
    assert value(text, "sglang:request_time_per_output_token_seconds_count") == 1
    assert value(text, "sglang:request_time_per_output_token_seconds_sum") == pytest.approx(0.03)
    assert value(text, "sglang:max_total_num_tokens") == 4096
    assert value(text, "sglang:spec_accept_length") == 2.5 and value(text, "sglang:gen_throughput") == 55.0


def test_sglang_client_line_parser_reads_it() -> None:
    """``get_cache_tokens_from_metrics`` in ``python/sglang/bench_one_batch_server.py`` reads
    lines starting with ``sglang:prompt_tokens_total{`` with this regex and sums them."""
    text = busy_metrics().render()
    total = 0.0
    for line in text.split("\n"):
        if line.startswith("sglang:prompt_tokens_total{"):
            match = re.search(r"sglang:prompt_tokens_total\{[^}]*\}\s+([\d.eE+-]+)", line)
            assert match
            total += float(match.group(1))
    assert total == 12


def test_each_engine_has_its_own_registry() -> None:
    """Two engines in one process (the in-process test servers) must not share series, and the
    process-global default registry stays untouched."""
    a, b = ReferenceMetrics(model_name="a"), ReferenceMetrics(model_name="b")
    a.observe_finished_request(prompt_tokens=3, generation_tokens=2, cached_tokens=0, e2e_latency=0.1,
                               spec_verify_ct=0, finish_type="stop", decode_seconds=0.05, is_streaming=False)
    assert value(a.render(), "sglang:prompt_tokens_total") == 3
    assert value(b.render(), "sglang:prompt_tokens_total") == 0
    assert not [n for n in REGISTRY._names_to_collectors if n.startswith("sglang:")]  # noqa: SLF001
