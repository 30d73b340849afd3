"""Which decode batch sizes SGLang 0.5.23 captures in CUDA graphs, and which graph a batch replays,
written once for the sweep's start flags and the GPU reference engine. Sources, under ``sglang/srt/``:

* the list: ``arg_groups/cuda_graph_hook.py`` ``generate_decode_cuda_graph_batch_sizes``;
* max_bs: ``arg_groups/memory_hook.py`` ``handle_gpu_memory_settings``;
* the runtime cut: ``model_executor/runner/base_cuda_graph_runner.py`` ``get_batch_sizes_to_capture``;
* the off switches: ``parse_cuda_graph_config``;
* replay: ``BaseCudaGraphRunner._pad_to_bucket`` and ``can_run_graph``.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Optional, Sequence

from serving.speculative_rules import SPECULATIVE_MAX_RUNNING_REQUESTS

__all__ = [
    "DecodeGraphPlan",
    "decode_backend",
    "decode_backend_of",
    "decode_batch_sizes",
    "default_decode_max_bs",
    "graph_batch_size",
    "plan_decode_graphs",
]

Backend = Literal["full", "breakable", "disabled"]


def decode_batch_sizes(max_bs: int, *, speculative: bool, disable_padding: bool = False) -> list[int]:
    """SGLang's decode capture list for ``max_bs`` (``generate_decode_cuda_graph_batch_sizes``).

    Args:
        max_bs: The largest batch size to capture (appended when the pattern misses it).
        speculative: Speculative decoding on (a denser pattern at small sizes).
        disable_padding: ``--disable-cuda-graph-padding``: every size from 1, no padding.
    """
    if disable_padding:
        sizes = list(range(1, max_bs + 1))
    elif not speculative:
        sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    else:
        sizes = [*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8), *range(272, max_bs + 1, 16)]
    sizes = [bs for bs in sizes if bs <= max_bs]
    if max_bs not in sizes:
        sizes.append(max_bs)
    return sizes


def default_decode_max_bs(gpu_memory_mib: Optional[float], tp_size: int) -> int:
    """``handle_gpu_memory_settings``'s ``max_bs`` for a GPU of ``gpu_memory_mib`` (None: unknown)."""
    if gpu_memory_mib is None:
        return 160
    gib = gpu_memory_mib / 1024
    small_tp = tp_size < 4
    if gib < 20:
        return 8
    if gib < 35:
        return 48 if small_tp else 160
    if gib < 60:
        return 32 if small_tp else 160
    if gib < 160:
        return 256 if small_tp else 512
    return 512


@dataclass(frozen=True)
class DecodeGraphPlan:
    """What the decode graphs are: the resolved config and the sizes captured.

    Attributes:
        backend: ``cuda_graph_config.decode.backend``.
        max_bs: ``cuda_graph_config.decode.max_bs`` (as resolved, before the runtime cut).
        bs: ``cuda_graph_config.decode.bs`` (likewise).
        captured: The sizes really captured (``decode_cuda_graph_bs``): empty when disabled.
        pad: Whether a batch pads up to the next captured size (``--disable-cuda-graph-padding`` off).
    """

    backend: Backend
    max_bs: int
    bs: tuple[int, ...]
    captured: tuple[int, ...]
    pad: bool = True

    @property
    def enabled(self) -> bool:
        return self.backend != "disabled" and bool(self.captured)

    def config_dict(self) -> dict[str, object]:
        """``/server_info``'s ``cuda_graph_config.decode``."""
        return {"backend": self.backend, "max_bs": self.max_bs, "bs": list(self.bs)}


def decode_backend(
    *,
    cuda_graph_backend_decode: Optional[Backend] = None,
    disable_decode_cuda_graph: bool = False,
    disable_cuda_graph: bool = False,
) -> Backend:
    """Decode's CUDA-graph backend from the flags, in SGLang 0.5.23's precedence: the backend flag
    over ``--disable-decode-cuda-graph`` over the deprecated ``--disable-cuda-graph`` (``full`` unset)."""
    backend: Backend = "full"
    if disable_cuda_graph or disable_decode_cuda_graph:
        backend = "disabled"
    if cuda_graph_backend_decode is not None:
        backend = cuda_graph_backend_decode
    return backend


def decode_backend_of(flags: Mapping[str, Any]) -> Backend:
    """``decode_backend`` of SGLang flags by name (a spec's ``extra_args``, ``/server_info``'s args)."""
    return decode_backend(cuda_graph_backend_decode=flags.get("cuda_graph_backend_decode"),
                          disable_decode_cuda_graph=bool(flags.get("disable_decode_cuda_graph")),
                          disable_cuda_graph=bool(flags.get("disable_cuda_graph")))


def plan_decode_graphs(
    *,
    speculative: bool,
    gpu_memory_mib: Optional[float],
    tp_size: int,
    max_running_requests: Optional[int] = None,
    request_pool: Optional[int] = None,
    cuda_graph_bs_decode: Optional[Sequence[int]] = None,
    cuda_graph_max_bs_decode: Optional[int] = None,
    cuda_graph_backend_decode: Optional[Backend] = None,
    disable_decode_cuda_graph: bool = False,
    disable_cuda_graph: bool = False,
    disable_cuda_graph_padding: bool = False,
) -> DecodeGraphPlan:
    """The decode graphs an SGLang 0.5.23 server with these flags captures, in its precedence:
    the backend flag over the off-switches over the deprecated ``--disable-cuda-graph``; an explicit
    list over ``--cuda-graph-max-bs-decode`` over the memory default; then the request-pool cut.

    Args:
        max_running_requests: ``--max-running-requests`` as given (a lower one caps a defaulted max_bs).
        request_pool: The running server's request pool, which cuts the captured sizes (default:
            ``max_running_requests``, else 48 under speculation, else no cut).
    """
    backend = decode_backend(cuda_graph_backend_decode=cuda_graph_backend_decode,
                             disable_decode_cuda_graph=disable_decode_cuda_graph, disable_cuda_graph=disable_cuda_graph)
    if cuda_graph_bs_decode:
        bs = sorted(set(int(b) for b in cuda_graph_bs_decode))
        max_bs = max(bs)
    else:
        max_bs = cuda_graph_max_bs_decode or default_decode_max_bs(gpu_memory_mib, tp_size)
        if cuda_graph_max_bs_decode is None and max_running_requests is not None and max_running_requests < max_bs:
            max_bs = max_running_requests
        bs = decode_batch_sizes(max_bs, speculative=speculative, disable_padding=disable_cuda_graph_padding)
    pool = request_pool or max_running_requests or (SPECULATIVE_MAX_RUNNING_REQUESTS if speculative else None)
    captured = list(bs)
    if pool is not None:
        if max(captured) > pool:
            captured.append(pool)
        captured = sorted(set(b for b in captured if b <= pool))
    if backend == "disabled":
        captured = []
    return DecodeGraphPlan(backend=backend, max_bs=max_bs, bs=tuple(bs), captured=tuple(captured),
                           pad=not disable_cuda_graph_padding)


def graph_batch_size(batch: int, captured: Sequence[int], *, pad: bool = True) -> Optional[int]:
    """The captured size a decode batch of ``batch`` requests replays, or None to run it eagerly
    (above the largest captured size, none captured, or no exact size without padding)."""
    if batch < 1 or not captured or batch > captured[-1]:
        return None
    index = bisect.bisect_left(captured, batch)
    size = captured[index]
    return size if pad or size == batch else None
