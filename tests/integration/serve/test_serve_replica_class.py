"""The deployment class outside Serve (it is plain Python with an async constructor): a real
reference engine, started, audited, health-checked and stopped exactly as a replica does — in
seconds, without a Ray cluster. The variables reach the engine through this process's own
environment here, standing in for the replica's runtime_env.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any, Iterator

import pytest

from serving.errors import EngineDied, EngineNotReady
from serving.serve.replica import EnvAuditFailed, _EngineReplica

from helpers.engine import alive, processes_with_marker, reference_config, wait_until
from helpers.serve import new_marker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture()
def replica_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """What a replica's runtime_env would put in its environment."""
    env = {"NCCL_ALGO": "Ring", "SPECTUNE_TEST_MARKER": new_marker()}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    yield env


async def _replica(config: Any, log_dir: Path) -> _EngineReplica:
    replica = _EngineReplica.__new__(_EngineReplica)
    await replica.__init__(config=config.model_dump(mode="json"),  # type: ignore[misc]
                           settings={"log_dir": str(log_dir), "start_timeout_s": 120, "health_check_timeout_s": 20})
    return replica


def test_replica_serves_a_healthy_audited_engine_and_notices_its_death(replica_env: dict, tmp_path: Path) -> None:
    config = reference_config(tp_size=2, env=replica_env)

    async def scenario() -> None:
        replica = await _replica(config, tmp_path)
        try:
            report = await replica.audit_report()
            assert report["ok"] and report["engine"]["tp_size"] == 2
            assert sum(p["role"] == "tp_worker" for p in report["now"]["processes"]) == 2
            await replica.check_health()  # healthy: no exception
            pids = [p["pid"] for p in report["now"]["processes"]]
            os.kill(report["engine"]["pid"], signal.SIGKILL)
            await asyncio.to_thread(wait_until, lambda: not alive(report["engine"]["pid"]), timeout_s=30,
                                    what="the SIGKILLed engine server to be dead")
            # Serve's hook raises for a dead engine (Serve then replaces the replica): EngineDied, or
            # EngineNotReady while the killed server's other threads are still exiting (its pid is
            # a zombie already, but the kernel reports the exit only once every thread is gone).
            with pytest.raises((EngineDied, EngineNotReady)):
                await replica.check_health()
            await asyncio.to_thread(wait_until, lambda: not any(alive(pid) for pid in pids), timeout_s=30,
                                    what="the killed engine's workers to follow it")
        finally:
            replica.__del__()

    asyncio.run(scenario())
    assert processes_with_marker(replica_env["SPECTUNE_TEST_MARKER"]) == []


def test_replica_refuses_an_engine_that_fails_the_env_audit(
    replica_env: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NCCL_ALGO is set in the engine's server only after its TP workers were spawned (the
    reference engine's late_env fault): the constructor raises, so Serve never routes to it, and
    the engine is stopped."""
    config = reference_config(tp_size=2, env={**replica_env, "SPECTUNE_REFERENCE_FAULT": "late_env:NCCL_ALGO"})
    monkeypatch.setenv("SPECTUNE_REFERENCE_FAULT", "late_env:NCCL_ALGO")
    with pytest.raises(EnvAuditFailed) as caught:
        asyncio.run(_replica(config, tmp_path))
    message = str(caught.value)
    assert "env audit FAILED" in message and "missing NCCL_ALGO" in message and "tp_worker" in message, message
    assert processes_with_marker(replica_env["SPECTUNE_TEST_MARKER"]) == []
