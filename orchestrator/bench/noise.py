"""Deciding under noise: pure functions the runner asks after every warm-up window and repetition.

* :func:`windows_stable`: warm-up stops once two consecutive windows agree on throughput.
* :func:`repetition_verdict`: a level stops once its target metric's 95% interval is narrow
  enough, or at the cap.
* :func:`detect_drift`: a monotone trend across repetitions (Mann-Kendall).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.bench.metrics import Distribution

__all__ = [
    "DRIFT_ALPHA",
    "DRIFT_MIN_REPETITIONS",
    "DriftCheck",
    "RepetitionVerdict",
    "ci_rel",
    "detect_drift",
    "relative_difference",
    "repetition_verdict",
    "windows_stable",
]

DRIFT_ALPHA = 0.05
"""Two-sided significance level of the drift test."""

DRIFT_MIN_REPETITIONS = 5
"""Fewest repetitions the drift test is run on (no 4-value series can reach p < 0.05)."""


def _present(values: Sequence[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(v)]


# --- warm-up ----------------------------------------------------------------------------------


def relative_difference(a: float, b: float) -> float:
    """|a - b| / max(|a|, |b|): symmetric, in [0, 1] for values of one sign; 0 when both are 0."""
    scale = max(abs(a), abs(b))
    return abs(a - b) / scale if scale else 0.0


def windows_stable(throughputs: Sequence[float | None], *, tolerance: float) -> bool:
    """Whether warm-up is done: the last two windows' throughputs agree within ``tolerance``
    (:func:`relative_difference`). False with fewer than two windows, or either absent or 0."""
    if len(throughputs) < 2:
        return False
    a, b = throughputs[-2], throughputs[-1]
    if a is None or b is None or not (a and b):
        return False
    return relative_difference(a, b) <= tolerance


# --- adaptive repetitions ---------------------------------------------------------------------


def ci_rel(values: Sequence[float | None]) -> float | None:
    """The relative half-width w of the 95% interval of the geometric mean of the present values:
    w = exp(t(0.975, n - 1) * s / sqrt(n)) - 1 with s the sd of log(values), i.e.
    sqrt(ci95_high / ci95_low) - 1 of :class:`~orchestrator.bench.metrics.Distribution`.

    None with fewer than ``orchestrator.statistics.MIN_VALUES`` present values or a value <= 0.
    """
    dist = Distribution.of(_present(values))
    if dist.ci95_low is None or dist.ci95_high is None:
        return None
    return math.sqrt(dist.ci95_high / dist.ci95_low) - 1.0


@dataclass(frozen=True)
class RepetitionVerdict:
    """What :func:`repetition_verdict` decided after a repetition.

    Attributes:
        stop: No further repetition of this level.
        ci_rel: The achieved relative half-width (:func:`ci_rel`); None where it cannot be had.
        target_met: ``ci_rel <= target``; None when there is no target (fixed repetitions).
    """

    stop: bool
    ci_rel: float | None
    target_met: bool | None


def repetition_verdict(
    values: Sequence[float | None],
    *,
    min_repetitions: int,
    max_repetitions: int,
    target_ci_rel: float | None,
) -> RepetitionVerdict:
    """Whether a level has been repeated enough, given its target metric's value per finished
    repetition (None: absent, counted as done).

    With n = len(values) and w = :func:`ci_rel` (values): no target, stop at ``max_repetitions``;
    n < ``min_repetitions``, go on; w <= ``target_ci_rel``, stop (met); n >= ``max_repetitions``,
    stop (not met); otherwise go on.
    """
    n = len(values)
    width = ci_rel(values)
    if target_ci_rel is None:
        return RepetitionVerdict(stop=n >= max_repetitions, ci_rel=width, target_met=None)
    met = width is not None and width <= target_ci_rel
    if n < min_repetitions:
        return RepetitionVerdict(stop=False, ci_rel=width, target_met=met)
    return RepetitionVerdict(stop=met or n >= max_repetitions, ci_rel=width, target_met=met)


# --- drift ------------------------------------------------------------------------------------


class DriftCheck(BaseModel):
    """The Mann-Kendall trend test of one metric over a level's repetitions; ``direction`` is set
    (the level drifts) when p < alpha."""

    model_config = ConfigDict(frozen=True)

    metric: str = Field(description="The metric tested (the level's target metric).")
    test: Literal["mann-kendall"] = Field(
        default="mann-kendall",
        description="Kendall's tau between repetition index and value; exact permutation p-value without ties, "
        "normal approximation with tie correction otherwise (scipy.stats.kendalltau).",
    )
    num_values: int = Field(description="Repetitions with a value for the metric.")
    tau: float | None = Field(
        default=None, description="Kendall's tau-b against the repetition index (None: not tested)."
    )
    p_value: float | None = Field(default=None, description="Two-sided p-value (None: too few values to test).")
    alpha: float = Field(default=DRIFT_ALPHA, description="Significance level: drift when p_value < alpha.")
    direction: Literal["up", "down"] | None = Field(
        default=None, description="up / down: a significant monotone trend; None: none found (or not testable)."
    )

    @property
    def drifts(self) -> bool:
        """Whether a trend was found."""
        return self.direction is not None


def detect_drift(values: Sequence[float | None], *, metric: str, alpha: float = DRIFT_ALPHA) -> DriftCheck:
    """Mann-Kendall test for a monotone trend in ``values`` (one per repetition, in order), by
    ``scipy.stats.kendalltau``: drift when p < ``alpha``, up for tau > 0, down for tau < 0.

    Fewer than :data:`DRIFT_MIN_REPETITIONS` present values are not tested (p None); all-equal
    values have no trend (p 1, tau None).
    """
    data = _present(values)
    if len(data) < DRIFT_MIN_REPETITIONS:
        return DriftCheck(metric=metric, num_values=len(data), alpha=alpha)
    if len(set(data)) == 1:
        return DriftCheck(metric=metric, num_values=len(data), alpha=alpha, p_value=1.0)
    from scipy.stats import kendalltau

    test = kendalltau(range(len(data)), data)
    tau, p = float(test.statistic), float(test.pvalue)
    direction: Literal["up", "down"] | None = None
    if p < alpha:
        direction = "up" if tau > 0 else "down"
    return DriftCheck(metric=metric, num_values=len(data), tau=tau, p_value=p, alpha=alpha, direction=direction)
