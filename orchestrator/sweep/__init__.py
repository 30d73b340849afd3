"""The tuning sweep: Ray Tune + Optuna over the spec's space, every trial proven and recorded.

Modules, in the order data flows through them:

* ``search``: the define-by-run space (SGLang's rules), the baselines, the Optuna searcher.
* ``trial``: one trial (engine host, env audit, probe, benchmark, teardown), as a Tune trainable.
* ``coordinator``: the single writer of the results directory and MLflow (a Ray actor).
* ``results``: trial records (``trials.jsonl``), atomic files.
* ``results_dir``: where results go; an earlier sweep's outputs moved to ``history/``.
* ``report`` / ``plots``: the verdict (best, improvements, NCCL effects) and its plots.
* ``display``: the console: a line per trial event, and what a quiet sweep is waiting for.
* ``callbacks``: Ray Tune's callbacks: progress lines, the record of trials that could not record themselves.
* ``scheduler``: ASHA early stopping that never stops a baseline.
* ``cluster``: the driver's Ray connection and the coordinator actor, one per results directory.
* ``visit``: the confirmation on the cluster: each visit ``trial.run_visit`` placed like a trial, persisted, shown.
* ``finish``: every trial recorded, then the verdict's files (summary, best.yaml, plots) and the parent run's figures.
* ``driver``: ``run_sweep``, what the CLI and ``python -m orchestrator.sweep`` call: one sweep, top to bottom.
* ``preview``: ``dry_run``, the baselines and first proposals with their engine commands, no Ray.
"""

from orchestrator.sweep.driver import SweepResumeError, run_sweep
from orchestrator.sweep.finish import SweepOutcome
from orchestrator.sweep.preview import dry_run
from orchestrator.sweep.results_dir import resolve_results_dir

__all__ = ["SweepOutcome", "SweepResumeError", "dry_run", "resolve_results_dir", "run_sweep"]
