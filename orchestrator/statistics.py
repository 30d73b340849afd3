"""Intervals for throughput-like data, and when to state none.

* Intervals are computed on the logarithms and mapped back (never negative; ratios symmetric in
  their own terms).
* No interval from fewer than :data:`MIN_VALUES` values.
* :func:`unpaired_ratio` compares two trials measured at different times (drift included); the
  confirmation's verdicts come from ``orchestrator.sequential`` on interleaved visits.

docs/confirmation.md gives the reasons.
"""

from __future__ import annotations

import functools
import math
import statistics
from typing import Sequence

from pydantic import BaseModel, Field

__all__ = [
    "MIN_VALUES",
    "Ratio",
    "geometric_mean",
    "half_width",
    "log_interval",
    "t975",
    "unpaired_ratio",
]

MIN_VALUES = 3
"""Fewest values (repetitions, or visit pairs) from which an interval is stated."""


class Ratio(BaseModel):
    """``a / b`` of two trials on the objective (> 1: ``a`` is better), with its 95% interval where
    enough repetitions give one."""

    ratio: float
    ci95_low: float | None = None
    ci95_high: float | None = None
    repetitions: int = Field(default=0, description="The smaller of the two trials' repetition counts.")

    @property
    def has_interval(self) -> bool:
        return self.ci95_low is not None and self.ci95_high is not None

    def text(self) -> str:
        """``x1.07 [1.04, 1.10]`` or ``x1.07 (too few repetitions for an interval)``."""
        if not self.has_interval:
            return f"x{self.ratio:.2f} (too few repetitions for an interval)"
        return f"x{self.ratio:.2f} [{self.ci95_low:.2f}, {self.ci95_high:.2f}]"


@functools.lru_cache(maxsize=None)
def t975(df: float) -> float:
    """The two-sided 95% Student-t quantile t(0.975, df), exact (``scipy.stats.t.ppf``) for every df,
    fractional ones included (Welch): a table that stops at df = 30 and then uses the normal 1.96
    makes intervals too narrow for 31-120 values (t(0.975, 60) = 2.000). scipy.stats is imported on
    first use: it takes over a second, and loading a spec must stay quick."""
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    from scipy import stats

    return float(stats.t.ppf(0.975, df))


def half_width(log_sd: float, n: int) -> float:
    """Half the width of a 95% t interval on the log scale from ``n`` values of spread ``log_sd``."""
    return t975(n - 1) * log_sd / math.sqrt(n)


def _logs(values: Sequence[float]) -> list[float]:
    return [math.log(v) for v in values if isinstance(v, (int, float)) and v > 0 and math.isfinite(v)]


def geometric_mean(values: Sequence[float]) -> float | None:
    """The geometric mean of the positive finite ``values`` (others left out); None when there is none."""
    logs = _logs(values)
    return math.exp(math.fsum(logs) / len(logs)) if logs else None


def log_interval(values: Sequence[float]) -> tuple[float, float] | None:
    """95% interval of the typical value (geometric mean) of positive ``values``; None from fewer than
    :data:`MIN_VALUES`, or when a value is not positive. Formula: exp(m +/- t(0.975, n-1) * s / sqrt(n)), m and s the mean and sample
    standard deviation of log(values)."""
    if any(not (isinstance(v, (int, float)) and v > 0 and math.isfinite(v)) for v in values):
        return None  # an interval of the positive values alone would describe another sample
    logs = _logs(values)
    if len(logs) < MIN_VALUES:
        return None
    mean = statistics.fmean(logs)
    half = half_width(statistics.stdev(logs), len(logs))
    return math.exp(mean - half), math.exp(mean + half)


def unpaired_ratio(a: Sequence[float], b: Sequence[float]) -> Ratio | None:
    """``a / b`` of two samples taken at different times (the search's trials): Welch's t on the
    logs, stated from :data:`MIN_VALUES` values on each side. Drift between the two trials is in
    this ratio; only the confirmation's paired ratio is a verdict."""
    la, lb = _logs(a), _logs(b)
    if not la or not lb:
        return None
    diff, repetitions = statistics.fmean(la) - statistics.fmean(lb), min(len(la), len(lb))
    if repetitions < MIN_VALUES:
        return Ratio(ratio=math.exp(diff), repetitions=repetitions)
    va, vb = statistics.variance(la) / len(la), statistics.variance(lb) / len(lb)
    se = math.sqrt(va + vb)
    if se == 0:
        return Ratio(ratio=math.exp(diff), ci95_low=math.exp(diff), ci95_high=math.exp(diff),
                     repetitions=repetitions)
    df = (va + vb) ** 2 / (va**2 / (len(la) - 1) + vb**2 / (len(lb) - 1))
    half = t975(df) * se
    return Ratio(ratio=math.exp(diff), ci95_low=math.exp(diff - half), ci95_high=math.exp(diff + half),
                 repetitions=repetitions)


