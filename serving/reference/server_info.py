"""``/server_info`` (alias ``/get_server_info``) in SGLang 0.5.23's shape.

Follows ``server_info`` in SGLang's ``srt/entrypoints/http_server.py``; what its clients read and
what is filled with SGLang's defaults is in docs/reference-engine.md ("SGLang compatibility:
/server_info and /metrics").
"""

from __future__ import annotations

from typing import Any

from serving.reference.config import DTYPE_BYTES, get_preset
from serving.reference.http_common import AppState

__all__ = ["SGLANG_DEFAULTS", "build_server_info"]

SGLANG_DEFAULTS: dict[str, Any] = {
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
"""SGLang's ServerArgs defaults, filled in where the reference engine's value is None or absent."""

def _server_args(state: AppState) -> dict[str, Any]:
    args = state.args.to_dict()
    for name, value in SGLANG_DEFAULTS.items():
        if args.get(name) is None:
            args[name] = value
    return args


def _memory_usage(state: AppState, scheduler_memory: dict[str, Any]) -> dict[str, Any]:
    """SGLang's ``memory_usage`` for rank 0 (full-size KV cache), next to the scheduler's figures."""
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

    Before the workers are ready the body already has its final shape; the scheduler's counters
    join once it reports.
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
        # SGLang: max_running_requests after resolve_max_num_reqs.
        "effective_max_running_requests_per_dp": state.args.max_running_requests,
        # [] when decode runs eagerly.
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
        # Seconds from process start to ready.
        internal["startup_time"] = body["startup_time"] = state.startup_time
    body["reference_engine"] = {
        "workers": state.worker_info,
        "ready": state.ready,
        "counters": (
            "totals since the last /flush_cache; folded every --decode-log-interval "
            "iterations and whenever the server goes idle"
        ),
    }
    for name in state.drop_fields:  # the drop_field fault
        body.pop(name, None)
        internal.pop(name, None)
    return body
