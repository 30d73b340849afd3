"""Deciding under noise: when warm-up is done, when a level has been repeated enough, whether it drifts.

Pure functions over per-window and per-repetition values (no I/O, no clock): the runner asks
them after every warm-up window and every repetition, and the unit tests check them against
hand-computed numbers. Why they exist (measured with ``ref-gpu-comm`` on one H200 at concurrency
8, repetitions of 64 x 256 tokens): a fixed warm-up at the highest concurrency left the first
repetition of other levels cold (559 vs 622-646 tok/s), and a fixed number of repetitions gave
intervals too wide to rank configs 3-8% apart.

* :func:`windows_stable`: warm-up stops once two consecutive windows agree on throughput.
* :func:`repetition_verdict`: a level stops once the 95% interval of its target metric's geometric
  mean (log scale, from 3 repetitions on: ``orchestrator.statistics``) is within a factor
  1 + ``target_ci_rel`` of it, or at the cap.
* :func:`detect_drift`: a monotone trend across repetitions (Mann-Kendall) is flagged, since a
  median over a drifting level describes none of its repetitions.
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
"""Fewest repetitions the drift test is run on: with 4 values even a strictly monotone series has
a two-sided Mann-Kendall p of 2/4! = 0.083, so no 4-value series can reach p < 0.05."""


def _present(values: Sequence[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(v)]


# --- warm-up ----------------------------------------------------------------------------------


def relative_difference(a: float, b: float) -> float:
    """|a - b| / max(|a|, |b|): symmetric, in [0, 1] for values of one sign; 0 when both are 0."""
    scale = max(abs(a), abs(b))
    return abs(a - b) / scale if scale else 0.0


def windows_stable(throughputs: Sequence[float | None], *, tolerance: float) -> bool:
    """Whether warm-up is done: the last two windows' throughputs a, b agree,
    relative_difference(a, b) = |a - b| / max(|a|, |b|) <= tolerance.

    False with fewer than two windows, or when either of the last two has no throughput (every
    request of the window failed) or none at all (0 tok/s): agreement of nothing is not warmth.
    """
    if len(throughputs) < 2:
        return False
    a, b = throughputs[-2], throughputs[-1]
    if a is None or b is None or not (a and b):
        return False
    return relative_difference(a, b) <= tolerance


# --- adaptive repetitions ---------------------------------------------------------------------


def ci_rel(values: Sequence[float | None]) -> float | None:
    """The relative half-width of the 95% interval of the geometric mean, on the log scale:
    w = exp(t(0.975, n - 1) * s / sqrt(n)) - 1, s the sample standard deviation of log(values),
    over the present values (None entries, i.e. repetitions without the metric, are left out).

    It is the interval of :class:`~orchestrator.bench.metrics.Distribution` (``ci95_low``,
    ``ci95_high``, from ``orchestrator.statistics.log_interval``) said as one number:
    ci95_high = geomean * (1 + w) and ci95_low = geomean / (1 + w), so w = sqrt(ci95_high / ci95_low) - 1,
    and "w <= 2%" means the interval lies within a factor 1.02 of the geometric mean either way. The
    level's summary states the same interval, so the stopping rule and the JSON cannot disagree.

    None with fewer than ``orchestrator.statistics.MIN_VALUES`` (3) present values, or when one of
    them is 0 or negative (a repetition that served nothing): no interval, so no width.
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
    repetition (None: absent in that repetition; it counts as done, not as a value).

    Rule, with n = len(values) and w = :func:`ci_rel` (values):

    * no target (``target_ci_rel`` None): stop at n = ``max_repetitions``, exactly as many as asked;
    * n < ``min_repetitions``: go on (too few to trust even a narrow interval; w is None below 3
      values whatever ``min_repetitions`` says);
    * w is not None and w <= ``target_ci_rel``: stop, target met;
    * n >= ``max_repetitions``: stop, target not met (the cap);
    * otherwise go on.
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
    """The Mann-Kendall trend test of one metric over a level's repetitions, in order.

    ``direction`` is set (the level drifts) when p < alpha; a drifting level's median and interval
    describe none of its repetitions, so it is flagged rather than averaged.
    """

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
    """Mann-Kendall test for a monotone trend in ``values`` (one per repetition, in order).

    Statistic S = sum over i < j of sign(x_j - x_i); tau-b = S / sqrt((n0 - n1)(n0 - n2)) with
    n0 = n(n - 1)/2 and n1, n2 the tied pairs in index and value; two-sided p from the exact
    permutation distribution when nothing ties (n <= 33), else the normal approximation
    (``scipy.stats.kendalltau``). Drift when p < ``alpha``: direction up for tau > 0, down for
    tau < 0. E.g. 5 strictly rising values: S = 10, tau = 1, p = 2/5! = 0.0167, drift up.

    Fewer than :data:`DRIFT_MIN_REPETITIONS` present values are not tested (p None): no series of
    4 can reach p < 0.05. All-equal values have no trend (tau undefined, reported as None).
    scipy.stats is imported here, on first use (it takes over a second to import).
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
