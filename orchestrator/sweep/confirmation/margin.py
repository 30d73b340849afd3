"""The confirmation's margin: each engine kind's between-visit noise prior (measured or assumed, each
figure saying which), and the margin ``confirmation.margin: auto`` derives from it
(docs/design/bench-and-spec.md gives the sources)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from orchestrator.sequential import critical_value
from orchestrator.spec import SweepSpec
from orchestrator.sweep.confirmation.extension import spec_design

__all__ = ["GPU_FIGURES", "Figure", "VISIT_CV_PRIOR", "confirmation_margin", "visit_cv_prior", "visit_noise_key"]


@dataclass(frozen=True)
class Figure:
    """A number with where it comes from.

    Attributes:
        value: The figure (a between-visit CV: the sd of a fresh engine's log level).
        kind: ``measured`` (by spectune, where and when in ``source``) or ``assumed`` (taken from elsewhere).
        source: Where it comes from, in words, with the measurement's directory where there is one.
    """

    value: float
    kind: Literal["measured", "assumed"]
    source: str

    def label(self) -> str:
        """``measured: one H200 ... (docs/measurements/...)``."""
        return f"{self.kind}: {self.source}"


VISIT_CV_PRIOR: dict[str, Figure] = {
    "reference": Figure(0.045, "measured", "the CPU reference engine, the demo's 5 paired visits "
                        "(docs/measurements/demo-cpu)"),
    "reference-gpu": Figure(0.01, "measured", "the GPU reference engine, c8, decode in CUDA graphs, one H200: "
                            "0.9-1.0% between visits (docs/measurements/gpu-replication-h200x1-graphs)"),
    "reference-gpu-eager": Figure(0.117, "measured", "the GPU reference engine decoding eagerly, paired fresh "
                                  "starts on one H200 (issue 29)"),
    "sglang": Figure(0.003, "assumed", "the top of a public table of one SGLang server's repetitions (0.1-0.3% "
                     "at c1-c16); nothing here measured SGLang between visits"),
}
"""The engine kind's between-visit CV before the sweep measures its own: each with its provenance
(docs/design/bench-and-spec.md). Only an entry whose kind is ``measured`` was measured by spectune."""

GPU_FIGURES: tuple[tuple[str, Figure], ...] = (
    ("between visits", VISIT_CV_PRIOR["reference-gpu"]),
    ("between starts", Figure(0.07, "measured", "the GPU reference engine's chain runs on one H100: 6.6-7.2% "
                              "between starts (docs/measurements/chain-prediction-h100x1)")),
)
"""spectune's own GPU spreads: the plan states its decision chance at these too."""


def visit_cv_prior(key: str) -> Figure:
    """The between-visit CV prior of the engine kind ``key`` (:func:`visit_noise_key`), with its provenance."""
    return VISIT_CV_PRIOR[key]


def visit_noise_key(spec: SweepSpec) -> str:
    """Which ``VISIT_CV_PRIOR`` entry ``spec``'s engine follows (the reference engine on the CPU,
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
    within which "equivalent" is reachable by the last look at the engine kind's prior
    between-visit CV (:func:`visit_cv_prior`): ``c_last * sqrt(2) * cv / sqrt(max_visits)``, ``c_last`` the last look's
    boundary of the main design (``orchestrator.sequential.main_design``: alpha held in reserve for
    extensions) with the leader's correction for ``top_k``. An extension keeps the margin the
    sweep started with (recorded with its stages, ``extension.design_record``)."""
    settings = spec.confirmation
    if settings.margin != "auto":
        return float(settings.margin)
    design = spec_design(spec)
    last = design[-1].last
    c_last = critical_value(last, design=design, comparisons=settings.top_k)
    cv = visit_cv_prior(visit_noise_key(spec)).value
    reachable = c_last * math.sqrt(2.0) * cv / math.sqrt(last)
    return max(0.01, math.ceil(reachable / 0.005 - 1e-9) * 0.005)
