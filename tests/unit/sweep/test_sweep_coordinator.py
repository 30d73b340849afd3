"""The sweep's single writer, without Ray: MLflow runs, trials.jsonl, the baseline, resume.

A trial's record reaches the writer one way: ``start_trial`` with the record it starts with, then
each report's record (``update_trial``, from Tune's results) and the last one (``finish_trial``);
``end_running`` records a trial that ended without its last report from the one it reported before.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from orchestrator.spec import SweepSpec
from orchestrator.sweep.output.spec_summary import sweep_params
from orchestrator.sweep.execution.coordinator import SweepCoordinator
from orchestrator.sweep.execution.finish import sweep_tags
from orchestrator.sweep.records.results import read_records

from helpers.spec_cases import BASE


@pytest.fixture
def results(results_dir: Path) -> Path:
    return results_dir


def _coordinator(results: Path, *, resume: bool = False) -> SweepCoordinator:
    return SweepCoordinator(results_dir=str(results), tracking_uri=f"sqlite:///{results / 'mlflow.db'}",
                            experiment_name="unit", sweep_name="unit", spec_text="name: unit\n", resume=resume)


def _runs(results: Path) -> list:
    client = MlflowClient(tracking_uri=f"sqlite:///{results / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("unit")
    return client.search_runs([experiment.experiment_id], max_results=100)


def _start(trial_id: str, *, label: str = "steps=3", params: dict | None = None, kind: str = "search",
           **fields) -> dict:
    """A trial's record as it starts (status running)."""
    return {"trial_id": trial_id, "number": 0, "kind": kind, "label": label,
            "params": {"num_steps": 3} if params is None else params, "status": "running",
            "engine_command": "python -m serving.reference ...", **fields}


def _record(trial_id: str, number: int, run_id: str) -> dict:
    return {"trial_id": trial_id, "number": number, "kind": "search", "label": "steps=3", "params": {"num_steps": 3},
            "status": "ok", "objective": {"metric": "output_tok_per_s", "concurrency": 4, "direction": "max",
                                          "values": [10.0, 11.0], "median": 10.5},
            "repetitions_done": 2, "repetitions_planned": 2, "measured_in_full": True, "mlflow_run_id": run_id,
            "node_id": "n1", "cuda_visible_devices": "0"}


def test_a_trial_is_one_nested_run_and_one_line(results: Path) -> None:
    coordinator = _coordinator(results)
    got = coordinator.start_trial(_start("a", params={"num_steps": 3, "NCCL_ALGO": "default"}))
    assert got["number"] == 1 and got["finished"] is None
    coordinator.update_trial(_start("a", node_id="n1"), step=0,
                             metrics={"c4.output_tok_per_s": 10.0, "c4.accept_length": None})
    coordinator.update_trial(_start("a", node_id="n1"), step=1, metrics={"c4.output_tok_per_s": 11.0})
    coordinator.finish_trial(_record("a", 1, got["run_id"]))
    (parent,) = [r for r in _runs(results) if r.data.tags["spectune.role"] == "sweep"]
    (child,) = [r for r in _runs(results) if r.data.tags["spectune.role"] == "trial"]
    assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert child.data.params["NCCL_ALGO"] == "default" and child.info.status == "FINISHED"
    assert child.data.tags["spectune.early_stopped"] == "false"
    history = MlflowClient(tracking_uri=f"sqlite:///{results / 'mlflow.db'}").get_metric_history(
        child.info.run_id, "c4.output_tok_per_s")
    assert sorted((m.step, m.value) for m in history) == [(0, 10.0), (1, 11.0)]
    assert "c4.accept_length" not in child.data.metrics, "an absent value is never logged as a number"
    (record,) = read_records(results / "trials.jsonl")
    assert record.trial_id == "a" and record.mlflow_run_id == child.info.run_id


def test_a_stopped_trial_keeps_what_it_reported(results: Path) -> None:
    coordinator = _coordinator(results)
    run = coordinator.start_trial(_start("b", label="steps=1", params={}, repetitions_planned=3))
    objective = {"metric": "output_tok_per_s", "concurrency": 4, "direction": "max", "values": [5.0], "median": 5.0}
    coordinator.update_trial(_start("b", label="steps=1", params={}, repetitions_planned=3, node_id="n2",
                                    cuda_visible_devices="0", audit_ok=True, objective=objective,
                                    engine_nodes=[{"node_rank": 0, "node_id": "n2", "pid": 4242}]), step=0)
    (child,) = [r for r in _runs(results) if r.info.run_id == run["run_id"]]
    assert (child.data.tags["spectune.node_id"], child.data.tags["spectune.engine_pid"]) == ("n2", "4242"), \
        "a running trial's MLflow run shows where it runs"
    assert child.info.status == "RUNNING" and not (results / "trials.jsonl").exists()
    assert coordinator.end_running(trial_id="b", status="early_stopped", reason="early_stopped", message="ASHA")
    (record,) = read_records(results / "trials.jsonl")
    assert (record.status, record.node_id, record.cuda_visible_devices, record.audit_ok) == (
        "early_stopped", "n2", "0", True)
    assert record.objective.values == [5.0] and record.repetitions_done == 1 and not record.complete
    assert (record.number, record.mlflow_run_id, record.repetitions_planned) == (1, run["run_id"], 3)
    (child,) = [r for r in _runs(results) if r.info.run_id == run["run_id"]]
    assert child.data.tags["spectune.cuda_visible_devices"] == "0"
    assert child.info.status == "FINISHED", "early stopping is not a crash: no red KILLED in the MLflow UI"
    assert (child.data.tags["spectune.early_stopped"], child.data.tags["spectune.status"]) == ("true", "early_stopped")
    assert not coordinator.end_running(trial_id="b", status="failed", reason="error", message="again")
    coordinator.finish_trial(record.model_dump())  # its final report, late: the record written stays
    assert len((results / "trials.jsonl").read_text().splitlines()) == 1


def test_the_parent_run_holds_the_specs_settings_and_the_verdict(results: Path) -> None:
    spec = SweepSpec.model_validate({**BASE, "objective": {"metric": "output_tok_per_s", "concurrency": 16},
                                     "benchmark": {"concurrency": [1, 16]}, "budget": {"num_trials": 12}})
    first = _coordinator(results)
    first.log_sweep(params=sweep_params(spec))
    report = {"best_trial": 4, "best_label": "steps=3 topk=1 draft=4",
              "verdict": {"vs_sglang_default": {"kind": "better", "ratio": 1.061234, "ci95_low": 1.02}}}
    first.log_sweep(tags=sweep_tags(report))
    first.end_sweep(status="FINISHED")
    again = _coordinator(results, resume=True)  # a resumed sweep logs its params again: the same, no error
    again.log_sweep(params=sweep_params(spec))
    again.end_sweep(status="FINISHED")
    (parent,) = [r for r in _runs(results) if r.data.tags["spectune.role"] == "sweep"]
    params = parent.data.params
    assert {k: params[k] for k in ("sweep.name", "engine.kind", "engine.model_path", "engine.draft_model_path",
                                   "objective.metric", "objective.concurrency", "budget.num_trials")} == {
        "sweep.name": "t", "engine.kind": "sglang", "engine.model_path": "org/model",
        "engine.draft_model_path": "org/draft", "objective.metric": "output_tok_per_s",
        "objective.concurrency": "16", "budget.num_trials": "12"}
    assert "NCCL_ALGO: default, Ring" in params["search.dimensions"]
    assert int(params["search.valid_configurations"]) > 1
    tags = parent.data.tags
    assert (tags["spectune.verdict"], tags["spectune.verdict_ratio"], tags["spectune.best_trial"]) == ("better", "1.061", "4")


def test_an_undecided_verdict_without_a_ratio_tags_only_its_kind() -> None:
    tags = sweep_tags({"best_trial": 2, "best_label": "SGLang auto",
                       "verdict": {"vs_sglang_default": {"kind": "undecided", "ratio": None}}})
    assert tags["spectune.verdict"] == "undecided" and "spectune.verdict_ratio" not in tags
    assert "spectune.verdict" not in sweep_tags({"best_trial": 2, "best_label": "x", "verdict": None})


def test_resume_continues_the_parent_and_never_duplicates_a_run(results: Path) -> None:
    first = _coordinator(results)
    done = first.start_trial(_start("a", label="x", params={}))
    first.finish_trial(_record("a", 1, done["run_id"]))
    first.start_trial(_start("b", label="y", params={}))  # killed mid-trial
    again = _coordinator(results, resume=True)
    assert again.parent_run_id == first.parent_run_id
    assert again.start_trial(_start("a", label="x", params={}))["finished"]
    rerun = again.start_trial(_start("b", label="y", params={}))
    assert rerun["number"] == 2
    trials = [r for r in _runs(results) if r.data.tags["spectune.role"] == "trial"]
    assert sorted(r.data.tags["spectune.trial_id"] for r in trials) == ["a", "b"]


def test_the_baseline_is_kept_or_its_failure_told(results: Path) -> None:
    coordinator = _coordinator(results)
    assert coordinator.get_baseline() == {}
    coordinator.baseline_failed("launch_failed: boom")
    assert coordinator.get_baseline() == {"failed": "launch_failed: boom"}
    coordinator.put_baseline('{"outputs": []}')
    assert coordinator.get_baseline() == {"text": '{"outputs": []}'}


def test_confirmation_visits_survive_the_driver_and_a_torn_line(results: Path) -> None:
    coordinator = _coordinator(results)
    visits = [{"trial": 3, "round": 0, "values": [10.0], "value": 10.0, "status": "ok", "reason": None, "message": ""},
              {"trial": 2, "round": 0, "values": [], "value": None, "status": "failed", "reason": "engine_died",
               "message": "boom"}]
    for visit in visits:
        coordinator.record_visit(visit)
    with open(results / "confirmation.jsonl", "a", encoding="utf-8") as handle:
        handle.write('{"trial": 1, "rou')  # killed mid-write
    assert _coordinator(results, resume=True).confirmation_visits() == visits


def test_ending_the_sweep_ends_every_run_it_left_open(results: Path) -> None:
    coordinator = _coordinator(results)
    coordinator.start_trial(_start("a", engine_config={"kind": "reference"}))
    coordinator.update_trial(_start("a", engine_config={"kind": "reference"},
                                    resolved_params={"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}))
    # an earlier driver's trial run, still RUNNING, that this driver never took over
    stale = coordinator.tracker.trial_run(parent_run_id=coordinator.parent_run_id, sweep="unit", trial_id="old",
                                          run_name="trial old", params={}, tags={})
    coordinator.end_sweep(status="KILLED")
    runs = {r.info.run_id: r for r in _runs(results)}
    assert all(r.info.status in ("FINISHED", "FAILED", "KILLED") for r in runs.values())
    assert runs[stale["run_id"]].info.status == "KILLED"
    (record,) = read_records(results / "trials.jsonl")
    assert (record.status, record.reason) == ("interrupted", "interrupted")
    assert record.resolved_params == {"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}
    assert record.engine_config == {"kind": "reference"}, "an interrupted trial's record is what ran"


def test_a_trial_the_killed_drivers_tune_never_saved_continues_its_mlflow_run(results: Path) -> None:
    """SIGKILL: trial "a" had its MLflow run, but Tune's saved state never held it, so the resumed
    sweep starts the same configuration as trial "b": one run, continued, never a second."""
    first = _coordinator(results)
    got = first.start_trial(_start("a", params={"num_steps": 3, "NCCL_ALGO": None}))
    del first  # killed: nothing ended, nothing recorded
    resumed = _coordinator(results, resume=True)
    other = resumed.start_trial(_start("c", label="steps=2", params={"num_steps": 2, "NCCL_ALGO": None}))
    again = resumed.start_trial(_start("b", params={"num_steps": 3, "NCCL_ALGO": None}))
    assert again["run_id"] == got["run_id"] and other["run_id"] != got["run_id"]
    trials = [r for r in _runs(results) if r.data.tags["spectune.role"] == "trial"]
    assert sorted(r.data.tags["spectune.trial_id"] for r in trials) == ["b", "c"]


def test_a_run_killed_before_its_params_were_logged_is_continued_by_its_kind_and_label(results: Path) -> None:
    """SIGKILL between MLflow's create_run and the params' log_batch (seen in CI): the lost run has its
    creation tags only, so the rerun is matched by kind and label instead, never given a second run."""
    first = _coordinator(results)
    got = first.start_trial(_start("a", params={"num_steps": 3}))
    client = MlflowClient(tracking_uri=f"sqlite:///{results / 'mlflow.db'}")
    made = client.get_run(got["run_id"])  # a second trial's run as create_run left it: tags, no params
    creation = {k: v for k, v in made.data.tags.items() if k in (
        "mlflow.parentRunId", "spectune.sweep", "spectune.role", "spectune.kind")}
    lost = client.create_run(made.info.experiment_id, run_name="trial 002 steps=2",
                             tags={**creation, "spectune.trial_id": "lost", "spectune.label": "steps=2"})
    del first
    resumed = _coordinator(results, resume=True)
    again = resumed.start_trial(_start("b", label="steps=2", params={"num_steps": 2}))
    assert again["run_id"] == lost.info.run_id
    assert client.get_run(lost.info.run_id).data.params["num_steps"] == "2"  # its params logged now
    trial_ids = sorted(r.data.tags["spectune.trial_id"] for r in _runs(results) if r.data.tags["spectune.role"] == "trial")
    assert trial_ids == ["a", "b"]


def test_the_auto_baselines_run_is_renamed_for_what_sglang_chose_and_gets_its_resolved_params(results: Path) -> None:
    coordinator = _coordinator(results)
    run = coordinator.start_trial(_start("auto", kind="baseline_auto", label="SGLang auto", params={}))
    resolved = {"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}
    coordinator.update_trial(_start("auto", kind="baseline_auto", label="SGLang auto (= steps 3 topk 1 draft 4)",
                                    params={}, resolved_params=resolved, all_reduce_kernel="nccl"))
    (child,) = [r for r in _runs(results) if r.info.run_id == run["run_id"]]
    assert child.data.tags["mlflow.runName"] == "trial 001 SGLang auto (= steps 3 topk 1 draft 4)"
    assert child.data.tags["spectune.all_reduce_kernel"] == "nccl"
    assert {child.data.params[f"resolved.{k}"] for k in resolved} == {"3", "1", "4"}
    assert child.data.params["resolved.all_reduce_kernel"] == "nccl"


def test_a_trial_asks_the_writer_only_for_its_start_its_artifacts_and_the_baseline() -> None:
    """Results flow one way: a trial's record reaches the writer through Ray Tune's results (the
    driver's callback), so the trial itself calls no writer method that records or tags it."""
    import ast

    import orchestrator.sweep.execution.trial as trial

    tree = ast.parse(Path(trial.__file__).read_text(encoding="utf-8"))
    called = {node.value.attr for node in ast.walk(tree)
              if isinstance(node, ast.Attribute) and node.attr == "remote" and isinstance(node.value, ast.Attribute)}
    # write_diagnostics: a contract stop's bundle of what the engine answered, files in the results directory
    assert called == {"start_trial", "log_artifacts", "put_baseline", "get_baseline", "baseline_failed",
                      "write_diagnostics"}


def test_a_smoke_runs_trials_are_taken_over_and_their_numbers_kept(results: Path) -> None:
    """``spectune sweep --resume`` of a smoke run: the night's first proposals of the smoke's kinds and
    parameters take over its ok records (not started again), and the numbers the callback reserved for
    them at their start go back, so the next trial is 3 (``orchestrator.sweep.execution.smoke``)."""
    smoke = _coordinator(results)
    for number, (trial_id, kind) in enumerate((("p", "baseline_plain"), ("a", "baseline_auto")), start=1):
        run = smoke.start_trial(_start(trial_id, kind=kind, params={"all_reduce": "default"}))
        smoke.finish_trial({**_record(trial_id, number, run["run_id"]), "kind": kind, "params": {"all_reduce": "default"}})
    night = SweepCoordinator(results_dir=str(results), tracking_uri=f"sqlite:///{results / 'mlflow.db'}",
                             experiment_name="unit", sweep_name="unit", spec_text="name: unit\n", resume=True,
                             adopt_ended=True)
    assert [night.reserve_number(trial_id=t) for t in ("p2", "a2")] == [3, 4]  # Tune's callback, at their start
    plain = night.start_trial(_start("p2", kind="baseline_plain", params={"all_reduce": "default"}))
    auto = night.start_trial(_start("a2", kind="baseline_auto", params={"all_reduce": "default"}))
    assert (plain["finished"]["trial_id"], plain["number"]) == ("p", 1)
    assert (auto["finished"]["trial_id"], auto["number"]) == ("a", 2)
    assert night.reserve_number(trial_id="next") == 3
    again = night.start_trial(_start("p3", kind="baseline_plain", params={"all_reduce": "default"}))
    assert again["finished"] is None  # each smoke record is taken over once
