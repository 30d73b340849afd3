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

__all__ = ["BEST_MARK", "SweepReport", "build_report", "measurement_lines", "node_measurements", "summary_table"]


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


def _between_visit_spread(visits: list[dict[str, Any]]) -> tuple[float, int] | None:
    """The sd of a contender's log level between its confirmation visits, pooled over the contenders (each
    visit's level: its ``value``; the repetitions within a visit add to it), and its degrees of freedom."""
    import math

    levels: dict[Any, list[float]] = {}
    for visit in visits:
        value = visit.get("value")
        if visit.get("status") == "ok" and visit.get("trial") is not None and isinstance(value, (int, float)) \
                and value > 0:
            levels.setdefault(visit["trial"], []).append(math.log(value))
    total, df = 0.0, 0
    for logs in levels.values():
        if len(logs) >= 2:
            mean = math.fsum(logs) / len(logs)
            total += math.fsum((v - mean) ** 2 for v in logs)
            df += len(logs) - 1
    return (math.sqrt(total / df), df) if df else None


def node_measurements(records: list[TrialRecord], visits: list[dict[str, Any]] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    """What this sweep measured on its node(s), for ``summary.json``'s ``measured`` and the next plan
    (``preview.dry_run`` with a previous results directory; a ``--resume`` re-plans from the records
    themselves): the warm and cold engine starts, a trial's time (``TrialTimings.total``, median of the
    trials that ended ok) and the between-visit spread of the confirmation's visits. Each figure says
    where (node, date) and from how many; a figure nothing measured is left out."""
    import statistics

    from orchestrator.sweep.output.cost import measured_start_times, measured_where, warm_and_cold_starts

    out: dict[str, Any] = {}
    started = [r for r in records if measured_start_times([r])]
    if not started:
        return out
    out["where"] = measured_where(started)
    _, warm, cold = warm_and_cold_starts(records)
    if warm:
        out["warm_start_s"] = {"value": round(statistics.median(warm), 1), "n": len(warm), "kind": "median"}
    if cold:
        out["cold_start_s"] = {"value": round(max(cold), 1), "n": len(cold), "kind": "slowest"}
    done = [r for r in started if r.status == "ok"]
    if done:
        out["trial_s"] = {"value": round(statistics.median(r.timings_s.total for r in done), 1), "n": len(done),
                          "kind": "median"}
    spread = _between_visit_spread(list(visits))
    if spread is not None:
        out["between_visit_cv"] = {"value": round(spread[0], 4), "df": spread[1], "kind": "pooled sd of log level"}
    return out


def measurement_lines(measured: dict[str, Any]) -> list[str]:
    """``measured here (node 10.0.0.5, 2026-12-05): warm start 9m55s (median of 8); ...``: one line."""
    from orchestrator.sweep.output.cost import format_duration

    if not measured:
        return []
    parts = []
    for key, what in (("warm_start_s", "warm start"), ("cold_start_s", "cold first start"), ("trial_s", "trial")):
        if key in measured:
            figure = measured[key]
            parts.append(f"{what} {format_duration(figure['value'])} ({figure['kind']} of {figure['n']})")
    spread = measured.get("between_visit_cv")
    parts.append(f"between-visit spread {spread['value']:.1%} ({spread['df']} df)" if spread else
                 "between-visit spread not measured (no contender visited twice)")
    return [f"measured here ({measured['where']}): " + "; ".join(parts) + " (the next plan of this spec can read "
            "them: spectune sweep --dry-run --resume DIR)"]
