"""``spectune sweep --smoke SPEC`` before bed: the night's two baselines through every check (env
audit, engine contract, probe baseline, one repetition at the objective's level), what passed and
the night re-planned; then ``--resume`` of its directory continues into the night without starting
them again: a night of two trials finishes on the smoke's records alone (their records and MLflow
runs are the night's trials 1 and 2; the writer's numbering after them is a unit test,
``test_a_smoke_runs_trials_are_taken_over_and_their_numbers_kept``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.engine import processes_with_marker
from helpers.ray_cluster import RayCluster
from helpers.sweep import all_runs_ended, engine_marker, reference_engine, seed_results, trial_records, write_spec
from serving.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

SPECTUNE = str(Path(sys.executable).with_name("spectune"))


def test_a_smoke_run_checks_the_baselines_and_resumes_into_the_night(
        ray_head: RayCluster, tmp_path: Path, mlflow_store_template: Path) -> None:
    marker = engine_marker()
    spec = write_spec(tmp_path / "spec.yaml", engine=reference_engine(tp_size=1, marker=marker),
                      search={"speculative": {"num_steps": [2, 3], "eagle_topk": [1]}, "nccl_env": {}, "seed": 3,
                              "early_stopping": {"enabled": False}},
                      budget={"num_trials": 2, "max_concurrent_trials": 1, "trial_timeout_s": 300,
                              "engine_start_timeout_s": 120})
    results = seed_results(tmp_path / "results", mlflow_store_template)
    base = [SPECTUNE, "sweep", "--results-dir", str(results), "--address", ray_head.address]
    smoke = subprocess.run([*base, str(spec), "--smoke"], env=ray_head.env, capture_output=True, text=True,
                           timeout=540)
    out = " ".join((smoke.stdout + smoke.stderr).split())
    assert smoke.returncode == 0, out[-4000:]
    records = trial_records(results)
    assert [(r["kind"], r["status"], r["repetitions_done"]) for r in records] == [
        ("baseline_plain", "ok", 1), ("baseline_auto", "ok", 1)], records
    assert "smoke: trial 1 no speculation: passed; env audit passed" in out
    assert "smoke: trial 2 SGLang auto (= steps 3 topk 1 draft 4): passed" in out and "engine start" in out
    assert "night: " in out and f"spectune sweep --resume {results}" in out
    assert json.loads((results / "smoke.json").read_text())["state"] == "done"
    assert not (results / "best.yaml").exists()  # a smoke run chooses nothing
    smoked = [r["trial_id"] for r in records]

    night = subprocess.run([*base, "--resume", str(results)], env=ray_head.env, capture_output=True, text=True,
                           timeout=540)
    out = " ".join((night.stdout + night.stderr).split())
    assert night.returncode in (0, 1), out[-4000:]
    records = trial_records(results)
    assert [(r["number"], r["trial_id"]) for r in records] == [(1, smoked[0]), (2, smoked[1])], records  # not re-run
    assert records[0]["repetitions_done"] == 1
    assert json.loads((results / "summary.json").read_text())["best_trial"] in (1, 2)
    assert json.loads((results / "smoke.json").read_text())["state"] == \
        "continued"
    assert all_runs_ended(results)
    wait_until(lambda: not processes_with_marker(marker), timeout_s=60, what="no engine of the sweep alive")
