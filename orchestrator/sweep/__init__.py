"""The tuning sweep: Ray Tune + Optuna over the spec's space, every trial proven and recorded.

Modules, in the order one sweep uses them:

* ``driver``: ``run_sweep``, what the CLI and ``python -m orchestrator.sweep`` call: one sweep, top to bottom.
* ``preflight``: what the first trial needs (tracking, resources, the engine where it will run), checked first.
* ``results_dir``: where results go; an earlier sweep's outputs moved to ``history/``.
* ``cluster``: the driver's Ray connection and the coordinator actor, one per results directory.
* ``coordinator``: the single writer of the results directory and MLflow (a Ray actor).
* ``search``: the Optuna searcher over the space's define-by-run function (``orchestrator.space``):
  the baselines first, a staged search, honest tells.
* ``scheduler``: ASHA early stopping that never stops a baseline.
* ``trial``: one trial (engine host, env audit, probe, benchmark, teardown), as a Tune trainable.
* ``session``: one engine's life in a trial's placement group (host actor, start, audit, time
  limit, teardown, log), shared by a trial and a confirmation visit.
* ``callbacks`` / ``display``: Ray Tune's callbacks (progress, trials that could not record themselves)
  and the console they print to, which is never silent for long.
* ``results``: trial records (``trials.jsonl``), atomic files.
* ``visit`` / ``visit_worker`` / ``confirm``: the confirmation: visits on fresh engines placed like
  trials (``visit_worker`` is the visit in its Ray worker), and the interleaved rounds that decide
  the verdict (no Ray: the visits are handed in).
* ``figures``: every number of the summary (the best, its improvements, NCCL effects, per-load
  results, the crossover), computed in one pass.
* ``finish`` / ``report`` / ``per_load`` / ``adaptive_schedule`` / ``plots``: the verdict's files
  (summary, best.yaml, summary.json, SGLang's adaptive schedule), those figures in words, the plots.
* ``preview``: ``dry_run``, the baselines and first proposals with their engine commands, no cluster.
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
    """The package's names, imported on first use (PEP 562). A trial worker unpickles
    ``orchestrator.sweep.trial`` and so imports this package: eager imports here would load the
    driver, the searcher and with it Optuna into every worker, which needs none of them."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'orchestrator.sweep' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
