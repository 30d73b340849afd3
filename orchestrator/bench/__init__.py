"""Benchmark harness: load generation, metric definitions, reports, the correctness probe.

The sweep uses :func:`run_benchmark` (one callback per repetition) and :func:`run_probe` (greedy
outputs against a stored baseline). The names are imported on first use (PEP 562), so loading a
spec does not pull in the HTTP client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_WHERE = {
    "BenchFailure": "report",
    "BenchResult": "report",
    "BenchRun": "runner",
    "BenchSettings": "settings",
    "BenchmarkAborted": "report",
    "Distribution": "metrics",
    "DriftCheck": "noise",
    "LevelResult": "report",
    "LevelWarmup": "report",
    "ProbeBaselineError": "probe",
    "ProbeMismatch": "probe",
    "ProbeResult": "probe",
    "ProgressUpdate": "runner",
    "RepetitionMetrics": "metrics",
    "arun_benchmark": "runner",
    "open_benchmark": "runner",
    "read_json": "report",
    "run_benchmark": "runner",
    "run_level": "runner",
    "run_probe": "probe",
    "run_repetition": "runner",
    "warm_up_level": "runner",
    "write_json": "report",
}
"""Each public name and the module of this package that defines it."""

__all__ = list(_WHERE)

if TYPE_CHECKING:  # pragma: no cover
    from orchestrator.bench.metrics import Distribution, RepetitionMetrics
    from orchestrator.bench.noise import DriftCheck
    from orchestrator.bench.probe import ProbeBaselineError, ProbeMismatch, ProbeResult, run_probe
    from orchestrator.bench.report import (
        BenchFailure,
        BenchmarkAborted,
        BenchResult,
        LevelResult,
        LevelWarmup,
        read_json,
        write_json,
    )
    from orchestrator.bench.runner import (
        BenchRun,
        ProgressUpdate,
        arun_benchmark,
        open_benchmark,
        run_benchmark,
        run_level,
        run_repetition,
        warm_up_level,
    )
    from orchestrator.bench.settings import BenchSettings


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}; it exports {', '.join(__all__)}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
