"""Trial records, the best trial and the NCCL comparison: hand-computed values."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from orchestrator.sweep.output.figures import sweep_figures
from orchestrator.sweep.output.summary_report import build_report
from orchestrator.bench.files import write_atomic
from orchestrator.sweep.records.results import (
    Objective,
    TrialRecord,
    append_record,
    best_record,
    read_records,
)


def _record(number: int, values: list[float], *, status: str = "ok", kind: str = "search", reps: int | None = None,
            params: dict | None = None, direction: str = "max") -> TrialRecord:
    median = sorted(values)[len(values) // 2] if values else None
    return TrialRecord(
        trial_id=f"t{number}", number=number, kind=kind, label=f"config {number}", params=params or {},
        status=status, reason=None if status == "ok" else status,
        objective=Objective(metric="output_tok_per_s", concurrency=4, direction=direction, values=values,
                            median=median) if values else None,
        repetitions_done=len(values), repetitions_planned=reps if reps is not None else len(values),
        measured_in_full=status in ("ok", "infeasible") and (reps is None or reps == len(values)),
    )


def test_best_excludes_early_stopped_failed_and_incomplete_trials() -> None:
    records = [
        _record(1, [100.0, 100.0]),
        _record(2, [500.0], status="early_stopped", reps=2),   # faster, but stopped by ASHA
        _record(3, [400.0], reps=2),                            # ok but missing a repetition
        _record(4, [300.0, 300.0], status="infeasible"),        # SLO violated
        _record(5, [], status="failed"),
        _record(6, [150.0, 160.0]),
    ]
    assert best_record(records).number == 6


def test_best_follows_the_direction() -> None:
    records = [_record(1, [20.0, 20.0], direction="min"), _record(2, [10.0, 10.0], direction="min")]
    assert best_record(records).number == 2


def test_records_survive_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "trials.jsonl"
    append_record(path, _record(1, [1.0]))
    append_record(path, _record(2, [2.0]))
    with open(path, "a", encoding="utf-8") as handle:
        handle.write('{"trial_id": "t3", "numb')  # killed mid-write
    assert [r.number for r in read_records(path)] == [1, 2]


def test_a_re_recorded_trial_keeps_its_last_record(tmp_path: Path) -> None:
    path = tmp_path / "trials.jsonl"
    append_record(path, _record(1, [], status="interrupted"))
    append_record(path, _record(1, [5.0]))
    (only,) = read_records(path)
    assert only.status == "ok" and only.value == 5.0


def test_atomic_write_leaves_no_temp_file(tmp_path: Path) -> None:
    """Every results file goes through the one writer: replaced whole, no temp file left, and
    readable by all (0644), like the benchmark's own JSON."""
    target = tmp_path / "best.yaml"
    write_atomic(target, "a: 1\n")
    write_atomic(target, "a: 2\n")
    assert target.read_text() == "a: 2\n" and [p.name for p in tmp_path.iterdir()] == ["best.yaml"]
    assert (target.stat().st_mode & 0o777) == 0o644


def test_report_states_both_baselines_and_nccl_effects() -> None:
    base = {"speculative": "explicit", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4, "all_reduce": "default"}
    records = [
        _record(1, [50.0, 51.0, 49.0], kind="baseline_plain", params={**base, "speculative": "off", "NCCL_ALGO": "default"}),
        _record(2, [90.0, 91.0, 89.0], kind="baseline_auto", params={**base, "speculative": "auto", "NCCL_ALGO": "default"}),
        _record(3, [100.0, 101.0, 99.0], params={**base, "NCCL_ALGO": "default"}),
        _record(4, [80.0, 81.0, 79.0], params={**base, "NCCL_ALGO": "Ring"}),
        _record(5, [70.0], status="early_stopped", reps=3, params={**base, "num_steps": 5, "NCCL_ALGO": "Tree"}),
    ]
    figures = sweep_figures(records, objective_level=4, nccl_variables=["NCCL_ALGO"])
    report = build_report(figures, metric="output_tok_per_s")
    assert report["best_trial"] == 3
    assert report["over_sglang_default"]["ratio"] == pytest.approx(100 / 90, rel=1e-3)
    assert report["over_no_speculation"]["ratio"] == pytest.approx(2.0, rel=1e-2)
    (ring,) = [e for e in report["nccl_effects"] if e["value"] == "Ring"]
    assert ring["basis"] == "matched" and ring["forced_trial"] == 4 and ring["default_trial"] == 3
    assert ring["ratio"]["ratio"] == pytest.approx(0.8, rel=1e-2)
    assert not [e for e in report["nccl_effects"] if e["value"] == "Tree"], "an early-stopped trial is no evidence"
    assert any("over SGLang's default" in line for line in report["lines"])


def test_a_record_at_its_end_keeps_what_it_had_and_counts_its_repetitions() -> None:
    """One record type all the way: the running record a trial last reported becomes its record
    at the end with only the outcome added (what the writer does for a trial ASHA stopped)."""
    running = TrialRecord(trial_id="t1", number=3, kind="search", label="steps=3", params={"num_steps": 3},
                          status="running", node_id="n1", repetitions_planned=3,
                          objective={"metric": "output_tok_per_s", "concurrency": 4, "direction": "max",
                                     "values": [5.0, 6.0]})
    record = running.ended(status="early_stopped", reason="early_stopped", message="ASHA", ended_at="now")
    assert (record.number, record.node_id, record.repetitions_done, record.ended_at) == (3, "n1", 2, "now")
    assert (record.status, running.status) == ("early_stopped", "running")
    assert not record.complete

def test_a_plan_and_the_record_of_its_trial_are_one_configuration() -> None:
    """One identity: ``candidate_key`` (what a plan asks for) and ``TrialRecord.ran_as`` (what its
    trial ran) come from ``configuration_key``; they differ only where the engine resolved
    something (SGLang's auto numbers, the kernel an arm ran on)."""
    from orchestrator.space import Candidate, SpeculativeTriple, TrialPlan, candidate_key

    plan = TrialPlan("search", Candidate(SpeculativeTriple(3, 1, 4), "nccl", {"NCCL_ALGO": "Ring"}))
    params = {**plan.params(), "NCCL_ALGO": "Ring", "NCCL_PROTO": "default", "env.NCCL_DEBUG": "WARN"}
    record = TrialRecord(trial_id="t", number=1, kind="search", label=plan.label(), params=params, status="ok")
    assert record.ran_as() == candidate_key(plan)
    assert record.model_copy(update={"all_reduce_kernel": "nccl"}).ran_as() != candidate_key(plan)
    auto = TrialPlan("baseline_auto", Candidate(SpeculativeTriple(None, None, None)))
    resolved = TrialRecord(trial_id="a", number=2, kind="baseline_auto", label="SGLang auto", params=auto.params(),
                           status="ok", resolved_params={"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4})
    same = TrialPlan("search", Candidate(SpeculativeTriple(3, 1, 4)))
    assert resolved.ran_as() == candidate_key(same), "SGLang's auto choice ran as the explicit point it resolved to"
