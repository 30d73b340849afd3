"""``spectune sweep --smoke SPEC``: the night's first minutes before bed.

A smoke run starts the night's two baselines (no speculation, SGLang's own choice) exactly as the
night would, each through every check a trial makes (env audit, engine contract, NCCL's proof, the
probe's baseline) and one repetition at the objective's level; then it says what passed, where each
start spent its time, and the night planned with the start time it measured. ``--resume`` of its
results directory continues into the night: the night's searcher proposes the same two baselines
first, and the writer hands back their smoke records instead of starting them again
(``SweepCoordinator.start_trial`` with ``adopt_ended``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orchestrator.bench.files import write_atomic
from orchestrator.spec import SweepSpec
from orchestrator.sweep.output.cost import format_duration
from orchestrator.sweep.records.results import TrialRecord

__all__ = ["SMOKE_FILE", "SMOKE_TRIALS", "smoke_lines", "smoke_passed", "smoke_resumable", "smoke_spec",
           "write_smoke_state"]

SMOKE_FILE = "smoke.json"
"""In a smoke run's results directory: ``{"state": "done" | "continued", ...}``."""

SMOKE_TRIALS = 2
"""The night's two baselines: no speculation, SGLang's own choice."""


def smoke_spec(spec: SweepSpec) -> SweepSpec:
    """``spec`` cut to the smoke run: the first two trials (the baselines), one repetition at the
    objective's level, no early stopping, no confirmation; every engine setting as the night's."""
    data = spec.model_dump(mode="json", exclude_unset=False)
    data["budget"].update(num_trials=SMOKE_TRIALS, max_concurrent_trials=min(spec.budget.max_concurrent_trials,
                                                                             SMOKE_TRIALS), time_limit_s=None)
    data["benchmark"].update(concurrency=[spec.objective_concurrency], repetitions=1)
    data["search"]["early_stopping"]["enabled"] = False
    data["confirmation"]["enabled"] = False
    return SweepSpec.model_validate(data)


def write_smoke_state(out: Path, state: str, **facts: Any) -> None:
    """Record the smoke run's state in ``out`` (``done``: ``--resume`` continues into the night;
    ``continued``: it did, and a later ``--resume`` restores the night as any other)."""
    write_atomic(out / SMOKE_FILE, json.dumps({"state": state, **facts}, indent=2) + "\n")


def smoke_resumable(out: Path) -> bool:
    """Whether ``out`` holds a finished smoke run the night has not continued yet."""
    path = out / SMOKE_FILE
    if not path.exists():
        return False
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("state") == "done"
    except ValueError:
        return False


def smoke_passed(records: list[TrialRecord]) -> bool:
    """Whether both baselines ran and passed (the smoke run's exit 0; ``--resume`` goes on from it)."""
    return len(records) == SMOKE_TRIALS and all(r.status == "ok" for r in records)


def smoke_lines(records: list[TrialRecord], *, out: Path) -> list[str]:
    """What the smoke run showed, trial by trial, and what to do next."""
    lines = []
    for r in records:
        checks = [f"env audit {'passed' if r.audit_ok else 'FAILED' if r.audit_ok is False else 'not reached'}"]
        if r.nccl_log:
            checks.append(f"NCCL's log {r.nccl_log}")
        if r.blind_readers:
            checks.append(f"blind readers: {'; '.join(r.blind_readers)}")
        value = f", {r.objective.metric} {r.objective.median:.4g} at concurrency {r.objective.concurrency} (one " \
                "repetition)" if r.objective is not None and r.objective.values else ""
        start = r.timings_s.engine_start
        phases = ", ".join(f"{k} {format_duration(v)}" for k, v in r.start_phases_s.items())
        timing = (f"; engine start {format_duration(start)}" + (f" ({phases})" if phases else "")
                  if start is not None else "")
        total = r.timings_s.total
        status = "passed" if r.status == "ok" else f"{r.status.upper()} ({r.reason}: {r.message[:300]})"
        lines.append(f"smoke: trial {r.number} {r.label}: {status}; {', '.join(checks)}{value}{timing}; "
                     f"trial time {format_duration(total)}")
    if smoke_passed(records):
        lines.append(f"smoke: both baselines passed; start the night from here (they are not run again): "
                     f"spectune sweep --resume {out}")
    else:
        lines.append("smoke: not every baseline passed; fix what the lines above name before the night "
                     f"(their engine logs are in the trials' MLflow runs), then run the smoke again")
    return lines
