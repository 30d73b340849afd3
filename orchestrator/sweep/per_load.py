"""The best configuration at each load, and where speculation stops paying.

The sweep measures every trial at every level of ``benchmark.concurrency`` (the objective's level
first, then the others), keeping the objective metric's per-repetition values at each level
(``TrialRecord.level_values``). Per level this finds the best complete, feasible trial measured
there and compares it with SGLang's default (the ``baseline_auto`` trial) and with no speculation
(``baseline_plain``), as the search's other comparisons are made: ratios of two trials'
repetitions with log-scale 95% intervals (``orchestrator.statistics.unpaired_ratio``), none from
fewer than three values. They are search estimates, trials measured minutes apart, and are
labelled so. Their counts are ``repetitions`` (the smaller of the two trials' repetitions at that
level); ``visits`` is kept for the confirmation's fresh-engine visits (:func:`ratio_dict`).

A comparison whose interval contains 1 is "within the noise" only where the measurement could
have told the two apart (:data:`NOISE_RESOLUTION`); otherwise it is "undecided" (:func:`describe`).

The crossover is the lowest level at which no speculation is decidedly faster than every
speculative configuration measured there (its interval against the best speculative one lies
above 1) and no higher level has a speculative configuration decidedly faster than no
speculation; without such a level nothing is said of a crossover.
"""

from __future__ import annotations

import statistics
from typing import Any, Iterable, Sequence

from orchestrator.statistics import Ratio, unpaired_ratio
from orchestrator.sweep.results import TrialRecord

__all__ = ["ESTIMATE", "NOISE_RESOLUTION", "LevelBest", "baseline", "best_at", "by_concurrency", "could_distinguish",
           "crossover", "decidedly_above_one", "describe", "eligible_at", "level_ratio", "measured_levels",
           "objective_direction", "per_load_lines", "ratio_dict", "ratio_from_dict"]

ESTIMATE = "search estimates, trials measured minutes apart"

NOISE_RESOLUTION = 0.10
"""The widest interval that still says "no difference": a ratio is "within the noise" only when its
whole 95% interval lies inside [1 / (1 + 0.10), 1 + 0.10] = [0.909, 1.10], i.e. the measurement
would have shown a 10% difference either way and showed none. 10% is the size of the gains the
search is after (the demo's search put its best at x1.15 over SGLang's default; two H200 sweeps
named winners at x1.10 and x0.78). Three repetitions a side (Welch, 4 degrees of freedom: half-width
about 2.3 x the CV) at the CVs measured under load (1.5-3.4%, DESIGN.md "Noise") give intervals of
about +/-3-8%, inside it; at the CV measured at concurrency 1 on the CPU (8.4%) about +/-19%, which
cannot rule out such a gain and so reads "undecided"."""


def ratio_dict(ratio: Ratio | None) -> dict[str, Any] | None:
    """``ratio`` as ``summary.json`` stores it, its count named for what it counts: ``repetitions``
    for a search estimate (``basis`` unpaired: the smaller of the two trials' repetitions) and
    ``visits`` only for the confirmation's paired fresh-engine visits."""
    if ratio is None:
        return None
    data = ratio.model_dump()
    if ratio.basis == "unpaired":
        data["repetitions"] = data.pop("visits")
    return data


def ratio_from_dict(data: dict[str, Any] | None) -> Ratio | None:
    """The inverse of :func:`ratio_dict`; also reads summaries written before the rename (``visits``
    for a search estimate's repetitions)."""
    if data is None:
        return None
    data = dict(data)
    if "repetitions" in data:
        data["visits"] = data.pop("repetitions")
    return Ratio.model_validate(data)


def measured_levels(records: Iterable[TrialRecord]) -> list[int]:
    """Every concurrency level some trial has values at, ascending."""
    levels: set[int] = set()
    for record in records:
        levels.update(int(key) for key, values in record.level_values.items() if values)
        if record.objective is not None and record.objective.values:
            levels.add(record.objective.concurrency)
    return sorted(levels)


def objective_direction(records: Sequence[TrialRecord]) -> str:
    return next((r.objective.direction for r in records if r.objective is not None), "max")


def eligible_at(record: TrialRecord, level: int) -> bool:
    """Complete and feasible (``best_record``'s rule), and measured at ``level``."""
    return record.status == "ok" and record.complete and bool(record.values_at(level))


def _median(record: TrialRecord, level: int) -> float:
    return statistics.median(record.values_at(level))


def best_at(records: Iterable[TrialRecord], level: int, direction: str) -> TrialRecord | None:
    """The trial of ``records`` with the best median at ``level`` among those eligible there."""
    candidates = [r for r in records if eligible_at(r, level)]
    if not candidates:
        return None
    pick = max if direction == "max" else min
    return pick(candidates, key=lambda r: _median(r, level))


def level_ratio(a: TrialRecord | None, b: TrialRecord | None, level: int, direction: str) -> Ratio | None:
    """``a`` over ``b`` at ``level`` on the objective metric, oriented so > 1 is better (max) / faster
    (min); None where either side has no values there."""
    if a is None or b is None or a is b:
        return None
    va, vb = a.values_at(level), b.values_at(level)
    if not va or not vb:
        return None
    return unpaired_ratio(va, vb) if direction == "max" else unpaired_ratio(vb, va)


def decidedly_above_one(ratio: Ratio | None) -> bool:
    """The interval lies entirely above 1 (none from fewer than 3 values)."""
    return ratio is not None and ratio.has_interval and ratio.ci95_low > 1.0  # type: ignore[operator]


def _decidedly_below_one(ratio: Ratio | None) -> bool:
    return ratio is not None and ratio.has_interval and ratio.ci95_high < 1.0  # type: ignore[operator]


class LevelBest(dict):
    """One entry of ``summary.json``'s ``by_concurrency``."""


def baseline(records: Iterable[TrialRecord], kind: str) -> TrialRecord | None:
    """The sweep's ``baseline_plain`` or ``baseline_auto`` trial, if it has one."""
    return next((r for r in records if r.kind == kind), None)


def by_concurrency(records: Sequence[TrialRecord], *, levels: Sequence[int] | None = None) -> list[LevelBest]:
    """Per level (ascending): the best complete, feasible trial measured there, its median of the
    objective metric (``repetitions``: how many values that median is of), and its ratios against
    SGLang's default and no speculation (:func:`ratio_dict`), None where not measurable, or where the best is that baseline). Also, per level, no speculation
    against the best speculative trial (``plain_vs_best_speculative``), which the crossover reads."""
    direction = objective_direction(records)
    plain, auto = baseline(records, "baseline_plain"), baseline(records, "baseline_auto")
    out: list[LevelBest] = []
    for level in sorted(levels) if levels is not None else measured_levels(records):
        best = best_at(records, level, direction)
        if best is None:
            continue
        speculative = best_at([r for r in records if r.kind != "baseline_plain"], level, direction)
        over_auto = level_ratio(best, auto, level, direction)
        over_plain = level_ratio(best, plain, level, direction)
        plain_vs_spec = level_ratio(plain, speculative, level, direction) if plain is not None and eligible_at(
            plain, level) else None
        out.append(LevelBest(
            concurrency=level, best_trial=best.number, best_kind=best.kind, best_label=best.label, best_params=dict(best.params),
            value=_median(best, level), repetitions=len(best.values_at(level)),
            vs_sglang_default=ratio_dict(over_auto), vs_no_speculation=ratio_dict(over_plain),
            best_speculative_trial=speculative.number if speculative else None,
            best_speculative_label=speculative.label if speculative else None,
            plain_vs_best_speculative=ratio_dict(plain_vs_spec),
        ))
    return out


def crossover(levels: Sequence[LevelBest]) -> dict[str, Any] | None:
    """The lowest level from which on no speculation is decidedly faster (see the module's rule), or
    None when no level decides it."""
    ratios = [ratio_from_dict(entry.get("plain_vs_best_speculative")) for entry in levels]
    for i, entry in enumerate(levels):
        if not decidedly_above_one(ratios[i]) or any(_decidedly_below_one(later) for later in ratios[i + 1:]):
            continue
        ratio = entry["plain_vs_best_speculative"]
        return {"concurrency": entry["concurrency"], "ratio": ratio,
                "best_speculative_trial": entry["best_speculative_trial"],
                "best_speculative_label": entry["best_speculative_label"]}
    return None


def could_distinguish(ratio: Ratio, resolution: float = NOISE_RESOLUTION) -> bool:
    """Whether ``ratio``'s interval is narrow enough to have shown a ``resolution`` difference: it lies
    within [1 / (1 + resolution), 1 + resolution] (:data:`NOISE_RESOLUTION`)."""
    return ratio.has_interval and 1.0 / (1.0 + resolution) <= ratio.ci95_low and ratio.ci95_high <= 1.0 + resolution  # type: ignore[operator]


def describe(ratio: Ratio | None, what: str) -> str:
    """One comparison in words. An interval that contains 1 is never a gain: it is "within the noise
    of ``what``" when it also lies within [1 / 1.1, 1.1] (:data:`NOISE_RESOLUTION`: the measurement
    could have told a 10% difference and saw none, a finding), and "undecided against ``what``
    (x0.63 to x5.00)" when it is wider (the measurement could not tell; the point estimate of such
    an interval is left out, it would read as a result)."""
    if ratio is None:
        return f"no comparison with {what} (not measured)"
    if ratio.has_interval and ratio.ci95_low <= 1.0 <= ratio.ci95_high:  # type: ignore[operator]
        if could_distinguish(ratio):
            return f"within the noise of {what} ({ratio.text()})"
        return f"undecided against {what} (x{ratio.ci95_low:.2f} to x{ratio.ci95_high:.2f})"
    return f"{ratio.text()} over {what}"


def _compare(ratio: dict[str, Any] | None, what: str) -> str:
    return describe(ratio_from_dict(ratio), what)


def _repetitions(entry: LevelBest) -> str:
    """``median of 3 repetitions``: a search trial's repetitions, never called visits."""
    n = entry.get("repetitions")
    return "median of 1 repetition" if n == 1 else f"median of {n} repetitions"


def per_load_lines(levels: Sequence[LevelBest], *, metric: str, cross: dict[str, Any] | None) -> list[str]:
    """The lines the console and ``summary.txt`` print: a heading, one line per level, the crossover
    when one is decided."""
    if not levels:
        return []
    lines = [f"per load: the best configuration at each concurrency level ({metric}; {ESTIMATE})"]
    for entry in levels:
        parts = []
        if entry["best_kind"] != "baseline_auto":
            parts.append(_compare(entry["vs_sglang_default"], "SGLang's default"))
        if entry["best_kind"] != "baseline_plain":
            parts.append(_compare(entry["vs_no_speculation"], "no speculation"))
        lines.append(f"  at concurrency {entry['concurrency']}: best {entry['best_label']} {entry['value']:.4g} "
                     f"{metric} ({_repetitions(entry)})" + ("; " + ", ".join(parts) if parts else ""))
    if cross is not None:
        ratio = ratio_from_dict(cross["ratio"])
        assert ratio is not None
        lines.append(f"  from concurrency {cross['concurrency']} on, no speculation is faster: {ratio.text()} over the "
                     f"best speculative configuration measured there ({cross['best_speculative_label']})")
    return lines
