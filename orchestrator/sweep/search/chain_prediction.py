"""Predict top-k 1 chains a sweep did not start, from the chains it measured: one start, many answers.

For a chain (top-k 1, num_draft_tokens = steps + 1) the drafted tokens of s steps are the first s of
S > s steps from the same state, and greedy verification accepts the longest matching prefix, so per
cycle accepted(s) = min(accepted(S), s). The longest measured chain's accepted-draft histogram
(``TrialRecord.accept_histograms``: [k] = cycles that accepted k drafts) therefore predicts every
shorter chain's accept length:

    accept_length(s) = 1 + sum_k min(k, s) hist[k] / sum_k hist[k]

Across a run it is an approximation (cycles start at other positions; a real EAGLE head drafting on
from its own features loses accuracy with depth, which a short chain restarting from the target's
does not), carried as a relative model error (:data:`ACCEPT_MODEL_REL`) that a held-out measured
chain checks.

Cycle time (``cycle_ms``: the decode phase per verify cycle) is a smooth function of the chain
length, draft steps plus one verify of s + 1 tokens: a weighted least-squares line over the
measured chains of the same arm, NCCL setting and level, its covariance from each chain's
repetition spread (and, with three or more chains, the residuals).

Throughput is predicted relative to the nearest measured chain r, which carries the level's
overheads (prefill, scheduling) that the two ratios leave alone:

    tok/s(s) = tok/s(r) x [accept_length(s) / accept_length(r)] x [cycle(r) / cycle(s)]

and its interval is built on the log scale (so it cannot go negative) by the delta method from
r's measured mean, every measured chain's cycle time (the line is linear in them: its value at s
and at r are weighted sums of the measured cycle times), the accept-length model error, and the
repetition noise a measurement of s itself would carry (the interval is for what a start of s would
measure, so a benchmark can check it). A chain's throughput and cycle time come from the same
repetitions, and a slow repetition is slow in both (tok/s ~ tokens per cycle / cycle time: on the CPU
reference engine and on an H100 their logs correlated at -0.99 or closer), so where the caller knows
their correlation (``MeasuredChain.tok_cycle_corr``) the reference's two errors partly cancel between
the measured chains and add up beyond them; where it does not (None) the interval is the wider of the
two extremes, independent and fully paired (-1). Pure functions: no I/O.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

__all__ = [
    "ACCEPT_MODEL_REL",
    "SAMPLED_ACCEPT_MODEL_REL",
    "ChainPrediction",
    "MeasuredChain",
    "accept_length_from_histogram",
    "cycle_line",
    "log_correlation",
    "predict_chains",
]

ACCEPT_MODEL_REL = 0.02
"""Relative error of the histogram's accept-length prediction under greedy traffic: the CPU reference
engine's chains were within 1.5-2.1% (docs/measurements/chain-prediction-cpu; ``benchmarks/chain_prediction.py``
re-measures it)."""

SAMPLED_ACCEPT_MODEL_REL = 0.06
"""The same under sampled traffic (temperature > 0): on the shipped request log (19 of 35 requests greedy,
the rest at 0.3-1.0) the CPU reference engine's shorter chains accepted 2.4-5.4% more than the longest
chain's histogram says (docs/measurements/chain-prediction-cpu/run4-request-log.json): the acceptance
holds in distribution, not per request, and one start's sample of coins is not another's."""

Z95 = 1.959964


@dataclass(frozen=True)
class MeasuredChain:
    """One measured chain at one level (arm, NCCL setting and concurrency fixed by the caller).

    Attributes:
        steps: Draft steps (num_draft_tokens = steps + 1).
        accept_length: Tokens per verify cycle, bonus included (the level's median).
        cycle_ms: Decode time per verify cycle (mean over repetitions).
        cycle_rel_se: Relative standard error of ``cycle_ms`` (repetition spread / sqrt(n)).
        tok_per_s: Output tokens per second (the level's geometric mean over repetitions).
        tok_rel_se: Relative standard error of ``tok_per_s`` (of the log values).
        histogram: Accepted-draft histogram (None: not reported).
        tok_cycle_corr: Correlation of log ``tok_per_s`` and ``cycle_ms`` across the same repetitions
            (None: unknown or fewer than three repetitions; the wider of 0 and -1 is then used).
    """

    steps: int
    accept_length: float
    cycle_ms: float
    cycle_rel_se: float
    tok_per_s: float
    tok_rel_se: float
    histogram: tuple[int, ...] | None = None
    tok_cycle_corr: float | None = None


@dataclass(frozen=True)
class ChainPrediction:
    """A chain's predicted figures: never mixed with a measured value (its own record kind).

    Attributes:
        steps: Draft steps.
        accept_length: From the longest measured chain's histogram.
        cycle_ms: From the cycle line.
        tok_per_s: Relative to the nearest measured chain (``reference_steps``).
        low, high: 95% interval of what a start of this chain would measure (``tok_per_s``).
        reference_steps: The measured chain the throughput is scaled from.
        histogram_steps: The chain whose histogram gave the accept length.
    """

    steps: int
    accept_length: float
    cycle_ms: float
    tok_per_s: float
    low: float
    high: float
    reference_steps: int
    histogram_steps: int

    @property
    def half_width_rel(self) -> float:
        """Half the interval's width relative to the prediction."""
        return (self.high - self.low) / 2 / self.tok_per_s


def accept_length_from_histogram(histogram: Sequence[int], steps: int) -> float:
    """Tokens per cycle a chain of ``steps`` would accept from the states that produced ``histogram``.

    Raises:
        ValueError: an empty histogram, or ``steps`` < 1.
    """
    cycles = sum(histogram)
    if cycles <= 0 or steps < 1:
        raise ValueError(f"need a histogram with cycles and steps >= 1 (got {sum(histogram)} cycles, steps {steps})")
    return 1.0 + sum(min(k, steps) * count for k, count in enumerate(histogram)) / cycles


def log_correlation(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Correlation of log ``xs`` and log ``ys`` taken from the same repetitions (``MeasuredChain.tok_cycle_corr``);
    None from fewer than three pairs or where either has no spread."""
    if len(xs) < 3 or len(xs) != len(ys):
        return None
    try:
        return statistics.correlation([math.log(x) for x in xs], [math.log(y) for y in ys])
    except statistics.StatisticsError:
        return None


def _weights(chains: Sequence[MeasuredChain]) -> list[float]:
    """Each chain's weight in the cycle line: 1 / the variance of its ``cycle_ms``."""
    return [1.0 / max((c.cycle_rel_se * c.cycle_ms) ** 2, 1e-12) for c in chains]


def _sums(chains: Sequence[MeasuredChain]) -> tuple[float, float, float, float]:
    """(sum w, sum w x, sum w x^2, determinant) of the weighted least squares of cycle on steps."""
    weights = _weights(chains)
    sw = sum(weights)
    sx = sum(w * c.steps for w, c in zip(weights, chains))
    sxx = sum(w * c.steps ** 2 for w, c in zip(weights, chains))
    return sw, sx, sxx, sw * sxx - sx ** 2


def _lack_of_fit(chains: Sequence[MeasuredChain], line: tuple[float, float]) -> float:
    """The residuals' chi-square per degree of freedom where above 1 (three or more chains), else 1."""
    if len(chains) <= 2:
        return 1.0
    chi2 = sum(w * (c.cycle_ms - line[0] - line[1] * c.steps) ** 2 for w, c in zip(_weights(chains), chains))
    return max(1.0, chi2 / (len(chains) - 2))


def cycle_line(chains: Sequence[MeasuredChain]) -> tuple[tuple[float, float], tuple[tuple[float, float], tuple[float, float]]]:
    """Weighted least squares of ``cycle_ms`` on ``steps``: ((intercept, slope), covariance).

    Weights are 1 / variance from each chain's ``cycle_rel_se``; with three or more chains the
    covariance is scaled up by the residuals' chi-square per degree of freedom where that exceeds 1.

    Raises:
        ValueError: fewer than two distinct chain lengths.
    """
    if len({c.steps for c in chains}) < 2:
        raise ValueError("a cycle line needs measured chains of at least two lengths")
    weights = _weights(chains)
    sw, sx, sxx, det = _sums(chains)
    sy = sum(w * c.cycle_ms for w, c in zip(weights, chains))
    sxy = sum(w * c.steps * c.cycle_ms for w, c in zip(weights, chains))
    slope = (sw * sxy - sx * sy) / det
    intercept = (sy - slope * sx) / sw
    scale = _lack_of_fit(chains, (intercept, slope))
    cov = ((sxx / det * scale, -sx / det * scale), (-sx / det * scale, sw / det * scale))
    return (intercept, slope), cov


def _line_loadings(chains: Sequence[MeasuredChain], steps: float) -> list[float]:
    """d line(steps) / d cycle_ms of each chain: the fitted value is a weighted sum of the measured
    cycle times, sum_j w_j (sxx - sx (x + x_j) + sw x x_j) / det * cycle_j."""
    sw, sx, sxx, det = _sums(chains)
    return [w * (sxx - sx * (steps + c.steps) + sw * steps * c.steps) / det for w, c in zip(_weights(chains), chains)]


def _log_ratio_variance(chains: Sequence[MeasuredChain], reference: MeasuredChain, steps: int,
                        line: tuple[float, float]) -> float:
    """Variance of log tok(r) + log line(r) - log line(s): r's throughput and every measured cycle
    time, with r's throughput and cycle time correlated as measured (unknown: the wider of 0 and -1;
    a negative correlation narrows the interval between the measured chains and widens it beyond
    them), the cycle part scaled up by the line's lack of fit."""
    at_r, at_s = line[0] + line[1] * reference.steps, line[0] + line[1] * steps
    loadings = [a / at_r - b / at_s for a, b in zip(_line_loadings(chains, reference.steps), _line_loadings(chains, steps))]
    cycle_sd = [c.cycle_rel_se * c.cycle_ms for c in chains]
    cycles = sum((g * sd) ** 2 for g, sd in zip(loadings, cycle_sd)) * _lack_of_fit(chains, line)
    g_ref, sd_ref = next((g, sd) for g, c, sd in zip(loadings, chains, cycle_sd) if c is reference)
    corrs = (0.0, -1.0) if reference.tok_cycle_corr is None else (reference.tok_cycle_corr,)
    cross = max(2 * g_ref * corr * reference.tok_rel_se * sd_ref for corr in corrs)
    return max(reference.tok_rel_se ** 2 + cycles + cross, 0.0)


def predict_chains(measured: Sequence[MeasuredChain], steps: Sequence[int], *,
                   accept_model_rel: float = ACCEPT_MODEL_REL) -> list[ChainPrediction]:
    """Predictions for the chains of ``steps`` (measured ones are skipped: a measured value is never
    replaced by a prediction).

    The accept length comes from the longest measured chain with a histogram; only chains no longer
    than it are predicted (a histogram says nothing of drafts past its own length).

    Raises:
        ValueError: no measured chain has a histogram, or the chains give no cycle line.
    """
    with_histogram = [c for c in measured if c.histogram]
    if not with_histogram:
        raise ValueError("no measured chain reports an accepted-draft histogram")
    longest = max(with_histogram, key=lambda c: c.steps)
    line, _ = cycle_line(measured)
    noise_rel = math.sqrt(sum(c.tok_rel_se ** 2 for c in measured) / len(measured))
    known = {c.steps for c in measured}
    out = []
    for s in sorted(set(steps) - known):
        if not 1 <= s <= longest.steps:
            continue
        reference = min(measured, key=lambda c: (abs(c.steps - s), -c.steps))
        accept = accept_length_from_histogram(longest.histogram or (), s)
        accept_ref = accept_length_from_histogram(longest.histogram or (), reference.steps) \
            if reference.steps <= longest.steps else reference.accept_length
        cycle, cycle_ref = line[0] + line[1] * s, line[0] + line[1] * reference.steps
        if cycle <= 0 or cycle_ref <= 0:
            continue
        tok = reference.tok_per_s * (accept / accept_ref) * (cycle_ref / cycle)
        log_var = (_log_ratio_variance(measured, reference, s, line) + accept_model_rel ** 2 + noise_rel ** 2)
        half = Z95 * math.sqrt(log_var)
        out.append(ChainPrediction(steps=s, accept_length=accept, cycle_ms=cycle, tok_per_s=tok,
                                   low=tok * math.exp(-half), high=tok * math.exp(half),
                                   reference_steps=reference.steps, histogram_steps=longest.steps))
    return out
