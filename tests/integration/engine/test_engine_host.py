"""EngineHost under real Ray (8 logical GPUs): env propagation through runtime_env, proven by the audit."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from serving.engine.host import EngineHost, create_engine_host, engine_host_options
from serving.errors import EngineAlreadyStarted, EngineLaunchError

from helpers.engine import NCCL_ENV, alive, reference_config, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[3]


def _wait_gone(pids: list[int], *, timeout_s: float, what: str) -> None:
    wait_until(lambda: not any(alive(pid) for pid in pids), timeout_s=timeout_s, what=what,
               detail=lambda: f"still alive: {[pid for pid in pids if alive(pid)]}")


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
    _wait_gone(pids, timeout_s=30, what="the engine's processes to be gone after stop()")


def test_managed_variable_already_in_the_launching_env_passes_the_audit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NCCL_CUMEM_ENABLE=1 exported before the launch (before `ray start`, by a container): the
    engine keeps it, as SGLang does, and the audit expects exactly that instead of failing a
    correct launch. The host runs as plain Python here: its logic is the same in and out of Ray."""
    monkeypatch.setenv("NCCL_CUMEM_ENABLE", "1")
    host = EngineHost(config=reference_config(tp_size=2).model_dump(), log_dir=str(tmp_path), start_timeout_s=120)
    try:
        audit = host.start()["audit"]
    finally:
        host.stop()
    assert audit["ok"], audit
    assert audit["worker_expected"]["NCCL_CUMEM_ENABLE"] == "1"
    assert audit["worker_expected"]["NCCL_NVLS_ENABLE"] == "0"
    assert sum(1 for p in audit["processes"] if p["role"] == "tp_worker") == 2, audit


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


# A second driver, started with NCCL_ALGO in its own shell environment, connects to the running
# cluster and launches a host whose runtime_env does not carry it (the user's mistake).
DRIVER = textwrap.dedent(
    """
    import json, os, sys
    import ray
    from serving.engine.config import EngineConfig
    from serving.engine.host import EngineHost, engine_host_options
    address, config_json, log_dir = sys.argv[1:4]
    ray.init(address=address, log_to_driver=False)
    config = EngineConfig.model_validate_json(config_json)
    options = {**engine_host_options(config, num_gpus=2), "runtime_env": {"env_vars": {}}}
    host = ray.remote(EngineHost).options(**options).remote(
        config=config.model_dump(), log_dir=log_dir, start_timeout_s=120)
    try:
        audit = ray.get(host.start.remote())["audit"]
    finally:
        ray.get(host.stop.remote())
        ray.kill(host)
    print("RESULT " + json.dumps({"driver_has": os.environ.get("NCCL_ALGO"), "audit": audit}), flush=True)
    """
)


def test_driver_env_does_not_reach_the_engine(ray_cluster: dict, tmp_path: Path) -> None:
    """The variable set in the shell of the driver instead of the runtime_env: every process lacks it."""
    assert os.environ.get("NCCL_ALGO") != "Tree", "precondition: the cluster itself must not have it"
    config = reference_config(tp_size=2, env={"NCCL_ALGO": "Tree"})
    run = subprocess.run(
        [sys.executable, "-c", DRIVER, ray_cluster["address"], config.model_dump_json(), str(tmp_path)],
        env={**os.environ, "NCCL_ALGO": "Tree"}, cwd=REPO, capture_output=True, text=True, timeout=240,
    )
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert run.returncode == 0 and lines, run.stdout + run.stderr
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["driver_has"] == "Tree"  # it really was in the driver's environment
    audit = result["audit"]
    assert not audit["ok"]
    assert len(audit["processes"]) >= 3
    assert all(p["missing"] == ["NCCL_ALGO"] for p in audit["processes"]), audit


def test_engine_errors_cross_the_actor_boundary_with_their_reason(ray_cluster: dict, tmp_path: Path) -> None:
    import ray

    crash = reference_config(env={"SPECTUNE_REFERENCE_FAULT": "crash_on_start"})
    host = create_engine_host(crash, num_gpus=0, log_dir=tmp_path / "crash", start_timeout_s=120)
    try:
        with pytest.raises(EngineLaunchError) as info:
            ray.get(host.start.remote())
    finally:
        ray.kill(host)
    assert info.value.reason == "launch_failed" and info.value.exit_code == 1
    assert "crash_on_start" in info.value.log_tail

    host = create_engine_host(reference_config(), num_gpus=0, log_dir=tmp_path / "ok", start_timeout_s=120)
    with started(host):
        with pytest.raises(EngineAlreadyStarted):
            ray.get(host.start.remote())
        ray.get(host.check_health.remote())  # healthy: returns


def test_killing_the_host_actor_takes_the_engine_down(ray_cluster: dict, tmp_path: Path) -> None:
    """ray.kill SIGKILLs the actor (no __del__); the engine must still not outlive it."""
    import ray

    host = create_engine_host(reference_config(tp_size=2), num_gpus=2, log_dir=tmp_path, start_timeout_s=120)
    audit = ray.get(host.start.remote())["audit"]
    pids = [p["pid"] for p in audit["processes"]]
    assert pids and all(psutil.pid_exists(p) for p in pids)
    ray.kill(host)
    _wait_gone(pids, timeout_s=60, what="the engine to die with its SIGKILLed host actor")


def test_host_runs_in_the_bundle_it_was_given(ray_cluster: dict, tmp_path: Path) -> None:
    """The group holds every GPU of the cluster, so a host that ignored it could not be placed at
    all, and the engine's GPUs must be exactly those of bundle 1 (not of bundle 2)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    pg = placement_group([{"CPU": 1}, {"GPU": 2}, {"GPU": 6}], strategy="PACK")
    ray.get(pg.ready(), timeout=120)
    try:
        in_bundle_1 = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=1)
        probe = ray.remote(num_cpus=0, num_gpus=2)(ray.get_gpu_ids).options(scheduling_strategy=in_bundle_1)
        bundle_gpus = sorted(str(gpu) for gpu in ray.get(probe.remote(), timeout=120))
        host = create_engine_host(
            reference_config(tp_size=2, env={"NCCL_DEBUG": "WARN"}), num_gpus=2, log_dir=tmp_path,
            start_timeout_s=120, placement_group=pg, bundle_index=1,
        )
        try:
            placed, _ = ray.wait([host.__ray_ready__.remote()], timeout=120)
            assert placed, "the host was never placed: it did not use the placement group (no GPU is free outside it)"
        except BaseException:
            ray.kill(host)
            raise
        with started(host) as result:
            assert result["audit"]["ok"], result["audit"]
            assert sorted(result["cuda_visible_devices"].split(",")) == bundle_gpus
    finally:
        remove_placement_group(pg)
