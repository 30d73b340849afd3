"""Benchmark harness: load generation, metric definitions, reports, the correctness probe.

The sweep uses two calls: :func:`run_benchmark` (settings from the spec's ``benchmark`` section,
one callback per repetition) and :func:`run_probe` (greedy outputs against a stored baseline).
"""

from orchestrator.bench.metrics import Distribution, RepetitionMetrics
from orchestrator.bench.probe import ProbeMismatch, ProbeResult, run_probe
from orchestrator.bench.report import BenchResult, LevelResult, read_json, write_json
from orchestrator.bench.runner import ProgressUpdate, arun_benchmark, run_benchmark
from orchestrator.bench.settings import BenchSettings

__all__ = [
    "BenchResult",
    "BenchSettings",
    "Distribution",
    "LevelResult",
    "ProbeMismatch",
    "ProbeResult",
    "ProgressUpdate",
    "RepetitionMetrics",
    "arun_benchmark",
    "read_json",
    "run_benchmark",
    "run_probe",
    "write_json",
]
