"""The visit economy: how many repetitions a confirmation visit should run.

A visit's variance is ``between + within / r`` and its cost ``c_start + r * c_rep``; the best ``r``
for a fixed cost is ``sqrt((c_start / c_rep) * (within / between))`` (:func:`choose_repetitions`).
:func:`visit_economy` estimates the components and costs from the trials and visits so far.
docs/design/sweep.md gives the derivation and the estimators.

**It never acts on a between-visit spread it has no evidence for.** A variance component
estimated from three pairs is often 0 (noise minus its within-visit share, truncated), and 0
sends the rule to its cap: a CPU sweep went from 1 to 8 repetitions per visit and doubled its
time. So the choice reads, for the between-visit spread:

* below :data:`MIN_BETWEEN_DF` degrees of freedom (the largest single comparison's pairs - 1: the
  comparisons share SGLang's default's visits, so their degrees of freedom do not add), the engine
  kind's **prior** (``margin.VISIT_CV_PRIOR``, passed in as ``prior_cv``), said as such;
* from there on, the one-sided :data:`UPPER_LEVEL` **chi-square upper bound** of the measured
  variance (its within-visit share taken off): an estimate of 0 from few pairs is not evidence that
  repetitions beat fresh starts.

And the choice never spends more than the time left: repetitions per visit are capped at what
``seconds_per_visit`` (the confirmation's time left / the visits left) holds after a start.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Sequence

from orchestrator.sweep.records.results import TrialRecord

__all__ = ["MAX_REPETITIONS_PER_VISIT", "MIN_BETWEEN_DF", "UPPER_LEVEL", "VisitEconomy", "between_upper_bound",
           "choose_repetitions", "engine_prior", "time_cap", "visit_economy"]

MAX_REPETITIONS_PER_VISIT = 8
"""The most repetitions the economy gives one visit (slow drift within a long visit is not cancelled)."""


MIN_BETWEEN_DF = 4
"""Degrees of freedom (pairs - 1 of the comparison with the most pairs) before the between-visit
estimate moves the choice, through its upper bound; below it the engine kind's prior does. At 4 df
the 90% upper bound of a variance is 3.8x the estimate; at 2 df, 9.5x."""

UPPER_LEVEL = 0.90
"""One-sided level of the chi-square upper bound the choice reads the between-visit variance at."""


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
        acted_between_cv: The between-visit spread the choice read (the prior, the upper bound, or
            None: assumed equal to the within-visit spread).
        acted_on: Where ``acted_between_cv`` comes from, in words ("prior: ...", "90% upper bound ...").
        time_cap: The most repetitions the time left allows a visit (None: no time limit or no costs).
    """

    within_cv: float | None
    between_cv: float | None
    start_s: float | None
    repetition_s: float | None
    repetitions_per_visit: int
    basis: str
    between_df: int = 0
    acted_between_cv: float | None = None
    acted_on: str = ""
    time_cap: int | None = None

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

        measured = pct(self.between_cv)
        if self.between_cv is not None:
            measured += f" ({self.between_df} df)"
        acted = f", read as {self.acted_on}" if self.acted_on else ""
        return (f"visit economy: spread within a visit {pct(self.within_cv)}, added by a fresh start "
                f"{measured}{acted}; "
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


def between_upper_bound(variance: float, df: int, *, level: float = UPPER_LEVEL) -> float:
    """The one-sided ``level`` chi-square upper bound of a variance estimated as ``variance`` from
    ``df`` degrees of freedom: ``variance x df / chi2_{1 - level}(df)``."""
    from scipy.stats import chi2

    return variance * df / float(chi2.ppf(1.0 - level, df))


def time_cap(*, seconds_per_visit: float | None, start_s: float | None, repetition_s: float | None) -> int | None:
    """The most repetitions a visit can run in ``seconds_per_visit`` after its start (at least 1);
    None without a time limit or without the costs."""
    if seconds_per_visit is None or not start_s or not repetition_s or repetition_s <= 0:
        return None
    return max(1, math.floor((seconds_per_visit - start_s) / repetition_s))


def engine_prior(spec: Any) -> tuple[float | None, str]:
    """The engine kind's between-visit CV (``margin.VISIT_CV_PRIOR`` at ``margin.visit_noise_key``) and how
    the line names it ("the measured reference prior", "the assumed sglang prior"); (None, "") where the
    table has no entry."""
    from orchestrator.sweep.confirmation import margin

    key = margin.visit_noise_key(spec)
    figure = margin.VISIT_CV_PRIOR.get(key)
    if figure is None:
        return None, ""
    return figure.value, f"the {figure.kind} {key} prior"


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
                  paired_diffs: Sequence[tuple[Sequence[float], Sequence[int]]], fixed: int | None,
                  prior_cv: float | None = None, prior_name: str = "the engine kind's prior",
                  seconds_per_visit: float | None = None) -> VisitEconomy:
    """The components, the costs and the repetitions per visit (``fixed`` when the spec sets them).

    Args:
        records: The search's trials (their objective repetitions, their timings).
        visits: The confirmation's visits so far (``values``, ``timings``).
        paired_diffs: Per comparison, the per-round log ratios and each round's repetitions.
        fixed: ``confirmation.repetitions_per_visit`` when it is a number.
        prior_cv: The engine kind's between-visit CV (``margin.VISIT_CV_PRIOR``): what the choice
            reads below :data:`MIN_BETWEEN_DF` (None: the between-visit spread is taken as equal to
            the within-visit one there).
        prior_name: Where ``prior_cv`` comes from, for the line.
        seconds_per_visit: The confirmation's time left / the visits left (None: no time limit): the
            repetitions a visit may run are capped by it (:func:`time_cap`), ``fixed`` too.
    """
    within = _pooled_log_variance(
        [r.objective.values for r in records if r.objective is not None and r.status == "ok"]
        + [v.get("values") or [] for v in visits if v.get("status") == "ok"])
    noise_total, repeated_total, pooled_df, between_df = 0.0, 0.0, 0, 0
    for diffs, reps in paired_diffs:
        if len(diffs) >= 2:
            df = len(diffs) - 1
            noise_total += _variance(diffs) / 2.0 * df
            repeated_total += statistics.fmean(1.0 / max(1, r) for r in reps) * (within or 0.0) * df
            pooled_df += df
            between_df = max(between_df, df)  # they share the default's visits: the df do not add
    noise = noise_total / pooled_df if pooled_df else None
    repeated = repeated_total / pooled_df if pooled_df else 0.0
    between = max(noise - repeated, 0.0) if noise is not None else None
    settled = between if between_df >= MIN_BETWEEN_DF else None
    upper = between_upper_bound(noise, between_df) - repeated if noise is not None and between_df else None
    acted: float | None
    if upper is not None and between_df >= MIN_BETWEEN_DF and upper > 0:
        acted, acted_on = upper, f"its {UPPER_LEVEL:.0%} upper bound {math.sqrt(upper):.1%}"
    elif prior_cv is not None:
        acted = prior_cv ** 2
        why = (f"until {MIN_BETWEEN_DF} df" if between_df < MIN_BETWEEN_DF else
               "the pairs vary less than the repetitions within a visit would make them: the two cannot be told "
               "apart")
        acted_on = f"{prior_name} {prior_cv:.1%}" + (f" ({why})" if between is not None else "")
    else:
        acted, acted_on = None, ""
    timed = [v.get("timings") or {} for v in visits if v.get("status") == "ok"]
    start_s = _median(t.get("engine_start", 0.0) + t.get("teardown", 0.0) + t.get("warmup", 0.0) for t in timed) \
        or _median((r.timings_s.engine_start or 0.0) + (r.timings_s.teardown or 0.0) for r in records)
    repetition_s = _median((t.get("bench", 0.0) - t.get("warmup", 0.0)) / max(1, len(v.get("values") or [])) for t, v in
                           zip(timed, [v for v in visits if v.get("status") == "ok"])) or _median(
        (r.timings_s.bench or 0.0) / max(1, sum(len(vs) for vs in r.level_values.values()) or r.repetitions_done)
        for r in records if r.repetitions_done)
    chosen = fixed if fixed is not None else choose_repetitions(within=within, between=acted, start_s=start_s,
                                                                repetition_s=repetition_s)
    basis = ("set by confirmation.repetitions_per_visit" if fixed is not None else
             "chosen from the confirmation's visits" if settled is not None else
             f"the start's share measured with {between_df} degree(s) of freedom, too few to act on"
             if between is not None else "chosen before the first look")
    if acted is None and fixed is None:
        basis += ": between-visit spread assumed equal to the within-visit spread"
    cap = time_cap(seconds_per_visit=seconds_per_visit, start_s=start_s, repetition_s=repetition_s)
    if cap is not None and chosen > cap:
        chosen = cap
        basis += f"; capped at {cap} by the time left ({seconds_per_visit:.0f} s a visit still to make)"
    return VisitEconomy(
        within_cv=math.sqrt(within) if within is not None else None,
        between_cv=math.sqrt(between) if between is not None else None,
        start_s=start_s, repetition_s=repetition_s, repetitions_per_visit=chosen, basis=basis, between_df=between_df,
        acted_between_cv=math.sqrt(acted) if acted is not None else None, acted_on=acted_on, time_cap=cap,
    )
