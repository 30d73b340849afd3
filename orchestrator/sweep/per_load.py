"""The best configuration at each load, and where speculation stops paying, in words and JSON.

The sweep measures every trial at every level of ``benchmark.concurrency`` (the objective's level
first, then the others), keeping the objective metric's per-repetition values at each level
(``TrialRecord.level_values``). The figures per level (the best complete, feasible trial there,
its ratios against SGLang's default and no speculation, the crossover) are computed with the rest
of the summary's in ``orchestrator.sweep.figures``; this module puts them into ``summary.json``'s
``by_concurrency`` and ``crossover`` and into the lines the console prints, and computes nothing.
The ratios are search estimates, trials measured minutes apart, and are labelled so. Their counts
are ``repetitions`` (the smaller of the two trials' repetitions at that level); ``visits`` is kept
for the confirmation's fresh-engine visits (:func:`ratio_dict`).

A comparison whose interval contains 1 is "within the noise" only where the measurement could
have told the two apart (:data:`NOISE_RESOLUTION`); otherwise it is "undecided" (:func:`describe`).
The crossover line names the lowest level from which on no speculation is decidedly faster
(``figures.crossover_index``); without such a level nothing is said of a crossover.
"""

from __future__ import annotations

from typing import Any, Sequence

from orchestrator.statistics import Ratio
from orchestrator.sweep.figures import Crossover, LevelFigures, crossover_index

__all__ = ["ESTIMATE", "NOISE_RESOLUTION", "LevelBest", "by_concurrency", "could_distinguish", "crossover",
           "crossover_dict", "describe", "per_load_lines", "ratio_dict", "ratio_from_dict"]

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
    """``ratio`` as ``summary.json`` stores it."""
    return None if ratio is None else ratio.model_dump()


def ratio_from_dict(data: dict[str, Any] | None) -> Ratio | None:
    """The inverse of :func:`ratio_dict`."""
    return None if data is None else Ratio.model_validate(data)


class LevelBest(dict):
    """One entry of ``summary.json``'s ``by_concurrency``."""


def by_concurrency(levels: Sequence[LevelFigures]) -> list[LevelBest]:
    """``summary.json``'s ``by_concurrency`` from the per-level figures (``SweepFigures.levels``):
    per level (ascending) the best complete, feasible trial measured there, its median of the
    objective metric (``repetitions``: how many values that median is of), and its ratios against
    SGLang's default and no speculation (:func:`ratio_dict`), None where not measurable, or where
    the best is that baseline. Also no speculation against the best speculative trial
    (``plain_vs_best_speculative``), which the crossover reads."""
    return [LevelBest(
        concurrency=entry.concurrency, best_trial=entry.best.number, best_kind=entry.best.kind,
        best_label=entry.best.label, best_params=dict(entry.best.params), value=entry.value,
        repetitions=entry.repetitions, vs_sglang_default=ratio_dict(entry.vs_sglang_default),
        vs_no_speculation=ratio_dict(entry.vs_no_speculation),
        best_speculative_trial=entry.best_speculative.number if entry.best_speculative else None,
        best_speculative_label=entry.best_speculative.label if entry.best_speculative else None,
        plain_vs_best_speculative=ratio_dict(entry.plain_vs_best_speculative),
    ) for entry in levels]


def crossover_dict(cross: Crossover | None) -> dict[str, Any] | None:
    """``summary.json``'s ``crossover`` from the figures' (``SweepFigures.crossover``)."""
    if cross is None:
        return None
    return {"concurrency": cross.concurrency, "ratio": ratio_dict(cross.ratio),
            "best_speculative_trial": cross.best_speculative.number,
            "best_speculative_label": cross.best_speculative.label}


def crossover(levels: Sequence[LevelBest]) -> dict[str, Any] | None:
    """The crossover of ``by_concurrency`` entries read back from a ``summary.json``, by the figures' rule (``figures.crossover_index``), or None."""
    at = crossover_index([ratio_from_dict(entry.get("plain_vs_best_speculative")) for entry in levels])
    if at is None:
        return None
    entry = levels[at]
    return {"concurrency": entry["concurrency"], "ratio": entry["plain_vs_best_speculative"],
            "best_speculative_trial": entry["best_speculative_trial"],
            "best_speculative_label": entry["best_speculative_label"]}


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
