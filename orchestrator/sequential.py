"""The confirmation's verdict under repeated looks: group-sequential boundaries with alpha spending.

After each round, the paired log ratios ``d`` are tested with Student's t at a boundary ``c_n``
of their own per look (Lan-DeMets O'Brien-Fleming-type spending, critical values found by seeded
simulation), for the claims **better** (the interval lies above 1: against ratio 1), **worse**
(below ``1 / (1 + margin)``) and **equivalent** (TOST within ``+-margin``); a better claim says
separately whether its interval also clears ``1 + margin`` (:attr:`LookDecision.clears_margin`),
read at the same look and boundary. Each claim stops a confirmation. Why stopping at "better" needs
no boundary of its own for the margin statement: docs/confirmation.md ("What better means").

**Stages.** A design is a tuple of :class:`Stage` (looks ``first..last`` and the one-sided error
they spend). The confirmation's main design (:func:`main_design`) spends ``ALPHA x (1 -
EXTENSION_RESERVE)`` over looks ``min_visits..max_visits`` and keeps the rest for extensions
(``spectune sweep --resume DIR --max-visits N``, :func:`extend`): extension ``j`` spends ``ALPHA x
EXTENSION_RESERVE x 2^-j`` by O'Brien-Fleming over its own looks (the previous last + 1 .. ``N``),
its t statistic reading every pair from the first. Each stage's boundaries are set so that, at a
true ratio on the boundary, its own looks cross with probability at most its alpha (whatever the
earlier stages did: the simulation does not condition on them); a false claim anywhere needs a
crossing in some stage, so by the union bound its probability is at most the sum of the stages'
alphas, below ``ALPHA`` for any number of extensions (``ALPHA x (1 - EXTENSION_RESERVE x 2^-J)``
after ``J``). The bound takes each stage's looks as fixed before its visits are seen; an extension's
length chosen from the earlier pairs is discussed (and its effect measured) in docs/confirmation.md.
Callers that pass ``first``/``last`` alone get one stage at the full ``ALPHA`` (no reserve).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal, Sequence

__all__ = [
    "ALPHA",
    "Design",
    "EXTENSION_RESERVE",
    "LookDecision",
    "MAX_LOOK",
    "Stage",
    "beyond_level",
    "boundaries",
    "check_design",
    "critical_value",
    "decision_distance",
    "decisive_look",
    "design_alpha",
    "extend",
    "extension_alpha",
    "judge",
    "main_design",
    "obrien_fleming_spent",
    "pairs_to_clear",
    "single_stage",
    "visits_to_decide",
]

ALPHA = 0.025
"""One-sided error of each claim (better, worse, equivalent): the 95% the output prints."""

PATHS = 200_000
"""Simulated paths per boundary set (seeded)."""

SEED = 20261203

EXTENSION_RESERVE = 0.2
"""Share of ``ALPHA`` the main design leaves unspent, for extensions: 0.5 points of the 2.5. Its
cost to a confirmation never extended is a slightly stricter boundary at every look (at the last
look of a 3..8 design 2.79 instead of 2.65, about 5% wider intervals; 2-7 points of power near
the margin; docs/confirmation.md)."""

MAX_LOOK = 100
"""The most pairs a design may reach (``confirmation.max_visits``' own limit; the simulation holds
``PATHS x looks`` values)."""

Claim = Literal["better", "worse", "equivalent", "undecided"]


@dataclass(frozen=True)
class Stage:
    """Looks at ``first .. last`` pairs that spend one-sided error ``alpha`` (before a Bonferroni
    division) by O'Brien-Fleming over their own information ``n / last``."""

    first: int
    last: int
    alpha: float

    def to_list(self) -> list[float]:
        """``[first, last, alpha]`` (what confirmation.jsonl's design record holds)."""
        return [self.first, self.last, self.alpha]


Design = tuple[Stage, ...]
"""Stages in look order, contiguous: each starts one look after the previous one's last."""


def single_stage(first: int, last: int) -> Design:
    """One stage spending the whole ``ALPHA`` over ``first..last``: no extension possible (what the
    functions below use when given ``first``/``last`` alone)."""
    return (Stage(first, last, ALPHA),)


def main_design(first: int, last: int) -> Design:
    """The confirmation's design: ``ALPHA x (1 - EXTENSION_RESERVE)`` over ``first..last``, the rest
    held for extensions (:func:`extend`)."""
    return (Stage(first, last, round(ALPHA * (1.0 - EXTENSION_RESERVE), 12)),)


def extension_alpha(j: int) -> float:
    """What extension ``j`` (1, 2, ...) spends: ``ALPHA x EXTENSION_RESERVE x 2^-j`` (all of them
    together never more than the reserve)."""
    return round(ALPHA * EXTENSION_RESERVE * 2.0 ** -j, 12)


def design_alpha(design: Design) -> float:
    """The one-sided error the design's stages spend in all (the union bound's sum)."""
    return math.fsum(stage.alpha for stage in design)


def extend(design: Design, last: int) -> Design:
    """``design`` with one more stage, looks ``design[-1].last + 1 .. last`` at :func:`extension_alpha`
    of its number.

    Raises:
        ValueError: ``last`` not above the design's last look, or above :data:`MAX_LOOK`.
    """
    current = design[-1].last
    if not current < last <= MAX_LOOK:
        raise ValueError(f"an extension needs {current} < last <= {MAX_LOOK}, got last={last}")
    return (*design, Stage(current + 1, last, extension_alpha(len(design))))


def check_design(design: Design) -> None:
    """Raise ValueError unless the stages are contiguous, start at 2 pairs or more, and spend at
    most ``ALPHA`` in all."""
    if not design:
        raise ValueError("a design needs at least one stage")
    if design[0].first < 2:
        raise ValueError(f"looks need at least 2 pairs, the first stage starts at {design[0].first}")
    for before, stage in zip(design, design[1:]):
        if stage.first != before.last + 1:
            raise ValueError(f"stages must be contiguous: {before} then {stage}")
    if any(not s.first <= s.last or s.alpha <= 0 for s in design):
        raise ValueError(f"every stage needs first <= last and alpha > 0: {design}")
    if design_alpha(design) > ALPHA * (1.0 + 1e-9):
        raise ValueError(f"the stages spend {design_alpha(design):.4g}, more than ALPHA {ALPHA}")


def _design(design: Design | None, first: int | None, last: int | None) -> Design:
    """``design``, else one full-``ALPHA`` stage over ``first..last``."""
    if design is not None:
        return design
    if first is None or last is None:
        raise TypeError("give design, or first and last")
    return single_stage(first, last)


def obrien_fleming_spent(t: float, *, alpha: float = ALPHA) -> float:
    """Lan-DeMets O'Brien-Fleming-type spending: the one-sided error spent by information ``t``."""
    if t <= 0:
        return 0.0
    from scipy.stats import norm

    return float(2.0 * (1.0 - norm.cdf(norm.ppf(1.0 - alpha / 2.0) / math.sqrt(min(t, 1.0)))))


@functools.lru_cache(maxsize=256)
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


def critical_value(n: int, *, first: int | None = None, last: int | None = None, design: Design | None = None,
                   comparisons: int = 1) -> float:
    """``c_n`` at ``n`` pairs: the boundary of the stage holding look ``n`` at its alpha / ``comparisons``;
    ``inf`` before the first look; past the design's last look, the last look's. ``design`` default:
    one stage at the full ``ALPHA`` over ``first..last``."""
    stages = _design(design, first, last)
    if n < stages[0].first:
        return math.inf
    n = min(n, stages[-1].last)
    stage = next(s for s in stages if s.first <= n <= s.last)
    return boundaries(stage.first, stage.last, stage.alpha / max(1, comparisons))[n - stage.first]


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
        clears_margin: A better claim whose interval also lies above ``1 + margin`` (the gain is
            shown larger than the margin, at the same error); False for every other claim.
    """

    claim: Claim
    ratio: float
    low: float | None
    high: float | None
    critical: float
    pairs: int
    log_sd: float | None
    clears_margin: bool = False


def judge(diffs: Sequence[float], *, margin: float, first: int | None = None, last: int | None = None,
          design: Design | None = None, comparisons: int = 1) -> LookDecision:
    """The claim the per-pair log ratios ``diffs`` (> 0: the first is faster) support at this look
    (``n = len(diffs)``), by ``design`` (default: one full-``ALPHA`` stage over ``first..last``).

    The interval is ``mean(d) +- c_n sd(d) / sqrt(n)`` (on the log scale). In order: **better** when
    it lies above 0 (ratio 1; ``clears_margin`` when also above ``log(1 + margin)``), **worse** when
    it lies below ``-log(1 + margin)``, **equivalent** when it lies within ``+-log(1 + margin)``
    (TOST), else **undecided**. A false better (true ratio <= 1), worse (true ratio >=
    ``1 / (1 + margin)``), equivalent (true ratio outside the margins) or margin clearance (true
    ratio <= ``1 + margin``) each happens with probability at most the design's one-sided error
    (divided by ``comparisons``), whichever look the confirmation stops at."""
    n = len(diffs)
    if n == 0:
        return LookDecision("undecided", 1.0, None, None, math.inf, 0, None)
    mean = math.fsum(diffs) / n
    if n < 2:
        return LookDecision("undecided", math.exp(mean), None, None, math.inf, n, None)
    sd = math.sqrt(max(math.fsum((d - mean) ** 2 for d in diffs) / (n - 1), 0.0))
    critical = critical_value(n, design=_design(design, first, last), comparisons=comparisons)
    if not math.isfinite(critical):
        return LookDecision("undecided", math.exp(mean), None, None, critical, n, sd)
    half = critical * sd / math.sqrt(n)
    low, high = mean - half, mean + half
    bound = math.log(1.0 + margin)
    if low > 0.0:
        claim: Claim = "better"
    elif high < -bound:
        claim = "worse"
    elif low > -bound and high < bound:
        claim = "equivalent"
    else:
        claim = "undecided"
    return LookDecision(claim, math.exp(mean), math.exp(low), math.exp(high), critical, n, sd,
                        clears_margin=claim == "better" and low > bound)


def beyond_level(design: Design) -> float:
    """The one-sided level a look past the design's last is read at: what the next extension would
    spend (:func:`extension_alpha`) where the design keeps a reserve; a design spending all of
    ``ALPHA`` (``first``/``last`` alone) at ``ALPHA``, a fixed-size design of that many pairs."""
    if design_alpha(design) >= ALPHA * (1.0 - 1e-9):
        return ALPHA
    return extension_alpha(len(design))


def pairs_to_clear(*, distance: float, log_sd: float, first: int | None = None, last: int | None = None,
                   design: Design | None = None, comparisons: int = 1, cap: int = 10_000) -> int | None:
    """The fewest pairs whose decision interval's half-width is below ``distance`` (log scale) at
    spread ``log_sd``: up to the design's last look with its boundaries, beyond it at the level the
    next extension would spend (:func:`beyond_level`; the fixed-size t quantile, a little below that
    extension's own last boundary: an estimate); None when ``distance`` or ``log_sd`` is not
    positive, or beyond ``cap``."""
    if log_sd <= 0 or distance <= 0:
        return None
    stages = _design(design, first, last)
    last = stages[-1].last
    for n in range(max(stages[0].first, 2), last + 1):
        critical = critical_value(n, design=stages, comparisons=comparisons)
        if math.isfinite(critical) and critical * log_sd / math.sqrt(n) < distance:
            return n
    level = beyond_level(stages) / max(1, comparisons)
    n = last + 1
    while n <= cap:
        if _t_quantile(1.0 - level, n - 1) * log_sd / math.sqrt(n) < distance:
            return n
        n += max(1, n // 10)
    return None


def decision_distance(log_mean: float, margin: float) -> float:
    """How far the interval's half-width must shrink below for :func:`judge` to decide at this mean
    (log scale; ``log_mean`` signed, > 0: faster): above 0, the larger of ``log_mean`` (better) and
    ``log(1 + margin) - log_mean`` (equivalent); below 0, ``| |log_mean| - log(1 + margin) |``
    (worse or equivalent: better is out of reach). 0 only on the worse margin."""
    bound = math.log(1.0 + margin)
    if log_mean >= 0.0:
        return max(log_mean, bound - log_mean)
    return abs(-log_mean - bound)


def visits_to_decide(*, log_mean: float, log_sd: float, margin: float, first: int | None = None,
                     last: int | None = None, design: Design | None = None, comparisons: int = 1,
                     cap: int = 10_000) -> int | None:
    """Pairs that would decide if the mean and spread stayed as measured (:func:`pairs_to_clear`
    for :func:`decision_distance`; ``log_mean`` signed, > 0: the first is faster); None on the
    worse margin itself."""
    distance = decision_distance(log_mean, margin)
    return pairs_to_clear(distance=distance, log_sd=log_sd, design=_design(design, first, last),
                          comparisons=comparisons, cap=cap)


def decisive_look(*, log_mean: float, log_sd: float, margin: float, design: Design, comparisons: int = 1) -> int | None:
    """The fewest pairs at which ``design`` would decide if the mean (signed, > 0: faster) and
    spread stayed as measured: within the design by its own boundaries; past its last look by the
    boundaries of the extension to that many pairs (:func:`extend`, simulated: what
    ``--max-visits`` would run), at most :data:`MAX_LOOK`. None on the worse margin, without a
    spread, or past :data:`MAX_LOOK`.

    The extension's last boundary sits 4-8% above the fixed-size t quantile that
    :func:`pairs_to_clear` estimates with: the estimate is the start, each step a simulation."""
    distance = decision_distance(log_mean, margin)
    estimate = pairs_to_clear(distance=distance, log_sd=log_sd, design=design, comparisons=comparisons, cap=MAX_LOOK)
    if estimate is None or estimate <= design[-1].last:
        return estimate
    n = estimate
    while n <= MAX_LOOK:
        if critical_value(n, design=extend(design, n), comparisons=comparisons) * log_sd / math.sqrt(n) < distance:
            return n
        n += max(1, n // 20)
    return None


@functools.lru_cache(maxsize=4096)
def _t_quantile(q: float, df: int) -> float:
    from scipy.stats import t as student

    return float(student.ppf(q, df))
