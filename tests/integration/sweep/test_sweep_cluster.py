"""The sweep on a shape of cluster a user meets: two nodes, a trial on each at once. (A variable set
in the driver's shell instead of the runtime_env: test_sweep_job.py.)"""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path

import pytest

from helpers.engine import processes_with_marker, wait_until
from helpers.ray_cluster import RayCluster
from helpers.sweep import REPO, engine_marker, reference_engine, seed_results, trial_records, write_spec

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]


def _spans(record: dict) -> tuple[datetime, datetime]:
    return datetime.fromisoformat(record["started_at"]), datetime.fromisoformat(record["ended_at"])


def test_two_nodes_run_trials_at_once(two_nodes: RayCluster, tmp_path: Path, mlflow_store_template: Path) -> None:
    marker = engine_marker()
    spec = write_spec(
        tmp_path / "spec.yaml",
        engine=reference_engine(tp_size=1, marker=marker),
        search={"speculative": {"num_steps": [2], "eagle_topk": [1]}, "nccl_env": {}, "seed": 1,
                "early_stopping": {"enabled": False}},
        budget={"num_trials": 2, "max_concurrent_trials": 2, "trial_timeout_s": 300,
                "engine_start_timeout_s": 120},
        resources={"gpus_per_trial": 4, "cpus_per_trial": 1},
    )
    results = seed_results(tmp_path / "results", mlflow_store_template)
    proc = two_nodes.submit([sys.executable, "-m", "orchestrator.sweep", str(spec), "--results-dir", str(results)],
                            working_dir=REPO)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    wait_until(lambda: not processes_with_marker(marker), timeout_s=60, what="no engine of this sweep alive")
    records = trial_records(results)
    assert len(records) == 2 and all(r["status"] == "ok" for r in records), records
    nodes = {r["node_id"] for r in records}
    assert len(nodes) == 2, "each node (4 logical GPUs, one CPU) holds one trial: both must be used"
    (a_start, a_end), (b_start, b_end) = (_spans(r) for r in records)
    assert a_start <= b_end and b_start <= a_end, "the two trials ran at the same time"
    assert all(r["cuda_visible_devices"] and len(r["cuda_visible_devices"].split(",")) == 4 for r in records)
