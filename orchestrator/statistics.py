"""The statistics a user acts on: intervals that fit throughput-like data, and when to state none.

Three rules, each from a way the sweep's numbers once misled:

* **Log scale.** Throughput and latency are positive and their noise is multiplicative (a busy
  machine slows everything by a share, not by a fixed amount), so intervals are computed on the
  logarithms and mapped back: ``exp(mean(log x) +/- t * sd(log x) / sqrt(n))``. Such an interval
  is never negative, and a ratio's interval is symmetric in the ratio's own terms (x0.9 is as far
  from 1 as x1.11). Two repetitions of 266 and 222 tok/s once printed [-35.2, 523.4].
* **No interval from fewer than** :data:`MIN_VALUES` **values.** A t interval with one degree of
  freedom is 12.7 standard errors wide: it says nothing a user can act on, so it is not stated
  ("too few repetitions for an interval").
* **Ratios from interleaved visits, paired by position.** A machine drifts (a GPU warms, a
  neighbour starts a job); measured A A A then B B B, drift looks like a difference. Visited
  A B A B ..., visit i of A is paired with visit i of B and the ratio is estimated from the
  per-pair log ratios ``d_i = log a_i - log b_i``: drift slower than one round cancels within each
  pair. The interval is Student's t on the ``d_i`` (scipy's quantile), chosen over a bootstrap:
  with 3-10 pairs a percentile bootstrap's interval is too narrow (it cannot be wider than the
  spread of the few values it resamples), while t on log ratios is exact for log-normal noise and
  conservative for small n.

The sequential confirmation (``orchestrator.sweep.confirm``) decides with :func:`decide` after each
round of visits and stops as soon as the ratio is decided.
"""

from __future__ import annotations

import functools
import math
import statistics
from typing import Literal, Sequence

from pydantic import BaseModel, Field

__all__ = [
    "MIN_VALUES",
    "Ratio",
    "VerdictKind",
    "decide",
    "half_width",
    "log_interval",
    "paired_ratio",
    "t975",
    "unpaired_ratio",
    "visits_needed",
]

MIN_VALUES = 3
"""Fewest values (repetitions, or visit pairs) from which an interval is stated."""

VerdictKind = Literal["better", "equivalent", "worse", "undecided"]

MAX_VISITS_NEEDED = 10_000
"""Beyond this, "visits needed to decide" is reported as not reachable at the observed spread."""


class Ratio(BaseModel):
    """``a / b`` of two configurations on the objective (> 1: ``a`` is better), with its 95% interval
    where enough values give one."""

    ratio: float
    ci95_low: float | None = None
    ci95_high: float | None = None
    visits: int = Field(default=0, description="Pairs of interleaved visits (paired), or the smaller sample size.")
    basis: Literal["paired", "unpaired"] = Field(
        default="unpaired", description="paired: interleaved visits paired by position; unpaired: two trials "
        "measured at different times (drift included).")
    log_sd: float | None = Field(default=None, description="Standard deviation of the per-pair log ratios (paired).")

    @property
    def has_interval(self) -> bool:
        return self.ci95_low is not None and self.ci95_high is not None

    def text(self) -> str:
        """``x1.07 [1.04, 1.10]`` or ``x1.07 (too few repetitions for an interval)``."""
        if not self.has_interval:
            what = "visits" if self.basis == "paired" else "repetitions"
            return f"x{self.ratio:.2f} (too few {what} for an interval)"
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


def paired_ratio(a: Sequence[float], b: Sequence[float]) -> Ratio | None:
    """``a / b`` from interleaved visits paired by position (visit i of a with visit i of b).

    Both sequences are per-visit values in visit order; pairs with a missing or non-positive side
    are dropped. The point is exp(mean(d)), the interval exp(mean(d) +/- t(0.975, n-1) * sd(d) / sqrt(n))
    with d_i = log a_i - log b_i, stated from :data:`MIN_VALUES` pairs on.
    """
    diffs = [math.log(x) - math.log(y) for x, y in zip(a, b)
             if x is not None and y is not None and x > 0 and y > 0]
    if not diffs:
        return None
    mean = statistics.fmean(diffs)
    if len(diffs) < MIN_VALUES:
        return Ratio(ratio=math.exp(mean), visits=len(diffs), basis="paired")
    half = half_width(statistics.stdev(diffs), len(diffs))
    return Ratio(ratio=math.exp(mean), ci95_low=math.exp(mean - half), ci95_high=math.exp(mean + half),
                 visits=len(diffs), basis="paired", log_sd=statistics.stdev(diffs))


def unpaired_ratio(a: Sequence[float], b: Sequence[float]) -> Ratio | None:
    """``a / b`` of two samples taken at different times (the search's trials): Welch's t on the
    logs, stated from :data:`MIN_VALUES` values on each side. Drift between the two trials is in
    this ratio; only the confirmation's paired ratio is a verdict."""
    la, lb = _logs(a), _logs(b)
    if not la or not lb:
        return None
    diff = statistics.fmean(la) - statistics.fmean(lb)
    if len(la) < MIN_VALUES or len(lb) < MIN_VALUES:
        return Ratio(ratio=math.exp(diff), visits=min(len(la), len(lb)), basis="unpaired")
    va, vb = statistics.variance(la) / len(la), statistics.variance(lb) / len(lb)
    se = math.sqrt(va + vb)
    if se == 0:
        return Ratio(ratio=math.exp(diff), ci95_low=math.exp(diff), ci95_high=math.exp(diff),
                     visits=min(len(la), len(lb)), basis="unpaired")
    df = (va + vb) ** 2 / (va**2 / (len(la) - 1) + vb**2 / (len(lb) - 1))
    half = t975(df) * se
    return Ratio(ratio=math.exp(diff), ci95_low=math.exp(diff - half), ci95_high=math.exp(diff + half),
                 visits=min(len(la), len(lb)), basis="unpaired")


def decide(ratio: Ratio | None, *, margin: float) -> VerdictKind:
    """The verdict on ``ratio`` (oriented so > 1 is better) with a practical margin:

    * ``better``: the whole interval above 1 + margin;
    * ``worse``: the whole interval below 1 / (1 + margin);
    * ``equivalent``: the whole interval inside [1 / (1 + margin), 1 + margin];
    * ``undecided``: no interval yet, or one that straddles a boundary.
    """
    if ratio is None or ratio.ci95_low is None or ratio.ci95_high is None:
        return "undecided"
    high_bound, low_bound = 1.0 + margin, 1.0 / (1.0 + margin)
    if ratio.ci95_low > high_bound:
        return "better"
    if ratio.ci95_high < low_bound:
        return "worse"
    if ratio.ci95_low >= low_bound and ratio.ci95_high <= high_bound:
        return "equivalent"
    return "undecided"


def visits_needed(ratio: Ratio | None, *, margin: float) -> int | None:
    """Pairs of visits that would decide ``ratio`` if its mean and spread stayed as observed; None
    where it cannot be said (no spread measured yet) or would take more than ``MAX_VISITS_NEEDED``
    (the ratio sits on a decision boundary)."""
    if ratio is None or ratio.log_sd is None or ratio.log_sd == 0:
        return None
    mean, sd, bound = math.log(ratio.ratio), ratio.log_sd, math.log(1.0 + margin)
    # distance of the mean to the boundary it must clear: beyond +/-bound (better/worse), inside (equivalent)
    distance = abs(mean) - bound if abs(mean) > bound else bound - abs(mean)
    if distance <= 0:
        return None
    n = max(MIN_VALUES, ratio.visits)
    while n <= MAX_VISITS_NEEDED:
        if half_width(sd, n) < distance:
            return n
        n += max(1, n // 10)
    return None
