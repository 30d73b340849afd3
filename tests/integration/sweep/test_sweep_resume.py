"""A sweep whose driver is SIGKILLed resumes to exactly its plan: no finished trial re-runs, no
duplicate MLflow run, the interrupted trial re-run, no engine left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from helpers.engine import processes_with_marker, wait_until
from helpers.ray_cluster import RayCluster
from helpers.sweep import engine_marker, trial_records, write_spec

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1200)]

SPECTUNE = str(Path(sys.executable).with_name("spectune"))
PLANNED = 4


def test_a_killed_sweep_resumes_to_exactly_its_plan(ray_head: RayCluster, tmp_path: Path) -> None:
    marker = engine_marker()
    spec = write_spec(
        tmp_path / "spec.yaml",
        engine={"kind": "reference", "model_path": "ref-tiny", "draft_model_path": "ref-tiny-draft",
                "speculative_algorithm": "EAGLE3", "tp_size": 1, "env": {"SPECTUNE_TEST_MARKER": marker}},
        search={"speculative": {"num_steps": [1, 2, 3], "eagle_topk": [1]}, "nccl_env": {}, "seed": 2,
                "early_stopping": {"enabled": False}},
        budget={"num_trials": PLANNED, "max_concurrent_trials": 1, "trial_timeout_s": 300,
                "engine_start_timeout_s": 120},
    )
    results = tmp_path / "results"
    cluster = ray_head
    with open(tmp_path / "first.log", "wb") as log:
        driver = subprocess.Popen(
            [SPECTUNE, "sweep", str(spec), "--results-dir", str(results), "--address", cluster.address],
            env=cluster.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            wait_until(lambda: len(trial_records(results)) >= 2 or driver.poll() is not None, timeout_s=600,
                       what="two finished trials", poll_s=0.5)
            assert driver.poll() is None, (tmp_path / "first.log").read_text()[-4000:]
        finally:
            os.killpg(driver.pid, signal.SIGKILL)  # the driver dies without a word: no cleanup runs
            driver.wait(timeout=30)
    before = {r["trial_id"]: r for r in trial_records(results)}
    assert len(before) >= 2
    resumed = subprocess.run(
        [SPECTUNE, "sweep", "--resume", str(results), "--address", cluster.address],
        env=cluster.env, capture_output=True, text=True, timeout=900,
    )
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-6000:]
    wait_until(lambda: not processes_with_marker(marker), timeout_s=60, what="no engine of this sweep alive")
    after = trial_records(results)
    final = {r["trial_id"]: r for r in after}
    assert len(final) == PLANNED, sorted((r["number"], r["label"], r["status"]) for r in final.values())
    assert sorted(r["number"] for r in final.values()) == list(range(1, PLANNED + 1))
    for trial_id, record in before.items():
        assert final[trial_id] == record, "a finished trial never runs again"
    assert all(r["status"] == "ok" for r in final.values()), [(r["label"], r["status"], r["reason"]) for r in after]
    client = MlflowClient(tracking_uri=f"sqlite:///{results / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("ci-sweep").experiment_id], max_results=100)
    parents = [r for r in runs if r.data.tags.get("spectune.role") == "sweep"]
    trials = [r for r in runs if r.data.tags.get("spectune.role") == "trial"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert sorted(r.data.tags["spectune.trial_id"] for r in trials) == sorted(final), "one MLflow run per trial"
    assert all(r.info.status == "FINISHED" for r in trials)
    assert (results / "best.yaml").exists()
