"""The end of a sweep: every trial recorded, then the verdict written where people look for it.

:func:`finish_sweep` writes the summary (job log, ``summary.txt``, ``summary.json``), ``best.yaml``
/ ``best.json`` (with a valid best only), SGLang's adaptive schedule and the plots, logs them to the
parent MLflow run, tags best.yaml's trial's own run (:data:`TAG_BEST_YAML`) and ends the sweep's runs;
the outcome's exit code says whether a valid best came out.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from orchestrator.mlflow_schema import (
    TAG_BEST_LABEL,
    TAG_BLIND_READERS,
    TAG_STOPPED,
    TAG_BEST_TRIAL,
    TAG_VERDICT,
    TAG_VERDICT_RATIO,
    tag_value,
)
from orchestrator.exit_codes import EXIT_FAILED, EXIT_OK
from orchestrator.spec import SweepSpec
from orchestrator.sweep.output.adaptive_schedule import (
    SCHEDULE_FILE,
    launch_advice,
    launch_line,
    schedule_lines,
    schedule_summary,
    write_adaptive_schedule,
)
from orchestrator.sweep.confirmation.confirm import Confirmation, margin_clause
from orchestrator.sweep.records.results import CONFIRMATION_FILE, TRIALS_FILE
from orchestrator.sweep.output.figures import sweep_figures
from orchestrator.sweep.output.morning import default_engine_config, engine_command, retire_morning_files
from orchestrator.sweep.output.predicted_rows import PREDICTIONS_FILE, predict_rows, prediction_lines
from orchestrator.sweep.output.summary_report import (
    SweepReport, build_report, measurement_lines, node_measurements, summary_table,
)
from orchestrator.bench.files import write_atomic
from orchestrator.sweep.records.results import (
    TrialRecord,
    best_record,
    served_engine_config,
    traffic_line,
    trial_provenance,
    write_best_yaml,
    write_json_file,
)
from orchestrator.timestamps import utc_timestamp
from serving.serve.provenance import Provenance

__all__ = ["EXIT_NO_BEST", "EXIT_OK", "FALLBACK", "SweepOutcome", "TAG_BEST_YAML", "best_yaml_choice",
           "best_yaml_header", "best_yaml_run_tags", "confirmation_why", "final_records", "finish_sweep",
           "summary_report", "summary_text", "sweep_tags", "verdict_summary"]

EXIT_NO_BEST = EXIT_FAILED  # the sweep ran, but no trial gave a valid best configuration


@dataclass(frozen=True)
class SweepOutcome:
    """What a sweep produced."""

    exit_code: int
    results_dir: Path
    best_yaml: Path | None
    summary: dict[str, Any]


def verdict_summary(confirmation: Confirmation | None) -> dict[str, Any] | None:
    """``summary.json``'s ``verdict``: each comparison as ``{"kind", "ratio", "ci95_low", "ci95_high",
    "visits", ...}`` (None where it was not made)."""
    if confirmation is None:
        return None
    return {"vs_sglang_default": confirmation.vs_sglang_default, "vs_no_speculation": confirmation.vs_no_speculation,
            "chosen_trial": confirmation.chosen, "rounds": confirmation.rounds,
            "visits": len(confirmation.visits), "wall_s": round(confirmation.wall_s, 1)}


TAG_BEST_YAML = "spectune.best_yaml"
"""On each trial's run at the sweep's end: ``true`` on best.yaml's trial, ``false`` on the others
(so a resumed sweep's new choice moves it): ``tags.`spectune.best_yaml` = 'true'`` finds the winner."""


def best_yaml_run_tags(records: list[TrialRecord], best_trial: int | None) -> dict[str, dict[str, str]]:
    """:data:`TAG_BEST_YAML` for every trial's MLflow run, by run id (``log_sweep``'s ``run_tags``);
    none is ``true`` where no best.yaml is written (``best_trial`` None)."""
    return {r.mlflow_run_id: {TAG_BEST_YAML: "true" if r.number == best_trial else "false"}
            for r in records if r.mlflow_run_id}


def blind_lines(records: list[TrialRecord]) -> tuple[dict[str, list[str]], list[str]]:
    """What engines did not answer that only a blind reader uses (``TrialRecord.blind_readers``): by
    trial number, and the summary's warning lines (one per distinct item, naming its trials)."""
    by_trial = {str(r.number): list(r.blind_readers) for r in records if r.blind_readers}
    trials_of: dict[str, list[int]] = {}
    for r in records:
        for item in r.blind_readers:
            trials_of.setdefault(item, []).append(r.number)
    lines = [f"warning: blind reader: {item} (trial{'s' if len(numbers) > 1 else ''} "
             f"{', '.join(map(str, numbers))}); the night went on without what it reads"
             for item, numbers in trials_of.items()]
    return by_trial, lines


def sweep_tags(report: dict[str, Any]) -> dict[str, Any]:
    """The parent run's outcome tags: best.yaml's trial (``spectune.best_trial``; its own run carries
    :data:`TAG_BEST_YAML`), and the verdict against SGLang's default (``spectune.verdict``,
    ``spectune.verdict_ratio``). Tags, not params: a resumed sweep may change them."""
    tags: dict[str, Any] = {TAG_BEST_TRIAL: report["best_trial"], TAG_BEST_LABEL: report["best_label"]}
    verdict = (report.get("verdict") or {}).get("vs_sglang_default") or {}
    if verdict.get("kind"):
        tags[TAG_VERDICT] = verdict["kind"]
    if verdict.get("ratio") is not None:
        tags[TAG_VERDICT_RATIO] = f"{verdict['ratio']:.4g}"
    if report.get("blind_readers"):
        tags[TAG_BLIND_READERS] = tag_value("; ".join(sorted({i for items in report["blind_readers"].values()
                                                             for i in items})))
    if report.get("stopped"):
        tags[TAG_STOPPED] = tag_value(report["stopped"])
    return tags


FALLBACK = "a fallback, not a choice"
"""How a why begins where best.yaml keeps SGLang's default because the confirmation could not decide."""


def confirmation_why(confirmation: Confirmation) -> str:
    """Why best.yaml holds the confirmation's ``chosen``, in words: its choice (the leader was better;
    equivalent or worse, so SGLang's default; no speculation was faster), or :data:`FALLBACK` where
    it kept SGLang's default because it could not decide (undecided, or nothing to decide between)."""
    default, plain = confirmation.role("default"), confirmation.role("no_speculation")
    against_default = confirmation.vs_sglang_default or {}
    kind, visits = against_default.get("kind"), against_default.get("visits")
    chosen, leader = confirmation.chosen, confirmation.leader
    if plain is not None and chosen == plain.number and (confirmation.vs_no_speculation or {}).get("kind") == "worse":
        return ("the confirmation's choice: no speculation was faster than the speculative configuration it "
                "would otherwise have kept")
    if default is not None and chosen == default.number:
        if kind == "equivalent":
            return f"the confirmation's choice: trial {leader} was equivalent to SGLang's default, the simpler one"
        if kind == "worse":
            return f"the confirmation's choice: trial {leader} was worse than SGLang's default"
        if kind == "undecided":
            after = f" after {visits} visits each" if visits else ""
            return (f"{FALLBACK}: the confirmation could not decide between trial {leader} and SGLang's default"
                    f"{after}, so best.yaml keeps SGLang's default")
        if leader is None and confirmation.searched:
            return f"{FALLBACK}: no visit of the search's contenders counted, so best.yaml keeps SGLang's default"
        if leader is None:
            return f"{FALLBACK}: no search trial completed apart from SGLang's default"
    if kind == "better" and chosen == leader:  # better: the interval above 1; the margin said apart
        text = f", {against_default['text']}" if against_default.get("text") else ""
        return (f"the confirmation's choice: better than SGLang's default{text}; "
                f"{margin_clause(against_default, confirmation.margin)}")
    return "the confirmation's choice"


def best_yaml_choice(spec: SweepSpec, records: list[TrialRecord], confirmation: Confirmation | None,
                     unconfirmed: str | None = None) -> tuple[TrialRecord | None, str]:
    """The trial whose configuration best.yaml holds, and why (:func:`confirmation_why`): the
    confirmation's ``chosen`` when it ran; where it was not asked for (``unconfirmed``: why, e.g.
    ``--finish`` without ``--max-minutes``), SGLang's default as measured, the search's best then an
    unconfirmed candidate; else the search's best. The report, best.yaml, the table's mark, the
    plots and the MLflow tags all take it from here."""
    if confirmation is not None:
        chosen = next((r for r in records if r.number == confirmation.chosen), None)
        return chosen, confirmation_why(confirmation)
    searched = best_record(records)
    default = default_engine_config(spec, records)[1] if unconfirmed is not None else None
    if default is not None:
        return default, f"{FALLBACK}: SGLang's default, kept without a verdict ({unconfirmed})"
    if unconfirmed is not None:
        return searched, f"the search's best: SGLang's default was never measured ({unconfirmed})"
    if not spec.confirmation.enabled:
        return searched, "the search's best; the confirmation was off: confirmation.enabled is false"
    return searched, ("the search's best; no confirmation could run: it needs SGLang's default and another "
                      "complete trial")


def summary_report(spec: SweepSpec, records: list[TrialRecord], confirmation: Confirmation | None,
                   stopped: str | None = None, unconfirmed: str | None = None) -> SweepReport:
    """``summary.json``'s content but the wall time: the figures in words (``report.build_report``),
    the adaptive schedule and launch advice, the confirmation and the verdict; ``stopped``: why the
    search stopped early (``night_stop``), its first line; ``unconfirmed``: why no confirmation was
    asked for (:func:`best_yaml_choice`)."""
    metric, level = spec.objective.metric, spec.objective_concurrency
    best, why = best_yaml_choice(spec, records, confirmation, unconfirmed=unconfirmed)
    kept_default = confirmation is None and unconfirmed is not None and best is not None
    figures = sweep_figures(records, objective_level=level, direction=spec.objective.direction,
                            levels=spec.benchmark.concurrency, nccl_variables=spec.search.nccl_variables(),
                            confirmed=best if confirmation is not None or kept_default else None)
    report = build_report(figures, metric=metric, best_why=why,
                          confirmation_lines=confirmation.lines if confirmation else None)
    schedule = schedule_summary(figures.levels)
    report["adaptive_schedule"] = schedule
    report["launch"] = launch_advice(schedule, best, objective_level=level,
                                     confirmed_why=why if confirmation is not None else None)
    if schedule is not None:
        report["per_load_lines"] += schedule_lines(schedule)
    report["per_load_lines"] += launch_line(report["launch"])
    report["confirmation"] = confirmation.to_dict() if confirmation else None
    report["verdict"] = verdict_summary(confirmation)
    traffic = next((r.traffic for r in records if r.traffic), None)
    if traffic:  # records from before traffic was fingerprinted have none: their summary stays as it was
        report["traffic"] = traffic
        report["lines"].append(f"tuned on: {traffic_line(traffic)}")
    blind, warnings = blind_lines(records)
    if blind:
        report["blind_readers"] = blind
        report["lines"] += warnings
    measured = node_measurements(records, confirmation.visits if confirmation else [])  # what the next plan reads
    if measured:
        report["measured"] = measured
        report["lines"] += measurement_lines(measured)
    if stopped:
        report["stopped"] = stopped
        report["lines"].insert(0, f"search stopped: {stopped}")
    candidate = best_record(records)
    if kept_default and candidate is not None and candidate is not best:
        config = served_engine_config(candidate)[0]
        report["candidate"] = {"trial": candidate.number, "label": candidate.label, "value": candidate.value,
                               "confirmed": False, "engine_config": config, "engine_command": engine_command(config)}
        report["lines"].append(f"unconfirmed candidate: trial {candidate.number} {candidate.label} (the search's "
                               f"best, {metric} {candidate.value:.4g}); its engine command: "
                               f"{report['candidate']['engine_command']}")
    return report


def summary_text(records: list[TrialRecord], report: dict[str, Any], *, metric: str, concurrency: int) -> str:
    """``summary.txt``: the table (best.yaml's trial marked) and the report's lines."""
    text_console = Console(record=True, width=140, file=open(os.devnull, "w"))
    text_console.print(summary_table(records, metric=metric, concurrency=concurrency, best_trial=report["best_trial"]))
    return text_console.export_text() + "\n".join(report["lines"] + report["per_load_lines"]) + "\n"


def best_yaml_header(spec: SweepSpec, report: dict[str, Any], *, path: Path) -> list[str]:
    """best.yaml's comment lines: what it is, the report's lines (its trial and why, a fallback said
    as one; where its speculative numbers come from) and how to serve it."""
    title = (f"spectune sweep {spec.name}: the configuration to serve ({spec.objective.metric} at concurrency "
             f"{spec.objective_concurrency})")
    return [title] + [line.strip() for line in report["lines"]] + [f"serve it: spectune serve {path}"]


def final_records(coordinator: Any) -> list[TrialRecord]:
    """Every trial's record once the search is over; a trial that had not recorded an end is
    recorded as interrupted first (``--resume`` runs it again)."""
    import ray

    for trial_id in ray.get(coordinator.open_trials.remote()):
        ray.get(coordinator.end_running.remote(
            trial_id=trial_id, status="interrupted", reason="interrupted",
            message="the trial had not recorded an end when the sweep finished",
        ))
    return [TrialRecord.model_validate(r) for r in ray.get(coordinator.records.remote())]


def _best_provenance(spec: SweepSpec, records: list[TrialRecord], report: dict[str, Any],
                     confirmation: Confirmation | None, coordinator: Any) -> Provenance | None:
    """best.yaml's provenance: the trial whose configuration it holds, its run and the sweep's."""
    import ray

    record = next((r for r in records if r.number == report["best_trial"]), None)
    if record is None:
        return None
    info = ray.get(coordinator.info.remote())
    verdict = (confirmation.vs_sglang_default or {}).get("kind") if confirmation is not None else None
    return trial_provenance(record, sweep=spec.name, parent_run_id=info["parent_run_id"],
                            tracking_uri=info["tracking_uri"], experiment=spec.experiment_name, verdict=verdict,
                            written_at=utc_timestamp())


def finish_sweep(spec: SweepSpec, *, records: list[TrialRecord], confirmation: Confirmation | None, out: Path,
                 coordinator: Any, console: Console, started: float, stopped: str | None = None,
                 unconfirmed: str | None = None) -> SweepOutcome:
    """The verdict: summary table, best.yaml, summary.json, plots, parent-run figures; the sweep's
    MLflow runs end here (FINISHED with a best configuration, FAILED without or when ``stopped``:
    the search ended early for that reason, and the exit code says so). The interim morning files
    (``output.morning``) stop first and are replaced by these; ``unconfirmed``: see
    :func:`best_yaml_choice`."""
    import ray

    from orchestrator.sweep.output.plots import draw_plots

    ray.get(coordinator.end_morning.remote())
    metric, level = spec.objective.metric, spec.objective_concurrency
    report = summary_report(spec, records, confirmation, stopped=stopped, unconfirmed=unconfirmed)
    schedule = report["adaptive_schedule"]
    wall_s = time.monotonic() - started
    report["wall_s"] = round(wall_s, 1)
    console.print(summary_table(records, metric=metric, concurrency=level, best_trial=report["best_trial"]))
    # rows of their own kind: never in trials.jsonl or the verdict; their intervals carry the start-to-start
    # spread the confirmation measured, once it has the degrees of freedom the economy acts on
    economy = confirmation.economy if confirmation is not None else None
    predictions = predict_rows(spec, records, start_rel=economy.settled_between_cv if economy is not None else None,
                               start_dof=float(economy.between_df) if economy is not None else float("inf"))
    report["predictions"] = predictions.to_dict()
    for line in report["lines"] + report["per_load_lines"] + prediction_lines(predictions, concurrency=level):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    files: list[Path] = []
    if predictions.rows:
        write_atomic(out / PREDICTIONS_FILE, "".join(json.dumps(r.to_dict()) + "\n" for r in predictions.rows))
        files.append(out / PREDICTIONS_FILE)
    best_path = None
    if report["best_config"] is not None:
        best_path = write_best_yaml(out / "best.yaml", engine_config=report["best_config"],
                                    header_lines=best_yaml_header(spec, report, path=out / "best.yaml"),
                                    provenance=_best_provenance(spec, records, report, confirmation, coordinator))
        write_json_file(out / "best.json", {k: report[k] for k in ("best_trial", "best_label", "best_value", "metric",
                                                                    "concurrency", "over_sglang_default",
                                                                    "over_no_speculation", "verdict", "best_config")})
        files += [out / "best.yaml", out / "best.json"]
    if schedule is not None:
        files.append(write_adaptive_schedule(out / SCHEDULE_FILE, schedule["config"]))
    write_json_file(out / "summary.json", dict(report))
    write_atomic(out / "summary.txt", summary_text(records, report, metric=metric, concurrency=level))
    retire_morning_files(out)  # the final files replaced the interim links; what is left of them goes
    files += [out / "summary.json", out / "summary.txt", out / TRIALS_FILE]
    if confirmation is not None:
        files.append(out / CONFIRMATION_FILE)
    plots = draw_plots(records, out_dir=out / "plots", metric=metric, concurrency=level,
                       best_trial=report["best_trial"])
    figures: dict[str, float] = {"trials": float(len(records)), "wall_s": wall_s}
    if report["best_value"] is not None:
        figures["best." + metric] = report["best_value"]
    for name, verdict in (report["verdict"] or {}).items():
        if isinstance(verdict, dict) and verdict.get("ratio") is not None:
            for key in ("ratio", "ci95_low", "ci95_high", "visits"):
                if verdict.get(key) is not None:
                    figures[f"verdict.{name}.{key}"] = float(verdict[key])
    for key in ("over_sglang_default", "over_no_speculation"):
        if report[key]:
            for end in ("ratio", "ci95_low", "ci95_high"):
                if report[key].get(end) is not None:
                    figures[f"search.{key}.{end}"] = report[key][end]
    ray.get(coordinator.log_sweep.remote(metrics=figures, tags=sweep_tags(report),
                                         files=[str(p) for p in files + plots],
                                         run_tags=best_yaml_run_tags(records, report["best_trial"])))
    ray.get(coordinator.end_sweep.remote(status="FINISHED" if best_path and not stopped else "FAILED"))
    console.print(f"results: {escape(str(out))}", highlight=False)
    console.print(f"MLflow UI: mlflow ui --backend-store-uri sqlite:///{escape(str(out / 'mlflow.db'))}  "
                  "(then open http://127.0.0.1:5000)", highlight=False)
    if best_path is None:
        console.print("no valid best configuration: every trial failed or was stopped early (see the table)",
                      highlight=False)
    return SweepOutcome(exit_code=EXIT_OK if best_path and not stopped else EXIT_NO_BEST, results_dir=out,
                        best_yaml=best_path,
                        summary=dict(report))
