"""``spectune serve --mlflow-run``'s reading side, against a real MLflow SQLite store written by the
sweep's coordinator: a trial's run gives back its engine config and provenance, a sweep's run its
best.yaml; a run not there, a run with no config and a store that is not there are clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.sweep.execution.coordinator import SweepCoordinator
from orchestrator.sweep.records.results import TrialRecord, trial_provenance, write_best_yaml
from orchestrator.tracking import RunConfigError, recorded_config, tag_served
from serving.engine.config import EngineConfig
from serving.serve.options import parse_served

ENGINE = EngineConfig.model_validate({
    "kind": "reference", "model_path": "ref-tiny", "tp_size": 1, "speculative_algorithm": "EAGLE3",
    "speculative_draft_model_path": "ref-tiny-draft", "speculative_num_steps": 2, "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 3,
}).model_dump()


def _sweep(results: Path) -> tuple[SweepCoordinator, str, str]:
    """A sweep with one finished trial; returns the coordinator, the tracking URI, the trial's run id."""
    uri = f"sqlite:///{results / 'mlflow.db'}"
    coordinator = SweepCoordinator(results_dir=str(results), tracking_uri=uri, experiment_name="unit",
                                   sweep_name="unit-sweep", spec_text="name: unit-sweep\n")
    got = coordinator.start_trial({"trial_id": "a", "number": 0, "kind": "search", "label": "steps=2",
                                   "params": {"num_steps": 2}, "status": "running", "engine_config": ENGINE,
                                   "engine_command": "python -m serving.reference ..."})
    coordinator.finish_trial({
        "trial_id": "a", "number": got["number"], "kind": "search", "label": "steps=2", "params": {"num_steps": 2},
        "status": "ok", "objective": {"metric": "output_tok_per_s", "concurrency": 4, "direction": "max",
                                      "values": [10.0, 11.0, 12.0], "median": 11.0, "ci95_low": 9.5,
                                      "ci95_high": 12.5},
        "repetitions_done": 3, "repetitions_planned": 3, "measured_in_full": True, "engine_config": ENGINE,
    })
    return coordinator, uri, got["run_id"]


def test_a_trial_run_gives_back_its_engine_config_and_provenance(results_dir: Path) -> None:
    _, uri, run_id = _sweep(results_dir)
    recorded = recorded_config(tracking_uri=uri, run_id=run_id)
    engine, _, _ = parse_served(recorded.text, source=recorded.source)
    assert engine.model_dump() == ENGINE
    prov = recorded.provenance
    assert (prov["sweep"], prov["trial"], prov["trial_label"], prov["mlflow_run_id"], prov["experiment"]) == (
        "unit-sweep", 1, "steps=2", run_id, "unit")
    assert prov["objective"] == {"metric": "output_tok_per_s", "concurrency": 4, "median": 11.0, "ci95_low": 9.5,
                                 "ci95_high": 12.5, "repetitions": 3}
    tag_served(tracking_uri=uri, run_id=run_id, tags={"spectune.served_by": "host:1"})
    from mlflow.tracking import MlflowClient

    assert MlflowClient(tracking_uri=uri).get_run(run_id).data.tags["spectune.served_by"] == "host:1"


def test_a_sweep_run_gives_back_its_best_yaml(results_dir: Path) -> None:
    results = results_dir
    coordinator, uri, run_id = _sweep(results)
    record = TrialRecord.model_validate(coordinator.records()[0])
    best = write_best_yaml(results / "best.yaml", engine_config=ENGINE, header_lines=["best"], provenance=(
        trial_provenance(record, sweep="unit-sweep", parent_run_id=coordinator.parent_run_id, tracking_uri=uri,
                         experiment="unit", verdict=None, written_at="2026-01-01T00:00:00+00:00")))
    coordinator.log_sweep(files=[str(best)])
    recorded = recorded_config(tracking_uri=uri, run_id=coordinator.parent_run_id)
    engine, _, prov = parse_served(recorded.text)
    assert engine.model_dump() == ENGINE and prov.mlflow_run_id == run_id and prov.trial == 1
    assert recorded.provenance["mlflow_run_id"] == run_id
    assert recorded.provenance["parent_run_id"] == coordinator.parent_run_id


def test_unknown_run_no_config_and_unreachable_store_are_clear_errors(tmp_path: Path, results_dir: Path) -> None:
    coordinator, uri, _ = _sweep(results_dir)
    with pytest.raises(RunConfigError, match=r"run 0123abcd not found at sqlite:///"):
        recorded_config(tracking_uri=uri, run_id="0123abcd")
    # The sweep's run before its best.yaml exists: no configuration recorded on it.
    with pytest.raises(RunConfigError, match=rf"run {coordinator.parent_run_id} at .* records no configuration"):
        recorded_config(tracking_uri=uri, run_id=coordinator.parent_run_id)
    missing = tmp_path / "elsewhere" / "mlflow.db"
    with pytest.raises(RunConfigError, match="unreachable: no SQLite file"):
        recorded_config(tracking_uri=f"sqlite:///{missing}", run_id="0123abcd")
    assert not missing.exists(), "an unreachable SQLite store must not be created"
    result = CliRunner().invoke(app, ["serve", "--mlflow-run", "0123abcd", "--tracking-uri", uri])
    assert result.exit_code == 2 and "0123abcd" in result.output and "not found" in result.output, result.output
