"""Where a sweep's MLflow runs go: ``--tracking-uri``, the spec, ``$MLFLOW_TRACKING_URI`` (how a
Ray job on Kubernetes names the cluster's server), a SQLite file; a resumed sweep keeps its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.spec import SweepSpec
from orchestrator.sweep.records.results import STATE_FILE
from orchestrator.sweep.execution.driver import SweepResumeError, resolve_tracking_uri

REPO = Path(__file__).resolve().parents[3]
SERVER = "http://mlflow.spectune.svc:5000"


def _spec(mlflow_uri: str | None = None) -> SweepSpec:
    spec = SweepSpec.from_yaml(REPO / "experiments" / "reference-cpu.yaml")
    return spec.model_copy(update={"tracking": spec.tracking.model_copy(update={"mlflow_uri": mlflow_uri})})


def test_the_flag_then_the_spec_then_the_environment_then_sqlite(tmp_path: Path) -> None:
    out = tmp_path / "results"
    env = {"MLFLOW_TRACKING_URI": SERVER}
    assert resolve_tracking_uri(_spec("sqlite:///x.db"), out, given="http://other:5000", resume=False,
                                environ=env) == ("http://other:5000", "--tracking-uri")
    assert resolve_tracking_uri(_spec("sqlite:////abs/x.db"), out, given=None, resume=False,
                                environ=env) == ("sqlite:////abs/x.db", "tracking.mlflow_uri")
    assert resolve_tracking_uri(_spec(), out, given=None, resume=False, environ=env) == (
        SERVER, "$MLFLOW_TRACKING_URI")
    uri, where = resolve_tracking_uri(_spec(), out, given=None, resume=False, environ={})
    assert uri == f"sqlite:///{out / 'mlflow.db'}" and "SQLite file" in where


def test_a_resumed_sweep_keeps_the_store_its_parent_run_is_in(tmp_path: Path) -> None:
    out = tmp_path / "results"
    out.mkdir()
    (out / STATE_FILE).write_text(json.dumps({"parent_run_id": "abc", "tracking_uri": SERVER}))
    env = {"MLFLOW_TRACKING_URI": "http://elsewhere:5000"}
    assert resolve_tracking_uri(_spec(), out, given=None, resume=True, environ=env) == (
        SERVER, "the resumed sweep's store")
    assert resolve_tracking_uri(_spec(), out, given=SERVER, resume=True, environ=env)[0] == SERVER
    with pytest.raises(SweepResumeError, match="started with http://mlflow.spectune.svc:5000"):
        resolve_tracking_uri(_spec(), out, given="http://elsewhere:5000", resume=True, environ=env)


def test_opening_a_tracker_leaves_the_process_environment_alone(tmp_path: Path, monkeypatch) -> None:
    """mlflow.set_tracking_uri exports MLFLOW_TRACKING_URI to every later subprocess, where a sweep
    would read it as the user's choice (seen: a serve test's store captured a later sweep's runs)."""
    from orchestrator.tracking import open_tracker

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    tracker = open_tracker(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", experiment_name="e",
                           artifact_root=tmp_path / "mlartifacts")
    run_id = tracker.start_sweep_run(sweep="s", run_name="sweep s", tags={})
    tracker.log_text(run_id, "x\n", "spec.yaml")  # its artifact repository needs no global URI
    assert (tmp_path / "mlartifacts").exists()
    import os

    assert "MLFLOW_TRACKING_URI" not in os.environ
