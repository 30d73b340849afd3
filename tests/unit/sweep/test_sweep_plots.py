"""The Optuna plots' study rebuilt from trial records: its trial numbers are the summary's, every
trial with a median is drawn at its number, and the history's x-axis has whole-number ticks only."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import pytest

from orchestrator.sweep.records.results import Objective, TrialRecord

matplotlib.use("Agg", force=True)


def _record(number: int, values: list[float], *, status: str = "ok", violation: float | None = None) -> TrialRecord:
    median = sorted(values)[len(values) // 2] if values and status in ("ok", "infeasible") else None
    return TrialRecord(
        trial_id=f"t{number}", number=number, kind="search" if number > 2 else "baseline_plain",  # type: ignore[arg-type]
        label=f"config {number}", params={"num_steps": number % 3, "NCCL_ALGO": "default"}, status=status,  # type: ignore[arg-type]
        reason=None if status == "ok" else status, slo_violation=violation,
        objective=Objective(metric="output_tok_per_s", concurrency=4, direction="max", values=values,
                            median=median) if values else None,
        repetitions_done=len(values), repetitions_planned=3, measured_in_full=status in ("ok", "infeasible"),
    )


def _sweep() -> list[TrialRecord]:
    """The shape of the demo's run: two early-stopped trials between measured ones, then an
    infeasible and a failed one."""
    return [
        _record(1, [60.0, 59.0, 58.0]),
        _record(2, [250.0, 255.0, 254.0]),
        _record(3, [176.0], status="early_stopped"),
        _record(4, [266.0, 274.0, 248.0]),
        _record(5, [43.0], status="early_stopped"),
        _record(6, [300.0, 301.0, 299.0], status="infeasible", violation=0.2),
        _record(7, [], status="failed"),
    ]


def test_the_study_numbers_its_trials_as_the_summary_does() -> None:
    from optuna.trial import TrialState

    from orchestrator.sweep.output.plots import _study

    study = _study(_sweep())
    assert [t.number for t in study.trials] == list(range(8)), "one study trial per number, none renumbered"
    assert all(t.user_attrs.get("number") == t.number for t in study.trials)
    complete = {t.number: t.value for t in study.trials if t.state == TrialState.COMPLETE}
    assert complete == {1: 59.0, 2: 254.0, 4: 266.0, 6: 300.0}, "every trial with a median, at its own number"
    assert study.trials[6].constraints == {"slo": 0.2}, "the infeasible trial carries its SLO violation"
    assert {t.number for t in study.trials if t.state == TrialState.PRUNED} == {3, 5}
    assert study.trials[3].intermediate_values == {0: 176.0}
    assert {t.number for t in study.trials if t.state == TrialState.FAIL} == {0, 7}


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_the_history_draws_each_trial_at_its_number_on_whole_number_ticks() -> None:
    from orchestrator.sweep.output.plots import _history, _study

    axes = _history(_study(_sweep()), metric="output_tok_per_s")
    axes.figure.canvas.draw()
    feasible, *rest = [c for c in axes.collections if len(c.get_offsets())]
    assert [tuple(p) for p in feasible.get_offsets()] == [(1, 59.0), (2, 254.0), (4, 266.0)]
    (infeasible,) = rest
    assert [tuple(p) for p in infeasible.get_offsets()] == [(6, 300.0)], "drawn grey, off the best-value line"
    low, high = axes.get_xlim()
    ticks = [t for t in axes.get_xticks() if low <= t <= high]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
    labels = [label.get_text() for label in axes.get_xticklabels() if label.get_text()]
    assert labels and all(text.lstrip("−-").isdigit() for text in labels), labels
    assert "numbered as in the summary" in axes.get_xlabel()


@pytest.mark.parametrize("measured", [0, 1])
def test_the_history_is_drawn_from_one_measured_trial_on(tmp_path: Path, measured: int) -> None:
    from orchestrator.sweep.output.plots import draw_plots

    records = [_record(1, [60.0, 59.0, 58.0])][:measured] + [_record(2, [10.0], status="early_stopped")]
    made = draw_plots(records, out_dir=tmp_path, metric="output_tok_per_s", concurrency=4)
    assert (tmp_path / "optimization_history.png" in made) == bool(measured)


def test_the_pareto_plot_leaves_out_early_stopped_trials() -> None:
    """An early-stopped trial's record now carries the medians of the one or two repetitions ASHA let it
    make: not a point to trade throughput against latency on. Here it would have been the whole front."""
    from orchestrator.sweep.output.plots import _pareto

    def with_metrics(record: TrialRecord, tok: float, tpot: float) -> TrialRecord:
        return record.model_copy(update={"metrics": {"c4.output_tok_per_s": tok, "c4.tpot_ms_p99": tpot}})

    records = [with_metrics(_record(2, [250.0, 255.0, 254.0]), 254.0, 20.0),
               with_metrics(_record(3, [176.0], status="early_stopped"), 400.0, 5.0),  # beats every other point
               with_metrics(_record(4, [266.0, 274.0, 248.0]), 266.0, 25.0)]
    ax = _pareto(records, concurrency=4)
    try:
        labels = sorted(text.get_text() for text in ax.texts)
        assert labels == ["2", "4"], labels
    finally:
        import matplotlib.pyplot as plt

        plt.close(ax.figure)
