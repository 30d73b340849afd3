"""EngineProcess against the real reference engine: start, health, failure paths, clean stop."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import psutil
import pytest

from serving.engine.audit import audit_process_tree
from serving.engine.process import EngineProcess
from serving.errors import EngineDied, EngineLaunchError, EngineStartTimeout

from helpers.engine import NCCL_ENV, alive, listening, processes_with_marker, reference_config, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_tp2_engine_direct_launch_passes_audit_and_stops_clean(tmp_path: Path) -> None:
    config = reference_config(tp_size=2, env=NCCL_ENV)
    engine = EngineProcess.from_config(config, log_dir=tmp_path, start_timeout_s=120)
    with engine:
        report = audit_process_tree(root_pid=engine.pid, expected=config.env)
        assert report.ok, report.summary()
        assert report.count("server") == 1 and report.count("tp_worker") == 2, report.summary()
        port = engine.command.port
        assert listening(port)
    assert not listening(port)
    survivors = [p.pid for p in report.processes if alive(p.pid)]
    assert survivors == [], f"engine processes outlived stop(): {survivors}"


def test_bad_flag_fails_fast_with_log_tail(tmp_path: Path) -> None:
    # A name the engine lacks no longer gets this far (EngineConfig checks extra_args against the
    # engine's flags); a value out of the engine's bounds still does, and must fail the same way.
    config = reference_config(extra_args={"max_running_requests": 0})
    engine = EngineProcess.from_config(config, log_dir=tmp_path, start_timeout_s=120)
    started = time.monotonic()
    with pytest.raises(EngineLaunchError) as excinfo:
        with engine:
            pass
    assert time.monotonic() - started < 60, "a bad flag must fail at once, not at the deadline"
    assert excinfo.value.exit_code not in (None, 0)
    assert "--max-running-requests must be an integer in [1, 65536], got 0" in excinfo.value.log_tail
    assert "--max-running-requests" in str(excinfo.value)
    assert excinfo.value.reason == "launch_failed"
    assert not engine.started


def test_crash_on_start_is_reported_with_exit_code(tmp_path: Path) -> None:
    config = reference_config(env={"SPECTUNE_REFERENCE_FAULT": "crash_on_start"})
    with pytest.raises(EngineLaunchError) as excinfo:
        with EngineProcess.from_config(config, log_dir=tmp_path, start_timeout_s=120):
            pass
    assert excinfo.value.exit_code not in (None, 0)
    assert excinfo.value.reason == "launch_failed"


def test_hang_on_start_times_out_and_is_cleaned_up(tmp_path: Path) -> None:
    config = reference_config(env={"SPECTUNE_REFERENCE_FAULT": "hang_on_start"})
    engine = EngineProcess.from_config(config, log_dir=tmp_path, start_timeout_s=8)
    with pytest.raises(EngineLaunchError, match="not healthy after 8 s") as excinfo:
        with engine:
            pass
    assert excinfo.value.exit_code is None
    assert isinstance(excinfo.value, EngineStartTimeout) and excinfo.value.reason == "timeout"
    assert not engine.started and not listening(engine.command.port)


def test_sigkill_mid_run_is_reported_dead_and_orphans_are_reaped(tmp_path: Path) -> None:
    engine = EngineProcess.from_config(reference_config(tp_size=2), log_dir=tmp_path, start_timeout_s=120)
    engine.start()
    try:
        engine.wait_healthy()
        assert engine.health().healthy
        workers = psutil.Process(engine.pid).children(recursive=True)
        assert workers
        os.kill(engine.pid, signal.SIGKILL)
        wait_until(lambda: not engine.health().alive, timeout_s=30, what="the health check to see the kill")
        health = engine.health()
        assert not health.healthy and "killed by signal 9" in health.detail
        # It had been healthy: now it "died" (not a launch failure), for check and wait alike.
        with pytest.raises(EngineDied) as died:
            engine.check_healthy()
        assert (died.value.reason, died.value.exit_code) == ("died", -signal.SIGKILL)
        with pytest.raises(EngineDied):
            engine.wait_healthy(timeout_s=30)
    finally:
        report = engine.stop()
    assert [w.pid for w in workers if alive(w.pid)] == [], "orphaned TP workers survived stop()"
    assert set(w.pid for w in workers) <= set(report.stopped_pids)


CYCLES = 5


@pytest.mark.timeout(600)
def test_repeated_start_stop_cycles_leave_nothing_behind(tmp_path: Path) -> None:
    # Every process of these engines carries a marker in its environment, so the count is exact
    # even while other engines (other tests, other users) run on the machine. Five cycles: a leak
    # of one process or port a cycle shows in the first; the sweep tests start ~40 engines more.
    marker = uuid.uuid4().hex
    config = reference_config(env={"SPECTUNE_TEST_MARKER": marker})
    ports, seen = [], 0
    stopped_at: dict[int, float] = {}
    for cycle in range(CYCLES):
        engine = EngineProcess.from_config(config, log_dir=tmp_path / str(cycle), start_timeout_s=120)
        with engine:
            ports.append(engine.command.port)
            assert engine.health().healthy
            seen += len(processes_with_marker(marker))
        assert engine.stop().stopped_pids == ()  # a second stop is a no-op
        stopped_at[engine.command.port] = time.time()
    assert seen >= 2 * CYCLES, "each cycle should have had a server and a TP worker"
    leftover = processes_with_marker(marker)
    assert leftover == [], f"processes left behind: {leftover}"
    # A freed port may be taken again by a process started since (a Ray worker of the session's
    # cluster took one in CI): only a listener older than its engine's stop is one left behind.
    assert [port for port in ports if _listener_from_before(port, stopped_at[port])] == []
    assert len(set(ports)) >= 2


def _listener_from_before(port: int, stopped_at: float) -> bool:
    """Whether a process that existed before ``stopped_at`` listens on TCP ``port`` (a listener
    whose pid cannot be read counts as one)."""
    for conn in psutil.net_connections(kind="tcp"):
        if not (conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN):
            continue
        try:
            if conn.pid is None or psutil.Process(conn.pid).create_time() <= stopped_at:
                return True
        except psutil.NoSuchProcess:
            continue
    return False
