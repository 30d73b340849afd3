"""``/server_info`` (alias ``/get_server_info``) in the shape SGLang's own clients read.

SGLang 0.5.23's handler (``srt/entrypoints/http_server.py`` ``server_info``) returns
``{**build_server_info(server_args, scheduler_info), "startup_time", "internal_states": [...],
"version", "frontend"}``, where ``build_server_info`` (``srt/utils/common.py``) is
``server_args.resolved_dict()`` (every server arg with SGLang's resolutions applied) plus
``launch_command``, ``scheduler_info`` and ``kv_events``. Each ``internal_states[i]`` is one DP
rank's ``get_internal_state`` (``srt/managers/scheduler_components/internal_state.py``): again
every server arg (``get_context().resolved_server_args_dict()``), then ``world_size``,
``startup_time``, ``effective_max_running_requests_per_dp``, ``last_gen_throughput``,
``memory_usage`` (``weight``/``kvcache``/``graph`` in GB, ``token_capacity`` in tokens) and, once
a verify cycle has been folded since the last ``/flush_cache``, ``avg_spec_accept_length``.

What reads it: ``python/sglang/bench_one_batch_server.py`` asserts
``internal_states[0]["effective_max_running_requests_per_dp"] > 0``, multiplies it by
``internal_states[0].get("dp_size") or 1``, sums ``memory_usage.token_capacity`` over the states,
and takes ``tokenizer_path`` and ``avg_spec_accept_length`` / ``last_gen_throughput``; SGLang's
speculative tests read ``internal_states[0]["avg_spec_accept_length"]``. spectune's own harness
(``orchestrator/bench/control.py``) reads the same accept length.

The reference engine has no DP, pipeline or expert parallelism and no paged or radix cache; the
server args SGLang would report for those are given SGLang's defaults (``dp_size`` 1,
``page_size`` 1, ``disable_radix_cache`` false, ...) instead of null, because a client computes
with them (``max_running * dp_size``).
"""

from __future__ import annotations

from typing import Any

from serving.reference.config import DTYPE_BYTES, get_preset
from serving.reference.http_common import AppState

__all__ = ["SGLANG_DEFAULTS", "build_server_info"]

SGLANG_DEFAULTS: dict[str, Any] = {
    # SGLang ServerArgs defaults for what the reference engine does not have or does not resolve.
    "page_size": 1,
    "disable_radix_cache": False,
    "schedule_policy": "fcfs",
    "kv_cache_dtype": "auto",
    "dp_size": 1,
    "attn_dp_size": 1,  # newest SGLang's name next to dp_size (dp_size if --enable-dp-attention, else 1)
    "enable_dp_attention": False,
    "pp_size": 1,
    "ep_size": 1,
    "attn_cp_size": 1,
    "moe_dp_size": 1,
    "disaggregation_mode": "null",
    "disable_cuda_graph": False,
    "disable_decode_cuda_graph": False,
    "disable_prefill_cuda_graph": False,
    "disable_cuda_graph_padding": False,
}
"""Filled in where the reference engine's value is None (or the arg does not exist here)."""



def _server_args(state: AppState) -> dict[str, Any]:
    args = state.args.to_dict()
    for name, value in SGLANG_DEFAULTS.items():
        if args.get(name) is None:
            args[name] = value
    return args


def _memory_usage(state: AppState, scheduler_memory: dict[str, Any]) -> dict[str, Any]:
    """SGLang's ``memory_usage``: GB of rank 0's weights and full-size KV cache, from the preset's
    shapes (this engine's cache grows on demand up to that size), and ``token_capacity`` =
    ``max_total_num_tokens``. The scheduler's own cache figures are kept next to them."""
    args = state.args
    preset = get_preset(args.model_path)
    size = DTYPE_BYTES.get(args.dtype, 4)
    kv_bytes = state.max_total_num_tokens * preset.kv_elements_per_token(args.tp_size) * size
    return {
        **scheduler_memory,
        "weight": round(preset.weight_elements(args.tp_size) * size / 2**30, 2),
        "kvcache": round(kv_bytes / 2**30, 2),
        "token_capacity": int(state.max_total_num_tokens),
        "graph": round(state.graph_memory_gb, 3),
    }


def build_server_info(state: AppState, *, version: str) -> dict[str, Any]:
    """The ``/server_info`` body (SGLang's shape, plus a ``reference_engine`` section).

    Before the workers are ready ``internal_states[0]`` still carries the server args,
    ``memory_usage`` and ``effective_max_running_requests_per_dp`` (from the resolved flags), so a
    client polling early sees the final shape; the scheduler's counters join once it reports.
    """
    args = _server_args(state)
    args["cuda_graph_config"] = {"decode": state.args.decode_graph_plan().config_dict()}
    scheduler = dict(state.client.internal_state) if state.client else {}
    scheduler_memory = scheduler.pop("memory_usage", {}) or {}
    internal: dict[str, Any] = {
        **args,
        **scheduler,
        "last_gen_throughput": scheduler.get("last_gen_throughput", 0.0),
        "memory_usage": _memory_usage(state, scheduler_memory),
        # SGLang: self.max_running_requests after resolve_max_num_reqs (speculation caps it at 48).
        "effective_max_running_requests_per_dp": state.args.max_running_requests,
        # The sizes really captured (SGLang's internal_states key): [] when decode runs eagerly.
        "decode_cuda_graph_bs": list(state.decode_cuda_graph_bs),
    }
    body: dict[str, Any] = {
        **args,
        "max_total_num_tokens": state.max_total_num_tokens,
        "max_req_input_len": state.args.context_length - 1,
        "internal_states": [internal],
        "version": version,
    }
    if state.ready:
        body["status"] = "ready"
    if state.startup_time is not None:
        # Seconds from process start to ready (SGLang's sglang:engine_startup_time meaning).
        internal["startup_time"] = body["startup_time"] = state.startup_time
    body["reference_engine"] = {
        "workers": state.worker_info,
        "ready": state.ready,
        "counters": (
            "totals since the last /flush_cache; folded every --decode-log-interval "
            "iterations and whenever the server goes idle"
        ),
    }
    return body
