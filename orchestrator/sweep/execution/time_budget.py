"""``budget.time_limit_s`` bounds the whole sweep: the search stops *starting* trials in time for the
confirmation, which gets what is left; no running trial is killed for the budget.

Ray Tune's ``time_budget_s`` would stop every trial when it runs out (its ``TimeoutStopper``): the
running one is killed and its start wasted, and the confirmation after it was outside any bound.
Instead the searcher asks :meth:`TimeBudget.stop_reason` before each proposal (the baselines always
run: the probe needs the no-speculation one) and finishes the search when

    elapsed + one trial  >  time_limit_s - the confirmation's least time

where one trial is ``cost.trial_cost`` (the one estimate the plan reads too: the median measured
start, run and teardown, ``TrialTimings``' parts counted once; before any, the spec's estimates); and the
confirmation's least time is ``confirmation.min_visits`` rounds of its contenders at the visit
estimate (``cost.visit_estimate_s``): less than that decides nothing. The confirmation then runs
under ``min(confirmation.max_minutes, what is left)``. Ray's ``time_budget_s`` stays as a backstop,
a trial's limit past the budget. A resumed sweep counts from its resume.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable

from orchestrator.spec import SweepSpec
from orchestrator.sweep.output.cost import format_duration, planned_starts, trial_cost, visit_estimate_s
from orchestrator.sweep.records.results import TrialRecord

__all__ = ["TimeBudget"]


class TimeBudget:
    """The sweep's clock against ``budget.time_limit_s``.

    Picklable where ``records`` is (Ray Tune pickles the searcher that asks it).

    Args:
        spec: The sweep.
        records: The trials ended so far, read at each question (the sweep's writer's records).
        clock: Seconds, monotonic (tests pass their own).
    """

    def __init__(self, spec: SweepSpec, *, records: Callable[[], Iterable[TrialRecord]],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.spec = spec
        self.records = records
        self.clock = clock
        self.started = clock()

    def __setstate__(self, state: dict) -> None:
        """Unpickled (Ray Tune restores the searcher that holds it on ``--resume``): the budget counts
        from now, as a monotonic clock of another process means nothing here."""
        self.__dict__.update(state)
        self.started = self.clock()

    @property
    def limit_s(self) -> float | None:
        return self.spec.budget.time_limit_s

    def elapsed_s(self) -> float:
        return self.clock() - self.started

    def left_s(self) -> float | None:
        """Seconds of ``budget.time_limit_s`` left (None without a limit)."""
        return None if self.limit_s is None else max(0.0, self.limit_s - self.elapsed_s())

    def trial_s(self, records: list[TrialRecord]) -> float:
        """What one more trial is expected to take: ``cost.trial_cost`` (the plan's own estimate), a warm one."""
        return trial_cost(self.spec, records).total_s

    def confirmation_reserve_s(self, records: list[TrialRecord]) -> float:
        """The confirmation's least time: ``min_visits`` rounds of its contenders (0 when it is off)."""
        contenders = planned_starts(self.spec).contenders
        if not contenders:
            return 0.0
        return contenders * self.spec.confirmation.min_visits * visit_estimate_s(self.spec, records)

    def stop_reason(self) -> str | None:
        """Why the search must start no more trials (in words), or None while one still fits."""
        if self.limit_s is None:
            return None
        records = list(self.records())
        trial, reserve, elapsed = self.trial_s(records), self.confirmation_reserve_s(records), self.elapsed_s()
        if elapsed + trial <= self.limit_s - reserve:
            return None
        return (f"budget.time_limit_s ({format_duration(self.limit_s)}): {format_duration(elapsed)} spent, another "
                f"trial takes about {format_duration(trial)} and the confirmation needs at least "
                f"{format_duration(reserve)}; no more trials are started")

    def confirmation_minutes(self) -> float | None:
        """The confirmation's time: ``confirmation.max_minutes`` or what the budget has left, the smaller."""
        left = self.left_s()
        own = self.spec.confirmation.max_minutes
        if left is None:
            return own
        return left / 60 if own is None else min(own, left / 60)
