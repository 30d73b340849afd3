"""The search space of a sweep: which configurations are candidates, how many, and how a sampler walks them.

* ``points``: the valid points, their count, and ``space_problems``.
* ``plan``: what one trial runs (``TrialPlan``), and one key per configuration.
* ``define_by_run``: the space as Optuna samples it (``DefineByRunSpace``; not re-exported here,
  since it imports Optuna).
* ``settings``: one point from ``key=value`` settings (``spectune engine-cmd --set``).
* ``arms``: the all-reduce arms on one node.
* ``kernels``: whether one draft step runs another graph than longer chains.

Nothing here imports the spec or the sweep.
"""

from orchestrator.space import plan, points
from orchestrator.space.plan import BASELINE_AUTO, BASELINE_PLAIN, IDENTITY_PARAMS, TrialPlan, candidate_key, configuration_key
from orchestrator.space.points import *  # noqa: F403 - the package re-exports points.__all__
from orchestrator.space.point_settings import candidate_from_settings
from orchestrator.space.kernels import one_step_runs_own_graph

__all__ = [*plan.__all__, *points.__all__, "candidate_from_settings", "one_step_runs_own_graph"]
