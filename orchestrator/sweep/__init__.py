"""The tuning sweep: Ray Tune + Optuna over the spec's space, every trial proven and recorded.

One folder a job, in the order one sweep uses them:

* ``execution``: the sweep on Ray: the driver, the preflight, the writer actor, Tune's callbacks,
  a trial and a confirmation visit on the cluster, the end, the dry run.
* ``search``: the Optuna searcher (baselines first) and early stopping (ASHA sparing the baselines).
* ``confirmation``: the confirmation's statistics: which contender to visit, the verdict, its margin.
* ``output``: the figures, the summary in words, the plots, the console.
* ``records``: the trial record every part reads, and the results directory.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.sweep.execution.driver import SweepResumeError, run_sweep
    from orchestrator.sweep.execution.finish import SweepOutcome
    from orchestrator.sweep.execution.preview import dry_run
    from orchestrator.sweep.records.results_dir import resolve_results_dir

__all__ = ["SweepOutcome", "SweepResumeError", "dry_run", "resolve_results_dir", "run_sweep"]

_EXPORTS = {
    "SweepOutcome": "orchestrator.sweep.execution.finish",
    "SweepResumeError": "orchestrator.sweep.execution.driver",
    "dry_run": "orchestrator.sweep.execution.preview",
    "resolve_results_dir": "orchestrator.sweep.records.results_dir",
    "run_sweep": "orchestrator.sweep.execution.driver",
}


def __getattr__(name: str) -> Any:
    """The package's names, imported on first use (PEP 562), so a trial worker does not load Optuna."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'orchestrator.sweep' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
