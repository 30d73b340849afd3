"""What a sweep leaves behind: one record per trial and the best configuration.

``trials.jsonl`` holds one :class:`TrialRecord` per line, flushed line by line (a torn last line
is skipped on reading); ``best.yaml`` and the JSON files are written atomically
(``orchestrator.bench.files.write_atomic``).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Iterable, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from orchestrator.bench.files import write_atomic
from orchestrator.bench.probe_rule import NearTieFlip
from orchestrator.space.plan import configuration_key
from orchestrator.sweep.records.timings import TrialTimings
from serving.serve.provenance import Provenance, ProvenanceObjective
from serving.speculative_rules import FIELD_NAMES, speculative_problem

__all__ = [
    "BASELINE_FILE",
    "CONFIRMATION_FILE",
    "STATE_FILE",
    "TRIALS_FILE",
    "FAILURE_REASONS",
    "OBJECTIVE_KEY",
    "OBJECTIVE_REPETITION_KEY",
    "TrialKind",
    "TrialRecord",
    "TrialStatus",
    "append_record",
    "auto_label",
    "best_record",
    "best_yaml_text",
    "read_records",
    "served_engine_config",
    "traffic_line",
    "trial_provenance",
    "write_best_yaml",
]

logger = logging.getLogger(__name__)

TRIALS_FILE = "trials.jsonl"
CONFIRMATION_FILE = "confirmation.jsonl"
STATE_FILE = "sweep-state.json"
BASELINE_FILE = "probe-baseline.json"
"""The files of a results directory the sweep's writer keeps: records, visits, its state, the probe baseline."""

OBJECTIVE_KEY = "objective"
"""The metric name every trial reports to Ray Tune, ASHA and Optuna (here so a worker needs no Optuna)."""

OBJECTIVE_REPETITION_KEY = "objective_repetition"
"""In a report at the objective's level: the repetition's 1-based number (ASHA's time, Optuna's step)."""

TrialStatus = Literal["running", "ok", "failed", "infeasible", "early_stopped", "interrupted"]
"""``running``: the record of a trial that has not ended (in Tune's results, never in trials.jsonl)."""
TrialKind = Literal["baseline_plain", "baseline_auto", "search"]

FAILURE_REASONS: dict[str, str] = {
    "launch_failed": "the engine exited before it became healthy",
    "not_healthy": "the engine did not become healthy in time",
    "env_audit": "a process of the engine lacks one of the trial's variables (or has another value)",
    "engine_contract": "the engine does not answer as the harness expects (a field, endpoint or log line of "
                       "SGLang 0.5.23 missing or mistyped); the sweep stops",
    "nccl_log": "with NCCL_DEBUG=INFO, a rank's NCCL reported another value (or none) for a trial's NCCL variable",
    "probe_mismatch": "greedy outputs differ from the no-speculation baseline",
    "probe_failed": "the correctness probe's requests failed, so there was nothing to compare",
    "no_baseline": "the correctness baseline could not be written (the no-speculation trial failed)",
    "engine_died": "the engine died while it was being measured",
    "bench_failed": "the benchmark could not complete (see the message)",
    "timeout": "the trial ran past its time limit (budget.trial_timeout_s, or the one derived from measured trials)",
    "slo_violated": "a latency limit of objective.slo was exceeded (infeasible, not failed)",
    "stop_failed": "a process or the port of the engine survived teardown",
    "early_stopped": "ASHA stopped the trial after a repetition (not all repetitions ran)",
    "interrupted": "the sweep was killed while the trial ran",
    "error": "an unexpected error in spectune (a bug: see the message and the job log)",
}
"""Every reason tag a trial can end with, and what it means (shown in the summary and MLflow)."""


class Objective(BaseModel):
    """The objective of one trial: its per-repetition values at the objective's concurrency."""

    model_config = ConfigDict(extra="forbid")

    metric: str
    concurrency: int
    direction: Literal["max", "min"]
    values: list[float] = Field(default_factory=list, description="One value per repetition, in order.")
    median: float | None = None
    ci95_low: float | None = Field(default=None, description="95% interval of the values' geometric mean (log scale; none from < 3 values).")
    ci95_high: float | None = None


class TrialRecord(BaseModel):
    """One trial: the one record of it. The trial builds it as it runs and reports it with every
    ``tune.report`` (status ``running`` until its end); the sweep's writer keeps the last one it
    was told, writes MLflow from it and, at the end, one line of ``trials.jsonl``."""

    model_config = ConfigDict(extra="forbid")

    trial_id: str = Field(description="Ray Tune's trial id.")
    number: int = Field(description="1-based order in which the sweep started the trial.")
    kind: TrialKind = Field(description="A baseline, or a point proposed by the searcher.")
    label: str = Field(description="Short human label of the configuration.")
    params: dict[str, Any] = Field(description="The configuration in the sweep's names (NCCL variables by name).")
    status: TrialStatus
    reason: str | None = Field(default=None, description="One of FAILURE_REASONS when status is not ok.")
    message: str = Field(default="", description="What happened, in words (the error, the audit or probe verdict).")
    objective: Objective | None = None
    metrics: dict[str, float] = Field(default_factory=dict, description="c{concurrency}.{metric} medians.")
    level_values: dict[str, list[float]] = Field(
        default_factory=dict, description="The objective metric's per-repetition values at every measured "
        "concurrency level, keyed by the concurrency as a string (the objective's level included; empty in "
        "records written before per-load results).")
    level_cycle_ms: dict[str, list[float]] = Field(
        default_factory=dict, description="Each measured level's per-repetition cycle_ms (decode time per verify "
        "cycle), keyed by the concurrency as a string, in the order of ``level_values``; a level where a "
        "repetition lacks one is left out whole (the pairs would not line up). What the chain prediction pairs "
        "with the throughput. Empty without speculation and in records written before it.")
    accept_histograms: dict[str, list[int]] = Field(
        default_factory=dict, description="Each measured level's accepted-draft histogram, keyed by the concurrency "
        "as a string: [k] = verify cycles that accepted k drafts (bonus excluded), summed over the level's "
        "requests' meta_info.spec_correct_drafts_histogram (SGLang 0.5.23); what a chain's histogram predicts "
        "shorter chains from. Empty without speculation.")
    slo_violation: float | None = Field(
        default=None, description="max(observed / limit - 1) over the SLO limits; > 0 means infeasible."
    )
    repetitions_done: int = 0
    repetitions_planned: int = Field(default=0, description="The benchmark's cap on repetitions at the objective level.")
    measured_in_full: bool = Field(
        default=False, description="The objective level's benchmark ran to its end (not stopped early, not cut off)."
    )
    timings_s: TrialTimings = Field(default_factory=TrialTimings, description="Seconds per phase (engine_start, "
                                    "contract, probe, bench, teardown, other) and their derived total "
                                    "(orchestrator.sweep.records.timings).")
    start_phases_s: dict[str, float] = Field(
        default_factory=dict, description="What the engine's start spent its time on, from its own log "
        "(serving.engine.start_phases): weights, cuda_graphs (the slowest rank's) and other (the rest of "
        "engine_start); empty where the log has no such lines.")
    time_limits_s: dict[str, float] = Field(
        default_factory=dict, description="The limits the trial ran under: engine_start (to healthy) and trial (launch "
        "to end); the budget's until a trial ended ok, then derived from measured starts and runs "
        "(orchestrator.sweep.execution.time_limits).")
    node_id: str | None = None
    node_ip: str | None = None
    cuda_visible_devices: str | None = None
    engine_nodes: list[dict[str, Any]] = Field(
        default_factory=list, description="Every node the engine ran on, by node rank: node_rank, node_id, node_ip, "
        "pid, cuda_visible_devices (node_id / node_ip above are node rank 0's); empty before the engine started.")
    audit_ok: bool | None = None
    blind_readers: list[str] = Field(
        default_factory=list, description="What the engine's first answers lacked that only a blind reader uses "
        "(serving.engine.contract ContractCheck.blind: an accept-length cross-check, the all-reduce observation, "
        "the probe's near-tie rule, chain prediction, NCCL's proof): the trial ran without it; the summary flags "
        "the night.")
    engine_config: dict[str, Any] = Field(default_factory=dict, description="EngineConfig.model_dump() of the trial.")
    resolved_params: dict[str, int] | None = Field(
        default=None, description="The speculative numbers the running engine reported in /server_info "
        "({num_steps, eagle_topk, num_draft_tokens}): SGLang's automatic choice resolved, or a count it adjusted.")
    all_reduce_kernel: str | None = Field(
        default=None, description="The kernel the running engine's decode all-reduce was on, read from its "
        "/server_info and log (serving.engine.all_reduce_observed): flashinfer_fusion, custom_all_reduce, nccl, "
        "none (TP 1), mixed or unknown; None in records written before it was read.")
    probe_flips: list[NearTieFlip] = Field(
        default_factory=list, description="Divergences from the no-speculation baseline the probe passed as GPU "
        "numerics (near-tie flips: prompt, position, tokens, gap); empty for an exact match.")
    nccl_log: str | None = Field(
        default=None, description="The per-rank NCCL_DEBUG=INFO check (serving.engine.nccl_log): ok, mismatch, "
        "not_applicable; None before the probe.")
    engine_command: str = Field(default="", description="The engine's command line (secrets redacted).")
    start_flags: dict[str, Any] = Field(
        default_factory=dict, description="Engine flags the sweep added to this trial's engine to start it sooner "
        "(orchestrator.sweep.execution.start_flags: skip_server_warmup, the decode CUDA-graph sizes the benchmark reaches); in "
        "engine_command, never in engine_config (best.yaml and spectune serve start without them).")
    mlflow_run_id: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    traffic: dict[str, Any] | None = Field(
        default=None, description="What the trial benchmarked: the sweep's TrafficFingerprint "
        "(orchestrator.bench.traffic: dataset file and hash, requests, API, chat template kwargs, sampling).")

    def ended(self, *, status: TrialStatus, reason: str | None, message: str, ended_at: str) -> "TrialRecord":
        """This record at the trial's end: what it had measured so far, with its outcome."""
        return self.model_copy(update={
            "status": status, "reason": reason, "message": message, "ended_at": ended_at,
            "repetitions_done": len(self.objective.values) if self.objective is not None else 0,
        })

    @property
    def complete(self) -> bool:
        """Measured in full: ok or infeasible, the objective level's benchmark run to its end."""
        return self.status in ("ok", "infeasible") and self.measured_in_full and self.objective is not None and bool(
            self.objective.values
        )

    def values_at(self, concurrency: int) -> list[float]:
        """The objective metric's per-repetition values at ``concurrency`` (empty where not measured),
        from ``level_values``, else the objective's own."""
        values = self.level_values.get(str(concurrency))
        if values:
            return list(values)
        if self.objective is not None and self.objective.concurrency == concurrency:
            return list(self.objective.values)
        return []

    @property
    def value(self) -> float | None:
        """The objective's median, if measured."""
        return self.objective.median if self.objective else None

    def ran_as(self) -> str:
        """The configuration *as it ran* (``orchestrator.space.configuration_key``, the identity
        ``candidate_key`` gives a plan): the resolved speculative numbers, the all-reduce kernel
        instead of the arm, so two names for the same engine are one configuration."""
        params = dict(self.params)
        if self.resolved_params and params.get("speculative") != "off":
            params.update(self.resolved_params, speculative="explicit")
        if self.all_reduce_kernel not in (None, "unknown", "mixed"):
            params["all_reduce"] = f"kernel:{self.all_reduce_kernel}"
        nccl_env = {name: str(value) for name, value in self.params.items()
                    if name.startswith("NCCL_") and value not in (None, "default")}
        return configuration_key(params, nccl_env)


def auto_label(label: str, resolved: dict[str, int] | None) -> str:
    """The auto baseline's ``label`` with what SGLang's choice resolved to:
    ``SGLang auto`` -> ``SGLang auto (= steps 3 topk 1 draft 4)`` (the rest of the label kept)."""
    if not resolved:
        return label
    return label.replace("SGLang auto", f"SGLang auto (= steps {resolved['num_steps']} topk "
                         f"{resolved['eagle_topk']} draft {resolved['num_draft_tokens']})", 1)


def append_record(path: Path, record: TrialRecord) -> None:
    """Append one record as one line, flushed to disk before returning."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(record.model_dump_json() + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def read_records(path: Path) -> list[TrialRecord]:
    """Every record of ``trials.jsonl``; the last record of a trial id wins (a resumed sweep may
    re-record an interrupted trial). A torn line (a kill mid-write) is skipped with a warning."""
    if not path.exists():
        return []
    by_id: dict[str, TrialRecord] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = TrialRecord.model_validate_json(line)
        except ValueError:
            logger.warning("%s line %d is not a complete trial record (torn write?); skipped", path, number)
            continue
        by_id[record.trial_id] = record
    return sorted(by_id.values(), key=lambda r: r.number)


def _better(direction: str, a: float, b: float) -> bool:
    return a > b if direction == "max" else a < b


def best_record(records: Iterable[TrialRecord]) -> TrialRecord | None:
    """The best *complete, feasible* trial (status ok, every repetition measured), or None."""
    best: TrialRecord | None = None
    for record in records:
        if record.status != "ok" or not record.complete or record.value is None:
            continue
        assert record.objective is not None
        if best is None or _better(record.objective.direction, record.value, best.value):  # type: ignore[arg-type]
            best = record
    return best


def _numbers_text(numbers: dict[str, Any]) -> str:
    return f"steps {numbers['num_steps']} topk {numbers['eagle_topk']} draft {numbers['num_draft_tokens']}"


def served_engine_config(record: TrialRecord) -> tuple[dict[str, Any], str | None]:
    """The engine configuration best.yaml holds for ``record``, and a line saying where its
    speculative numbers come from (None where they are the trial's own, or it has none).

    Where the trial left the numbers to SGLang's automatic choice, best.yaml holds what the engine
    resolved them to (``resolved_params``), so ``spectune serve`` starts the engine that was
    measured; SGLang's choice stays null where the engine reported none, or where the resolved
    numbers break a rule EngineConfig checks (``serving.speculative_rules``: it would refuse them).
    """
    config = dict(record.engine_config)
    fields = {key: FIELD_NAMES[key] for key in ("num_steps", "eagle_topk", "num_draft_tokens")}
    if config.get("speculative_algorithm") is None or any(config.get(name) is not None for name in fields.values()):
        return config, None
    resolved = record.resolved_params or {}
    if any(resolved.get(key) is None for key in fields):
        return config, ("speculative numbers: SGLang's automatic choice, left to SGLang at start (the engine did not "
                        "report what it resolved them to)")
    numbers = {key: resolved[key] for key in fields}
    problem = speculative_problem(**numbers, names=FIELD_NAMES)
    if problem:
        return config, (f"speculative numbers: SGLang's automatic choice, left to SGLang at start: the engine resolved "
                        f"them to {_numbers_text(numbers)}, which EngineConfig refuses ({problem})")
    config.update({name: numbers[key] for key, name in fields.items()})
    return config, (f"speculative numbers: SGLang's automatic choice, resolved by the engine to "
                    f"{_numbers_text(numbers)} (best.yaml sets them, so serving starts the engine that was measured)")


def best_yaml_text(*, engine_config: dict[str, Any], header_lines: list[str],
                   provenance: Provenance | None = None) -> str:
    """``best.yaml``'s text: an EngineConfig (what ``spectune serve`` loads) under comment lines with the
    figures, then a ``provenance:`` block, which the serve loader takes off (``serving.serve.options``)."""
    comments = "".join(f"# {line}\n" for line in header_lines)
    body = yaml.safe_dump(engine_config, sort_keys=False)
    if provenance is not None:
        body += ("# where this configuration came from (GET /spectune/info answers with it; never passed to the engine)\n"
                 + yaml.safe_dump({"provenance": provenance.model_dump(mode="json")}, sort_keys=False))
    return comments + body


def write_best_yaml(path: Path, *, engine_config: dict[str, Any], header_lines: list[str],
                    provenance: Provenance | None = None) -> Path:
    """``best.yaml`` (:func:`best_yaml_text`), written atomically."""
    return write_atomic(path, best_yaml_text(engine_config=engine_config, header_lines=header_lines,
                                             provenance=provenance))


def trial_provenance(record: TrialRecord, *, sweep: str, parent_run_id: str | None, tracking_uri: str | None,
                     experiment: str | None, verdict: str | None, written_at: str) -> Provenance:
    """The provenance block of ``best.yaml`` for the trial whose configuration it holds."""
    objective = record.objective
    return Provenance(
        sweep=sweep, trial=record.number, trial_label=record.label, mlflow_run_id=record.mlflow_run_id,
        parent_run_id=parent_run_id, tracking_uri=tracking_uri, experiment=experiment,
        objective=ProvenanceObjective(
            metric=objective.metric, concurrency=objective.concurrency, median=objective.median,
            ci95_low=objective.ci95_low, ci95_high=objective.ci95_high, repetitions=len(objective.values),
        ) if objective is not None else None,
        verdict=verdict, written_at=written_at, traffic=traffic_line(record.traffic),
    )


def traffic_line(traffic: dict[str, Any] | None) -> str | None:
    """A record's traffic fingerprint in one line (None without one)."""
    if not traffic:
        return None
    from orchestrator.bench.traffic import TrafficFingerprint

    return TrafficFingerprint.model_validate(traffic).short()


def write_json_file(path: Path, data: Any) -> Path:
    """Indented JSON, written atomically."""
    return write_atomic(path, json.dumps(data, indent=2, default=str) + "\n")
