"""The confirmation's verdict under repeated looks: group-sequential boundaries with alpha spending.

After each round, the paired log ratios ``d`` are tested with Student's t against the margins at
a boundary ``c_n`` of their own per look (Lan-DeMets O'Brien-Fleming-type spending, critical
values found by seeded simulation), for the claims better, worse and equivalent (TOST). The
design and its references are in docs/confirmation.md.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal, Sequence

__all__ = [
    "ALPHA",
    "LookDecision",
    "boundaries",
    "critical_value",
    "judge",
    "obrien_fleming_spent",
    "pairs_to_clear",
    "visits_to_decide",
]

ALPHA = 0.025
"""One-sided error of each claim (better, worse, equivalent): the 95% the output prints."""

PATHS = 200_000
"""Simulated paths per boundary set (seeded)."""

SEED = 20261203

Claim = Literal["better", "worse", "equivalent", "undecided"]


def obrien_fleming_spent(t: float, *, alpha: float = ALPHA) -> float:
    """Lan-DeMets O'Brien-Fleming-type spending: the one-sided error spent by information ``t``."""
    if t <= 0:
        return 0.0
    from scipy.stats import norm

    return float(2.0 * (1.0 - norm.cdf(norm.ppf(1.0 - alpha / 2.0) / math.sqrt(min(t, 1.0)))))


@functools.lru_cache(maxsize=64)
def boundaries(first: int, last: int, alpha: float = ALPHA) -> tuple[float, ...]:
    """Critical values ``c_n`` of the one-sided t statistic for looks at ``n = first .. last`` pairs
    (``inf`` where the look spends nothing the simulation can resolve).

    Raises:
        ValueError: not ``2 <= first <= last``.
    """
    import numpy as np

    if not 2 <= first <= last:
        raise ValueError(f"looks need 2 <= first <= last, got first={first}, last={last}")
    rng = np.random.default_rng(SEED + 1000 * first + last)
    counts = np.arange(1, last + 1, dtype=np.float64)
    looks = last - first + 1
    t_stats = np.empty((PATHS, looks), dtype=np.float32)  # 200,000 x 98 looks at most: 78 MB
    chunk = 25_000
    for start in range(0, PATHS, chunk):
        d = rng.standard_normal((min(chunk, PATHS - start), last))
        sums, squares = np.cumsum(d, axis=1), np.cumsum(d * d, axis=1)
        mean = sums / counts
        var = np.maximum((squares - counts * mean * mean) / np.maximum(counts - 1.0, 1.0), 1e-300)
        t_stats[start:start + d.shape[0]] = (mean / np.sqrt(var / counts))[:, first - 1:]
    alive = np.ones(PATHS, dtype=bool)
    out: list[float] = []
    spent_before = 0.0  # no look before ``first``: the share up to it is spent at the first look
    for n in range(first, last + 1):
        t_stat = t_stats[:, n - first]
        spent = obrien_fleming_spent(n / last, alpha=alpha)
        crossings = int(round((spent - spent_before) * PATHS))
        spent_before = spent
        candidates = np.sort(t_stat[alive])
        if crossings < 1 or candidates.size == 0:
            out.append(math.inf)
            continue
        crossings = min(crossings, candidates.size)
        critical = float(candidates[-crossings]) if crossings < candidates.size else float(candidates[0])
        out.append(critical)
        alive &= ~(t_stat >= critical)
    return tuple(out)


def critical_value(n: int, *, first: int, last: int, comparisons: int = 1) -> float:
    """``c_n`` at ``n`` pairs for tests at ``ALPHA / comparisons``; ``inf`` before the first look."""
    if n < first:
        return math.inf
    return boundaries(first, last, ALPHA / max(1, comparisons))[min(n, last) - first]


@dataclass(frozen=True)
class LookDecision:
    """One look's verdict on per-pair log ratios.

    Attributes:
        claim: better, worse, equivalent or undecided.
        ratio: exp(mean(d)).
        low, high: The decision interval (None where this look can decide nothing: fewer than 2
            pairs, or a look that spends no error).
        critical: ``c_n``.
        pairs: n.
        log_sd: sd(d).
    """

    claim: Claim
    ratio: float
    low: float | None
    high: float | None
    critical: float
    pairs: int
    log_sd: float | None


def judge(diffs: Sequence[float], *, margin: float, first: int, last: int, comparisons: int = 1) -> LookDecision:
    """The claim the per-pair log ratios ``diffs`` support at this look (``n = len(diffs)``)."""
    n = len(diffs)
    if n == 0:
        return LookDecision("undecided", 1.0, None, None, math.inf, 0, None)
    mean = math.fsum(diffs) / n
    if n < 2:
        return LookDecision("undecided", math.exp(mean), None, None, math.inf, n, None)
    sd = math.sqrt(max(math.fsum((d - mean) ** 2 for d in diffs) / (n - 1), 0.0))
    critical = critical_value(n, first=first, last=last, comparisons=comparisons)
    if not math.isfinite(critical):
        return LookDecision("undecided", math.exp(mean), None, None, critical, n, sd)
    half = critical * sd / math.sqrt(n)
    low, high = mean - half, mean + half
    bound = math.log(1.0 + margin)
    if low > bound:
        claim: Claim = "better"
    elif high < -bound:
        claim = "worse"
    elif low > -bound and high < bound:
        claim = "equivalent"
    else:
        claim = "undecided"
    return LookDecision(claim, math.exp(mean), math.exp(low), math.exp(high), critical, n, sd)


def pairs_to_clear(*, distance: float, log_sd: float, first: int, last: int, comparisons: int = 1,
                   cap: int = 10_000) -> int | None:
    """The fewest pairs whose decision interval's half-width is below ``distance`` (log scale) at
    spread ``log_sd``: up to ``last`` with this design's boundaries, beyond it at the last look's
    level; None when ``distance`` or ``log_sd`` is not positive, or beyond ``cap``."""
    if log_sd <= 0 or distance <= 0:
        return None
    for n in range(max(first, 2), last + 1):
        critical = critical_value(n, first=first, last=last, comparisons=comparisons)
        if math.isfinite(critical) and critical * log_sd / math.sqrt(n) < distance:
            return n
    level = ALPHA / max(1, comparisons)
    n = last + 1
    while n <= cap:
        if _t_quantile(1.0 - level, n - 1) * log_sd / math.sqrt(n) < distance:
            return n
        n += max(1, n // 10)
    return None


def visits_to_decide(*, log_mean: float, log_sd: float, margin: float, first: int, last: int,
                     comparisons: int = 1, cap: int = 10_000) -> int | None:
    """Pairs that would decide if the mean and spread stayed as measured (:func:`pairs_to_clear`
    for the distance from the mean to the margin it must clear); None on the margin itself."""
    bound = math.log(1.0 + margin)
    distance = abs(abs(log_mean) - bound)
    return pairs_to_clear(distance=distance, log_sd=log_sd, first=first, last=last, comparisons=comparisons,
                          cap=cap)


@functools.lru_cache(maxsize=4096)
def _t_quantile(q: float, df: int) -> float:
    from scipy.stats import t as student

    return float(student.ppf(q, df))
