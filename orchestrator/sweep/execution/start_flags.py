"""Sweep-only start flags: what a trial's (and a confirmation visit's) engine adds to start sooner.

* ``--skip-server-warmup``: the harness warms every level up itself.
* ``--cuda-graph-bs-decode`` / ``--cuda-graph-max-bs-decode``: decode CUDA graphs only for the
  batch sizes the benchmark can reach (:func:`reachable_batch_size`).

The flags are recorded with the trial (``start_flags``, ``engine_command``) but never in its
``engine_config``; a spec that sets any of them keeps its own, and
``budget.sweep_only_start_flags: false`` turns them off. docs/design/sweep.md says why they change
nothing the benchmark measures.
"""

from __future__ import annotations

from typing import Mapping

from orchestrator.spec import SweepSpec
from serving.cuda_graph_rules import decode_batch_sizes
from serving.engine.config import EngineConfig, FlagValue
from serving.speculative_rules import SPECULATIVE_MAX_RUNNING_REQUESTS

__all__ = [
    "GRAPH_FLAGS",
    "WARMUP_FLAG",
    "reachable_batch_size",
    "sweep_start_flags",
    "with_start_flags",
]

WARMUP_FLAG = "skip_server_warmup"
"""SGLang's switch for its own warm-up request."""

GRAPH_FLAGS = ("cuda_graph_bs_decode", "cuda_graph_max_bs_decode")
"""The decode CUDA-graph flags the sweep sets: the list, then its largest size."""

USER_GRAPH_CHOICES = (
    *GRAPH_FLAGS,
    "cuda_graph_config",
    "cuda_graph_backend_decode",
    "disable_decode_cuda_graph",
    "disable_cuda_graph",
)
"""``extra_args`` flags by which a spec chooses the decode graphs itself; with any of them set (not
``false``) the sweep adds no graph flag. ``skip_server_warmup`` given at all is the spec's choice."""


def _int_flag(value: FlagValue | None) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


def _given(extra_args: Mapping[str, FlagValue], flag: str, *, false_counts: bool = True) -> bool:
    """Whether ``extra_args`` sets ``flag``, spelled out or as a prefix (SGLang's parser takes
    unambiguous prefixes); ``false_counts=False``: a flag given as ``false`` does not count."""
    return any(flag.startswith(name) and (false_counts or value is not False) for name, value in extra_args.items())


def reachable_batch_size(spec: SweepSpec, config: EngineConfig) -> int:
    """The largest decode batch the sweep's benchmark can put on ``config``'s engine: the highest
    concurrency level, capped by ``max_running_requests`` (``engine.extra_args``, else SGLang's 48
    under speculation)."""
    n = max(spec.benchmark.concurrency)
    cap = _int_flag(config.extra_args.get("max_running_requests"))
    if cap is None and config.speculative:
        cap = SPECULATIVE_MAX_RUNNING_REQUESTS
    return max(1, min(n, cap)) if cap is not None else n


def sweep_start_flags(spec: SweepSpec, config: EngineConfig) -> dict[str, FlagValue]:
    """The flags a sweep adds to ``config``'s engine, in SGLang's names: ``skip_server_warmup`` and the
    decode CUDA-graph sizes the benchmark reaches, minus those the spec chooses itself; empty with
    ``budget.sweep_only_start_flags: false``."""
    if not spec.budget.sweep_only_start_flags:
        return {}
    extra = config.extra_args
    flags: dict[str, FlagValue] = {}
    if not _given(extra, WARMUP_FLAG):
        flags[WARMUP_FLAG] = True
    if not any(_given(extra, flag, false_counts=False) for flag in USER_GRAPH_CHOICES):
        n = reachable_batch_size(spec, config)
        sizes = decode_batch_sizes(n, speculative=config.speculative,
                                   disable_padding=extra.get("disable_cuda_graph_padding") is True)
        flags["cuda_graph_bs_decode"] = list(sizes)
        flags["cuda_graph_max_bs_decode"] = max(sizes)
    return flags


def with_start_flags(config: EngineConfig, flags: Mapping[str, FlagValue]) -> EngineConfig:
    """``config`` as the sweep launches it: ``flags`` added to its ``extra_args``."""
    if not flags:
        return config
    return config.model_copy(update={"extra_args": {**config.extra_args, **flags}})
