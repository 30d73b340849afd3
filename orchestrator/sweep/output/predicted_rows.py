"""Predicted rows: every top-k 1 chain of the space the sweep did not start, predicted from the chains it
measured (``search.chain_prediction``), as rows of their own kind.

Chains are grouped by what moves the cycle time (all-reduce path, NCCL setting) and predicted per
benchmark level from the group's measured chains (top-k 1, status ok, an accepted-draft histogram at
that level): accept length from the longest chain's histogram, cycle time from a line through the
measured chains' ``cycle_ms``, throughput scaled from the nearest measured chain, each with a 95%
interval of what a start of it would measure. A group that measured two chain lengths is predicted from
its own; a group that measured one (the sweep's opening starts each NCCL setting and path once, at
SGLang's chain) borrows the shape across chain lengths from a group that measured more
(:func:`_setting_rows`). The objective must be ``output_tok_per_s`` (the model predicts tokens per second).

Trials that ended ok or early-stopped (ASHA after their first repetitions) count. Each measured chain's
relative standard error comes from its repetitions at the level
(``level_values``: the objective's per-repetition values, log scale), its cycle time's from the same
repetitions' ``level_cycle_ms``, and the two are paired (their correlation: a slow repetition is slow
in both, so the reference's errors partly cancel in the prediction). A record without per-repetition
cycle times (older ones, fewer than three repetitions) lets the throughput's error stand for the cycle
time's, their correlation unknown (the wider of independent and fully paired); a chain measured fewer than
three times takes the median of the others' (:func:`_fill_spread`).

**Check.** Where a group measured three or more chain lengths, every measured chain that is not the
group's longest is also predicted from the others and compared with its measurement (leave one
out): ``checks``; a miss outside the interval is said in words, and the predictions of that group
are then marked ``unchecked_miss`` (start them rather than trust them).

**Start-to-start spread.** Every interval carries the spread a fresh engine start adds (``start_rel``): the
confirmation's between-visit estimate once settled, else the engine kind's prior (:func:`start_spread_prior`,
labelled a prior wherever printed). ``reaches_best`` compares a row's interval with the best measured
configuration's lower bound (its repetitions and its start, at the t quantile of its degrees of freedom), not
with the largest point estimate (the largest of several noisy values is biased up: the winner's curse).

**Kernels.** Where one draft step runs another graph than longer chains (:func:`one_step_runs_own_graph`:
GPU engines decoding in CUDA graphs; SGLang 0.5.23 captures no draft-decode graph for one step), the one-step
chain is off the model's line: it is neither predicted nor predicted from.

Predicted rows are never mixed with measured values: they go to ``predictions.jsonl`` and a table of
their own, never to ``trials.jsonl``, the searcher or the confirmation.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Iterable

from orchestrator.bench.metrics import sum_histograms
from orchestrator.space import Candidate, SpeculativeTriple, TrialPlan
from orchestrator.spec import SweepSpec
from orchestrator.statistics import geometric_mean
from orchestrator.sweep.records.results import TrialRecord
from orchestrator.space import one_step_runs_own_graph
from orchestrator.statistics import t975
from orchestrator.sweep.search.chain_prediction import (ACCEPT_MODEL_REL, SAMPLED_ACCEPT_MODEL_REL, MeasuredChain,
                                                     log_correlation, predict_chains)

__all__ = ["PREDICTIONS_FILE", "START_REL_PRIOR_CPU", "START_REL_PRIOR_GPU", "PredictedRow", "Predictions",
           "predict_rows", "prediction_lines", "start_spread_prior"]

PREDICTIONS_FILE = "predictions.jsonl"

USABLE_STATUSES = ("ok", "early_stopped")
"""Trials whose measured repetitions a prediction may use: an early-stopped trial (ASHA, after its first
repetitions) measured its chain, only fewer times."""

SINGLE_VALUE_REL = 0.05
"""Relative standard error given a chain measured once when no chain at its level was measured more often."""

START_REL_PRIOR_CPU = 0.045
"""Prior start-to-start spread (sd of logs) of the CPU reference engine: measured between its starts
(docs/measurements/chain-prediction-cpu; the issue's 4.5%). A prior: no sweep measured it on this node."""

START_REL_PRIOR_GPU = 0.072
"""Prior start-to-start spread of an engine on GPUs: the top of the GPU reference engine's 6.6-7.2% between
starts on an H100 (docs/measurements/chain-prediction-h100x1). A prior, from another node and engine."""

SETTING_MODEL_REL = 0.02
"""Relative error allowed for a setting whose effect on the cycle time is not one ratio at every chain
length (its all-reduces grow with the verify's tokens); checked whenever such a row is started."""


@dataclass(frozen=True)
class PredictedRow:
    """One chain predicted at one level (``kind`` is always ``predicted``).

    Attributes:
        label: ``steps=2 topk=1 draft=3`` and the group's settings.
        num_steps: Draft steps (top-k 1, draft = steps + 1).
        all_reduce, nccl_env: The group's settings.
        concurrency: The benchmark level.
        accept_length, cycle_ms, tok_per_s: The predictions.
        low, high: 95% interval of what a start of this chain would measure (tok/s).
        reference_trial: The measured trial the throughput is scaled from.
        histogram_trial: The measured trial whose histogram gave the accept length.
        from_trials: Every measured trial of the group.
        reaches_best: Whether the interval reaches the best measured value at this level (worth a start).
        unchecked_miss: The group's check missed: measure, do not trust.
        basis: ``chains`` (the group's own measured chains) or ``setting`` (the group measured one chain;
            the shape across chain lengths is borrowed from the base group, see the module).
        best_low: The best measured configuration's lower bound at this level (what ``reaches_best`` compares with).
    """

    label: str
    num_steps: int
    all_reduce: str
    nccl_env: dict[str, str]
    concurrency: int
    accept_length: float
    cycle_ms: float
    tok_per_s: float
    low: float
    high: float
    reference_trial: int
    histogram_trial: int
    from_trials: list[int]
    reaches_best: bool = False
    unchecked_miss: bool = False
    basis: str = "chains"
    best_low: float | None = None
    kind: str = "predicted"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Predictions:
    """A sweep's predicted rows and the checks of its model against measured chains."""

    rows: list[PredictedRow] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)
    skipped: str | None = None
    sampling: str | None = None
    """Under sampled traffic: what the prediction rests on then (:data:`SAMPLING_NOTE`); None for greedy."""
    start_rel: float | None = None
    """The spread a fresh start adds, carried by the intervals: measured (the confirmation's between-visit
    estimate) or the engine kind's prior (``start_rel_source``)."""
    start_rel_source: str | None = None
    """Where ``start_rel`` comes from, in words: ``measured ...`` or ``prior ...``."""

    def to_dict(self) -> dict[str, Any]:
        return {"rows": [r.to_dict() for r in self.rows], "checks": self.checks, "skipped": self.skipped,
                "sampling": self.sampling, "start_rel": self.start_rel, "start_rel_source": self.start_rel_source}


def start_spread_prior(spec: SweepSpec) -> tuple[float, str]:
    """The engine kind's prior start-to-start spread and its label: :data:`START_REL_PRIOR_GPU` for an engine
    on GPUs, :data:`START_REL_PRIOR_CPU` for the CPU reference engine."""
    if spec.gpus_per_trial > 0:
        return START_REL_PRIOR_GPU, ("prior for GPU engines (the GPU reference engine's 6.6-7.2% between starts on "
                                     "an H100; not measured on this node)")
    return START_REL_PRIOR_CPU, "prior for the CPU reference engine (4.5% between its starts; not measured on this node)"


SAMPLING_NOTE = (
    "the traffic samples (temperature > 0): a shorter chain's acceptance is predicted in distribution, not request by "
    "request (SGLang 0.5.23 verifies depth j from the draft prefix, the target's probabilities and one coin, so "
    "P(accepted(s) >= k) = P(accepted(S) >= k) for k <= s; the coins differ between starts); measured on a sampled log "
    "the histogram was 2.4-5.4% low, so the intervals carry a 6% model error instead of greedy's 2%, and the sweep's "
    "own measured chains check it")
"""What holds for the predicted rows under sampling (docs/design/sweep.md, predicted_rows)."""


def _samples(spec: SweepSpec, records: list[TrialRecord]) -> bool:
    """Whether the sweep's traffic sampled: the spec's temperature, or a replayed log's requests'."""
    if spec.benchmark.temperature > 0:
        return True
    traffic = next((r.traffic for r in records if r.traffic), None) or {}
    return float((traffic.get("temperature") or {}).get("max") or 0.0) > 0


def _lower_bound(values: list[float], fill_rel: float, start_rel: float, start_dof: float) -> float:
    """95% lower bound (one side at 2.5%) of a configuration's true level from its repetitions ``values``: its
    standard error (``fill_rel`` where fewer than three) and its start's spread, at t of their degrees of freedom."""
    rel = _rel_se(values)
    se2, dof = (fill_rel ** 2, 2.0) if math.isnan(rel) else (rel ** 2, float(len(values) - 1))
    spread = se2 * se2 / dof + ((start_rel ** 4 / start_dof) if math.isfinite(start_dof) else 0.0)
    total = se2 + start_rel ** 2
    welch = total * total / spread if spread > 0 else math.inf
    return geometric_mean(values) * math.exp(-t975(min(welch, 1e6)) * math.sqrt(total))


def _rel_se(values: list[float]) -> float:
    """Relative standard error of the geometric mean of positive ``values`` (log scale); NaN from fewer
    than three (one value has no spread of its own, and two give one degree of freedom, often far too
    small: :func:`_fill_spread` gives them the others')."""
    logs = [math.log(v) for v in values]
    return statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 2 else math.nan


def _chain_steps(record: TrialRecord) -> int | None:
    """The record's chain length if it ran a top-k 1 chain (SGLang's auto choice as it resolved)."""
    params = dict(record.params)
    if record.resolved_params and params.get("speculative") == "auto":
        params.update(record.resolved_params)
    if params.get("speculative") == "off" or params.get("eagle_topk") != 1 or not isinstance(params.get("num_steps"), int):
        return None
    return int(params["num_steps"])


def _group_key(record: TrialRecord) -> tuple[str, tuple[tuple[str, str], ...]]:
    nccl = tuple(sorted((k, str(v)) for k, v in record.params.items() if k.startswith("NCCL_") and v not in (None, "default")))
    return str(record.params.get("all_reduce") or "default"), nccl


def _measured(record: TrialRecord, level: int) -> MeasuredChain | None:
    """The record's chain at ``level``, or None where it lacks a histogram, a cycle time or values."""
    steps = _chain_steps(record)
    histogram = record.accept_histograms.get(str(level))
    values = [v for v in record.values_at(level) if v > 0]
    cycle = record.metrics.get(f"c{level}.cycle_ms")
    accept = record.metrics.get(f"c{level}.accept_length_requests") or record.metrics.get(f"c{level}.accept_length")
    if steps is None or not histogram or not values or not cycle or not accept:
        return None
    rel = _rel_se(values)
    cycles = [c for c in record.level_cycle_ms.get(str(level), []) if c > 0]
    paired = len(cycles) == len(values) >= 3
    return MeasuredChain(steps=steps, accept_length=float(accept), cycle_ms=float(cycle),
                         cycle_rel_se=_rel_se(cycles) if paired else rel, tok_per_s=geometric_mean(values),
                         tok_rel_se=rel, histogram=tuple(sum_histograms([histogram]) or ()),
                         tok_cycle_corr=log_correlation(values, cycles) if paired else None, dof=max(len(values) - 1, 1))


def _space_chains(spec: SweepSpec) -> list[int]:
    """The top-k 1 chain lengths of the spec's space the model covers (not one step where it runs another graph)."""
    shortest = 2 if one_step_runs_own_graph(spec) else 1
    return sorted({t.num_steps for t in spec.space().speculative
                   if t.eagle_topk == 1 and t.num_steps and t.num_steps >= shortest})


def predict_rows(spec: SweepSpec, records: Iterable[TrialRecord], *, start_rel: float | None = None,
                 start_dof: float = math.inf) -> Predictions:
    """Every unmeasured top-k 1 chain of ``spec``'s space, predicted per group and level (see the module).

    ``start_rel``: the spread a fresh engine start adds beyond its repetitions (the confirmation's
    between-visit estimate, sd of logs, with ``start_dof`` degrees of freedom), carried by every interval;
    None: not measured, the engine kind's prior (:func:`start_spread_prior`) is carried instead."""
    records = [r for r in records if r.status in USABLE_STATUSES]
    if spec.objective.metric != "output_tok_per_s":
        return Predictions(skipped=f"the objective is {spec.objective.metric}; chains are predicted in output tok/s only")
    steps_wanted = _space_chains(spec)
    if not steps_wanted:
        return Predictions(skipped="the space has no top-k 1 chains")
    sampled = _samples(spec, records)
    if start_rel is None:
        start_rel, source = start_spread_prior(spec)
        start_dof = math.inf
    else:
        source = "measured (the confirmation's between-visit spread)"
    shortest = min(steps_wanted)  # a one-step chain off the line (another graph) is no group's
    out = Predictions(sampling=SAMPLING_NOTE if sampled else None, start_rel=start_rel, start_rel_source=source)
    model_rel = SAMPLED_ACCEPT_MODEL_REL if sampled else ACCEPT_MODEL_REL
    groups: dict[Any, list[TrialRecord]] = {}
    for record in records:
        if (_chain_steps(record) or 0) >= shortest:
            groups.setdefault(_group_key(record), []).append(record)
    best = {level: _best_low(records, level, start_rel, start_dof) for level in spec.benchmark.concurrency}
    for level in spec.benchmark.concurrency:
        by_group = _fill_spread({key: _chains_at(members, level) for key, members in sorted(groups.items())})
        own: dict[Any, tuple[list, bool]] = {}  # group -> (its own predictions, its check missed)
        for (all_reduce, nccl), chains in by_group.items():
            if len(chains) < 2:
                continue
            measured = [c for c, _ in chains.values()]
            missed = _check(out, measured, chains, level=level, all_reduce=all_reduce, nccl=nccl, model_rel=model_rel,
                            start_rel=start_rel, start_dof=start_dof)
            own[(all_reduce, nccl)] = (predict_chains(measured, steps_wanted, accept_model_rel=model_rel,
                                                      start_rel=start_rel, start_dof=start_dof), missed)
            for p in own[(all_reduce, nccl)][0]:
                out.rows.append(_row(p.steps, all_reduce, nccl, level, p.accept_length, p.cycle_ms, p.tok_per_s,
                                     p.low, p.high, chains[p.reference_steps][1], chains[p.histogram_steps][1],
                                     (n for _, n in chains.values()), best, missed, "chains"))
        for (all_reduce, nccl), chains in by_group.items():
            if len(chains) == 1:
                out.rows += _setting_rows(all_reduce, nccl, chains, by_group, own, steps_wanted, level, best,
                                          start_rel=start_rel)
    return out


def _best_low(records: list[TrialRecord], level: int, start_rel: float, start_dof: float) -> float:
    """The best measured configuration's lower bound at ``level``: the largest of every ok or early-stopped
    record's own lower bound (:func:`_lower_bound`; fewer than three repetitions take the median spread of the
    others, else :data:`SINGLE_VALUE_REL`); 0 where nothing was measured."""
    measured = [[v for v in r.values_at(level) if v > 0] for r in records]
    measured = [values for values in measured if values]
    known = [rel for rel in (_rel_se(values) for values in measured) if not math.isnan(rel)]
    fill = statistics.median(known) if known else SINGLE_VALUE_REL
    return max((_lower_bound(values, fill, start_rel, start_dof) for values in measured), default=0.0)


def _fill_spread(by_group: dict[Any, dict[int, tuple[MeasuredChain, int]]]) -> dict[Any, dict[int, tuple[MeasuredChain, int]]]:
    """A chain measured fewer than three times (an early-stopped trial) takes the median relative standard
    error of the chains measured more often at the level (else :data:`SINGLE_VALUE_REL`): one value has no
    spread of its own, two too little to weigh the chain by."""
    known = [c.tok_rel_se for chains in by_group.values() for c, _ in chains.values() if not math.isnan(c.tok_rel_se)]
    fill = statistics.median(known) if known else SINGLE_VALUE_REL
    return {key: {steps: ((replace(c, tok_rel_se=fill, cycle_rel_se=fill, dof=2.0) if math.isnan(c.tok_rel_se) else c), n)
                  for steps, (c, n) in chains.items()} for key, chains in by_group.items()}


def _chains_at(members: list[TrialRecord], level: int) -> dict[int, tuple[MeasuredChain, int]]:
    """Chain length -> (the chain at ``level``, its trial number), the first trial of each length."""
    chains: dict[int, tuple[MeasuredChain, int]] = {}
    for record in sorted(members, key=lambda r: r.number):
        chain = _measured(record, level)
        if chain is not None and chain.steps not in chains:
            chains[chain.steps] = (chain, record.number)
    return chains


def _row(steps: int, all_reduce: str, nccl: tuple, level: int, accept: float, cycle: float, tok: float, low: float,
         high: float, reference: int, histogram: int, from_trials: Iterable[int], best: dict[int, float],
         missed: bool, basis: str) -> PredictedRow:
    env = dict(nccl)
    label = TrialPlan("search", Candidate(SpeculativeTriple(steps, 1, steps + 1), all_reduce, env)).label()
    return PredictedRow(label=label, num_steps=steps, all_reduce=all_reduce, nccl_env=env, concurrency=level,
                        accept_length=round(accept, 4), cycle_ms=round(cycle, 4), tok_per_s=round(tok, 3),
                        low=round(low, 3), high=round(high, 3), reference_trial=reference, histogram_trial=histogram,
                        from_trials=sorted(set(from_trials)), reaches_best=high >= best.get(level, math.inf),
                        unchecked_miss=missed, basis=basis, best_low=round(best[level], 3) if level in best else None)


def _setting_rows(all_reduce: str, nccl: tuple, chains: dict[int, tuple[MeasuredChain, int]], by_group: dict,
                  own: dict, steps_wanted: list[int], level: int, best: dict[int, float],
                  start_rel: float | None = None) -> list[PredictedRow]:
    """A group (an all-reduce path or NCCL setting) that measured one chain s0: every other chain predicted
    as the base group's shape across chain lengths scaled by this group's measured s0. NCCL settings and
    the path move the cycle time, not the acceptance, so

        tok_G(s) = tok_G(s0) x tok_B(s) / tok_B(s0)

    with tok_B(s) the base group's measurement or prediction. The base is the group with the most measured
    chains that measured s0 and has its own predictions (the same path first). The interval adds, on the
    log scale, the base's own (or its measurement's error and a new measurement's noise), both measured
    s0's errors and :data:`SETTING_MODEL_REL` for a setting whose effect is not one ratio at every length;
    with ``start_rel`` known, the starts of both s0 measurements (and, for a measured base chain, its
    start and the new one's: a base prediction carries those already)."""
    (s0, (chain0, trial0)), = chains.items()
    bases = [key for key, group in by_group.items() if key in own and s0 in group]
    if not bases:
        return []
    base_key = max(bases, key=lambda k: (k[0] == all_reduce, len(by_group[k]), k == ("default", ())))
    base, (base_predictions, missed) = by_group[base_key], own[base_key]
    base0 = base[s0][0]
    predicted = {p.steps: p for p in base_predictions}
    noise = chain0.tok_rel_se
    rows = []
    for steps in steps_wanted:
        if steps == s0:
            continue
        if steps in predicted:
            p = predicted[steps]
            tok_b, log_var_b = p.tok_per_s, (math.log(p.high / p.tok_per_s) / t975(min(p.dof, 1e6))) ** 2
            accept, cycle_b, histogram = p.accept_length, p.cycle_ms, base[p.histogram_steps][1]
        elif steps in base:
            measured_b = base[steps][0]
            tok_b, log_var_b = measured_b.tok_per_s, measured_b.tok_rel_se ** 2 + noise ** 2 + 2 * (start_rel or 0.0) ** 2
            accept, cycle_b, histogram = measured_b.accept_length, measured_b.cycle_ms, base[steps][1]
        else:
            continue
        tok = chain0.tok_per_s * tok_b / base0.tok_per_s
        dof = min(base0.dof, chain0.dof, predicted[steps].dof if steps in predicted else base[steps][0].dof)
        half = t975(min(dof, 1e6)) * math.sqrt(log_var_b + base0.tok_rel_se ** 2 + chain0.tok_rel_se ** 2
                                               + SETTING_MODEL_REL ** 2 + 2 * (start_rel or 0.0) ** 2)
        cycle = cycle_b * chain0.cycle_ms / base0.cycle_ms
        rows.append(_row(steps, all_reduce, nccl, level, accept, cycle, tok, tok * math.exp(-half),
                         tok * math.exp(half), trial0, histogram, [trial0, *(n for _, n in base.values())], best,
                         missed, "setting"))
    return rows


def _check(out: Predictions, measured: list[MeasuredChain], chains: dict[int, tuple[MeasuredChain, int]], *,
           level: int, all_reduce: str, nccl: tuple, model_rel: float = ACCEPT_MODEL_REL,
           start_rel: float | None = None, start_dof: float = math.inf) -> bool:
    """Leave-one-out checks of the group's measured chains (not its longest) where three or more lengths
    were measured; True where one missed its interval."""
    if len(measured) < 3:
        return False
    longest = max(c.steps for c in measured)
    missed = False
    for held in measured:
        if held.steps == longest:
            continue
        others = [c for c in measured if c.steps != held.steps]
        predicted = next(iter(predict_chains(others, [held.steps], accept_model_rel=model_rel, start_rel=start_rel,
                                             start_dof=start_dof)), None)
        if predicted is None:
            continue
        inside = predicted.low <= held.tok_per_s <= predicted.high
        missed |= not inside
        out.checks.append({"trial": chains[held.steps][1], "num_steps": held.steps, "concurrency": level,
                           "all_reduce": all_reduce, "nccl_env": dict(nccl), "predicted": round(predicted.tok_per_s, 3),
                           "low": round(predicted.low, 3), "high": round(predicted.high, 3),
                           "measured": round(held.tok_per_s, 3), "inside": inside,
                           "accept_predicted": round(predicted.accept_length, 4),
                           "accept_measured": round(held.accept_length, 4)})
    return missed


def prediction_lines(predictions: Predictions, *, concurrency: int) -> list[str]:
    """The predicted rows at the objective's level, a line each, and the checks; each marked predicted."""
    rows = [r for r in predictions.rows if r.concurrency == concurrency]
    if predictions.skipped:
        return [f"predicted chains: none ({predictions.skipped})"]
    if not rows:
        return []
    spread = ("no start-to-start spread" if predictions.start_rel is None else
              f"with a start-to-start spread of {predictions.start_rel:.1%}, {predictions.start_rel_source}")
    lines = [f"predicted, not measured (top-k 1 chains the sweep did not start; 95% interval of what a start would "
             f"measure at concurrency {concurrency}, {spread}; {len(rows)} rows in predictions.jsonl):"]
    for row in sorted(rows, key=lambda r: -r.tok_per_s):
        note = "; could beat the best measured (its lower bound): worth a start" if row.reaches_best else ""
        note += "; the group's check missed: start it to know" if row.unchecked_miss else ""
        source = (f"histogram of trial {row.histogram_trial}, time per token through trials "
                  f"{', '.join(str(n) for n in row.from_trials)}"
                  if row.basis == "chains" else
                  f"this setting measured once in trial {row.reference_trial}, the shape across chain lengths "
                  f"from trials {', '.join(str(n) for n in row.from_trials if n != row.reference_trial)}")
        lines.append(f"  ~ {row.label}: {row.tok_per_s:.4g} tok/s [{row.low:.4g}, {row.high:.4g}], accept length "
                     f"{row.accept_length:.3g} ({source}){note}")
    if predictions.sampling:
        lines.append(f"  under sampling: {predictions.sampling}")
    for check in (c for c in predictions.checks if c["concurrency"] == concurrency):
        verdict = "inside" if check["inside"] else "OUTSIDE: the model missed; these predictions are not to be trusted"
        lines.append(f"  check: trial {check['trial']} (steps={check['num_steps']}) predicted from the others "
                     f"{check['predicted']:.4g} [{check['low']:.4g}, {check['high']:.4g}], measured "
                     f"{check['measured']:.4g}: {verdict}")
    return lines
