"""The tuning sweep: Ray Tune + Optuna over the spec's space, every trial proven and recorded.

Modules, in the order data flows through them:

* ``search``: the Optuna searcher over the space's define-by-run function (``orchestrator.space``):
  the baselines first, a staged search, honest tells.
* ``trial``: one trial (engine host, env audit, probe, benchmark, teardown), as a Tune trainable.
* ``session``: one engine's life in a trial's placement group (host actor, start, audit, time
  limit, teardown, log), shared by a trial and a confirmation visit.
* ``coordinator``: the single writer of the results directory and MLflow (a Ray actor).
* ``results``: trial records (``trials.jsonl``), atomic files.
* ``report`` / ``plots``: the verdict (best, improvements, NCCL effects) and its plots.
* ``driver``: ``run_sweep`` and ``dry_run``, what the CLI and ``python -m orchestrator.sweep`` call.
"""

from orchestrator.sweep.driver import SweepOutcome, SweepResumeError, dry_run, resolve_results_dir, run_sweep

__all__ = ["SweepOutcome", "SweepResumeError", "dry_run", "resolve_results_dir", "run_sweep"]
