"""A trial's timings: what each phase took, and a total that is *derived*, never stored beside its parts.

The trial (``execution.trial``) times its phases (engine start, contract, probe, benchmark, teardown)
and its whole wall clock. The wall clock minus the phases is ``other`` (the audit, reading the
engine's answers, reporting); :attr:`TrialTimings.total` is the sum of the parts, so it equals the
wall clock and nothing can add it to its own parts again (records before this type stored
``total`` beside its parts, and three readers summed the dict: a trial counted twice).

Records on disk load either way: with a ``total`` (or ``wall``) key, ``other`` is what it has
beyond the parts; without one, ``other`` is unknown (None) and ``total`` is the parts' sum.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

__all__ = ["PARTS", "TrialTimings", "trial_timings"]

PARTS = ("engine_start", "contract", "probe", "bench", "teardown", "other")
"""The phases, in the order a trial runs them (``other``: the wall clock's rest)."""


class TrialTimings(BaseModel):
    """Seconds per phase of one trial (None: the phase did not run or was not timed).

    Serialised as a flat dict of the timed parts plus ``total`` (for readers of ``trials.jsonl``),
    and read back from one: a stored ``total`` only fills ``other``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine_start: float | None = Field(default=None, description="Launch to healthy.")
    contract: float | None = Field(default=None, description="The first answers checked (serving.engine.contract).")
    probe: float | None = Field(default=None, description="The correctness probe.")
    bench: float | None = Field(default=None, description="The benchmark, its warm-up included.")
    teardown: float | None = Field(default=None, description="Stopping the engine and proving its tree gone.")
    other: float | None = Field(default=None, description="The wall clock beyond the parts above (audit, "
                                "reading the engine's answers, reporting); None in records without a wall clock.")

    @model_validator(mode="before")
    @classmethod
    def _derive_other(cls, data: Any) -> Any:
        """``total`` / ``wall`` (the trial's wall clock) -> ``other`` = wall - parts (never below 0)."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        wall = data.pop("total", None)
        wall = data.pop("wall", wall)
        if wall is not None and data.get("other") is None:
            parts = sum(float(v) for k, v in data.items() if k in PARTS and v is not None)
            data["other"] = round(max(0.0, float(wall) - parts), 3)
        return data

    @model_serializer(mode="plain")
    def _flat(self) -> dict[str, float]:
        return self.as_dict()

    @property
    def total(self) -> float:
        """The trial's whole time: the sum of its parts (its wall clock where ``other`` is known)."""
        return sum(v for v in self.parts().values())

    @property
    def run(self) -> float:
        """What the trial spent on its engine after the start, the teardown excluded (contract, probe,
        benchmark, other): what ``time_limits`` bounds and ``cost.trial_cost`` medians."""
        return self.total - (self.engine_start or 0.0) - (self.teardown or 0.0)

    def parts(self) -> dict[str, float]:
        """The timed phases (those not None), in :data:`PARTS` order."""
        return {name: getattr(self, name) for name in PARTS if getattr(self, name) is not None}

    def as_dict(self) -> dict[str, float]:
        """The timed phases and ``total``: what ``trials.jsonl`` and MLflow's ``time.*_s`` hold."""
        return {**self.parts(), "total": round(self.total, 3)}


def trial_timings(timed: dict[str, float]) -> TrialTimings:
    """The trial's record of its timer (``execution.trial``: the phases it timed and its ``wall`` clock),
    rounded to the millisecond."""
    return TrialTimings.model_validate({k: round(v, 3) for k, v in timed.items()})
