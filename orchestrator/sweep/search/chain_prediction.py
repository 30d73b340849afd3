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

Throughput: a token's time is part decode, part not (prefill, scheduling, a last cycle that overshoots
the output cap), and only the decode part scales with the chain. So the time per output token is fitted
as a line in the decode time per token, over the measured chains (weighted by their throughput spread):

    1000 / tok/s(s) = fixed + slope x cycle(s) / accept_length(s)

with cycle(s) the cycle line's value. Through two chains it interpolates; a chain between them moves
less than the cycle ratio says (the fixed part fitted through steps 1 and 6: 10-12% of a token's time at
concurrency 1 and 24-26% at 4 on the CPU reference engine; through 1 and 4, 25-28% on an H100 at 8). The
earlier model, all of a token's time scaled from the nearest measured chain, missed the chains between
steps 1 and 6 by -2.3% .. +4.7% on the CPU engine, this one by -2.0% .. +1.3%
(docs/measurements/chain-prediction-cpu, run 5). Where the measured chains' decode times per token are
close (two long chains), the fit is ill-conditioned and the delta method's interval says so. The fixed part is not clamped at zero: a fit through noisy
chains may put it below (least squares is unbiased; a clamp chosen on the estimate would not be, and its
interval would not carry the choice). Where the slope is not positive (a longer decode time per token
that does not cost time: noise, or a landscape this does not describe) the throughput falls back to the
nearest measured chain r, scaled:
tok/s(s) = tok/s(r) x [accept_length(s) / accept_length(r)] x [cycle(r) / cycle(s)].

The interval is built on the log scale (so it cannot go negative) by the delta method over every measured
chain's throughput and cycle time (derivatives by central differences of the whole computation: the
cycle line, the fit and the prediction), scaled up by the line's or the fit's lack of fit with three or
more chains; plus the accept-length model error (the share of the token's time that scales with the
cycle carries it), the spread a fresh start adds (``start_rel``: every measured chain's start and the new
one's), and the repetition noise a measurement of s itself would carry (the interval is for what a start of
s would measure, so a benchmark can check it). Its quantile is Student's t at the degrees of freedom the
variance has (Welch-Satterthwaite over its parts: each chain's repetitions give it ``dof``, a prior spread
or a model error counts as known), not the normal's 1.96: from 3 repetitions a chain's own spread has 2
(t(0.975, 2) = 4.30). Only chains between the shortest and the longest measured are predicted: below the
shortest the data cannot choose between the line and the nearest chain scaled, so nothing is extrapolated
(the sweep's opening measures the shortest chain that runs the same kernels as the others). A chain's
throughput and cycle time come from the same repetitions, and a slow repetition is slow in both (on the CPU reference engine and on an
H100 their logs correlated at -0.99 or closer), so where the caller knows their correlation
(``MeasuredChain.tok_cycle_corr``) a chain's two errors are paired; where it does not (None) the interval
is the wider of the two extremes, independent and fully paired (-1). Pure functions: no I/O.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

from orchestrator.statistics import t975

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
        dof: Degrees of freedom of ``tok_rel_se`` (repetitions - 1; a spread borrowed from other chains: theirs).
    """

    steps: int
    accept_length: float
    cycle_ms: float
    cycle_rel_se: float
    tok_per_s: float
    tok_rel_se: float
    histogram: tuple[int, ...] | None = None
    tok_cycle_corr: float | None = None
    dof: float = 2.0


@dataclass(frozen=True)
class ChainPrediction:
    """A chain's predicted figures: never mixed with a measured value (its own record kind).

    Attributes:
        steps: Draft steps.
        accept_length: From the longest measured chain's histogram.
        cycle_ms: From the cycle line.
        tok_per_s: From the token-time fit over the measured chains (or scaled from ``reference_steps``
            where the fit has no positive slope).
        low, high: 95% interval of what a start of this chain would measure (``tok_per_s``).
        reference_steps: The measured chain nearest to this one (the one the throughput is scaled from
            where the token-time fit falls back to scaling).
        histogram_steps: The chain whose histogram gave the accept length.
        fixed_share: The share of this chain's time per token that does not scale with the cycle
            (prefill, scheduling, the last cycle's overshoot), from the token-time fit (an estimate: it
            can come out below 0 through noisy chains); 0 where it fell back to scaling the nearest chain.
        dof: Degrees of freedom of the interval's variance (Welch-Satterthwaite; inf: every part known).
    """

    steps: int
    accept_length: float
    cycle_ms: float
    tok_per_s: float
    low: float
    high: float
    reference_steps: int
    histogram_steps: int
    fixed_share: float = 0.0
    dof: float = math.inf

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


def _wls(xs: Sequence[float], ys: Sequence[float], weights: Sequence[float]) -> tuple[float, float, float]:
    """Weighted least-squares line: (intercept, slope, the residuals' chi-square per degree of freedom
    where above 1 with three or more points, else 1)."""
    sw = sum(weights)
    mean_x = sum(w * x for w, x in zip(weights, xs)) / sw
    mean_y = sum(w * y for w, y in zip(weights, ys)) / sw
    # centred sums: stable where one weight dwarfs another (a chain with no spread)
    slope = (sum(w * (x - mean_x) * (y - mean_y) for w, x, y in zip(weights, xs, ys))
             / sum(w * (x - mean_x) ** 2 for w, x in zip(weights, xs)))
    intercept = mean_y - slope * mean_x
    if len(xs) <= 2:
        return intercept, slope, 1.0
    chi2 = sum(w * (y - intercept - slope * x) ** 2 for w, x, y in zip(weights, xs, ys))
    return intercept, slope, max(1.0, chi2 / (len(xs) - 2))


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
    intercept, slope, scale = _wls([c.steps for c in chains], [c.cycle_ms for c in chains], weights)
    sw = sum(weights)
    sx = sum(w * c.steps for w, c in zip(weights, chains))
    sxx = sum(w * c.steps ** 2 for w, c in zip(weights, chains))
    det = sw * sxx - sx ** 2
    cov = ((sxx / det * scale, -sx / det * scale), (-sx / det * scale, sw / det * scale))
    return (intercept, slope), cov


@dataclass(frozen=True)
class _Model:
    """What one prediction is computed from: the measured chains' values (perturbed by the delta
    method's differences), the weights and the model's form (fixed at the unperturbed values)."""

    steps: tuple[int, ...]
    accepts: tuple[float, ...]
    cycle_weights: tuple[float, ...]
    time_weights: tuple[float, ...]
    affine: bool
    reference: int

    def log_tok(self, log_toks: Sequence[float], log_cycles: Sequence[float], steps: int, accept: float) -> float:
        """log tok/s of a chain of ``steps`` accepting ``accept`` tokens per cycle."""
        cycles = [math.exp(v) for v in log_cycles]
        times = [1000.0 * math.exp(-v) for v in log_toks]
        a, b, _ = _wls(self.steps, cycles, self.cycle_weights)
        decode = [(a + b * s) / acc for s, acc in zip(self.steps, self.accepts)]  # the line's, as at ``steps``
        decode_s = (a + b * steps) / accept
        if self.affine:
            alpha, beta, _ = _wls(decode, times, self.time_weights)
            time_s = alpha + beta * decode_s
        elif decode[self.reference] > 0:
            time_s = times[self.reference] * decode_s / decode[self.reference]
        else:
            return math.nan
        return math.log(1000.0 / time_s) if time_s > 0 else math.nan


def _token_time_fit(measured: Sequence[MeasuredChain], accepts: Sequence[float],
                    line: tuple[float, float]) -> tuple[float, float, float]:
    """Time per output token (ms) against decode time per token (the cycle line's value / accept length)
    over the measured chains: (fixed part, slope, lack of fit), weighted by each chain's throughput spread."""
    times = [1000.0 / c.tok_per_s for c in measured]
    decode = [(line[0] + line[1] * c.steps) / acc for c, acc in zip(measured, accepts)]
    weights = [1.0 / max((t * c.tok_rel_se) ** 2, 1e-12) for t, c in zip(times, measured)]
    try:
        return _wls(decode, times, weights)
    except ZeroDivisionError:  # every chain at one decode time per token: no slope to fit
        return -1.0, 0.0, 1.0


def _chains_variance(model: _Model, measured: Sequence[MeasuredChain], steps: int, accept: float,
                     start_rel: float = 0.0) -> tuple[float, float, float]:
    """Variance of the predicted log tok/s from the measured chains' throughputs and cycle times: the delta
    method's, its derivatives by central differences, each chain's two errors correlated as measured
    (unknown: the wider of independent and fully paired); and, apart, what each measured chain's start
    adds (an engine that landed faster by d: log tok + d, log cycle - d, in every repetition); and the first
    part's degrees of freedom (each chain's share with its ``dof``)."""
    log_toks = [math.log(c.tok_per_s) for c in measured]
    log_cycles = [math.log(c.cycle_ms) for c in measured]
    h = 1e-5

    def derivative(values: list[float], index: int, other: list[float], tok_side: bool) -> float:
        up, down = list(values), list(values)
        up[index] += h
        down[index] -= h
        if tok_side:
            return (model.log_tok(up, other, steps, accept) - model.log_tok(down, other, steps, accept)) / (2 * h)
        return (model.log_tok(other, up, steps, accept) - model.log_tok(other, down, steps, accept)) / (2 * h)

    independent = paired = starts = 0.0
    parts: list[float] = []  # each chain's own share, for the degrees of freedom (Welch-Satterthwaite)
    for j, chain in enumerate(measured):
        g_tok = derivative(log_toks, j, log_cycles, True)
        g_cycle = derivative(log_cycles, j, log_toks, False)
        starts += ((g_tok - g_cycle) * start_rel) ** 2
        own = (g_tok * chain.tok_rel_se) ** 2 + (g_cycle * chain.cycle_rel_se) ** 2
        cross = 2 * g_tok * g_cycle * chain.tok_rel_se * chain.cycle_rel_se
        parts.append(own)
        if chain.tok_cycle_corr is None:
            independent, paired = independent + own, paired + own - cross
        else:
            independent, paired = independent + own + chain.tok_cycle_corr * cross, paired + own + chain.tok_cycle_corr * cross
    if not (math.isfinite(independent) and math.isfinite(paired)):
        return math.nan, math.nan, math.inf
    return max(independent, paired, 0.0), starts, _welch_dof([(v, c.dof) for v, c in zip(parts, measured)])


def _welch_dof(parts: Sequence[tuple[float, float]]) -> float:
    """Welch-Satterthwaite degrees of freedom of a sum of variances, each (variance, its dof; inf: known)."""
    total = sum(v for v, _ in parts)
    spread = sum(v * v / d for v, d in parts if math.isfinite(d) and d > 0)
    return total * total / spread if spread > 0 else math.inf


def predict_chains(measured: Sequence[MeasuredChain], steps: Sequence[int], *,
                   accept_model_rel: float = ACCEPT_MODEL_REL, start_rel: float | None = None,
                   start_dof: float = math.inf) -> list[ChainPrediction]:
    """Predictions for the chains of ``steps`` (measured ones are skipped: a measured value is never
    replaced by a prediction).

    ``start_rel`` is the spread a fresh engine start adds to a measurement beyond its repetitions (sd
    on the log scale: the confirmation's between-visit estimate); each measured chain is one start and
    so is the one the interval is for, so where it is known the interval carries both. None: not
    measured, the repetitions' spread only (an engine's own offset then shows only as a third chain's
    lack of fit). ``start_dof``: its degrees of freedom (inf: a prior, taken as known).

    The accept length comes from the longest measured chain with a histogram; only chains no longer
    than it are predicted (a histogram says nothing of drafts past its own length), and none shorter than
    the shortest measured chain (no extrapolation: see the module).

    Raises:
        ValueError: no measured chain has a histogram, a chain's throughput or cycle time is not
            positive, or the chains give no cycle line.
    """
    with_histogram = [c for c in measured if c.histogram]
    if not with_histogram:
        raise ValueError("no measured chain reports an accepted-draft histogram")
    if any(not (c.tok_per_s > 0 and c.cycle_ms > 0) for c in measured):
        raise ValueError("every measured chain needs a positive tok_per_s and cycle_ms")
    longest = max(with_histogram, key=lambda c: c.steps)
    histogram = longest.histogram or ()
    measured = list(measured)
    line, _ = cycle_line(measured)
    _, line_lack = _wls([c.steps for c in measured], [c.cycle_ms for c in measured], _weights(measured))[1:]
    accepts = [accept_length_from_histogram(histogram, c.steps) if c.steps <= longest.steps else c.accept_length
               for c in measured]
    fixed, per_decode, time_lack = _token_time_fit(measured, accepts, line)
    affine = per_decode > 0
    noise_rel = math.sqrt(sum(c.tok_rel_se ** 2 for c in measured) / len(measured))
    noise_dof = sum(c.dof for c in measured)
    start = start_rel or 0.0
    known = {c.steps for c in measured}
    log_toks = [math.log(c.tok_per_s) for c in measured]
    log_cycles = [math.log(c.cycle_ms) for c in measured]
    out = []
    for s in sorted(set(steps) - known):
        if not min(known) <= s <= longest.steps:
            continue
        reference = min(range(len(measured)), key=lambda j: (abs(measured[j].steps - s), -measured[j].steps))
        model = _Model(steps=tuple(c.steps for c in measured), accepts=tuple(accepts),
                       cycle_weights=tuple(_weights(measured)),
                       time_weights=tuple(1.0 / max((1000.0 / c.tok_per_s * c.tok_rel_se) ** 2, 1e-12) for c in measured),
                       affine=affine, reference=reference)
        accept = accept_length_from_histogram(histogram, s)
        cycle = line[0] + line[1] * s
        log_tok = model.log_tok(log_toks, log_cycles, s, accept)
        if cycle <= 0 or not math.isfinite(log_tok):
            continue
        tok = math.exp(log_tok)
        decode_share = per_decode * (cycle / accept) / (1000.0 / tok) if affine else 1.0
        chains_var, starts_var, chains_dof = _chains_variance(model, measured, s, accept, start)
        parts = [(chains_var * max(line_lack, time_lack if affine else 1.0), chains_dof),
                 (starts_var + start ** 2, start_dof), ((decode_share * accept_model_rel) ** 2, math.inf),
                 (noise_rel ** 2, noise_dof)]
        log_var = sum(v for v, _ in parts)
        if not math.isfinite(log_var):  # a perturbation took the fit past zero time: no honest interval
            continue
        dof = _welch_dof(parts)
        half = t975(min(dof, 1e6)) * math.sqrt(log_var)
        out.append(ChainPrediction(steps=s, accept_length=accept, cycle_ms=cycle, tok_per_s=tok,
                                   low=tok * math.exp(-half), high=tok * math.exp(half),
                                   reference_steps=measured[reference].steps, histogram_steps=longest.steps,
                                   fixed_share=1.0 - decode_share, dof=dof))
    return out
