"""Every number of a sweep's summary, computed in one pass: :func:`sweep_figures` -> :class:`SweepFigures`.

``report``, ``per_load`` and ``adaptive_schedule`` put these figures into words and JSON and compute
none. The figures: the best (best.yaml's trial), ratios against the baselines, NCCL effects, the
best per level and the crossover (docs/design/sweep.md explains the ratios, effects and crossover).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Iterable, Literal, Sequence

from orchestrator.space.define_by_run import DEFAULT_WORD
from orchestrator.statistics import Ratio, unpaired_ratio
from orchestrator.sweep.records.results import TrialRecord, best_record

__all__ = ["Crossover", "LevelFigures", "NcclEffect", "SweepFigures", "baseline", "chain_steps", "crossover_index",
           "decidedly_above_one", "decidedly_below_one", "measured_levels", "objective_direction", "sweep_figures"]


@dataclass(frozen=True)
class NcclEffect:
    """One forced NCCL value against NCCL's default, on the objective at its level."""

    variable: str
    value: str
    basis: Literal["matched", "unmatched"]
    pairs: int
    """Matched pairs found (0 when unmatched)."""
    forced: TrialRecord
    default: TrialRecord
    ratio: Ratio | None
    """``forced`` over ``default``."""


@dataclass(frozen=True)
class LevelFigures:
    """One concurrency level: its best trial and the comparisons made there."""

    concurrency: int
    best: TrialRecord
    value: float
    """The best trial's median of the objective metric at this level."""
    repetitions: int
    """How many values ``value`` is the median of."""
    vs_sglang_default: Ratio | None
    vs_no_speculation: Ratio | None
    best_speculative: TrialRecord | None
    plain_vs_best_speculative: Ratio | None
    """No speculation over the best speculative trial (None unless no speculation is eligible here)."""
    best_chain: TrialRecord | None
    """The best top-k 1 trial (:func:`chain_steps`), what SGLang's adaptive schedule can express."""
    plain_vs_best_chain: Ratio | None


@dataclass(frozen=True)
class Crossover:
    """The level from which on no speculation is decidedly faster (:func:`crossover_index`)."""

    concurrency: int
    ratio: Ratio
    """No speculation over the best speculative trial there."""
    best_speculative: TrialRecord


@dataclass(frozen=True)
class SweepFigures:
    """Every number of the summary (:func:`sweep_figures`)."""

    objective_level: int | None
    direction: str
    best: TrialRecord | None
    """best.yaml's trial: the confirmation's choice, else the search's best."""
    confirmed: bool
    """``best`` is the confirmation's choice (it ran)."""
    searched: TrialRecord | None
    """The search's best (``results.best_record``)."""
    plain: TrialRecord | None
    auto: TrialRecord | None
    best_vs_sglang_default: Ratio | None
    best_vs_no_speculation: Ratio | None
    searched_vs_sglang_default: Ratio | None
    searched_vs_no_speculation: Ratio | None
    nccl_effects: tuple[NcclEffect, ...]
    levels: tuple[LevelFigures, ...]
    crossover: Crossover | None
    counts: dict[str, int]
    """Trials per status, in the order the statuses first appear."""
    trials: int
    bench_s: float
    """Time spent benchmarking, summed over the trials."""
    total_s: float
    share_outside_benchmark: float | None
    """1 - bench_s / total_s; None without any time recorded."""


def baseline(records: Iterable[TrialRecord], kind: str) -> TrialRecord | None:
    """The sweep's ``baseline_plain`` or ``baseline_auto`` trial, if it has one."""
    return next((r for r in records if r.kind == kind), None)


def measured_levels(records: Iterable[TrialRecord]) -> list[int]:
    """Every concurrency level some trial has values at, ascending."""
    levels: set[int] = set()
    for record in records:
        levels.update(int(key) for key, values in record.level_values.items() if values)
        if record.objective is not None and record.objective.values:
            levels.add(record.objective.concurrency)
    return sorted(levels)


def objective_direction(records: Sequence[TrialRecord]) -> str:
    """The objective's direction as the records hold it (``max`` without any objective)."""
    return next((r.objective.direction for r in records if r.objective is not None), "max")


def chain_steps(record: TrialRecord) -> int | None:
    """num_steps of a top-k 1 configuration as it ran (SGLang's auto choice resolved), else None."""
    if record.params.get("speculative") == "off":
        return None
    numbers = record.resolved_params or record.params
    steps, topk = numbers.get("num_steps"), numbers.get("eagle_topk")
    if topk == 1 and isinstance(steps, int) and not isinstance(steps, bool):
        return steps
    return None


def decidedly_above_one(ratio: Ratio | None) -> bool:
    """The interval lies entirely above 1 (none from fewer than 3 values)."""
    return ratio is not None and ratio.has_interval and ratio.ci95_low > 1.0  # type: ignore[operator]


def decidedly_below_one(ratio: Ratio | None) -> bool:
    """The interval lies entirely below 1."""
    return ratio is not None and ratio.has_interval and ratio.ci95_high < 1.0  # type: ignore[operator]


def crossover_index(ratios: Sequence[Ratio | None]) -> int | None:
    """The index of the crossover level in per-level ratios of no speculation over the best
    speculative trial (ascending levels), or None: the lowest level whose ratio is decidedly above
    1 with no later one decidedly below 1."""
    for i, ratio in enumerate(ratios):
        if decidedly_above_one(ratio) and not any(decidedly_below_one(later) for later in ratios[i + 1:]):
            return i
    return None


class _Index:
    """Each record's objective values at every level the summary reads, read once, with the medians
    and eligibility they give."""

    def __init__(self, records: Sequence[TrialRecord], levels: Iterable[int], direction: str) -> None:
        self._direction = direction
        self._records = list(records)  # keeps the records the ids below name alive
        wanted = sorted(set(levels))
        self._values = {id(r): {level: tuple(r.values_at(level)) for level in wanted} for r in self._records}
        self._complete_ok = {id(r): r.status == "ok" and r.complete for r in self._records}

    def values(self, record: TrialRecord, level: int) -> tuple[float, ...]:
        return self._values[id(record)].get(level, ())

    def eligible(self, record: TrialRecord, level: int) -> bool:
        """Complete and feasible (``best_record``'s rule), and measured at ``level``."""
        return self._complete_ok[id(record)] and bool(self.values(record, level))

    def median(self, record: TrialRecord, level: int) -> float:
        return statistics.median(self.values(record, level))

    def best_at(self, records: Iterable[TrialRecord], level: int) -> TrialRecord | None:
        """The trial of ``records`` with the best median at ``level`` among those eligible there (the
        first of equals)."""
        candidates = [r for r in records if self.eligible(r, level)]
        if not candidates:
            return None
        pick = max if self._direction == "max" else min
        return pick(candidates, key=lambda r: self.median(r, level))

    def ratio(self, a: TrialRecord | None, b: TrialRecord | None, level: int | None) -> Ratio | None:
        """``a`` over ``b`` at ``level``, oriented so > 1 is better (max) / faster (min)."""
        if a is None or b is None or a is b or level is None:
            return None
        va, vb = self.values(a, level), self.values(b, level)
        if not va or not vb:
            return None
        return unpaired_ratio(va, vb) if self._direction == "max" else unpaired_ratio(vb, va)


def _nccl_effects(index: _Index, records: Sequence[TrialRecord], variables: Iterable[str],
                  level: int | None) -> tuple[NcclEffect, ...]:
    """Per NCCL variable and forced value, the objective against NCCL's default: a matched pair
    first, else the best with the value against the best with the default (``unmatched``)."""
    usable = [r for r in records if r.status in ("ok", "infeasible") and r.objective and r.objective.values]
    effects: list[NcclEffect] = []
    for name in variables:
        values = sorted({str(r.params.get(name, DEFAULT_WORD)) for r in usable} - {DEFAULT_WORD})
        for value in values:
            forced = [r for r in usable if str(r.params.get(name, DEFAULT_WORD)) == value]
            default = [r for r in usable if str(r.params.get(name, DEFAULT_WORD)) == DEFAULT_WORD]

            def rest(r: TrialRecord) -> tuple:
                return tuple(sorted((k, str(v)) for k, v in r.params.items() if k != name))

            by_rest = {rest(r): r for r in default}
            pairs = [(f, by_rest[rest(f)]) for f in forced if rest(f) in by_rest]
            basis: Literal["matched", "unmatched"]
            if pairs:
                richest = max(pairs, key=lambda p: len(p[0].objective.values))  # type: ignore[union-attr]
                forced_rec, default_rec = richest
                basis = "matched"
            elif default:
                forced_rec = best_record(forced) or forced[0]
                default_rec = best_record(default) or default[0]
                basis = "unmatched"
            else:
                continue
            effects.append(NcclEffect(variable=name, value=value, basis=basis, pairs=len(pairs), forced=forced_rec,
                                      default=default_rec, ratio=index.ratio(forced_rec, default_rec, level)))
    return tuple(effects)


def _level_figures(index: _Index, records: Sequence[TrialRecord], levels: Sequence[int],
                   plain: TrialRecord | None, auto: TrialRecord | None) -> tuple[LevelFigures, ...]:
    speculative = [r for r in records if r.kind != "baseline_plain"]
    chains = [r for r in records if chain_steps(r) is not None]
    out: list[LevelFigures] = []
    for level in levels:
        best = index.best_at(records, level)
        if best is None:
            continue
        best_speculative, best_chain = index.best_at(speculative, level), index.best_at(chains, level)
        plain_here = plain if plain is not None and index.eligible(plain, level) else None
        out.append(LevelFigures(
            concurrency=level, best=best, value=index.median(best, level), repetitions=len(index.values(best, level)),
            vs_sglang_default=index.ratio(best, auto, level), vs_no_speculation=index.ratio(best, plain, level),
            best_speculative=best_speculative,
            plain_vs_best_speculative=index.ratio(plain_here, best_speculative, level),
            best_chain=best_chain, plain_vs_best_chain=index.ratio(plain_here, best_chain, level),
        ))
    return tuple(out)


def sweep_figures(records: Sequence[TrialRecord], *, objective_level: int | None = None, direction: str | None = None,
                  levels: Sequence[int] | None = None, nccl_variables: Iterable[str] = (),
                  confirmed: TrialRecord | None = None) -> SweepFigures:
    """Every number of the summary of ``records``, in one pass.

    Args:
        objective_level: The objective's concurrency (``spec.objective_concurrency``); default: the
            records' (every record of a sweep has the same).
        direction: ``max`` or ``min`` (``spec.objective.direction``); default: the records'.
        levels: The benchmark's concurrency levels (``benchmark.concurrency``); default: every level
            some trial measured.
        nccl_variables: The NCCL variables the search varied (``search.nccl_variables()``).
        confirmed: The confirmation's choice (one of ``records``), which then is the best.

    Raises:
        ValueError: ``direction`` is neither ``max`` nor ``min``.
    """
    records = list(records)
    if objective_level is None:
        objective_level = next((r.objective.concurrency for r in records if r.objective is not None), None)
    direction = direction or objective_direction(records)
    if direction not in ("max", "min"):
        raise ValueError(f"direction must be 'max' or 'min' (objective.direction), got {direction!r}")
    per_level = sorted(levels) if levels is not None else measured_levels(records)
    indexed = records + ([confirmed] if confirmed is not None and not any(r is confirmed for r in records) else [])
    index = _Index(indexed, [*per_level, *([objective_level] if objective_level is not None else [])], direction)
    plain, auto = baseline(records, "baseline_plain"), baseline(records, "baseline_auto")
    searched = best_record(records)
    best = confirmed if confirmed is not None else searched
    level_figures = _level_figures(index, records, per_level, plain, auto)
    at = crossover_index([entry.plain_vs_best_speculative for entry in level_figures])
    crossover = None
    if at is not None:
        entry = level_figures[at]
        assert entry.plain_vs_best_speculative is not None and entry.best_speculative is not None
        crossover = Crossover(concurrency=entry.concurrency, ratio=entry.plain_vs_best_speculative,
                              best_speculative=entry.best_speculative)
    counts: dict[str, int] = {}
    for r in records:
        counts[r.status] = counts.get(r.status, 0) + 1
    bench = sum(r.timings_s.bench or 0.0 for r in records)
    total = sum(r.timings_s.total for r in records)
    return SweepFigures(
        objective_level=objective_level, direction=direction, best=best, confirmed=confirmed is not None,
        searched=searched, plain=plain, auto=auto,
        best_vs_sglang_default=index.ratio(best, auto, objective_level),
        best_vs_no_speculation=index.ratio(best, plain, objective_level),
        searched_vs_sglang_default=index.ratio(searched, auto, objective_level),
        searched_vs_no_speculation=index.ratio(searched, plain, objective_level),
        nccl_effects=_nccl_effects(index, records, nccl_variables, objective_level),
        levels=level_figures, crossover=crossover, counts=counts, trials=len(records), bench_s=bench, total_s=total,
        share_outside_benchmark=1 - bench / total if total else None,
    )
