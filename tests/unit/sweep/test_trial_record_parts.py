"""What a trial's record keeps of the repetitions it measured before the benchmark returned: ASHA stops a
trial after a report, and the sweep keeps that report's record, so the histogram, the per-repetition cycle
times and the medians must be in it then (the chain prediction reads them from early-stopped trials too)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from orchestrator.bench.loadgen import RequestRecord
from orchestrator.bench.metrics import compute_repetition_metrics
from orchestrator.sweep.execution.trial import _accept_histograms, _level_cycles, _medians


def _repetition(number: int, *, slow: float):
    """Two speculative requests; ``slow`` stretches their decode time (cycle_ms) and the repetition."""
    records = [
        RequestRecord(index=0, prompt_id="p0", output_tokens=11, spec_verify_ct=4, ttft_ms=100.0,
                      e2e_ms=100.0 + 200.0 * slow, num_chunks=5, prompt_tokens=7,
                      spec_correct_drafts_histogram=[1, 1, 2]),
        RequestRecord(index=1, prompt_id="p1", output_tokens=21, spec_verify_ct=8, ttft_ms=200.0,
                      e2e_ms=200.0 + 400.0 * slow, num_chunks=9, prompt_tokens=9,
                      spec_correct_drafts_histogram=[0, 2, 6]),
    ]
    return compute_repetition_metrics(records=records, duration_s=1.0 * slow, concurrency=4, repetition=number,
                                      request_rate=None, accept_length_server=None, accept_length_tolerance=0.1)


def test_an_early_stopped_trial_keeps_its_histogram_cycle_times_and_medians() -> None:
    reps = [_repetition(0, slow=1.0), _repetition(1, slow=1.5)]
    state = SimpleNamespace(repetitions={4: reps}, bench=None, other_levels=None)  # stopped before the result came
    spec = SimpleNamespace(objective=SimpleNamespace(metric="output_tok_per_s"))
    assert _accept_histograms(state) == {"4": [2, 6, 16]}  # the two repetitions' requests summed
    cycles = _level_cycles(spec, state)["4"]
    assert cycles == pytest.approx([600.0 / 12, 900.0 / 12])  # sum(e2e - ttft) / sum(verify cycles), per repetition
    medians = _medians(4, reps)
    assert medians["c4.cycle_ms"] == pytest.approx(62.5)
    assert medians["c4.accept_length_requests"] == pytest.approx(reps[0].accept_length_requests)
    assert "c4.ttft_ms_p50" in medians and all(key.startswith("c4.") for key in medians)


def test_a_level_whose_repetition_lacks_a_cycle_time_is_not_paired() -> None:
    plain = compute_repetition_metrics(
        records=[RequestRecord(index=0, prompt_id="p0", output_tokens=11, ttft_ms=100.0, e2e_ms=300.0, num_chunks=11,
                               prompt_tokens=7)],
        duration_s=1.0, concurrency=4, repetition=0, request_rate=None, accept_length_server=None,
        accept_length_tolerance=0.1)
    state = SimpleNamespace(repetitions={4: [_repetition(0, slow=1.0), plain]}, bench=None, other_levels=None)
    spec = SimpleNamespace(objective=SimpleNamespace(metric="output_tok_per_s"))
    assert _level_cycles(spec, state) == {}
    assert _accept_histograms(SimpleNamespace(repetitions={4: [plain]}, bench=None, other_levels=None)) == {}


def test_each_objective_level_repetition_teaches_the_record_what_was_measured_so_far() -> None:
    """The record a report carries after each objective-level repetition (what ASHA's stop leaves) has the
    objective's values, the medians, the summed histogram and the paired cycle times; another level's
    repetition is kept but teaches the record nothing yet."""
    from orchestrator.spec import SweepSpec
    from orchestrator.sweep.execution.trial import _learn_repetition, _TrialState
    from orchestrator.sweep.records.results import TrialRecord

    spec = SweepSpec.from_dict({
        "name": "t", "engine": {"kind": "reference", "model_path": "ref-tiny", "draft_model_path": "ref-tiny-draft"},
        "search": {"speculative": {"num_steps": [2], "eagle_topk": [1]}},
        "objective": {"metric": "output_tok_per_s", "concurrency": 4}, "benchmark": {"concurrency": [4, 8]}})
    record = TrialRecord(trial_id="t1", number=1, kind="search", label="steps=2", params={}, status="running")
    state = _TrialState(plan=None, record=record, limits=None)  # type: ignore[arg-type]
    first, second = _repetition(0, slow=1.0), _repetition(1, slow=1.5)
    assert _learn_repetition(spec, state, first) is True
    assert _learn_repetition(spec, state, second) is True
    learned = state.record
    assert learned.level_values == {"4": [first.output_tok_per_s, second.output_tok_per_s]}
    assert learned.accept_histograms == {"4": [2, 6, 16]}
    assert learned.level_cycle_ms["4"] == pytest.approx([50.0, 75.0])
    assert learned.metrics["c4.cycle_ms"] == pytest.approx(62.5)
    other = compute_repetition_metrics(records=[], duration_s=1.0, concurrency=8, repetition=0, request_rate=None,
                                       accept_length_server=None, accept_length_tolerance=0.1)
    assert _learn_repetition(spec, state, other) is False and state.record is learned
    assert 8 in state.repetitions
