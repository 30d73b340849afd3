"""One winner everywhere (issue 44): the summary line, best.yaml, the table, the plots and MLflow name
the same trial, best.yaml's and say why it holds it: a fallback where the confirmation could not
decide; best.yaml serves SGLang's automatic speculative numbers as the engine resolved them; the
plots leave out what never varied; a status is not repeated as its reason."""

from __future__ import annotations

import logging
import statistics
from pathlib import Path

import matplotlib
import pytest
from mlflow.tracking import MlflowClient

from orchestrator.spec import SweepSpec
from orchestrator.sweep.confirmation.confirm import Confirmation, Contender
from orchestrator.sweep.execution.coordinator import SweepCoordinator
from orchestrator.sweep.execution.finish import (
    FALLBACK,
    TAG_BEST_YAML,
    best_yaml_header,
    best_yaml_run_tags,
    confirmation_why,
    summary_report,
    summary_text,
)
from orchestrator.sweep.records.results import Objective, TrialRecord, served_engine_config, write_best_yaml
from serving.engine.config import EngineConfig
from serving.serve.options import read_served

matplotlib.use("Agg", force=True)

LEVEL = 4
AUTO_NUMBERS = {"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}
SPECULATIVE = {"kind": "reference", "model_path": "ref-tiny", "tp_size": 1, "speculative_algorithm": "EAGLE3",
               "speculative_draft_model_path": "ref-tiny-draft"}


def _engine(**numbers: int | None) -> dict:
    """An EngineConfig as a trial records it (``model_dump``)."""
    return EngineConfig.model_validate({**SPECULATIVE, **numbers}).model_dump()


AUTO_ENGINE = _engine()
CHAIN_ENGINE = _engine(speculative_num_steps=5, speculative_eagle_topk=1, speculative_num_draft_tokens=6)
PLAIN_ENGINE = EngineConfig.model_validate({"kind": "reference", "model_path": "ref-tiny", "tp_size": 1}).model_dump()


def _trial(number: int, kind: str, label: str, values: list[float], *, params: dict | None = None,
           engine: dict | None = None, resolved: dict | None = None, status: str = "ok",
           reason: str | None = None) -> TrialRecord:
    return TrialRecord(
        trial_id=f"t{number}", number=number, kind=kind, label=label, params=params or {}, status=status,  # type: ignore[arg-type]
        reason=reason, objective=Objective(metric="output_tok_per_s", concurrency=LEVEL, direction="max",
                                           values=values, median=statistics.median(values)) if values else None,
        level_values={str(LEVEL): values}, repetitions_done=len(values), repetitions_planned=3,
        measured_in_full=status in ("ok", "infeasible"), resolved_params=resolved, engine_config=engine or {},
    )


def _sweep() -> list[TrialRecord]:
    """The user's shape: the search's best (trial 5) leads SGLang's default (trial 2) by an estimate."""
    return [
        _trial(1, "baseline_plain", "no speculation", [140.0, 141.0, 139.0], params={"speculative": "off"},
               engine=PLAIN_ENGINE),
        _trial(2, "baseline_auto", "SGLang auto (= steps 3 topk 1 draft 4)", [340.0, 300.0, 380.0],
               params={"speculative": "auto"}, engine=AUTO_ENGINE, resolved=AUTO_NUMBERS),
        _trial(3, "search", "steps=6 topk=1 draft=7", [280.0], params={"speculative": "explicit"},
               status="early_stopped", reason="early_stopped"),
        _trial(5, "search", "steps=5 topk=1 draft=6", [390.0, 392.0, 398.0], params={"speculative": "explicit"},
               engine=CHAIN_ENGINE, resolved={"num_steps": 5, "eagle_topk": 1, "num_draft_tokens": 6}),
    ]


def _spec(*, confirmation: bool = True) -> SweepSpec:
    return SweepSpec.from_dict({
        "name": "t", "engine": {"kind": "reference", "model_path": "ref-tiny", "draft_model_path": "ref-tiny-draft"},
        "objective": {"metric": "output_tok_per_s", "concurrency": LEVEL}, "benchmark": {"concurrency": [LEVEL]},
        "confirmation": {"enabled": confirmation},
    })


def _confirmation(records: list[TrialRecord], *, chosen: int, kind: str | None, leader: int | None = 5,
                  floor: str | None = None, searched: int = 1) -> Confirmation:
    by_number = {r.number: r for r in records}
    contenders = [Contender("best", by_number[5]), Contender("default", by_number[2]),
                  Contender("no_speculation", by_number[1])]
    return Confirmation(
        contenders=contenders, margin=0.01, direction="max", leader=leader, chosen=chosen, rounds=4, searched=searched,
        vs_sglang_default={"kind": kind, "ratio": 1.04, "ci95_low": 0.98, "ci95_high": 1.11,
                           "visits": 4} if kind else None,
        vs_no_speculation={"kind": floor, "visits": 4} if floor else None,
        lines=[f"verdict: trial 5 vs SGLang's default: {kind}"],
    )


# --- why best.yaml holds its trial ---------------------------------------------------------------

@pytest.mark.parametrize(("chosen", "kind", "leader", "floor", "searched", "why"), [
    (5, "better", 5, None, 1, "the confirmation's choice: better than SGLang's default; not shown to clear the "
                             "1% margin"),
    (2, "equivalent", 5, None, 1,
     "the confirmation's choice: trial 5 was equivalent to SGLang's default, the simpler one"),
    (2, "worse", 5, None, 1, "the confirmation's choice: trial 5 was worse than SGLang's default"),
    (2, "undecided", 5, None, 1, f"{FALLBACK}: the confirmation could not decide between trial 5 and SGLang's "
                                 "default after 4 visits each, so best.yaml keeps SGLang's default"),
    (2, None, None, None, 1, f"{FALLBACK}: no visit of the search's contenders counted, so best.yaml keeps "
                             "SGLang's default"),
    (2, None, None, None, 0, f"{FALLBACK}: no search trial completed apart from SGLang's default"),
    (1, "undecided", 5, "worse", 1, "the confirmation's choice: no speculation was faster than the speculative "
                                    "configuration it would otherwise have kept"),
], ids=["better", "equivalent", "worse", "undecided", "no_visit_counted", "nothing_searched", "no_speculation"])
def test_the_why_says_choice_or_fallback(chosen: int, kind: str | None, leader: int | None, floor: str | None,
                                         searched: int, why: str) -> None:
    confirmation = _confirmation(_sweep(), chosen=chosen, kind=kind, leader=leader, floor=floor, searched=searched)
    assert confirmation_why(confirmation) == why


def test_an_undecided_confirmation_names_a_fallback_in_the_summary_and_best_yaml(tmp_path: Path) -> None:
    """The user's run: the table's top row is trial 5, best.yaml keeps trial 2, and every place that
    names trial 2 says it is a fallback, and why."""
    records = _sweep()
    report = summary_report(_spec(), records, _confirmation(records, chosen=2, kind="undecided"))
    line = next(line for line in report["lines"] if line.startswith("best.yaml:"))
    assert line == ("best.yaml: trial 2 SGLang auto (= steps 3 topk 1 draft 4) (a fallback, not a choice: the "
                    "confirmation could not decide between trial 5 and SGLang's default after 4 visits each, so "
                    "best.yaml keeps SGLang's default)")
    assert report["best_why"].startswith(FALLBACK)
    header = best_yaml_header(_spec(), report, path=tmp_path / "best.yaml")
    path = write_best_yaml(tmp_path / "best.yaml", engine_config=report["best_config"], header_lines=header)
    comments = [text for text in path.read_text().splitlines() if text.startswith("#")]
    assert comments[0] == "# spectune sweep t: the configuration to serve (output_tok_per_s at concurrency 4)"
    assert f"# {line}" in comments and comments[-1] == f"# serve it: spectune serve {path}"
    assert "# speculative numbers: SGLang's automatic choice, resolved by the engine to steps 3 topk 1 draft 4 " \
           "(best.yaml sets them, so serving starts the engine that was measured)" in comments


# --- what best.yaml serves -------------------------------------------------------------------------

def test_best_yaml_serves_sglangs_automatic_numbers_as_the_engine_resolved_them(tmp_path: Path) -> None:
    records = _sweep()
    report = summary_report(_spec(), records, _confirmation(records, chosen=2, kind="undecided"))
    assert report["best_config"] == {**AUTO_ENGINE, "speculative_num_steps": 3, "speculative_eagle_topk": 1,
                                     "speculative_num_draft_tokens": 4}
    assert "  speculative numbers: SGLang's automatic choice, resolved by the engine to steps 3 topk 1 draft 4 " \
           "(best.yaml sets them, so serving starts the engine that was measured)" in report["lines"]
    path = write_best_yaml(tmp_path / "best.yaml", engine_config=report["best_config"], header_lines=["t"])
    engine, _, _ = read_served(path)  # what `spectune serve` loads: a valid EngineConfig with the numbers set
    numbers = (engine.speculative_num_steps, engine.speculative_eagle_topk, engine.speculative_num_draft_tokens)
    assert numbers == (3, 1, 4)
    assert records[1].engine_config == AUTO_ENGINE, "the trial's record keeps what it was started with"


def test_a_trials_own_numbers_and_no_speculation_are_served_as_they_ran() -> None:
    records = _sweep()
    for record in (records[0], records[3]):
        config, line = served_engine_config(record)
        assert config == record.engine_config and line is None


def test_automatic_numbers_the_engine_did_not_report_stay_sglangs_choice() -> None:
    record = _sweep()[1].model_copy(update={"resolved_params": None})
    config, line = served_engine_config(record)
    assert config == AUTO_ENGINE and config["speculative_num_steps"] is None
    assert line == ("speculative numbers: SGLang's automatic choice, left to SGLang at start (the engine did not "
                    "report what it resolved them to)")


def test_resolved_numbers_engine_config_refuses_stay_sglangs_choice() -> None:
    record = _sweep()[1].model_copy(update={"resolved_params": {"num_steps": 3, "eagle_topk": 1,
                                                                "num_draft_tokens": 5}})
    config, line = served_engine_config(record)
    assert config == AUTO_ENGINE
    assert line is not None and line.startswith(
        "speculative numbers: SGLang's automatic choice, left to SGLang at start: the engine resolved them to steps 3 "
        "topk 1 draft 5, which EngineConfig refuses (speculative_eagle_topk=1 is a chain")
    EngineConfig.model_validate(config)


# --- the table -------------------------------------------------------------------------------------

def test_a_status_that_is_its_own_reason_is_shown_once() -> None:
    records = _sweep() + [_trial(6, "search", "steps=7 topk=1 draft=8", [], status="failed", reason="launch_failed")]
    text = summary_text(records, summary_report(_spec(confirmation=False), records, None),
                        metric="output_tok_per_s", concurrency=LEVEL)
    rows = {line.split()[0]: line.rstrip() for line in text.splitlines() if line.split() and line.split()[0].isdigit()}
    assert rows["3"].endswith("early_stopped") and "(early_stopped)" not in rows["3"], rows["3"]
    assert rows["6"].endswith("failed (launch_failed)"), rows["6"]


# --- the plots -------------------------------------------------------------------------------------

def _searched(count: int, *, vary_nccl: bool) -> list[TrialRecord]:
    """``count`` measured trials over num_steps (and NCCL_ALGO where ``vary_nccl``); all_reduce and
    NCCL_PROTO are never varied."""
    out = []
    for i in range(count):
        params = {"num_steps": 2 + i % 3, "NCCL_ALGO": ("Ring", "Tree")[i % 2] if vary_nccl else "default",
                  "NCCL_PROTO": "default", "all_reduce": "auto", "env.NCCL_ALGO": "x"}
        out.append(_trial(i + 1, "search", f"config {i + 1}", [100.0 + 7 * i, 101.0 + 7 * i, 99.0 + 7 * i],
                          params=params))
    return out


def test_only_varied_parameters_reach_the_plots() -> None:
    from orchestrator.sweep.output.plots import _study, varied_params

    records = _searched(4, vary_nccl=False) + [_trial(9, "search", "failed", [], params={"all_reduce": "other"},
                                                      status="failed", reason="launch_failed")]
    assert varied_params(records) == {"num_steps": ["2", "3", "4"]}, "a failed trial's value is not a variation"
    study = _study(records)
    assert all(set(t.params) == {"num_steps"} for t in study.trials if t.state.name == "COMPLETE")


@pytest.mark.parametrize(("count", "vary_nccl", "why"), [
    (4, False, "only num_steps varied across the 4 measured trial(s); a ranking needs two that did"),
    (4, True, "4 measured trial(s) of NCCL_ALGO, num_steps; a ranking from fewer than 8 is noise"),
])
def test_the_importance_plot_is_skipped_with_a_reason(tmp_path: Path, caplog: pytest.LogCaptureFixture, count: int,
                                                      vary_nccl: bool, why: str) -> None:
    from orchestrator.sweep.output.plots import draw_plots

    with caplog.at_level(logging.INFO, logger="orchestrator.sweep.output.plots"):
        made = draw_plots(_searched(count, vary_nccl=vary_nccl), out_dir=tmp_path, metric="output_tok_per_s",
                          concurrency=LEVEL)
    assert tmp_path / "param_importances.png" not in made
    assert f"plot param_importances skipped: {why}" in caplog.messages
    assert tmp_path / "parallel_coordinate.png" in made


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_the_importance_plot_ranks_only_what_varied(tmp_path: Path) -> None:
    from optuna.importance import get_param_importances

    from orchestrator.sweep.output.plots import IMPORTANCE_MIN_TRIALS, _study, draw_plots

    records = _searched(IMPORTANCE_MIN_TRIALS, vary_nccl=True)
    made = draw_plots(records, out_dir=tmp_path, metric="output_tok_per_s", concurrency=LEVEL)
    assert tmp_path / "param_importances.png" in made
    assert set(get_param_importances(_study(records))) == {"num_steps", "NCCL_ALGO"}


def test_without_any_varied_parameter_no_parallel_coordinates(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    from orchestrator.sweep.output.plots import draw_plots

    records = [r.model_copy(update={"params": {"num_steps": 3}}) for r in _searched(3, vary_nccl=False)]
    with caplog.at_level(logging.INFO, logger="orchestrator.sweep.output.plots"):
        made = draw_plots(records, out_dir=tmp_path, metric="output_tok_per_s", concurrency=LEVEL)
    assert [p.name for p in made if p.name in ("param_importances.png", "parallel_coordinate.png")] == []
    assert ("plot parallel_coordinate skipped: no parameter took two values across the 3 measured trials"
            in caplog.messages)


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_the_history_marks_best_yamls_trial_where_the_search_found_another() -> None:
    from orchestrator.sweep.output.plots import _history, _study

    axes = _history(_study(_sweep()), metric="output_tok_per_s", best_trial=2)
    assert axes.get_title() == "Optimization history (the search's values); best.yaml holds trial 2"
    (mark,) = [c for c in axes.collections if c.get_label() == "best.yaml: trial 2"]
    assert [tuple(p) for p in mark.get_offsets()] == [(2, 340.0)]
    assert "best.yaml: trial 2" in [t.get_text() for t in axes.get_legend().get_texts()]
    plain = _history(_study(_sweep()), metric="output_tok_per_s")
    assert not [c for c in plain.collections if c.get_label().startswith("best.yaml")]


# --- MLflow ----------------------------------------------------------------------------------------

def test_best_yamls_trial_is_tagged_on_its_mlflow_run_and_moves_on_resume(tmp_path: Path) -> None:
    results = tmp_path / "results"
    uri = f"sqlite:///{results / 'mlflow.db'}"

    def coordinator(resume: bool) -> SweepCoordinator:
        return SweepCoordinator(results_dir=str(results), tracking_uri=uri, experiment_name="unit",
                                sweep_name="unit", spec_text="name: unit\n", resume=resume)

    first = coordinator(False)
    records = []
    for number, trial_id in ((1, "a"), (2, "b"), (3, "c")):
        started = first.start_trial({"trial_id": trial_id, "number": 0, "kind": "search", "label": f"trial {number}",
                                     "params": {"num_steps": number}, "status": "running"})
        record = _trial(started["number"], "search", f"trial {number}", [10.0 * number] * 3,
                        params={"num_steps": number}).model_copy(update={"trial_id": trial_id,
                                                                         "mlflow_run_id": started["run_id"]})
        first.finish_trial(record.model_dump())
        records.append(record)
    first.log_sweep(run_tags=best_yaml_run_tags(records, 2))
    first.end_sweep(status="FINISHED")
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("unit")

    def winners() -> list[str]:
        runs = client.search_runs([experiment.experiment_id], filter_string=f"tags.`{TAG_BEST_YAML}` = 'true'")
        return [run.data.tags["spectune.label"] for run in runs]

    assert winners() == ["trial 2"]
    again = coordinator(True)  # a resumed sweep's end chooses another: the mark moves, never two
    again.log_sweep(run_tags=best_yaml_run_tags(records, 3))
    again.end_sweep(status="FINISHED")
    assert winners() == ["trial 3"]
    assert best_yaml_run_tags(records, None) == {r.mlflow_run_id: {TAG_BEST_YAML: "false"} for r in records}
