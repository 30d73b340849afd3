"""The confirmation round on test doubles with known speeds: interleaved visits, a verdict with an
interval, and "not distinguishable" when the interval includes 1."""

from __future__ import annotations

from orchestrator.spec import SweepSpec
from orchestrator.sweep.confirm import confirmation_candidates, run_confirmation
from orchestrator.sweep.results import Objective, TrialRecord


def _spec(**confirmation) -> SweepSpec:
    return SweepSpec.from_dict({
        "name": "t", "engine": {"kind": "reference", "model_path": "ref-tiny", "draft_model_path": "ref-tiny-draft"},
        "objective": {"metric": "output_tok_per_s", "concurrency": 4}, "benchmark": {"concurrency": [4]},
        "confirmation": {"top_k": 2, "rounds": 3, "repetitions_per_visit": 2, **confirmation},
    })


def _record(number: int, value: float, kind: str = "search", status: str = "ok") -> TrialRecord:
    return TrialRecord(
        trial_id=f"t{number}", number=number, kind=kind, label=f"config {number}", params={}, status=status,
        objective=Objective(metric="output_tok_per_s", concurrency=4, direction="max", values=[value], median=value),
        repetitions_done=1, repetitions_planned=1, measured_in_full=status == "ok",
    )


RECORDS = [_record(1, 50.0, "baseline_plain"), _record(2, 100.0, "baseline_auto"), _record(3, 112.0),
           _record(4, 108.0), _record(5, 130.0, status="early_stopped")]


def _visits(speeds: dict[int, list[float]]):
    order: list[int] = []

    def visit(record: TrialRecord, round_number: int) -> dict:
        order.append(record.number)
        base = speeds[record.number]
        # two repetitions per visit, the round shifts them a little (drift is shared by everyone)
        return {"values": [v * (1 + 0.01 * round_number) for v in base], "status": "ok", "reason": None,
                "message": ""}

    return visit, order


def test_candidates_are_the_top_k_complete_trials_and_sglangs_default() -> None:
    chosen = confirmation_candidates(RECORDS, top_k=2)
    assert [r.number for r in chosen] == [3, 4, 2], "early-stopped trial 5 is never a candidate"


def test_a_clear_winner_is_stated_with_its_interval() -> None:
    visit, order = _visits({3: [110.0, 111.0], 4: [104.0, 106.0], 2: [100.0, 101.0]})
    lines: list[str] = []
    result = run_confirmation(_spec(), RECORDS, visit=visit, say=lines.append)
    assert order == [3, 4, 2, 3, 4, 2, 3, 4, 2], "interleaved: A B C A B C A B C"
    assert result.winner == 3 and result.default == 2
    assert result.ratio.distinguishable and 1.08 < result.ratio.ratio < 1.11
    assert result.lines[0].startswith("confirmed best: trial 3 config 3: x1.")
    assert "over SGLang's default" in result.lines[0] and len(lines) == 9


def test_a_winner_within_the_noise_is_not_distinguishable() -> None:
    visit, _ = _visits({3: [102.0, 99.5], 4: [98.0, 100.0], 2: [100.0, 100.5]})
    result = run_confirmation(_spec(), RECORDS, visit=visit, say=lambda line: None)
    assert result.ratio is not None and not result.ratio.distinguishable
    assert "not distinguishable from SGLang's default" in result.lines[0]


def test_failed_visits_are_recorded_and_the_rest_still_decides() -> None:
    def visit(record: TrialRecord, round_number: int) -> dict:
        if record.number == 3:
            return {"values": [], "status": "failed", "reason": "engine_died", "message": "boom"}
        return {"values": [105.0 + record.number, 106.0 + record.number], "status": "ok", "reason": None,
                "message": ""}

    result = run_confirmation(_spec(), RECORDS, visit=visit, say=lambda line: None)
    assert result.failures[3] == ["engine_died: boom"] * 3
    assert result.winner == 4
