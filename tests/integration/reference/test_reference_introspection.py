"""``/server_info`` and ``/metrics`` of a running reference engine, read the way SGLang's clients read them.

One speculative server with ``--enable-metrics`` for the whole module (servers are slow to start on
two cores). Each test replays what a named SGLang client does with the response and asserts the
shape that client needs.
"""

from __future__ import annotations

from typing import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from serving.engine.process import EngineProcess

from helpers.reference_server import http, metric_total, running_server, sse_events

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

FLAGS = ("--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
         "--speculative-num-draft-tokens", "4", "--enable-metrics", "--context-length", "512",
         "--decode-log-interval", "1")  # SGLang's flag: every decode batch folds the accept-length totals


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    with running_server(*FLAGS, log_dir=tmp_path_factory.mktemp("ref-introspection")) as engine:
        yield engine


def greedy(text: str, n: int, **extra: object) -> dict:
    return {"text": text, "sampling_params": {"max_new_tokens": n, "temperature": 0}, **extra}


def test_bench_one_batch_server_reads_server_info(server: EngineProcess) -> None:
    """``python/sglang/bench_one_batch_server.py`` ``run_benchmark_internal``:

        internal_state = internal_states[0] if internal_states else {}
        dp_size = internal_state.get("dp_size", None) or 1
        max_running_requests_per_dp = internal_state.get("effective_max_running_requests_per_dp", -1)
        for state in internal_states:
            skip_token_capacity_threshold += state.get("memory_usage", {}).get("token_capacity", 1000000000)
        assert max_running_requests_per_dp > 0
        tokenizer_path = server_info["tokenizer_path"]

    and, after each case, ``avg_spec_accept_length`` / ``last_gen_throughput`` of every state."""
    http(server, "/generate", greedy("warm the counters", 24))
    for path in ("/server_info", "/get_server_info"):
        status, info = http(server, path)
        assert status == 200
        internal_states = info.get("internal_states", [])
        internal_state = internal_states[0] if internal_states else {}
        dp_size = internal_state.get("dp_size", None) or 1
        max_running_requests_per_dp = internal_state.get("effective_max_running_requests_per_dp", -1)
        capacity = sum(s.get("memory_usage", {}).get("token_capacity", 1000000000) for s in internal_states)
        assert max_running_requests_per_dp == 48  # speculation caps max_running_requests at 48 (SGLang)
        assert dp_size == 1 and internal_state["dp_size"] == 1 and internal_state["attn_dp_size"] == 1
        assert capacity == info["max_total_num_tokens"] > 0
        assert info["tokenizer_path"] == "ref-tiny"
        assert internal_state["avg_spec_accept_length"] >= 1.0
        assert isinstance(internal_state["last_gen_throughput"], float)
        memory = internal_state["memory_usage"]
        assert {"weight", "kvcache", "token_capacity", "graph"} <= set(memory)
        assert memory["weight"] >= 0 and memory["kvcache"] >= 0


def test_server_info_carries_the_server_args_and_sglang_defaults(server: EngineProcess) -> None:
    """SGLang puts every server arg both at the top level and in each internal state
    (``vars(get_global_server_args())``); what the reference engine does not have gets SGLang's
    default, not null."""
    info = http(server, "/server_info")[1]
    state = info["internal_states"][0]
    for body in (info, state):
        assert body["page_size"] == 1 and body["disable_radix_cache"] is False
        assert body["dp_size"] == 1 and body["pp_size"] == 1 and body["ep_size"] == 1
        assert body["speculative_num_draft_tokens"] == 4 and body["max_running_requests"] == 48
        assert body["schedule_policy"] == "fcfs" and body["kv_cache_dtype"] == "auto"
    assert info["status"] == "ready" and isinstance(info["version"], str)
    assert info["max_req_input_len"] == 511
    assert info["startup_time"] > 0 and state["startup_time"] == info["startup_time"]


def samples(text: str) -> list:
    return [s for f in text_string_to_metric_families(text) for s in f.samples]


def test_server_info_reports_the_decode_graph_plan_as_sglang_does_and_what_was_captured(server: EngineProcess) -> None:
    """0.5.23: the flags as given at the top level, the resolved plan under
    ``cuda_graph_config.decode`` (``cuda_graph_hook.parse_cuda_graph_config``, before the runtime
    cut) and the captured sizes as ``internal_states[i].decode_cuda_graph_bs``: none on CPU."""
    info = http(server, "/server_info")[1]
    decode = info["cuda_graph_config"]["decode"]
    assert decode["backend"] == "full" and decode["max_bs"] == 160, "unknown GPU memory: SGLang's 160"
    assert decode["bs"][:9] == [1, 2, 3, 4, 5, 6, 7, 8, 10] and decode["bs"][-1] == 160, "speculation's list"
    assert info["cuda_graph_bs_decode"] is None and info["disable_cuda_graph"] is False
    assert info["internal_states"][0]["decode_cuda_graph_bs"] == []


def test_metrics_agree_with_meta_info(server: EngineProcess) -> None:
    """Counters move by exactly what the requests' ``meta_info`` says, under SGLang's labels:
    ``spec_verify_calls_total`` by ``spec_verify_ct`` (what dashboards divide generated tokens by
    for an accept length), tokens and requests by ``completion_tokens`` / ``prompt_tokens``, and a
    streamed request lands in ``is_streaming="true"``."""
    before = http(server, "/metrics")[1]
    plain = http(server, "/generate", greedy("one whole answer", 20))[1]["meta_info"]
    streamed = [e for e in sse_events(server, "/generate", greedy("one streamed answer", 20, stream=True))
                if e != "[DONE]"][-1]["meta_info"]
    after = http(server, "/metrics")[1]

    def delta(name: str, **labels: str) -> float:
        return metric_total(after, name, **labels) - metric_total(before, name, **labels)

    assert delta("sglang:spec_verify_calls_total") == plain["spec_verify_ct"] + streamed["spec_verify_ct"] > 0
    assert delta("sglang:generation_tokens_total", is_streaming="false") == plain["completion_tokens"]
    assert delta("sglang:generation_tokens_total", is_streaming="true") == streamed["completion_tokens"]
    assert delta("sglang:prompt_tokens_total") == plain["prompt_tokens"] + streamed["prompt_tokens"]
    assert delta("sglang:num_requests_total", is_streaming="true") == 1
    assert delta("sglang:request_time_per_output_token_seconds_count") == 2
    # each request's wait in the scheduler's queue, observed once, at its prefill
    assert delta("sglang:queue_time_seconds_count") == 2
    assert delta("sglang:time_to_first_token_seconds_count", is_streaming="true") == 1
    # the streamed request's chunks: one observation per token after the first
    assert delta("sglang:inter_token_latency_seconds_count", is_streaming="true") == streamed["completion_tokens"] - 1


def test_scheduler_gauges_and_constants(server: EngineProcess) -> None:
    info = http(server, "/server_info")[1]
    text = http(server, "/metrics")[1]
    gauges = {s.name: s for s in samples(text) if s.name in (
        "sglang:max_total_num_tokens", "sglang:num_running_reqs", "sglang:num_retracted_reqs",
        "sglang:spec_accept_length")}
    assert gauges["sglang:max_total_num_tokens"].value == info["max_total_num_tokens"]
    assert gauges["sglang:num_retracted_reqs"].value == 0
    for sample in gauges.values():
        assert sample.labels == {"model_name": "ref-tiny", "engine_type": "unified", "tp_rank": "0",
                                 "pp_rank": "0", "moe_ep_rank": "0"}
    assert "# TYPE sglang:queue_time_seconds histogram" in text
    assert "# TYPE sglang:cached_tokens_total counter" in text
