"""The confirmation on the cluster: ``confirm.run_confirmation`` with real visits, each
``visit_worker.run_visit`` on a fresh engine placed like a trial, persisted by the coordinator.
"""

from __future__ import annotations

import time
from typing import Any

from orchestrator.spec import SweepSpec
from orchestrator.sweep.confirmation.confirm import Confirmation, choose_contenders, run_confirmation
from orchestrator.sweep.execution.time_limits import trial_limits
from orchestrator.sweep.output.display import Display
from orchestrator.sweep.records.results import TrialRecord

__all__ = ["run_cluster_confirmation", "run_placed_visit"]


def run_placed_visit(*, record: TrialRecord, round_number: int, repetitions: int, ctx: Any,
                     start_timeout_s: float | None = None) -> dict[str, Any]:
    """One confirmation visit: a fresh engine of ``record``'s config in a placement group shaped
    like a trial's (``spec.trial_placement``), its start limited to ``start_timeout_s`` (default
    ``budget.engine_start_timeout_s``)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from orchestrator.sweep.execution.visit_worker import run_visit

    placement = ctx.spec.trial_placement
    bundles = [dict(b) for b in placement.bundles]
    group = placement_group(bundles, strategy=placement.strategy)
    try:
        ray.get(group.ready(), timeout=600)
        task = ray.remote(run_visit).options(
            num_cpus=bundles[0]["CPU"], scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=group, placement_group_bundle_index=0, placement_group_capture_child_tasks=True),
        )
        return ray.get(task.remote(engine_config=record.engine_config, ctx=ctx,
                                   visit_id=f"confirm-{record.number}-{round_number}",
                                   repetitions=repetitions, start_timeout_s=start_timeout_s))
    finally:
        remove_placement_group(group)


def run_cluster_confirmation(spec: SweepSpec, records: list[TrialRecord], *, ctx: Any, coordinator: Any,
                             display: Display, max_minutes: float | None = None, extend_to: int | None = None,
                             given_minutes: float | None = None) -> Confirmation | None:
    """The confirmation (``confirm.run_confirmation``) with placed visits, persisted by the
    coordinator (a resumed sweep continues where it stopped, under the design recorded with its
    visits) and shown while they run.

    Args:
        ctx: The trials' ``trial.TrialContext`` (spec, coordinator), which a visit shares.
        max_minutes: Its time (``time_budget.TimeBudget.confirmation_minutes``); default
            ``confirmation.max_minutes``.
        extend_to: ``--max-visits``: extend the design to this many looks (recorded through the
            coordinator, as visits are, before the first visit under it).
        given_minutes: ``--max-minutes``: the rounds' time in this run, instead of ``max_minutes``.
    """
    import ray

    lines = ray.get(coordinator.confirmation_visits.remote())  # visits and design lines (confirmation.jsonl)
    done = [line for line in lines if "trial" in line]
    results_dir = ray.get(coordinator.info.remote())["results_dir"]
    start_timeout_s = trial_limits(spec, records).start_s  # the trials' measured starts: a hung start costs minutes

    def visit(record: TrialRecord, round_number: int, *, repetitions: int) -> dict[str, Any]:
        if display.confirmation is None:  # the first visit
            display.confirmation_started(len(choose_contenders(records, top_k=spec.confirmation.top_k,
                                                                 no_speculation=spec.confirmation.no_speculation)),
                                         done=len(done), max_visits=extend_to)
        display.activity = (f"confirmation round {round_number + 1}: trial {record.number} {record.label} on a fresh "
                            "engine (start, warm-up, repetitions)", time.monotonic())
        try:
            return run_placed_visit(record=record, round_number=round_number, repetitions=repetitions, ctx=ctx,
                                    start_timeout_s=start_timeout_s)
        finally:
            display.activity = None
            display.visit_ended()

    return run_confirmation(
        spec, records, visit=visit, say=display.line, done=lines, max_minutes=max_minutes, extend_to=extend_to,
        given_minutes=given_minutes, results_dir=results_dir,
        on_visit=lambda entry: ray.get(coordinator.record_visit.remote(entry)),
    )
