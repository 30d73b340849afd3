"""A night that would repeat itself stops, with the morning files: every speculative start of this
sweep fails the same way (the reference engine's ``crash_on_start@speculative``: an out-of-memory at
draft CUDA-graph capture), so after budget.max_same_failures such trials the search stops with a
diagnosis. Its engines also leave out ``disable_custom_all_reduce`` from /server_info, which only the
all-reduce observation reads: a blind reader, so the night goes on, flagged in the summary and MLflow."""

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


def test_a_failure_on_every_speculative_start_stops_the_search_after_k(
        ray_head: RayCluster, tmp_path: Path, mlflow_store_template: Path) -> None:
    marker = engine_marker()
    spec = write_spec(
        tmp_path / "spec.yaml",
        engine=reference_engine(tp_size=2, marker=marker,
                                SPECTUNE_REFERENCE_FAULT="crash_on_start@speculative;drop_field:disable_custom_all_reduce"),
        search={"speculative": {"num_steps": [2, 3, 4], "eagle_topk": [1]}, "nccl_env": {}, "seed": 3,
                "early_stopping": {"enabled": False}},
        benchmark={"repetitions": 1},  # the plain baseline measures once: the stop is what is tested
        budget={"num_trials": 6, "max_concurrent_trials": 1, "trial_timeout_s": 300, "engine_start_timeout_s": 120,
                "max_same_failures": 2},
    )
    results = seed_results(tmp_path / "results", mlflow_store_template)
    proc = subprocess.run([SPECTUNE, "sweep", str(spec), "--results-dir", str(results), "--address", ray_head.address],
                          env=ray_head.env, capture_output=True, text=True, timeout=540)
    out = " ".join((proc.stdout + proc.stderr).split())  # rich may wrap lines
    assert proc.returncode == 1, out[-4000:]
    records = trial_records(results)
    failed = [r for r in records if r["status"] == "failed"]
    assert len(records) == 3 and len(failed) == 2, out[-4000:]  # the plain baseline, then two same failures
    assert all(r["reason"] == "launch_failed" and "out of memory" in r["message"] for r in failed), failed
    assert "search stopped: 2 trials failed the same way (2, 3; budget.max_same_failures 2): launch_failed" in out
    (plain,) = [r for r in records if r["kind"] == "baseline_plain"]
    assert plain["status"] == "ok" and plain["blind_readers"][0].startswith("/server_info disable_custom_all_reduce")
    summary = json.loads((results / "summary.json").read_text())  # the morning files, with the diagnosis
    assert summary["stopped"].startswith("2 trials failed the same way")
    assert any(line.startswith("warning: blind reader: /server_info disable_custom_all_reduce") for line in
               summary["lines"])
    assert (results / "summary.txt").exists() and (results / "best.yaml").exists()
    assert all_runs_ended(results)
    wait_until(lambda: not processes_with_marker(marker), timeout_s=60, what="no engine of the stopped sweep alive")
