"""The best configuration at each load, and where speculation stops paying, in words and JSON.

Puts the per-level figures (``orchestrator.sweep.output.figures``) into ``summary.json``'s
``by_concurrency`` and ``crossover`` and into the console's lines; computes nothing. The ratios are
search estimates. :func:`describe` words one comparison ("within the noise" only where the
interval could have shown :data:`NOISE_RESOLUTION`, else "undecided").
"""

from __future__ import annotations

from typing import Any, Sequence, TypedDict

from orchestrator.statistics import Ratio
from orchestrator.sweep.output.figures import Crossover, LevelFigures, crossover_index

__all__ = ["ESTIMATE", "NOISE_RESOLUTION", "LevelBest", "by_concurrency", "could_distinguish", "crossover",
           "crossover_dict", "describe", "per_load_lines", "ratio_dict", "ratio_from_dict"]

ESTIMATE = "search estimates, trials measured minutes apart"

NOISE_RESOLUTION = 0.10
"""A ratio is "within the noise" only when its whole 95% interval lies inside
[1 / (1 + 0.10), 1 + 0.10]; docs/design/sweep.md says why 10%."""


def ratio_dict(ratio: Ratio | None) -> dict[str, Any] | None:
    """``ratio`` as ``summary.json`` stores it."""
    return None if ratio is None else ratio.model_dump()


def ratio_from_dict(data: dict[str, Any] | None) -> Ratio | None:
    """The inverse of :func:`ratio_dict`."""
    return None if data is None else Ratio.model_validate(data)


class LevelBest(TypedDict):
    """One entry of ``summary.json``'s ``by_concurrency`` (JSON as written and read back)."""

    concurrency: int
    best_trial: int
    best_kind: str
    best_label: str
    best_params: dict[str, Any]
    value: float
    repetitions: int
    vs_sglang_default: dict[str, Any] | None
    vs_no_speculation: dict[str, Any] | None
    best_speculative_trial: int | None
    best_speculative_label: str | None
    plain_vs_best_speculative: dict[str, Any] | None


def by_concurrency(levels: Sequence[LevelFigures]) -> list[LevelBest]:
    """``summary.json``'s ``by_concurrency`` from the per-level figures (``SweepFigures.levels``):
    per level (ascending) the best trial, its median, its ratios against both baselines and no
    speculation against the best speculative trial (which the crossover reads)."""
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
    """The crossover of ``by_concurrency`` entries read back from a ``summary.json``
    (``figures.crossover_index``), or None."""
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
    """One comparison in words. An interval that contains 1 is never a gain: "within the noise of
    ``what``" where :func:`could_distinguish`, else "undecided against ``what`` (x0.63 to x5.00)",
    without a point estimate."""
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
    """``median of 3 repetitions``."""
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
