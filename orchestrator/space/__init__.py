"""The search space of a sweep: which configurations are candidates, how many, and how a sampler walks them.

Modules, one job each:

* ``points``: the valid points (SGLang's speculative rules, the all-reduce paths, NCCL settings),
  counted without listing, and why a spec may not use a space (``space_problems``).
* ``plan``: what one trial runs (``TrialPlan``: a baseline or a point), and one key per configuration.
* ``define_by_run``: the space as Optuna samples it (``DefineByRunSpace``): the sampling function, the
  baselines, the replay of a known point, starting points, distances and one-factor variants.
* ``settings``: one point from ``key=value`` settings (``spectune engine-cmd --set``).

This package re-exports all but ``define_by_run``, which imports Optuna: the spec, ``spectune
validate`` and the CLI need only the points. Import ``DefineByRunSpace`` from
``orchestrator.space.define_by_run``.

The spec builds the space (``SweepSpec.space()``) and the searcher (``orchestrator.sweep.search``)
walks it: data flows spec -> space -> search, so nothing here imports the spec or the sweep
(``tests/unit/test_import_graph.py`` checks it).
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
