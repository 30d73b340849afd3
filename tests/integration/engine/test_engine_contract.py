"""A sweep whose engine does not answer what a measurement needs stops at its first start (exit 2),
naming the field and what the engine sent, with the morning files and a diagnostic bundle, instead of
measuring a night of nothing. Here the field is a speculative one, so the first start that breaks it
is the first speculative engine.

The reference engine's ``drop_field`` fault leaves ``meta_info.spec_verify_ct`` out of every answer,
as an SGLang that renamed it would: the speculative trial's engine contract fails, and the stopper
ends the sweep there."""

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


def test_an_engine_that_drops_a_relied_on_field_stops_the_sweep_at_its_first_start(
        ray_head: RayCluster, tmp_path: Path, mlflow_store_template: Path) -> None:
    marker = engine_marker()
    spec = write_spec(
        tmp_path / "spec.yaml",
        engine=reference_engine(tp_size=2, marker=marker, SPECTUNE_REFERENCE_FAULT="drop_field:spec_verify_ct"),
        search={"speculative": {"num_steps": [2, 3], "eagle_topk": [1]}, "nccl_env": {}, "seed": 3,
                "early_stopping": {"enabled": False}},
        budget={"num_trials": 4, "max_concurrent_trials": 2, "trial_timeout_s": 300, "engine_start_timeout_s": 120},
    )
    results = seed_results(tmp_path / "results", mlflow_store_template)
    proc = subprocess.run([SPECTUNE, "sweep", str(spec), "--results-dir", str(results), "--address", ray_head.address],
                          env=ray_head.env, capture_output=True, text=True, timeout=540)
    out = " ".join((proc.stdout + proc.stderr).split())  # rich may wrap lines
    assert proc.returncode == 2, out[-4000:]
    assert "sweep stopped: the engine does not answer what a measurement needs" in out, out[-4000:]
    assert "/generate meta_info.spec_verify_ct: expected a positive integer (verify cycles), got absent" in out
    # the first speculative engine (it starts once the no-speculation trial wrote the probe's baseline)
    # broke the contract; a trial that started meanwhile was stopped, none started after
    records = trial_records(results)
    (plain,) = [r for r in records if r["kind"] == "baseline_plain"]
    # it answered every field asked of it (it never speculates); still benchmarking when the first speculative
    # engine broke the contract (that engine starts once the probe's baseline is written), it was stopped
    assert plain["reason"] != "engine_contract" and plain["status"] in ("ok", "interrupted"), plain
    (broken,) = [r for r in records if r["reason"] == "engine_contract"]
    assert broken["kind"] != "baseline_plain" and "spec_verify_ct" in broken["message"], broken
    assert "the object has" in broken["message"]
    others = [r for r in records if r is not plain and r is not broken]
    assert "[trial 4/" not in out and len(others) <= 1, out[-6000:]
    assert all(r["status"] == "interrupted" for r in others), others
    assert all_runs_ended(results)
    summary = json.loads((results / "summary.json").read_text())  # the morning files say why the night ended
    assert "spec_verify_ct" in summary["stopped"] and (results / "summary.txt").exists()
    bundle = results / "diagnostics" / f"trial-{broken['number']:03d}-engine-contract"  # what a maintainer fixes from
    assert bundle.is_dir() and str(bundle) in broken["message"]
    assert "spec_verify_ct" not in json.loads((bundle / "generate_reply.json").read_text())["meta_info"]
    assert json.loads((bundle / "server_info.json").read_text())["tp_size"] == 2
    assert "server args" in (bundle / "engine-log-head.txt").read_text()
    wait_until(lambda: not processes_with_marker(marker), timeout_s=60, what="no engine of the stopped sweep alive")
