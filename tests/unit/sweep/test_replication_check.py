"""``benchmarks/replication.py``: two runs' verdicts contradict each other only when both are
decided and rule each other out; undecided contradicts nothing."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def _load():
    spec = importlib.util.spec_from_file_location("replication", REPO / "benchmarks" / "replication.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


replication = _load()


def _summary(kind: str, label: str = "steps=5 topk=1 draft=6", ratio: float = 1.1) -> dict:
    return {"best_label": label, "verdict": {"vs_sglang_default": {
        "kind": kind, "ratio": ratio, "ci95_low": ratio - 0.05, "ci95_high": ratio + 0.05, "visits": 5,
        "margin": 0.01, "label": label, "against_label": "SGLang auto"}, "vs_no_speculation": None}}


def test_better_and_worse_for_the_same_pair_contradict() -> None:
    assert replication.compare(_summary("better"), _summary("worse", ratio=0.9))["contradiction"]
    assert replication.compare(_summary("better"), _summary("equivalent", ratio=1.0))["contradiction"]


def test_undecided_or_the_same_verdict_does_not_contradict() -> None:
    assert not replication.compare(_summary("better"), _summary("undecided", ratio=1.02))["contradiction"]
    assert not replication.compare(_summary("better"), _summary("better", ratio=1.08))["contradiction"]


def test_a_leader_of_one_run_is_checked_against_the_other_runs_visits() -> None:
    other = _summary("better", label="steps=2 topk=2 draft=4")
    other["confirmation"] = {"rounds": 3, "contenders": [
        {"role": "best", "trial": 4, "label": "steps=2 topk=2 draft=4"},
        {"role": "runner_up", "trial": 5, "label": "steps=5 topk=1 draft=6"},
        {"role": "default", "trial": 2, "label": "SGLang auto"}],
        "visits": [{"trial": t, "round": r, "status": "ok", "value": v}
                   for r in range(3) for t, v in ((4, 120.0 + r), (5, 80.0 + r), (2, 100.0))]}
    result = replication.compare(_summary("better"), other)
    (check,) = [c for c in result["checks"] if c["comparison"] == "steps=5 topk=1 draft=6 vs SGLang auto"]
    assert check["other_run_says"] == "worse" and result["contradiction"]
