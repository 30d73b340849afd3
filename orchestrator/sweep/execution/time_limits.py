"""A trial's time limits, from what the sweep has measured: a hang costs minutes, not the budget.

``budget.engine_start_timeout_s`` and ``budget.trial_timeout_s`` are sized for a start nobody has
timed yet (the Kimi specs: 40 and 60 minutes). Once one trial has run to its end, the sweep knows
how long an engine start and a trial's measuring take on this node, and a hang (a non-default
``NCCL_BUFFSIZE`` has caused them) need not cost the whole budget. Each later trial runs under::

    start limit = max(2 x longest start, longest start + 2 min)
    trial limit = start limit + max(2 x longest run, longest run + 5 min) + longest teardown + 1 min

each capped by the spec's own. The longest start is the longest *warm* one once one is measured
(a node's first start is cold and slower: ``cost.cold_starts``), else the cold one. A run is what
the trial's timer covers after its engine is up (audit, contract, probe, benchmark: the trial's
timings but its start and teardown: ``TrialTimings.run``, what ``cost.trial_cost`` takes the median
of), over the trials that ended ``ok``; a configuration that
measures longer (more repetitions to reach the interval) fits the factor of two.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from orchestrator.spec import SweepSpec
from orchestrator.sweep.output.cost import format_duration, measured_start_times, warm_and_cold_starts
from orchestrator.sweep.records.results import TrialRecord

__all__ = ["TrialLimits", "trial_limits"]

START_FACTOR, START_MARGIN_S = 2.0, 120.0
RUN_FACTOR, RUN_MARGIN_S = 2.0, 300.0
SLACK_S = 60.0


@dataclass(frozen=True)
class TrialLimits:
    """The limits one trial runs under, and where they come from.

    Attributes:
        start_s: Seconds its engine may take to become healthy.
        trial_s: Seconds from the engine's launch to the trial's end.
        basis: In words: the spec's budget, or the measurements the limits were derived from.
    """

    start_s: float
    trial_s: float
    basis: str

    @property
    def derived(self) -> bool:
        return not self.basis.startswith("budget")


def trial_limits(spec: SweepSpec, records: Iterable[TrialRecord]) -> TrialLimits:
    """The limits for the next trial: the spec's until a trial has ended ``ok``, then derived (module
    docstring), never above the spec's."""
    budget = spec.budget
    spec_limits = TrialLimits(start_s=budget.engine_start_timeout_s, trial_s=budget.trial_timeout_s,
                              basis="budget.engine_start_timeout_s and budget.trial_timeout_s (nothing measured yet)")
    if not budget.derive_time_limits:
        return TrialLimits(spec_limits.start_s, spec_limits.trial_s, "budget (derive_time_limits: false)")
    records = list(records)
    finished = [r for r in records if r.status == "ok" and measured_start_times([r])]
    if not finished:
        return spec_limits
    _, warm, _ = warm_and_cold_starts(records)
    starts = warm or measured_start_times(records)
    start = max(starts)
    runs = [r.timings_s.run for r in finished]  # the same run ``cost.trial_cost`` medians; here the longest
    run = max(runs)
    teardown = max((r.timings_s.teardown or 0.0 for r in finished), default=0.0)
    start_s = min(budget.engine_start_timeout_s, max(START_FACTOR * start, start + START_MARGIN_S))
    trial_s = min(budget.trial_timeout_s, start_s + max(RUN_FACTOR * run, run + RUN_MARGIN_S) + teardown + SLACK_S)
    basis = (f"derived from {len(starts)} {'warm' if warm else 'cold'} start{'s' * (len(starts) > 1)} (longest "
             f"{format_duration(start)}) and {len(runs)} finished trial{'s' * (len(runs) > 1)} (longest run "
             f"{format_duration(run)}); budget.engine_start_timeout_s={budget.engine_start_timeout_s:g} and "
             f"budget.trial_timeout_s={budget.trial_timeout_s:g} cap them")
    return TrialLimits(start_s=start_s, trial_s=trial_s, basis=basis)
