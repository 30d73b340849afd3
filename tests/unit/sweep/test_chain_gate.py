"""The chain gate: a chain predicted not to reach the best is not started; a started prediction is checked.

The landscape is made up but follows the model's own premises: each draft is accepted with chance 0.8
given the ones before it (so a shorter chain accepts min(k, s) of what the longest accepted), a cycle
costs 5 ms + 1 ms per draft step, and four requests run at once. The best chain is then 3-4 steps.
"""

from __future__ import annotations

import json
import logging

import optuna
import pytest
from ray.tune.search import Searcher

from orchestrator.space import TrialPlan, candidate_key
from orchestrator.space.define_by_run import DefineByRunSpace
from orchestrator.spec import SweepSpec
from orchestrator.sweep.records.results import OBJECTIVE_KEY, TrialRecord
from orchestrator.sweep.search.chain_gate import ChainGate
from orchestrator.sweep.search.searcher import SweepSearcher

optuna.logging.set_verbosity(optuna.logging.WARNING)
ACCEPT, LEVEL = 0.8, 4


def _spec() -> SweepSpec:
    return SweepSpec.from_dict({
        "name": "t", "engine": {"kind": "reference", "model_path": "ref-tiny", "draft_model_path": "ref-tiny-draft"},
        "search": {"speculative": {"num_steps": [1, 2, 3, 4, 5, 6], "eagle_topk": [1]}},
        "objective": {"metric": "output_tok_per_s", "concurrency": LEVEL},
        "benchmark": {"concurrency": [LEVEL]},
    })


def _histogram(steps: int, cycles: int = 100_000) -> list[int]:
    counts = [round(cycles * ACCEPT ** k * (1 - ACCEPT)) for k in range(steps)]
    return counts + [cycles - sum(counts)]


def _tok_per_s(steps: int | None) -> float:
    if steps is None:
        return 500.0  # no speculation, and SGLang's auto choice here (not a chain the gate predicts)
    histogram = _histogram(steps)
    accept = 1 + sum(k * n for k, n in enumerate(histogram)) / sum(histogram)
    return accept / (5.0 + steps) * 1000 * LEVEL


def _result(number: int, plan: TrialPlan, *, factor: float = 1.0) -> dict:
    """The final report of a trial of ``plan`` as the trial sends it (its record as JSON included)."""
    triple = plan.candidate.speculative
    steps = triple.num_steps if plan.speculative and not triple.is_auto else None
    value = _tok_per_s(steps) * factor
    metrics = {}
    histograms = {}
    if steps is not None:
        histogram = _histogram(steps)
        metrics = {f"c{LEVEL}.cycle_ms": 5.0 + steps,
                   f"c{LEVEL}.accept_length_requests": 1 + sum(k * n for k, n in enumerate(histogram)) / sum(histogram)}
        histograms = {str(LEVEL): histogram}
    record = TrialRecord(trial_id=f"t{number}", number=number, kind=plan.kind, label=plan.label(), status="ok",
                         params={**plan.params()}, metrics=metrics, accept_histograms=histograms,
                         level_values={str(LEVEL): [value * 0.999, value, value * 1.001]})
    return {"final": True, "status": "ok", OBJECTIVE_KEY: value, "record": record.model_dump_json()}


def _drive(searcher: SweepSearcher, n: int) -> list[TrialPlan]:
    plans = []
    for i in range(n):
        config = searcher.suggest(f"t{i}")
        if config == Searcher.FINISHED:
            break
        plan = TrialPlan.from_config(config)
        plans.append(plan)
        searcher.on_trial_complete(f"t{i}", _result(i + 1, plan))
    return plans


def test_chains_predicted_below_the_best_are_never_started(caplog: pytest.LogCaptureFixture) -> None:
    spec = _spec()
    searcher = SweepSearcher(space=DefineByRunSpace(spec), mode="max", seed=0, slo=False, gate=ChainGate(spec))
    with caplog.at_level(logging.INFO, logger="orchestrator.sweep.search.searcher"):
        plans = _drive(searcher, 12)
    started = [p.candidate.speculative.num_steps for p in plans if p.speculative and not p.candidate.speculative.is_auto]
    # the opening: SGLang's chain (3), the longest (6), whose histogram predicts the rest, and the shortest
    # (1), the cycle line's other end; 2 is predicted below the best and cannot win
    assert started[:3] == [3, 6, 1]
    assert 2 not in started, started
    assert 3 in started and 4 in started  # the best and the chains whose interval reaches it are measured
    skipped = {key: row for key, row in searcher._predicted.items()}
    assert skipped and all(row.high < max(_tok_per_s(s) for s in (3, 4)) for row in skipped.values())
    assert any("not started: steps=2 topk=1 draft=3 is predicted at" in r.getMessage() for r in caplog.records)
    # the search still finishes: every point is measured or predicted out
    assert set(searcher._busy()) >= {candidate_key(p) for p in DefineByRunSpace(spec).candidates()}


def _gate_after_3_and_6() -> tuple[ChainGate, dict[int, TrialPlan]]:
    """A gate that learned the opening's two chains (3 and 6 steps), and the space's chains by length."""
    plans = {p.candidate.speculative.num_steps: p for p in DefineByRunSpace(_spec()).candidates()}
    gate = ChainGate(_spec())
    for number, steps in ((1, 3), (2, 6)):
        assert gate.learn(f"t{number}", _result(number, plans[steps])) is None  # no prediction made: no check
    return gate, plans


def test_a_started_chain_outside_its_prediction_switches_the_gate_off() -> None:
    gate, plans = _gate_after_3_and_6()
    assert gate.skip(plans[1]) is not None  # predicted below the best: not worth a start
    gate.expect("t3", plans[4])
    measured_low = _result(3, plans[4], factor=0.6)  # the model misses by 40%
    line, inside = gate.learn("t3", measured_low)
    assert line is not None and "OUTSIDE" in line and "measured, not predicted" in line
    assert not inside
    assert gate.skip(plans[1]) is None, "after a miss every chain is measured"


def test_a_missed_extrapolation_is_said_but_leaves_the_gate_on() -> None:
    """The opening starts the shortest chain after the longer ones: its prediction extrapolates, and once it is
    measured nothing does, so its miss says so without switching the gate off; an interpolation's miss does."""
    gate, plans = _gate_after_3_and_6()
    gate.expect("t3", plans[1])
    assert gate.expected["t3"].extrapolated
    line, inside = gate.learn("t3", _result(3, plans[1], factor=0.5))
    assert not inside and "OUTSIDE" in line and "the gate stays on" in line
    assert gate.missed is None
    gate.expect("t4", plans[4])
    assert not gate.expected["t4"].extrapolated
    line, inside = gate.learn("t4", _result(4, plans[4], factor=0.6))
    assert not inside and gate.missed is not None and "measured, not predicted" in line


def test_a_started_chain_inside_its_prediction_keeps_the_gate_on() -> None:
    gate, plans = _gate_after_3_and_6()
    gate.expect("t3", plans[4])
    measured = _result(3, plans[4])
    line, inside = gate.learn("t3", measured)
    assert line.endswith("inside") and inside
    assert gate.missed is None and gate.skip(plans[1]) is not None
    assert json.loads(measured["record"])["accept_histograms"]  # the record the gate learned from carries it


def test_a_check_reads_the_finished_trials_own_record_not_the_last_one_learned() -> None:
    gate, plans = _gate_after_3_and_6()
    gate.expect("t3", plans[4])
    # the trial ended without a record (an error): nothing to check, and no other trial's record is used
    assert gate.learn("t3", {"final": True, "status": "failed"}) is None
    assert gate.missed is None and "t3" not in gate.expected


def test_a_chain_asha_stopped_counts_as_the_sweep_records_it() -> None:
    """ASHA ends a trial on its last report, whose record still says running: the gate keeps it as the
    sweep does (early-stopped), so its chain predicts like one that ended ok; a failed worker's is failed."""
    plans = {p.candidate.speculative.num_steps: p for p in DefineByRunSpace(_spec()).candidates()}
    gate = ChainGate(_spec())
    stopped = _result(1, plans[3])
    record = json.loads(stopped["record"]) | {"status": "running"}
    gate.learn("t1", {**stopped, "final": False, "record": json.dumps(record)})
    gate.learn("t2", _result(2, plans[6]))
    assert [r.status for r in gate.records] == ["early_stopped", "ok"]
    assert gate.skip(plans[1]) is not None  # predicted from the stopped chain and the finished one
    gate.learn("t3", {**stopped, "final": False, "record": json.dumps(record | {"trial_id": "t3"})}, error=True)
    assert gate.records[-1].status == "failed" and gate.records[-1].reason == "error"
