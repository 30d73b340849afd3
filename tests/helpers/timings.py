"""Trial timings as the trial produces them (``execution.trial``'s timer through ``records.timings``), for
fixtures: a hand-written dict could leave the wall clock out and hide a double count."""

from __future__ import annotations

from orchestrator.sweep.records.timings import TrialTimings, trial_timings


def produced(*, engine_start: float | None = None, contract: float | None = None, probe: float | None = None,
             bench: float | None = None, teardown: float | None = None, other: float = 0.0) -> TrialTimings:
    """The timings of a trial that timed these phases and whose wall clock was their sum plus ``other``."""
    timed = {name: value for name, value in (("engine_start", engine_start), ("contract", contract), ("probe", probe),
                                             ("bench", bench), ("teardown", teardown)) if value is not None}
    return trial_timings({**timed, "wall": sum(timed.values()) + other})
