"""Sweep-only start flags: what a trial's (and a confirmation visit's) engine adds to its command line
to start sooner, and why each flag changes nothing the benchmark measures.

Every trial and every confirmation visit is an engine start; on an 8-GPU node an SGLang start of
Kimi-K2.5 loads ~600 GB of weights and then captures decode CUDA graphs, minutes each. Two parts of
that start serve a server nobody has warmed up, for loads the benchmark never sends:

* **SGLang's warm-up request.** ``--skip-server-warmup`` skips it (0.5.23
  ``srt/entrypoints/http_server.py`` ``_wait_and_warmup``: ``if not skip_server_warmup:
  execute_warmup_func(...)`` else the server is marked up at once). The harness warms every level
  up itself (``benchmark.warmup_requests`` and the stability windows), after the correctness probe.
* **Decode CUDA graphs for batch sizes that never run.** Unset, SGLang builds the decode list from
  ``generate_decode_cuda_graph_batch_sizes(max_bs)`` (0.5.23 ``srt/arg_groups/cuda_graph_hook.py``):
  under speculation ``1-8, 10-32 step 2, 40-64 step 4, 72-256 step 8, 272.. step 16``, without it
  ``1, 2, 4, 8, 12, 16-256 step 8, 272-496 step 16, 512.. step 32``; entries above ``max_bs``
  dropped, ``max_bs`` itself appended when missing. ``max_bs`` defaults by GPU memory
  (``srt/arg_groups/memory_hook.py`` ``handle_gpu_memory_settings``: 256 below TP 4 and 512 from TP
  4 on an 80-160 GB GPU such as the H200). The runner then keeps only sizes up to the request pool
  (``srt/model_executor/runner/base_cuda_graph_runner.py`` ``get_batch_sizes_to_capture``:
  ``capture_bs = [bs for bs in capture_bs if bs <= num_max_requests]``, ``num_max_requests`` being
  ``req_to_token_pool.size``, i.e. ``max_running_requests``), which speculation sets to 48 unless
  given (``srt/arg_groups/speculative_hook.py``): 1-8, 10-32 step 2, 40, 44, 48 with speculation;
  about fifty sizes up to 512 without it (the no-speculation baseline and contender). A decode batch
  of ``n`` requests replays the smallest captured size ``>= n`` (``_pad_to_bucket``:
  ``bisect_left(buckets, raw_size)``) and runs eagerly above the largest (``can_run_graph``:
  ``cuda_graph_bs <= self.max_bs``).

Which batch sizes the benchmark reaches: at most one request per closed-loop worker, and in open
loop at most the level's concurrency in flight (``orchestrator.bench.loadgen``), so no decode batch
exceeds the highest of ``benchmark.concurrency`` — in warm-up, stability windows and repetitions
alike; the correctness probe and ``/health_generate`` send one request at a time. Below the level
every size occurs, as a batch fills at the start and drains at the end of a run (and shrinks for a
moment whenever a request finishes before its successor is admitted). The engine's own cap bounds
it too: ``max_running_requests`` (48 under speculation unless ``engine.extra_args`` sets it). So
the reachable sizes are ``1..n`` with ``n = min(highest level, that cap)``, and the captured list is
SGLang's own list built for ``max_bs = n`` (``serving.cuda_graph_rules.decode_batch_sizes``): every reachable size
pads to a captured one no larger than ``n``, sizes up to the last default entry below ``n`` replay
exactly the graph the served default engine replays for them, and the few sizes between that entry
and ``n`` pad to ``n`` instead of to the next default entry (no slower). With
``disable_cuda_graph_padding`` in ``extra_args`` SGLang captures every size (``range(1, max_bs +
1)``), and so does this list. ``--cuda-graph-bs-decode`` holds the list (SGLang then takes
``max_bs = max(bs)``, ``memory_hook.py``); ``--cuda-graph-max-bs-decode`` says the largest.

What differs from the served engine, and is left so: with ``mem_fraction_static`` unset SGLang
reserves ``max_bs * 2`` MB for decode graphs when it sizes the KV pool
(``memory_hook.reserve_for_graph_mb``), so a sweep engine's pool may be up to about 1 GB per GPU
larger than the served default's (none of it on a GPU where the 10 GB floor applies; set
``mem_fraction_static`` to make them identical, as the Kimi spec does). Where a GPU's own default
``max_bs`` is below ``n`` (GPUs under 60 GB: 8, 32 or 48 below TP 4), the sweep captures sizes the
served default runs eagerly.

The flags are the sweep's business only: a trial's record carries them (``TrialRecord.start_flags``,
the MLflow tag ``spectune.start_flags``, and the ``engine_command`` that ran), while the recorded
``engine_config`` — what ``best.yaml`` and ``spectune serve --mlflow-run`` are built from — never
does: what is served starts as SGLang's default, or as the user's ``engine.extra_args`` say. A spec
that sets any of these flags itself (or disables decode CUDA graphs, or gives ``cuda_graph_config``)
keeps its own; ``budget.sweep_only_start_flags: false`` turns them all off.
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
"""``extra_args`` flags by which a spec decides the decode graphs itself (a size, a list, the JSON
config that wins over both, a backend, or none at all); with any of them set (``false`` is not a
choice: it renders as nothing) the sweep adds no graph flag. ``skip_server_warmup`` given at all,
``false`` included, is the spec's choice (``false``: keep SGLang's warm-up)."""


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
    unambiguous prefixes of long options: ``skip_server_warm`` is ``skip_server_warmup``).
    ``false_counts=False``: a flag given as ``false`` (rendered as nothing) does not count."""
    return any(flag.startswith(name) and (false_counts or value is not False) for name, value in extra_args.items())


def reachable_batch_size(spec: SweepSpec, config: EngineConfig) -> int:
    """The largest decode batch the sweep's benchmark can put on ``config``'s engine (see the module
    docstring): the highest concurrency level, capped by the engine's ``max_running_requests``
    (``engine.extra_args``, else SGLang's 48 under speculation). The probe's single requests are
    below it."""
    n = max(spec.benchmark.concurrency)
    cap = _int_flag(config.extra_args.get("max_running_requests"))
    if cap is None and config.speculative:
        cap = SPECULATIVE_MAX_RUNNING_REQUESTS
    return max(1, min(n, cap)) if cap is not None else n


def sweep_start_flags(spec: SweepSpec, config: EngineConfig) -> dict[str, FlagValue]:
    """The flags a sweep adds to ``config``'s engine (a trial's, or a confirmation visit's), in
    SGLang's names: ``skip_server_warmup``, and the decode CUDA-graph sizes the benchmark reaches;
    empty with ``budget.sweep_only_start_flags: false``. A flag the spec sets in
    ``engine.extra_args`` is left as given (and with any decode-graph choice of the spec, no graph
    flag is added)."""
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
    """``config`` as the sweep launches it: ``flags`` added to its ``extra_args``. The config a
    trial records (and ``best.yaml`` holds) stays the one without them."""
    if not flags:
        return config
    return config.model_copy(update={"extra_args": {**config.extra_args, **flags}})
