"""A sweep's tracker against a real ``mlflow server``: with a tracking server the runs' artifacts
go to the server's own store (where its UI and every machine read them), not the writing node's
disk, where a Ray job on Kubernetes would leave them on a pod that is deleted with the cluster."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from orchestrator.tracking import open_tracker
from orchestrator.tracking_server import health_status
from serving.ports import free_port

from helpers.engine import wait_until
from helpers.sweep import seed_results

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory, mlflow_store_template: Path) -> Iterator[dict]:
    work = seed_results(tmp_path_factory.mktemp("mlflow-server"), mlflow_store_template)
    port = free_port()
    log = (work / "server.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{work / 'mlflow.db'}", "--artifacts-destination", str(work / "served")],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=work)
    uri = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        assert proc.poll() is None, (work / "server.log").read_text()[-3000:]
        try:
            return health_status(uri, timeout_s=2) == 200
        except OSError:
            return False

    try:
        wait_until(answers, timeout_s=120, what="mlflow server to answer /health")
        yield {"uri": uri, "work": work}
    finally:
        import os
        import signal

        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:  # a test's server: its graceful drain is not under test
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        log.close()


def test_artifacts_go_to_the_servers_store_not_the_nodes_disk(mlflow_server: dict, tmp_path: Path) -> None:
    local = tmp_path / "results" / "mlartifacts"
    tracker = open_tracker(tracking_uri=mlflow_server["uri"], experiment_name="served-artifacts", artifact_root=local)
    run_id = tracker.start_sweep_run(sweep="s", run_name="sweep s", tags={})
    tracker.log_text(run_id, "engine: reference\n", "spec.yaml")
    tracker.end_run(run_id, status="FINISHED")
    assert not local.exists(), "nothing on the writing node's disk"
    stored = list((mlflow_server["work"] / "served").rglob("spec.yaml"))
    assert len(stored) == 1 and stored[0].read_text() == "engine: reference\n"
    experiment = tracker.client.get_experiment(tracker.experiment_id)
    assert experiment.artifact_location.startswith("mlflow-artifacts:"), experiment.artifact_location
