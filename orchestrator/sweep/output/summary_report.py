"""The sweep's verdict in words and JSON: the best configuration, its gains over both baselines,
each forced NCCL variable's effect, and the summary table.

Every number comes from ``orchestrator.sweep.output.figures``; this module words them. The search's
comparisons are labelled as estimates; the confirmation's verdict lines are added as given.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table

from orchestrator.sweep.output.figures import NcclEffect, SweepFigures
from orchestrator.sweep.output.per_load import ESTIMATE, by_concurrency, crossover_dict, describe, per_load_lines, ratio_dict
from orchestrator.sweep.records.results import TrialRecord, served_engine_config

__all__ = ["BEST_MARK", "SweepReport", "build_report", "summary_table"]


def _nccl_effect(effect: NcclEffect) -> dict[str, Any]:
    """One entry of ``summary.json``'s ``nccl_effects``, its line included."""
    return {
        "variable": effect.variable, "value": effect.value, "basis": effect.basis, "pairs": effect.pairs,
        "forced_trial": effect.forced.number, "default_trial": effect.default.number,
        "ratio": ratio_dict(effect.ratio),
        "text": f"{effect.variable}={effect.value}: " + describe(effect.ratio, "NCCL's default") + f" ({effect.basis})",
    }


class SweepReport(dict):
    """Plain-data verdict of a sweep (what ``summary.json`` holds)."""


def build_report(figures: SweepFigures, *, metric: str, confirmation_lines: list[str] | None = None,
                 best_why: str | None = None) -> SweepReport:
    """``summary.json``'s figures (``figures.sweep_figures``) in words and JSON: the best trial, its
    improvements over both baselines, the NCCL effects, per-status counts, time shares, and the best
    configuration at each load (``orchestrator.sweep.output.per_load``).

    ``best_config`` is what best.yaml holds (``results.served_engine_config``: SGLang's automatic
    speculative numbers resolved), with a line saying so under ``best.yaml: trial N ...``.

    Args:
        confirmation_lines: The confirmation's verdict lines, added after the search's best.
        best_why: Why best.yaml holds its trial, for the ``best.yaml: trial N ...`` line and ``best_why``.
    """
    best, searched, plain, auto = figures.best, figures.searched, figures.plain, figures.auto
    lines = []
    if searched is None:
        lines.append("no trial measured every repetition successfully: there is no best configuration")
    else:
        lines.append(f"search's best: trial {searched.number} {searched.label}: {metric} {searched.value:.4g} at "
                     f"concurrency {figures.objective_level}")
        if searched is not auto and auto is not None:
            lines.append("  " + describe(figures.searched_vs_sglang_default, "SGLang's default") + f" ({ESTIMATE})")
        if searched is not plain and plain is not None:
            lines.append("  " + describe(figures.searched_vs_no_speculation, "no speculation") + f" ({ESTIMATE})")
    lines += list(confirmation_lines or [])
    why, best_config = None, None
    if best is not None:
        why = best_why or ("the confirmation's choice" if figures.confirmed else "the search's best")
        lines.append(f"best.yaml: trial {best.number} {best.label} ({why})")
        best_config, numbers_line = served_engine_config(best)
        lines += [f"  {numbers_line}"] if numbers_line else []
    effects = [_nccl_effect(effect) for effect in figures.nccl_effects]
    lines += [f"  {e['text']}" for e in effects]
    per_level = by_concurrency(figures.levels)
    cross = crossover_dict(figures.crossover)
    total = figures.total_s
    return SweepReport(
        best_trial=best.number if best else None,
        best_label=best.label if best else None,
        best_value=best.value if best else None,
        best_why=why,
        best_config=best_config,
        metric=metric,
        concurrency=figures.objective_level,
        over_sglang_default=ratio_dict(figures.best_vs_sglang_default),
        over_no_speculation=ratio_dict(figures.best_vs_no_speculation),
        nccl_effects=effects,
        counts=dict(figures.counts),
        trials=figures.trials,
        time_benchmarking_s=round(figures.bench_s, 1),
        time_total_s=round(total, 1),
        share_outside_benchmark=round(figures.share_outside_benchmark, 3)
        if figures.share_outside_benchmark is not None else None,
        lines=lines,
        by_concurrency=per_level,
        crossover=cross,
        per_load_lines=per_load_lines(per_level, metric=metric, cross=cross),
    )


BEST_MARK = "<- best.yaml"
"""The table's mark on best.yaml's trial (not necessarily the top row: the table ranks the search's estimates)."""


def _status_cell(record: TrialRecord) -> str:
    """``failed (launch_failed)``; the reason once where it is the status (``early_stopped``)."""
    if record.reason and record.reason != record.status:
        return f"{record.status} ({record.reason})"
    return record.status


def summary_table(records: list[TrialRecord], *, metric: str, concurrency: int, best_trial: int | None) -> Table:
    """Trials sorted by the objective (best first; failed ones last, with their reason), the trial
    ``best_trial`` (the report's, never recomputed; None: none) marked :data:`BEST_MARK`."""
    measured = [r for r in records if r.value is not None]
    direction = measured[0].objective.direction if measured and measured[0].objective else "max"
    ordered = sorted(measured, key=lambda r: r.value if direction == "min" else -r.value)  # type: ignore[operator]
    ordered += [r for r in records if r.value is None]
    best = next((r for r in records if r.number == best_trial), None) if best_trial is not None else None
    table = Table(title=f"{metric} at concurrency {concurrency} (median of repetitions; 95% interval on the log "
                        "scale, from 3 repetitions on)", box=None)
    kernels = any(r.all_reduce_kernel not in (None, "none") for r in records)
    columns = [("#", "right"), ("configuration", "left"), (metric, "right"), ("95% interval", "right"),
               ("reps", "right")] + ([("all-reduce", "left")] if kernels else []) + [("status", "left")]
    for column, justify in columns:
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for r in ordered:
        obj = r.objective
        if obj and obj.ci95_low is not None and obj.ci95_high is not None:
            interval = f"[{obj.ci95_low:.4g}, {obj.ci95_high:.4g}]"
        else:
            interval = "too few reps" if obj and obj.values else "-"
        status = _status_cell(r) + (f"  {BEST_MARK}" if best is r else "")
        cells = [str(r.number), r.label, f"{r.value:.4g}" if r.value is not None else "-", interval,
                 f"{r.repetitions_done}/{r.repetitions_planned}"]
        cells += [r.all_reduce_kernel or "-"] if kernels else []
        table.add_row(*cells, status)
    return table
