"""The confirmation's margin: the measured between-visit noise of each engine kind, and the margin
``confirmation.margin: auto`` derives from it (docs/design/bench-and-spec.md gives the sources)."""

from __future__ import annotations

import math

from orchestrator.sequential import critical_value
from orchestrator.spec import SweepSpec
from orchestrator.sweep.confirmation.extension import spec_design

__all__ = ["MEASURED_VISIT_CV", "confirmation_margin", "visit_noise_key"]

MEASURED_VISIT_CV: dict[str, float] = {
    "reference": 0.045,
    "reference-gpu": 0.01,
    "reference-gpu-eager": 0.117,
    "sglang": 0.003,
}
"""Between-visit CV (sd of a fresh engine's log level) per engine, as measured."""


def visit_noise_key(spec: SweepSpec) -> str:
    """Which ``MEASURED_VISIT_CV`` entry ``spec``'s engine follows (the reference engine on the CPU,
    on a GPU with decode CUDA graphs, or on a GPU decoding eagerly)."""
    engine = spec.engine
    if engine.kind != "reference":
        return engine.kind
    extra = engine.extra_args
    device = extra.get("device")
    on_gpu = device == "cuda" or (device is None and spec.gpus_per_trial > 0)
    if not on_gpu:
        return "reference"
    eager = (extra.get("disable_decode_cuda_graph") or extra.get("disable_cuda_graph")
             or extra.get("cuda_graph_backend_decode") == "disabled" or engine.tp_size > 1)
    return "reference-gpu-eager" if eager else "reference-gpu"


def confirmation_margin(spec: SweepSpec) -> float:
    """``confirmation.margin``, or for ``auto`` the smallest margin (in 0.5% steps, at least 1%)
    within which "equivalent" is reachable by the last look at the engine kind's measured
    between-visit CV: ``c_last * sqrt(2) * cv / sqrt(max_visits)``, ``c_last`` the last look's
    boundary of the main design (``orchestrator.sequential.main_design``: alpha held in reserve for
    extensions) with the leader's correction for ``top_k``. An extension keeps the margin the
    sweep started with (recorded with its stages, ``extension.design_record``)."""
    settings = spec.confirmation
    if settings.margin != "auto":
        return float(settings.margin)
    design = spec_design(spec)
    last = design[-1].last
    c_last = critical_value(last, design=design, comparisons=settings.top_k)
    cv = MEASURED_VISIT_CV[visit_noise_key(spec)]
    reachable = c_last * math.sqrt(2.0) * cv / math.sqrt(last)
    return max(0.01, math.ceil(reachable / 0.005 - 1e-9) * 0.005)
