"""Predicted rows: unmeasured top-k 1 chains predicted from measured ones, as rows of their own kind.

The measured chains are real: the CPU reference engine's chains of 1-6 steps at concurrency 1 and 4
(docs/measurements/chain-prediction-cpu/run1.json), turned into the records a sweep writes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from orchestrator.spec import SweepSpec
from orchestrator.sweep.output.predicted_rows import predict_rows, prediction_lines
from orchestrator.sweep.records.results import TrialRecord

RUN = json.loads((Path(__file__).resolve().parents[3] / "docs/measurements/chain-prediction-cpu/run1.json")
                 .read_text(encoding="utf-8"))["designs"]["longest_and_shortest"]
LEVELS = (1, 4)


def _spec(**objective) -> SweepSpec:
    return SweepSpec.from_dict({
        "name": "t", "engine": {"kind": "reference", "model_path": "ref-tiny", "draft_model_path": "ref-tiny-draft"},
        "search": {"speculative": {"num_steps": [1, 2, 3, 4, 5, 6], "eagle_topk": [1, 2], "num_draft_tokens": [4]}},
        "objective": {"metric": "output_tok_per_s", "concurrency": 4, **objective},
        "benchmark": {"concurrency": list(LEVELS)},
    })


def _record(number: int, steps: int, *, topk: int = 1, status: str = "ok", nccl: dict | None = None,
            speed: float = 1.0, paired: bool = False) -> TrialRecord:
    """A trial of ``steps`` as the sweep records it, from the measured chain at each level (``speed``: an
    NCCL setting that scales the cycle time by 1 / speed; ``paired``: each repetition's cycle time
    recorded too, slow where its throughput is)."""
    metrics, values, histograms, cycles = {}, {}, {}, {}
    for level in LEVELS:
        chain = RUN[str(level)]["measured"][str(steps)]
        spread = chain["tok_rel_se"] * math.sqrt(3)  # three repetitions whose log spread gives that standard error
        values[str(level)] = [chain["tok_per_s"] * speed * math.exp(d) for d in (-spread, 0.0, spread)]
        if paired:
            cycles[str(level)] = [chain["cycle_ms"] / speed * math.exp(-d) for d in (-spread, 0.0, spread)]
        metrics[f"c{level}.cycle_ms"] = chain["cycle_ms"] / speed
        metrics[f"c{level}.accept_length_requests"] = chain["accept_length"]
        histograms[str(level)] = chain["histogram"]
    return TrialRecord(trial_id=f"t{number}", number=number, kind="search", label=f"steps={steps}", status=status,
                       params={"speculative": "explicit", "num_steps": steps, "eagle_topk": topk,
                               "num_draft_tokens": steps + 1, "all_reduce": "default", **(nccl or {})},
                       metrics=metrics, level_values=values, accept_histograms=histograms, level_cycle_ms=cycles)


def test_two_starts_predict_every_other_chain_within_3_percent_and_inside_the_interval() -> None:
    predictions = predict_rows(_spec(), [_record(1, 6), _record(2, 1)])
    rows = {(r.num_steps, r.concurrency): r for r in predictions.rows}
    assert sorted(rows) == [(s, c) for s in (2, 3, 4, 5) for c in LEVELS]  # measured chains are never predicted
    for (steps, level), row in rows.items():
        measured = RUN[str(level)]["measured"][str(steps)]
        assert row.kind == "predicted" and row.histogram_trial == 1 and row.from_trials == [1, 2]
        assert abs(row.accept_length / measured["accept_length"] - 1) <= 0.03
        assert row.low <= measured["tok_per_s"] <= row.high
        assert 0 < row.low < row.tok_per_s < row.high


def test_repetitions_slow_in_both_throughput_and_cycle_time_narrow_the_interval() -> None:
    """A record that keeps each repetition's cycle time beside its throughput lets the reference's two
    errors cancel where they move together; one without it takes them as independent (wider)."""
    unpaired = {(r.num_steps, r.concurrency): r for r in predict_rows(_spec(), [_record(1, 6), _record(2, 1)]).rows}
    paired = {(r.num_steps, r.concurrency): r
              for r in predict_rows(_spec(), [_record(1, 6, paired=True), _record(2, 1, paired=True)]).rows}
    assert sorted(paired) == sorted(unpaired)
    for key, row in paired.items():
        measured = RUN[str(key[1])]["measured"][str(key[0])]
        assert row.tok_per_s == pytest.approx(unpaired[key].tok_per_s)
        assert row.high - row.low < unpaired[key].high - unpaired[key].low, key
        assert row.low <= measured["tok_per_s"] <= row.high, key


def test_a_third_chain_is_checked_against_a_prediction_from_the_other_two() -> None:
    predictions = predict_rows(_spec(), [_record(1, 6), _record(2, 1), _record(3, 3)])
    checks = [c for c in predictions.checks if c["concurrency"] == 4]
    assert [(c["trial"], c["num_steps"]) for c in checks] == [(3, 3)]  # the shortest would extrapolate: not checked
    assert all(c["inside"] for c in checks), checks
    lines = prediction_lines(predictions, concurrency=4)
    assert lines[0].startswith("predicted, not measured")
    assert all(line.startswith("  ~ ") for line in lines[1:4])
    assert any("check: trial 3 (steps=3) predicted from the others" in line and line.endswith("inside") for line in lines)


def test_the_confirmations_start_to_start_spread_reaches_every_interval_and_the_header() -> None:
    """Until the confirmation measured what a fresh start adds, the intervals carry the engine kind's prior
    (the CPU reference engine's 4.5%), labelled a prior; a measured spread replaces it in every predicted row
    (and the check), and the header says which spread the intervals carry."""
    records = [_record(1, 6), _record(2, 1), _record(3, 3)]
    plain, spread = predict_rows(_spec(), records), predict_rows(_spec(), records, start_rel=0.08)
    assert len(plain.rows) == len(spread.rows) > 0
    for a, b in zip(plain.rows, spread.rows):
        assert b.tok_per_s == pytest.approx(a.tok_per_s) and b.high - b.low > a.high - a.low
    assert all(b["high"] - b["low"] > a["high"] - a["low"] for a, b in zip(plain.checks, spread.checks))
    assert "4.5%, prior for the CPU reference engine" in prediction_lines(plain, concurrency=4)[0]
    assert plain.start_rel == 0.045
    assert "8.0%, measured" in prediction_lines(spread, concurrency=4)[0]
    assert spread.to_dict()["start_rel"] == 0.08


def test_trees_failures_and_other_objectives_are_not_predicted_from() -> None:
    assert predict_rows(_spec(), [_record(1, 6), _record(2, 1, topk=2)]).rows == []
    assert predict_rows(_spec(), [_record(1, 6), _record(2, 1, status="failed")]).rows == []
    skipped = predict_rows(_spec(metric="tpot_ms_p50"), [_record(1, 6), _record(2, 1)])
    assert skipped.rows == [] and "predicted in output tok/s only" in skipped.skipped


@pytest.mark.parametrize("level", LEVELS)
def test_a_prediction_whose_interval_reaches_the_best_is_worth_a_start(level: int) -> None:
    rows = [r for r in predict_rows(_spec(), [_record(1, 6), _record(2, 1)]).rows if r.concurrency == level]
    best = max(RUN[str(level)]["measured"][str(s)]["tok_per_s"] for s in (1, 6))
    assert all(r.reaches_best == (r.high >= best) for r in rows)


def test_a_setting_measured_once_borrows_the_shape_across_chain_lengths() -> None:
    # the default setting measured 1, 3 and 6 steps; NCCL_ALGO=Ring only SGLang's chain (3), 10% slower cycles
    records = [_record(1, 6), _record(2, 1), _record(3, 3), _record(4, 3, nccl={"NCCL_ALGO": "Ring"}, speed=0.9)]
    rows = [r for r in predict_rows(_spec(), records).rows if r.nccl_env == {"NCCL_ALGO": "Ring"}]
    assert sorted(r.num_steps for r in rows if r.concurrency == 4) == [1, 2, 4, 5, 6]
    default = {(r.num_steps, r.concurrency): r for r in predict_rows(_spec(), records[:3]).rows}
    for row in rows:
        assert row.basis == "setting" and row.reference_trial == 4 and row.from_trials == [1, 2, 3, 4]
        measured = RUN[str(row.concurrency)]["measured"][str(row.num_steps)]
        # the default's own figure for that chain (measured or predicted), scaled by the setting's 0.9
        base = default[(row.num_steps, row.concurrency)].tok_per_s if (row.num_steps, row.concurrency) in default \
            else measured["tok_per_s"]
        assert row.tok_per_s == pytest.approx(0.9 * base, rel=1e-3)
        assert row.low <= 0.9 * measured["tok_per_s"] <= row.high  # what a start of it would measure
    line = next(x for x in prediction_lines(predict_rows(_spec(), records), concurrency=4) if "NCCL_ALGO=Ring" in x)
    assert "this setting measured once in trial 4, the shape across chain lengths from trials 1, 2, 3" in line


def test_an_early_stopped_setting_measured_once_is_predicted_with_the_others_spread() -> None:
    # ASHA stopped the NCCL_ALGO=Ring trial after one repetition: it still measured SGLang's chain once
    ring = _record(4, 3, nccl={"NCCL_ALGO": "Ring"}, speed=0.9)
    one = ring.model_copy(update={"status": "early_stopped",
                                  "level_values": {k: v[1:2] for k, v in ring.level_values.items()}})
    rows = [r for r in predict_rows(_spec(), [_record(1, 6), _record(2, 1), _record(3, 3), one]).rows
            if r.nccl_env == {"NCCL_ALGO": "Ring"} and r.concurrency == 4]
    assert sorted(r.num_steps for r in rows) == [1, 2, 4, 5, 6]
    # its spread is the median of the chains measured three times, not zero: the interval stays honest
    full = {r.num_steps: r for r in predict_rows(_spec(), [_record(1, 6), _record(2, 1), _record(3, 3), ring]).rows
            if r.nccl_env == {"NCCL_ALGO": "Ring"} and r.concurrency == 4}
    for row in rows:
        assert row.low < row.tok_per_s < row.high
        assert row.tok_per_s == pytest.approx(full[row.num_steps].tok_per_s, rel=1e-6)


def test_sampled_traffic_says_what_the_prediction_rests_on() -> None:
    """Greedy: no note. A replayed log whose requests sample: the rows say the prediction holds in
    distribution, not request by request, in predictions.jsonl's summary and the printed block."""
    greedy = predict_rows(_spec(), [_record(1, 6), _record(2, 1)])
    assert greedy.sampling is None and not any("under sampling" in line for line in prediction_lines(greedy, concurrency=4))
    sampled = [r.model_copy(update={"traffic": {"temperature": {"greedy_share": 0.5, "min": 0.0, "p50": 0.2, "max": 0.8}}})
               for r in (_record(1, 6), _record(2, 1))]
    predictions = predict_rows(_spec(), sampled)
    assert predictions.sampling and "in distribution" in predictions.sampling
    assert predictions.to_dict()["sampling"] == predictions.sampling
    assert any(line.startswith("  under sampling:") for line in prediction_lines(predictions, concurrency=4))


def test_a_chain_stopped_after_two_repetitions_takes_the_others_spread() -> None:
    """Two repetitions give one degree of freedom, often far below the chain's real spread: such a chain
    takes the median spread of the chains measured three times, as one measured once does."""
    two_close = _record(2, 1).model_copy(update={
        "status": "early_stopped",
        "level_values": {k: [v[1] * 0.9999, v[1]] for k, v in _record(2, 1).level_values.items()}})
    three_close = _record(2, 1).model_copy(update={
        "level_values": {k: [v[1] * 0.9999, v[1], v[1] * 1.0001] for k, v in _record(2, 1).level_values.items()}})
    by_two = {(r.num_steps, r.concurrency): r for r in predict_rows(_spec(), [_record(1, 6), two_close]).rows}
    by_three = {(r.num_steps, r.concurrency): r for r in predict_rows(_spec(), [_record(1, 6), three_close]).rows}
    assert sorted(by_two) == sorted(by_three)
    for key, row in by_two.items():  # steps 2 is scaled from the stopped chain: its own 0.01% spread is not used
        if key[0] == 2:
            assert row.high / row.low > by_three[key].high / by_three[key].low, key


def test_nothing_below_the_shortest_measured_chain_is_predicted() -> None:
    """From SGLang's chain (3) and the longest (6): steps 1 and 2 lie below every measured chain and are not
    predicted, for the default setting nor for a setting that measured 3 alone; 4 and 5 lie between."""
    records = [_record(1, 6), _record(2, 3), _record(3, 3, nccl={"NCCL_ALGO": "Ring"}, speed=0.9)]
    rows = predict_rows(_spec(), records).rows
    assert {r.num_steps for r in rows if r.basis == "chains"} == {4, 5}
    assert not any(r.num_steps < 3 for r in rows)  # the setting's rows borrow 4-6 from the default's


def test_on_gpus_the_one_step_chain_is_neither_predicted_nor_predicted_from() -> None:
    """An engine on GPUs decoding in CUDA graphs runs one draft step in another graph (SGLang 0.5.23 captures no
    draft-decode graph for it): the one-step chain is off the line, so the chains rest on 2..6 only, and the
    prior is the GPU one. With decode graphs off, one step is the model's own case again."""
    gpu = SweepSpec.from_dict({**_spec().model_dump(exclude_none=True), "resources": {"gpus_per_trial": 1}})
    records = [_record(1, 6), _record(2, 1), _record(3, 2), _record(4, 3)]
    predictions = predict_rows(gpu, records)
    assert {r.num_steps for r in predictions.rows} == {4, 5}
    assert all(1 not in [int(r.num_steps)] and 2 not in r.from_trials for r in predictions.rows)
    assert {c["num_steps"] for c in predictions.checks} == {3}  # 2 is the shortest now: 3 is checked, 1 is not used
    assert predictions.start_rel == 0.072 and "prior for GPU engines" in predictions.start_rel_source
    eager = SweepSpec.from_dict({**gpu.model_dump(exclude_none=True),
                                 "engine": {**gpu.engine.model_dump(exclude_none=True),
                                            "extra_args": {"cuda_graph_backend_decode": "disabled"}}})
    assert {c["num_steps"] for c in predict_rows(eager, records).checks} == {2, 3}


def test_worth_a_start_is_judged_against_the_best_measured_lower_bound_not_its_point_value() -> None:
    """The largest of several noisy measured values is biased up (the winner's curse): a row is worth a start
    when its interval reaches the best configuration's 95% lower bound (its repetitions and its start's prior
    spread, at t), not its measured value. A tree measured 50% faster than SGLang's chain is the best here:
    steps 2's interval tops out below its measured value but above its lower bound, so it is still worth a start."""
    tree = _record(4, 3, topk=2, speed=1.5)
    predictions = predict_rows(_spec(), [_record(1, 6), _record(2, 1), _record(3, 3), tree])
    row = next(r for r in predictions.rows if r.concurrency == 4 and r.num_steps == 2)
    best_value = math.exp(sum(math.log(v) for v in tree.values_at(4)) / 3)
    assert row.best_low < row.high < best_value
    assert row.reaches_best
