"""A sweep stopped as ``ray job stop`` stops it (SIGTERM) ends every MLflow run and says how to
resume; resumed, then SIGKILLed (no cleanup at all), then resumed again, it ends at exactly its
plan: no finished trial re-runs, one MLflow run per trial, the interrupted trials re-run, no engine
left behind. One sweep carries both stops (each stop costs a driver start, not a sweep)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
from mlflow.tracking import MlflowClient

from helpers.engine import processes_with_marker, wait_until
from helpers.ray_cluster import RayCluster
from helpers.sweep import all_runs_ended, engine_marker, reference_engine, trial_records, write_spec

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1200)]

SPECTUNE = str(Path(sys.executable).with_name("spectune"))
PLANNED = 4


def _has_trial_run(results: Path, number: int) -> bool:
    """The sweep's MLflow store holds the run of trial ``number`` (``trial 002 ...``)."""
    db = results / "mlflow.db"
    if not db.exists():
        return False
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    experiment = client.get_experiment_by_name("ci-sweep")
    if experiment is None:
        return False
    return bool(client.search_runs([experiment.experiment_id],
                                   filter_string=f"tags.`mlflow.runName` LIKE 'trial {number:03d} %'"))


def _run_until(argv: list[str], log: Path, *, env: dict[str, str], until: Callable[[], bool], stop: signal.Signals) -> str:
    """Run the driver until ``until()`` holds, then send ``stop`` to it (its process group for SIGKILL:
    the driver dies without a word); returns its log."""
    with open(log, "wb") as out:
        driver = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_until(lambda: driver.poll() is not None or until(), timeout_s=600, what=f"the moment to send {stop.name}",
                       poll_s=0.5)
            assert driver.poll() is None, log.read_text()[-4000:]
            if stop == signal.SIGKILL:
                os.killpg(driver.pid, signal.SIGKILL)
            else:
                driver.send_signal(stop)  # what `ray job stop` sends the entrypoint
            driver.wait(timeout=120)
        finally:
            if driver.poll() is None:
                os.killpg(driver.pid, signal.SIGKILL)
                driver.wait(timeout=30)
    assert driver.returncode != 0
    return log.read_text()


def test_a_stopped_then_killed_sweep_resumes_to_exactly_its_plan(ray_head: RayCluster, tmp_path: Path) -> None:
    marker = engine_marker()
    spec = write_spec(
        tmp_path / "spec.yaml",
        engine=reference_engine(tp_size=1, marker=marker),
        search={"speculative": {"num_steps": [1, 2, 3], "eagle_topk": [1]}, "nccl_env": {}, "seed": 2,
                "early_stopping": {"enabled": False}},
        budget={"num_trials": PLANNED, "max_concurrent_trials": 1, "trial_timeout_s": 300,
                "engine_start_timeout_s": 120},
    )
    results = tmp_path / "results"
    first = [SPECTUNE, "sweep", str(spec), "--results-dir", str(results), "--address", ray_head.address]
    resume = [SPECTUNE, "sweep", "--resume", str(results), "--address", ray_head.address]
    client = MlflowClient(tracking_uri=f"sqlite:///{results / 'mlflow.db'}")

    # 1. SIGTERM once trial 2 is open (its MLflow run exists): every run ends, trial 2 is interrupted.
    text = _run_until(first, tmp_path / "first.log", env=ray_head.env, stop=signal.SIGTERM,
                      until=lambda: "[trial 2/4] start" in (tmp_path / "first.log").read_text()
                      and _has_trial_run(results, 2))
    assert "spectune sweep --resume" in text, text[-4000:]
    assert all_runs_ended(results), text[-4000:]
    runs = client.search_runs([client.get_experiment_by_name("ci-sweep").experiment_id], max_results=100)
    (parent,) = [r for r in runs if r.data.tags.get("spectune.role") == "sweep"]
    assert parent.info.status == "KILLED"
    interrupted = [r for r in trial_records(results) if r["status"] == "interrupted"]
    assert interrupted and interrupted[0]["number"] == 2, trial_records(results)
    wait_until(lambda: not processes_with_marker(marker), timeout_s=60, what="no engine of the stopped sweep alive")

    # 2. Resumed, then SIGKILLed once three trials are finished: no cleanup runs.
    _run_until(resume, tmp_path / "second.log", env=ray_head.env, stop=signal.SIGKILL,
               until=lambda: sum(r["status"] == "ok" for r in trial_records(results)) >= 3)
    before = {r["trial_id"]: r for r in trial_records(results) if r["status"] == "ok"}
    assert len(before) >= 3

    # 3. Resumed again: it ends at exactly its plan.
    resumed = subprocess.run(resume, env=ray_head.env, capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-6000:]
    wait_until(lambda: not processes_with_marker(marker), timeout_s=60, what="no engine of this sweep alive")
    final = {r["trial_id"]: r for r in trial_records(results)}
    assert len(final) == PLANNED, sorted((r["number"], r["label"], r["status"]) for r in final.values())
    assert sorted(r["number"] for r in final.values()) == list(range(1, PLANNED + 1))
    for trial_id, record in before.items():
        assert final[trial_id] == record, "a finished trial never runs again"
    assert all(r["status"] == "ok" for r in final.values()), [(r["label"], r["status"], r["reason"])
                                                              for r in final.values()]
    runs = client.search_runs([client.get_experiment_by_name("ci-sweep").experiment_id], max_results=100)
    parents = [r for r in runs if r.data.tags.get("spectune.role") == "sweep"]
    trials = [r for r in runs if r.data.tags.get("spectune.role") == "trial"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert sorted(r.data.tags["spectune.trial_id"] for r in trials) == sorted(final), "one MLflow run per trial"
    assert all(r.info.status == "FINISHED" for r in trials)
    assert (results / "best.yaml").exists()
