"""The tuning sweep: Ray Tune + Optuna over the spec's space, every trial proven and recorded.

Modules, in the order one sweep uses them:

* ``driver``: ``run_sweep``, one sweep top to bottom; ``preflight``: checks before the first trial.
* ``results_dir``, ``cluster``, ``coordinator``: where results go, and their single writer (a Ray actor).
* ``search``, ``scheduler``: the Optuna searcher (baselines first) and ASHA that spares the baselines.
* ``trial``, ``session``: one trial as a Tune trainable; one engine's life, shared with a visit.
* ``callbacks``, ``display``: Ray Tune's callbacks and the console.
* ``results``: trial records (``trials.jsonl``).
* ``visit``, ``visit_worker``, ``confirm``, ``confirm_margin``: the confirmation on fresh engines, its verdict, and
  its margin (from the measured between-visit noise).
* ``figures``, ``finish``, ``report``, ``per_load``, ``adaptive_schedule``, ``plots``: the verdict's
  numbers and files.
* ``preview``: ``dry_run``, the first proposals and their engine commands, no cluster.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.sweep.driver import SweepResumeError, run_sweep
    from orchestrator.sweep.finish import SweepOutcome
    from orchestrator.sweep.preview import dry_run
    from orchestrator.sweep.results_dir import resolve_results_dir

__all__ = ["SweepOutcome", "SweepResumeError", "dry_run", "resolve_results_dir", "run_sweep"]

_EXPORTS = {
    "SweepOutcome": "orchestrator.sweep.finish",
    "SweepResumeError": "orchestrator.sweep.driver",
    "dry_run": "orchestrator.sweep.preview",
    "resolve_results_dir": "orchestrator.sweep.results_dir",
    "run_sweep": "orchestrator.sweep.driver",
}


def __getattr__(name: str) -> Any:
    """The package's names, imported on first use (PEP 562), so a trial worker does not load Optuna."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'orchestrator.sweep' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
