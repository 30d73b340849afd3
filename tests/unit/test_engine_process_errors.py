"""EngineProcess's failure paths and their reasons, with plain programs standing in for an engine
(no server: nothing here ever answers HTTP)."""

from __future__ import annotations

import signal
import socket
import sys
from pathlib import Path

import pytest

from serving.engine.command import EngineCommand
from serving.engine.process import EngineProcess
from serving.errors import (
    EngineAlreadyStarted,
    EngineLaunchError,
    EngineNotReady,
    EngineStartTimeout,
    EngineStopError,
)
from serving.ports import free_port

from helpers.engine import wait_until

# They print READY (computed, so the command line echoed at the top of the log cannot match).
SLEEPER = "import signal; print('ready'.upper(), flush=True); signal.pause()"
STUBBORN = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready'.upper(), flush=True); signal.pause()"


def engine_running(code: str, tmp_path: Path) -> EngineProcess:
    """An EngineProcess of ``python -c code`` on a free port, started; READY seen in its log."""
    command = EngineCommand(argv=[sys.executable, "-c", code], port=free_port())
    engine = EngineProcess(command=command, log_path=tmp_path / "engine.log")
    engine.start()
    if "ready" in code:
        wait_until(lambda: "READY" in engine.log_tail(), timeout_s=60, what="the program to start", detail=engine.log_tail)
    return engine


def test_start_twice_is_a_caller_mistake(tmp_path: Path) -> None:
    engine = engine_running(SLEEPER, tmp_path)
    try:
        with pytest.raises(EngineAlreadyStarted, match="already started"):
            engine.start()
    finally:
        report = engine.stop()
    assert report.exit_code == -signal.SIGTERM and not report.escalated


def test_exit_before_healthy_is_launch_failed_with_the_log_tail(tmp_path: Path) -> None:
    engine = engine_running("print('error: no GPU found', flush=True); raise SystemExit(3)", tmp_path)
    try:
        with pytest.raises(EngineLaunchError) as info:
            engine.wait_healthy(timeout_s=60)
    finally:
        engine.stop()
    assert type(info.value) is EngineLaunchError and info.value.reason == "launch_failed"
    assert info.value.exit_code == 3 and "error: no GPU found" in info.value.log_tail


def test_deadline_is_timeout_and_the_engine_is_left_running(tmp_path: Path) -> None:
    engine = engine_running(SLEEPER, tmp_path)
    try:
        with pytest.raises(EngineStartTimeout, match="not healthy after 0.5 s") as info:
            engine.wait_healthy(timeout_s=0.5, poll_s=0.05)
        assert info.value.reason == "timeout" and info.value.exit_code is None
        assert engine.health().alive
        with pytest.raises(EngineNotReady, match="not healthy: cannot connect") as not_ready:
            engine.check_healthy(timeout_s=1)
        assert not_ready.value.reason == "not_healthy"
    finally:
        engine.stop()


def test_not_started_is_not_ready(tmp_path: Path) -> None:
    engine = EngineProcess(command=EngineCommand(argv=[sys.executable], port=free_port()), log_path=tmp_path / "e.log")
    for call in (lambda: engine.pid, engine.check_healthy, engine.wait_healthy):
        with pytest.raises(EngineNotReady):
            call()


def test_stop_escalates_to_sigkill(tmp_path: Path) -> None:
    engine = engine_running(STUBBORN, tmp_path)
    report = engine.stop(grace_s=0.5)
    assert report.escalated and report.exit_code == -signal.SIGKILL
    assert not engine.started


def test_a_port_still_open_after_stop_is_stop_failed(tmp_path: Path) -> None:
    engine = engine_running(SLEEPER, tmp_path)
    port = engine.command.port
    with socket.socket() as holder:  # someone else now answers on the engine's port
        holder.bind(("127.0.0.1", port))
        holder.listen()
        with pytest.raises(EngineStopError, match=f"port {port} still accepts connections") as info:
            engine.stop(port_timeout_s=0.5)
    assert info.value.reason == "stop_failed" and info.value.port == port and info.value.survivors == ()
    assert not engine.started  # stopped all the same: a second stop() is a no-op
    assert engine.stop().stopped_pids == ()
