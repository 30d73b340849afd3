"""EngineHost under real Ray (8 logical GPUs): env propagation through runtime_env, proven by the audit."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from serving.engine.host import EngineHost, create_engine_host, engine_host_options

from engine_testing import NCCL_ENV, reference_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def _gone(pids: list[int], *, timeout_s: float) -> list[int]:
    """Wait until none of ``pids`` is alive; return those still alive at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


@contextlib.contextmanager
def started(host: object) -> Iterator[dict]:
    """Start the host's engine; afterwards always stop it (result under "stop") and kill the actor."""
    import ray

    result: dict = {}
    try:
        result.update(ray.get(host.start.remote()))  # type: ignore[attr-defined]
        yield result
    finally:
        result["stop"] = ray.get(host.stop.remote())  # type: ignore[attr-defined]
        ray.kill(host)


def test_runtime_env_reaches_server_and_both_tp_workers(ray_cluster: dict, tmp_path: Path) -> None:
    import ray

    config = reference_config(tp_size=2, env=NCCL_ENV)
    host = create_engine_host(config, num_gpus=2, log_dir=tmp_path, start_timeout_s=120, label="trial-ok")
    with started(host) as result:
        audit = result["audit"]
        assert audit["ok"], audit
        roles = sorted(p["role"] for p in audit["processes"])
        assert roles.count("server") == 1 and roles.count("tp_worker") == 2, roles
        assert all(not p["missing"] and not p["mismatched"] for p in audit["processes"])
        # What the engine sets itself before spawning workers is proven on the workers too.
        assert set(audit["worker_expected"]) == {"NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE", "CUDA_DEVICE_MAX_CONNECTIONS"}
        # Ray gave the actor two (logical) GPUs and the engine inherits them.
        assert len(result["cuda_visible_devices"].split(",")) == 2
        assert ray.get(host.health.remote())["healthy"]
        pids = [p["pid"] for p in audit["processes"]]
    assert set(pids) <= set(result["stop"]["stopped_pids"])
    assert _gone(pids, timeout_s=30) == []


def test_variable_set_after_spawn_is_caught_naming_pids_and_variable(ray_cluster: dict, tmp_path: Path) -> None:
    """The seed's failure: NCCL_ALGO is in the server's env, but not in the TP workers'."""
    import ray

    env = {**NCCL_ENV, "SPECTUNE_REFERENCE_FAULT": "late_env:NCCL_ALGO"}
    host = create_engine_host(reference_config(tp_size=2, env=env), num_gpus=2, log_dir=tmp_path, start_timeout_s=120)
    with started(host) as result:
        audit = result["audit"]
        # The truth, independently of the audit: the server's children named as TP ranks.
        worker_pids = {
            p.pid for p in psutil.Process(result["pid"]).children(recursive=True) if p.name().startswith("ref::tp")
        }
    assert not audit["ok"]
    failing = [p for p in audit["processes"] if not p["ok"]]
    # Both TP workers (and any helper spawned in the same window, e.g. multiprocessing's
    # resource tracker) lack exactly NCCL_ALGO; the report names each pid.
    assert len(worker_pids) == 2
    assert {p["pid"] for p in failing if p["role"] == "tp_worker"} == worker_pids, failing
    assert all(p["missing"] == ["NCCL_ALGO"] for p in failing)
    server = next(p for p in audit["processes"] if p["role"] == "server")
    assert server["ok"]


def test_driver_env_does_not_reach_the_engine(ray_cluster: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Setting the variable in the driver instead of the runtime_env: every process lacks it."""
    import ray

    monkeypatch.setenv("NCCL_ALGO", "Tree")  # the driver's env, not the job's runtime_env
    config = reference_config(tp_size=2, env={"NCCL_ALGO": "Tree"})
    options = {**engine_host_options(config, num_gpus=2), "runtime_env": {"env_vars": {}}}
    host = ray.remote(EngineHost).options(**options).remote(
        config=config.model_dump(), log_dir=str(tmp_path), start_timeout_s=120
    )
    with started(host) as result:
        audit = result["audit"]
    assert not audit["ok"]
    assert len(audit["processes"]) >= 3
    assert all(p["missing"] == ["NCCL_ALGO"] for p in audit["processes"])


def test_killing_the_host_actor_takes_the_engine_down(ray_cluster: dict, tmp_path: Path) -> None:
    """ray.kill SIGKILLs the actor (no __del__); the engine must still not outlive it."""
    import ray

    host = create_engine_host(reference_config(tp_size=2), num_gpus=2, log_dir=tmp_path, start_timeout_s=120)
    audit = ray.get(host.start.remote())["audit"]
    pids = [p["pid"] for p in audit["processes"]]
    assert pids and all(psutil.pid_exists(p) for p in pids)
    ray.kill(host)
    assert _gone(pids, timeout_s=60) == [], "engine processes outlived their host actor"


def test_host_in_a_placement_group_bundle(ray_cluster: dict, tmp_path: Path) -> None:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    pg = placement_group([{"CPU": 1}, {"GPU": 2}], strategy="PACK")
    ray.get(pg.ready(), timeout=60)
    host = create_engine_host(
        reference_config(tp_size=2, env={"NCCL_DEBUG": "WARN"}), num_gpus=2, log_dir=tmp_path, start_timeout_s=120,
        placement_group=pg, bundle_index=1,
    )
    try:
        with started(host) as result:
            assert result["audit"]["ok"], result["audit"]
            assert len(result["cuda_visible_devices"].split(",")) == 2
    finally:
        remove_placement_group(pg)
