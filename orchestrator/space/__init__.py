"""The search space of a sweep: which configurations are candidates, how many, and how a sampler walks them.

* ``points``: the valid points, counted without listing, and ``space_problems``.
* ``plan``: what one trial runs (``TrialPlan``), and one key per configuration.
* ``define_by_run``: the space as Optuna samples it (``DefineByRunSpace``; not re-exported here,
  since it imports Optuna).
* ``settings``: one point from ``key=value`` settings (``spectune engine-cmd --set``).
* ``arms``: the all-reduce arms on one node.

Nothing here imports the spec or the sweep.
"""

from orchestrator.space.plan import BASELINE_AUTO, BASELINE_PLAIN, TrialPlan, candidate_key
from orchestrator.space.points import (
    AUTO,
    ALL_REDUCE_ARMS,
    AUTO_ONLY,
    MAX_CONFIGURATIONS,
    Candidate,
    NcclPreset,
    arm_flags,
    canonical_arm,
    SearchSpace,
    SpeculativeList,
    SpeculativeSpace,
    SpeculativeTriple,
    count_candidates,
    iter_candidates,
    preset_label,
    space_problems,
    speculative_triples,
    triple_problem,
)
from orchestrator.space.settings import candidate_from_settings

__all__ = [
    "ALL_REDUCE_ARMS",
    "AUTO",
    "AUTO_ONLY",
    "BASELINE_AUTO",
    "BASELINE_PLAIN",
    "Candidate",
    "MAX_CONFIGURATIONS",
    "NcclPreset",
    "SearchSpace",
    "SpeculativeList",
    "SpeculativeSpace",
    "SpeculativeTriple",
    "TrialPlan",
    "arm_flags",
    "canonical_arm",
    "candidate_from_settings",
    "candidate_key",
    "count_candidates",
    "iter_candidates",
    "preset_label",
    "space_problems",
    "speculative_triples",
    "triple_problem",
]
