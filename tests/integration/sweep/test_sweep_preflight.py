"""A sweep that cannot run says so in seconds (exit 2, naming what is missing), and leaves no
MLflow run RUNNING: the 8-GPU spec on a cluster whose nodes have 4 GPUs each, an MLflow server
nobody runs, and an SGLang spec where SGLang is not installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from serving.ports import free_port

from helpers.ray_cluster import RayCluster
from helpers.sweep import REPO, all_runs_ended, write_spec

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SPECTUNE = str(Path(sys.executable).with_name("spectune"))
PREFLIGHT_LIMIT_S = 60
"""The acceptance bound: a sweep that cannot run exits within this (a timeout, not a measurement)."""


def _sweep(spec: Path, results: Path, address: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [SPECTUNE, "sweep", str(spec), "--results-dir", str(results), "--address", address],
        env=env, capture_output=True, text=True, timeout=PREFLIGHT_LIMIT_S,
    )


def test_the_8_gpu_spec_where_no_node_has_8_exits_2_naming_both(two_nodes: RayCluster, tmp_path: Path) -> None:
    results = tmp_path / "results"
    proc = _sweep(REPO / "experiments" / "kimi-k2.5-eagle3-8gpu.yaml", results, two_nodes.address, two_nodes.env)
    out = " ".join((proc.stdout + proc.stderr).split())  # rich may wrap lines
    assert proc.returncode == 2, out[-3000:]
    assert "8 GPUs per trial" in out and "the cluster has 8 GPUs" in out, out[-3000:]
    assert "in 2 nodes (the largest node: 4 GPUs" in out, out[-3000:]
    assert "--wait-for-resources" in out
    assert "[trial" not in out, "no trial may start"
    assert all_runs_ended(results)


def test_waiting_for_resources_says_what_for_and_gives_up(two_nodes: RayCluster, tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    data = yaml.safe_load((REPO / "experiments" / "kimi-k2.5-eagle3-8gpu.yaml").read_text())
    spec.write_text(yaml.safe_dump(data))
    proc = subprocess.run(
        [SPECTUNE, "sweep", str(spec), "--results-dir", str(tmp_path / "results"), "--address", two_nodes.address,
         "--wait-for-resources", "1"],
        env=two_nodes.env, capture_output=True, text=True, timeout=PREFLIGHT_LIMIT_S,
    )
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2, out[-3000:]
    assert "gave up after waiting" in out and "--wait-for-resources 1" in out, out[-3000:]


def test_an_unreachable_mlflow_server_exits_2_naming_it(two_nodes: RayCluster, tmp_path: Path) -> None:
    uri = f"http://127.0.0.1:{free_port('127.0.0.1')}"  # nothing listens there
    spec = write_spec(tmp_path / "spec.yaml", tracking={"mlflow_uri": uri})
    results = tmp_path / "results"
    proc = _sweep(spec, results, two_nodes.address, two_nodes.env)
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2, out[-3000:]
    assert f"tracking.mlflow_uri: {uri} does not answer" in out, out[-3000:]
    assert not results.exists(), "a sweep that cannot start writes nothing"


def test_an_sglang_spec_without_sglang_exits_2_naming_the_package(ray_cluster: dict, tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path / "spec.yaml",
        engine={"kind": "sglang", "model_path": "org/some-model", "draft_model_path": "/no/such/draft",
                "speculative_algorithm": "EAGLE3", "tp_size": 1},
        search={"speculative": {"num_steps": [3], "eagle_topk": [1]}, "nccl_env": {}},
    )
    results = tmp_path / "results"
    proc = _sweep(spec, results, ray_cluster["address"], dict(os.environ))
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2, out[-3000:]
    assert "the package 'sglang' cannot be imported" in out and "pip install 'sglang[all]==0.5.23'" in out, out[-3000:]
    assert "engine.draft_model_path: /no/such/draft does not exist" in out, out[-3000:]
    assert all_runs_ended(results)
