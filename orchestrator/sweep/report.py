"""The sweep's verdict: the best configuration, what it gained over both baselines, what each forced
NCCL variable gained or cost against NCCL's default, and the table a person reads at the end.

The search's comparisons are ratios of two trials' repetitions, measured minutes apart, with
log-scale 95% intervals (``orchestrator.statistics.unpaired_ratio``): labelled as the search's
estimates, they carry the machine's drift. The verdict a user acts on is the confirmation's
(``orchestrator.sweep.confirm``: interleaved visits, paired); its lines are added here.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from rich.table import Table

from orchestrator.space.define_by_run import DEFAULT_WORD
from orchestrator.statistics import Ratio
from orchestrator.sweep.per_load import (
    ESTIMATE,
    baseline,
    by_concurrency,
    crossover,
    describe,
    level_ratio,
    per_load_lines,
    ratio_dict,
)
from orchestrator.sweep.results import TrialRecord, best_record

__all__ = ["BEST_MARK", "SweepReport", "build_report", "summary_table"]


def _ratio(a: TrialRecord | None, b: TrialRecord | None) -> Ratio | None:
    """``a`` over ``b`` on the objective, oriented so > 1 is better (max) / faster (min): the
    per-load comparison at the objective's own level."""
    if a is None or a.objective is None:
        return None
    return level_ratio(a, b, a.objective.concurrency, a.objective.direction)


def _nccl_effects(records: list[TrialRecord], variables: Iterable[str]) -> list[dict[str, Any]]:
    """Per NCCL variable and forced value: the objective against NCCL's default.

    Matched pairs first: trials identical except for this variable (the cleanest evidence).
    Without a pair, the best trial with the value against the best with the default (labelled
    ``unmatched``: other settings differ too).
    """
    usable = [r for r in records if r.status in ("ok", "infeasible") and r.objective and r.objective.values]
    effects: list[dict[str, Any]] = []
    for name in variables:
        values = sorted({str(r.params.get(name, DEFAULT_WORD)) for r in usable} - {DEFAULT_WORD})
        for value in values:
            forced = [r for r in usable if str(r.params.get(name, DEFAULT_WORD)) == value]
            default = [r for r in usable if str(r.params.get(name, DEFAULT_WORD)) == DEFAULT_WORD]

            def rest(r: TrialRecord) -> tuple:
                return tuple(sorted((k, str(v)) for k, v in r.params.items() if k != name))

            by_rest = {rest(r): r for r in default}
            pairs = [(f, by_rest[rest(f)]) for f in forced if rest(f) in by_rest]
            if pairs:
                forced_rec, default_rec = max(pairs, key=lambda p: len(p[0].objective.values))  # type: ignore[union-attr]
                basis = "matched"
            elif default:
                forced_rec = best_record(forced) or forced[0]
                default_rec = best_record(default) or default[0]
                basis = "unmatched"
            else:
                continue
            ratio = _ratio(forced_rec, default_rec)
            effects.append({
                "variable": name, "value": value, "basis": basis, "pairs": len(pairs),
                "forced_trial": forced_rec.number, "default_trial": default_rec.number,
                "ratio": ratio_dict(ratio),
                "text": f"{name}={value}: " + describe(ratio, "NCCL's default") + f" ({basis})",
            })
    return effects


class SweepReport(dict):
    """Plain-data verdict of a sweep (what ``summary.json`` holds)."""


def build_report(records: list[TrialRecord], *, nccl_variables: Iterable[str], metric: str, concurrency: int,
                 confirmed: TrialRecord | None = None, confirmation_lines: list[str] | None = None,
                 levels: Sequence[int] | None = None, best_why: str | None = None) -> SweepReport:
    """Best trial, improvements over both baselines, NCCL effects, per-status counts, time shares,
    and the best configuration at each load (``orchestrator.sweep.per_load``).

    ``confirmed``: the confirmation round's choice, which then is the best (its lines are added).
    ``levels``: the benchmark's concurrency levels (default: every level some trial measured).
    ``best_why``: why best.yaml holds the trial it holds, for its ``best.yaml: trial N ...`` line
    (default: "the confirmation's choice" with ``confirmed``, else "the search's best").
    """
    best = confirmed or best_record(records)
    plain, auto = baseline(records, "baseline_plain"), baseline(records, "baseline_auto")
    over_auto = _ratio(best, auto) if best is not None and auto is not None and best is not auto else None
    over_plain = _ratio(best, plain) if best is not None and plain is not None and best is not plain else None
    counts: dict[str, int] = {}
    for r in records:
        counts[r.status] = counts.get(r.status, 0) + 1
    bench = sum(r.timings_s.get("bench", 0.0) for r in records)
    total = sum(r.timings_s.get("total", 0.0) for r in records)
    lines = []
    searched = best_record(records)
    if searched is None:
        lines.append("no trial measured every repetition successfully: there is no best configuration")
    else:
        estimate = ESTIMATE
        lines.append(f"search's best: trial {searched.number} {searched.label}: {metric} {searched.value:.4g} at "
                     f"concurrency {concurrency}")
        if searched is not auto and auto is not None:
            lines.append("  " + describe(_ratio(searched, auto), "SGLang's default") + f" ({estimate})")
        if searched is not plain and plain is not None:
            lines.append("  " + describe(_ratio(searched, plain), "no speculation") + f" ({estimate})")
    lines += list(confirmation_lines or [])
    if best is not None:
        why = best_why or ("the confirmation's choice" if confirmed is not None else "the search's best")
        lines.append(f"best.yaml: trial {best.number} {best.label} ({why})")
    effects = _nccl_effects(records, nccl_variables)
    lines += [f"  {e['text']}" for e in effects]
    per_level = by_concurrency(records, levels=levels)
    cross = crossover(per_level)
    return SweepReport(
        best_trial=best.number if best else None,
        best_label=best.label if best else None,
        best_value=best.value if best else None,
        best_config=best.engine_config if best else None,
        metric=metric,
        concurrency=concurrency,
        over_sglang_default=ratio_dict(over_auto),
        over_no_speculation=ratio_dict(over_plain),
        nccl_effects=effects,
        counts=counts,
        trials=len(records),
        time_benchmarking_s=round(bench, 1),
        time_total_s=round(total, 1),
        share_outside_benchmark=round(1 - bench / total, 3) if total else None,
        lines=lines,
        by_concurrency=per_level,
        crossover=cross,
        per_load_lines=per_load_lines(per_level, metric=metric, cross=cross),
    )


BEST_MARK = "<- best.yaml"
"""The table's mark on the trial whose configuration best.yaml holds (the confirmation's choice when
it ran, which need not be the table's top row: the table ranks the search's estimates)."""


def summary_table(records: list[TrialRecord], *, metric: str, concurrency: int, best_trial: int | None) -> Table:
    """Trials sorted by the objective (best first; failed ones last, with their reason), the trial
    ``best_trial`` marked :data:`BEST_MARK`. ``best_trial`` is the report's (``build_report``: what
    best.yaml holds), passed, never recomputed here, so the mark cannot stand on another trial than
    best.yaml; None (no valid best configuration) marks nothing."""
    measured = [r for r in records if r.value is not None]
    direction = measured[0].objective.direction if measured and measured[0].objective else "max"
    ordered = sorted(measured, key=lambda r: r.value if direction == "min" else -r.value)  # type: ignore[operator]
    ordered += [r for r in records if r.value is None]
    best = next((r for r in records if r.number == best_trial), None) if best_trial is not None else None
    table = Table(title=f"{metric} at concurrency {concurrency} (median of repetitions; 95% interval on the log "
                        "scale, from 3 repetitions on)", box=None)
    kernels = any(r.all_reduce_kernel not in (None, "none") for r in records)  # only where TP all-reduces
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
        status = r.status + (f" ({r.reason})" if r.reason else "") + (f"  {BEST_MARK}" if best is r else "")
        cells = [str(r.number), r.label, f"{r.value:.4g}" if r.value is not None else "-", interval,
                 f"{r.repetitions_done}/{r.repetitions_planned}"]
        cells += [r.all_reduce_kernel or "-"] if kernels else []
        table.add_row(*cells, status)
    return table
