"""The visit economy: how many repetitions a confirmation visit should run.

A visit's variance is ``between + within / r`` and its cost ``c_start + r * c_rep``; the best ``r``
for a fixed cost is ``sqrt((c_start / c_rep) * (within / between))`` (:func:`choose_repetitions`).
:func:`visit_economy` estimates the components and costs from the trials and visits so far.
docs/design/sweep.md gives the derivation and the estimators.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Sequence

from orchestrator.sweep.records.results import TrialRecord

__all__ = ["MAX_REPETITIONS_PER_VISIT", "VisitEconomy", "choose_repetitions", "visit_economy"]

MAX_REPETITIONS_PER_VISIT = 8
"""The most repetitions the economy gives one visit (slow drift within a long visit is not cancelled)."""


MIN_BETWEEN_DF = 4
"""Degrees of freedom (pairs - 1, summed over comparisons) before the between-visit estimate moves
the choice (docs/design/sweep.md says why)."""


@dataclass(frozen=True)
class VisitEconomy:
    """The two variance components (as CVs: sd on the log scale), the costs, and the choice.

    Attributes:
        within_cv: Spread of repetitions on one engine.
        between_cv: Spread of a fresh engine's level beyond that (None: not measured yet).
        start_s: Seconds a visit spends outside repetitions (engine start, warm-up, teardown).
        repetition_s: Seconds one repetition takes.
        repetitions_per_visit: The choice.
        basis: Where the numbers came from.
        between_df: Degrees of freedom behind ``between_cv`` (acted on from :data:`MIN_BETWEEN_DF`).
    """

    within_cv: float | None
    between_cv: float | None
    start_s: float | None
    repetition_s: float | None
    repetitions_per_visit: int
    basis: str
    between_df: int = 0

    @property
    def settled_between_cv(self) -> float | None:
        """``between_cv`` once it has :data:`MIN_BETWEEN_DF` degrees of freedom, else None."""
        return self.between_cv if self.between_df >= MIN_BETWEEN_DF else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        def pct(value: float | None) -> str:
            return "not measured" if value is None else f"{value:.1%}"

        def sec(value: float | None) -> str:
            return "?" if value is None else f"{value:.0f} s"

        return (f"visit economy: spread within a visit {pct(self.within_cv)}, added by a fresh start "
                f"{pct(self.between_cv)}; "
                f"a start costs {sec(self.start_s)}, a repetition {sec(self.repetition_s)}: "
                f"{self.repetitions_per_visit} repetition(s) per visit ({self.basis})")


def choose_repetitions(*, within: float | None, between: float | None, start_s: float | None,
                       repetition_s: float | None, high: int = MAX_REPETITIONS_PER_VISIT) -> int:
    """``round(sqrt((start_s / repetition_s) * (within / between)))`` in ``[1, high]``; ``between``
    unknown counts as equal to ``within``; no costs known: 1."""
    if not start_s or not repetition_s or start_s <= 0 or repetition_s <= 0:
        return 1
    if within is None or within <= 0:
        return 1  # repetitions do not vary: one is as good as many
    share = 1.0 if between is None else (within / between if between > 0 else math.inf)
    if not math.isfinite(share):
        return high
    return max(1, min(high, round(math.sqrt(start_s / repetition_s * share))))


def _variance(values: Sequence[float]) -> float:
    """Sample variance (n - 1), in floats (``statistics.variance`` is exact in fractions, and slow)."""
    mean = math.fsum(values) / len(values)
    return math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1)


def _pooled_log_variance(groups: Iterable[Sequence[float]]) -> float | None:
    """Pooled variance of log values over groups of two or more (degrees of freedom as weights)."""
    total, df = 0.0, 0
    for values in groups:
        logs = [math.log(v) for v in values if isinstance(v, (int, float)) and v > 0]
        if len(logs) >= 2:
            total += _variance(logs) * (len(logs) - 1)
            df += len(logs) - 1
    return total / df if df else None


def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if isinstance(v, (int, float)) and v > 0]
    return statistics.median(present) if present else None


def visit_economy(*, records: Sequence[TrialRecord], visits: Sequence[dict[str, Any]],
                  paired_diffs: Sequence[tuple[Sequence[float], Sequence[int]]], fixed: int | None) -> VisitEconomy:
    """The components, the costs and the repetitions per visit (``fixed`` when the spec sets them).

    Args:
        records: The search's trials (their objective repetitions, their timings).
        visits: The confirmation's visits so far (``values``, ``timings``).
        paired_diffs: Per comparison, the per-round log ratios and each round's repetitions.
        fixed: ``confirmation.repetitions_per_visit`` when it is a number.
    """
    within = _pooled_log_variance(
        [r.objective.values for r in records if r.objective is not None and r.status == "ok"]
        + [v.get("values") or [] for v in visits if v.get("status") == "ok"])
    between_total, between_df = 0.0, 0
    for diffs, reps in paired_diffs:
        if len(diffs) >= 2:
            noise = _variance(diffs) / 2.0
            repeated = statistics.fmean(1.0 / max(1, r) for r in reps) * (within or 0.0)
            between_total += max(noise - repeated, 0.0) * (len(diffs) - 1)
            between_df += len(diffs) - 1
    between = between_total / between_df if between_df else None
    settled = between if between_df >= MIN_BETWEEN_DF else None
    timed = [v.get("timings") or {} for v in visits if v.get("status") == "ok"]
    start_s = _median(t.get("engine_start", 0.0) + t.get("teardown", 0.0) + t.get("warmup", 0.0) for t in timed) \
        or _median(r.timings_s.get("engine_start", 0.0) + r.timings_s.get("teardown", 0.0) for r in records)
    repetition_s = _median((t.get("bench", 0.0) - t.get("warmup", 0.0)) / max(1, len(v.get("values") or [])) for t, v in
                           zip(timed, [v for v in visits if v.get("status") == "ok"])) or _median(
        r.timings_s.get("bench", 0.0) / max(1, sum(len(vs) for vs in r.level_values.values()) or r.repetitions_done)
        for r in records if r.repetitions_done)
    chosen = fixed if fixed is not None else choose_repetitions(within=within, between=settled, start_s=start_s,
                                                                repetition_s=repetition_s)
    basis = ("set by confirmation.repetitions_per_visit" if fixed is not None else
             "chosen from the confirmation's visits" if settled is not None else
             f"the start's share measured with {between_df} degree(s) of freedom, too few to act on: assumed equal "
             f"to the within-visit spread until {MIN_BETWEEN_DF}" if between is not None else
             "chosen before the first look: between-visit spread assumed equal to the within-visit spread")
    return VisitEconomy(
        within_cv=math.sqrt(within) if within is not None else None,
        between_cv=math.sqrt(between) if between is not None else None,
        start_s=start_s, repetition_s=repetition_s, repetitions_per_visit=chosen, basis=basis, between_df=between_df,
    )
