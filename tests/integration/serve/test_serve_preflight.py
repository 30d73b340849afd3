"""``spectune serve`` of a configuration that cannot run here exits 2 in seconds, naming what is
missing, and deploys nothing: replicas no node can hold (on the session's 8-GPU cluster, joined
with ``--address``), an unknown reference preset (checked by a Ray task placed like a replica),
and a missing SGLang model path (checked on this machine before a local Ray starts)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from serving.ports import free_port

from helpers.serve import REPO, SPECTUNE, write_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

PREFLIGHT_LIMIT_S = 60
"""The acceptance bound: a serve that cannot run exits within this (a timeout, not a measurement);
it used to wait silently for ever (no node) or exit 1 after three engine launches."""


def _serve(config: Path, *args: str) -> tuple[subprocess.CompletedProcess, str]:
    proc = subprocess.run([SPECTUNE, "serve", str(config), "--port", str(free_port()), *args], cwd=REPO,
                          env=dict(os.environ), capture_output=True, text=True, timeout=PREFLIGHT_LIMIT_S)
    return proc, " ".join((proc.stdout + proc.stderr).split())  # rich may wrap lines


def test_replicas_no_node_can_hold_exit_2_naming_the_per_node_need(ray_cluster: dict, tmp_path: Path) -> None:
    config = write_config(tmp_path / "best.yaml", engine={"kind": "reference", "model_path": "ref-tiny", "tp_size": 1})
    # 10 GPUs in all would fit in the cluster's 8 only if a replica could span nodes; 5 per replica on
    # an 8-GPU node leave room for one.
    proc, out = _serve(config, "--address", ray_cluster["address"], "--num-replicas", "2",
                          "--gpus-per-replica", "5")
    assert proc.returncode == 2, out[-3000:]
    assert "cannot serve (nothing was deployed)" in out, out[-3000:]
    assert ("each replica needs 5 GPUs (serve.gpus_per_replica) and 1 CPU (serve.cpus_per_replica) on one node, "
            "x 2 replicas (serve.num_replicas), but the cluster has 8 GPUs") in out, out[-3000:]
    assert "room for 1 replica" in out and "--wait-for-resources SECONDS" in out, out[-3000:]
    assert "deploying" not in out, "nothing may be deployed"


def test_an_unknown_preset_exits_2_naming_the_presets_checked_where_the_replica_runs(
        ray_cluster: dict, tmp_path: Path) -> None:
    config = write_config(tmp_path / "best.yaml", engine={"kind": "reference", "model_path": "ref-hueg", "tp_size": 1})
    proc, out = _serve(config, "--address", ray_cluster["address"])
    assert proc.returncode == 2, out[-3000:]
    assert "model_path: --model-path 'ref-hueg' is not a reference-engine preset; known presets:" in out, out[-3000:]
    assert "ref-tiny" in out and "deploying" not in out, out[-3000:]


def test_a_missing_sglang_model_path_exits_2_naming_it_before_ray_starts(tmp_path: Path) -> None:
    missing = tmp_path / "models" / "kimi-k2"
    config = write_config(tmp_path / "best.yaml", engine={"kind": "sglang", "model_path": str(missing), "tp_size": 8})
    proc, out = _serve(config)
    assert proc.returncode == 2, out[-3000:]
    assert f"model_path: {missing} does not exist on node" in out, out[-3000:]
    assert "Started a local Ray" not in out, "the engine check of a local cluster comes before Ray starts"


def test_an_interface_no_node_has_exits_2_naming_the_field_and_each_node(ray_cluster: dict, tmp_path: Path) -> None:
    config = write_config(tmp_path / "best.yaml", engine={"kind": "reference", "model_path": "ref-tiny", "tp_size": 1,
                                                          "env": {"NCCL_SOCKET_IFNAME": "=spectune-missing0"}})
    proc, out = _serve(config, "--address", ray_cluster["address"])
    assert proc.returncode == 2, out[-3000:]
    assert "env.NCCL_SOCKET_IFNAME: NCCL_SOCKET_IFNAME='=spectune-missing0' cannot work on node" in out, out[-3000:]
    assert "matches no interface with an address there" in out and "interfaces " in out, out[-3000:]
    assert "deploying" not in out, "nothing may be deployed"
