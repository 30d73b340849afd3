"""Process lifecycle: bad flags, signals, parent death, and the fault switches."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from serving.errors import EngineLaunchError
from serving.ports import free_port

from helpers.engine import read_environ, wait_until
from helpers.reference_server import http, port_open, reference_process, worker_processes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_unknown_flag_exits_2() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "serving.reference", "--model-path", "ref-tiny", "--speculative-bogus", "3"],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    assert "--speculative-bogus" in proc.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_server_stops_workers_and_frees_port(tmp_path: Path, sig: signal.Signals) -> None:
    """Only the server gets the signal; it must take its workers down and release the port."""
    engine = reference_process("--tp-size", "2", log_dir=tmp_path)
    engine.start()
    try:
        engine.wait_healthy(timeout_s=120)
        workers = worker_processes(engine)
        assert len(workers) == 2
        os.kill(engine.pid, sig)
        gone, alive = psutil.wait_procs([psutil.Process(engine.pid), *workers], timeout=30)
        assert not alive, f"still alive after {sig.name}: {alive}\n{engine.log_tail()}"
        assert engine._popen.wait(5) == 0  # noqa: SLF001 - the server's own exit status
        assert not port_open(engine.command.port)
        assert "TP workers stopped (exit codes [0, 0])" in engine.log_path.read_text()
    finally:
        engine.stop()


def test_group_sigterm_is_a_clean_shutdown(tmp_path: Path) -> None:
    """EngineProcess signals the whole process group; workers ignore it and the server shuts them down."""
    engine = reference_process("--tp-size", "2", log_dir=tmp_path)
    with engine:
        pass
    report_log = engine.log_path.read_text()
    assert "received SIGTERM; shutting down" in report_log
    assert "cannot continue" not in report_log


def test_workers_die_with_a_killed_server(tmp_path: Path) -> None:
    engine = reference_process("--tp-size", "2", log_dir=tmp_path)
    engine.start()
    try:
        engine.wait_healthy(timeout_s=120)
        workers = worker_processes(engine)
        os.kill(engine.pid, signal.SIGKILL)
        _, alive = psutil.wait_procs(workers, timeout=30)
        assert not alive, f"orphaned workers: {alive}"
    finally:
        engine.stop()


def test_a_dead_worker_takes_the_server_down(tmp_path: Path) -> None:
    engine = reference_process("--tp-size", "2", log_dir=tmp_path)
    engine.start()
    try:
        engine.wait_healthy(timeout_s=120)
        victim = next(w for w in worker_processes(engine) if w.name() == "ref::tp1")
        victim.kill()
        assert engine._popen.wait(30) == 1  # noqa: SLF001
        assert "TP worker rank 1" in engine.log_path.read_text()
    finally:
        engine.stop()


def test_fault_crash_on_start(tmp_path: Path) -> None:
    engine = reference_process(log_dir=tmp_path, env={"SPECTUNE_REFERENCE_FAULT": "crash_on_start"})
    engine.start()
    try:
        with pytest.raises(EngineLaunchError) as info:
            engine.wait_healthy(timeout_s=60)
        assert info.value.exit_code == 1
        assert "crash_on_start" in info.value.log_tail
    finally:
        engine.stop()


def test_fault_hang_on_start(tmp_path: Path) -> None:
    engine = reference_process("--tp-size", "2", log_dir=tmp_path, env={"SPECTUNE_REFERENCE_FAULT": "hang_on_start"})
    engine.start()
    try:
        wait_until(lambda: port_open(engine.command.port), timeout_s=60, what="the port", detail=engine.log_tail)
        wait_until(lambda: len(worker_processes(engine)) == 2, timeout_s=60, what="two workers", detail=engine.log_tail)
        with pytest.raises(EngineLaunchError, match="not healthy"):
            engine.wait_healthy(timeout_s=3)
        assert http(engine, "/health")[0] == 503
    finally:
        report = engine.stop()
    assert not report.escalated, "hang_on_start must still shut down on SIGTERM"


def test_fault_die_after_tokens(tmp_path: Path) -> None:
    engine = reference_process(log_dir=tmp_path, env={"SPECTUNE_REFERENCE_FAULT": "die_after_tokens:40"})
    engine.start()
    try:
        engine.wait_healthy(timeout_s=120)  # warm-up and health checks emit a few tokens
        workers = worker_processes(engine)
        try:
            http(engine, "/generate", {"text": "go", "sampling_params": {"max_new_tokens": 200, "temperature": 0}}, timeout_s=30)
        except OSError:
            pass  # the server may vanish mid-response
        assert engine._popen.wait(30) == 1  # noqa: SLF001
        _, alive = psutil.wait_procs(workers, timeout=30)
        assert not alive
        assert "die_after_tokens:40" in engine.log_path.read_text()
    finally:
        engine.stop()


def test_fault_late_env_hides_variables_from_workers(tmp_path: Path) -> None:
    env = {"NCCL_ALGO": "Tree", "NCCL_PROTO": "Simple", "SPECTUNE_REFERENCE_FAULT": "late_env:NCCL_ALGO"}
    engine = reference_process("--tp-size", "2", log_dir=tmp_path, env=env)
    with engine:
        assert read_environ(engine.pid)["NCCL_ALGO"] == "Tree"
        for worker in worker_processes(engine):
            worker_env = read_environ(worker.pid)
            assert "NCCL_ALGO" not in worker_env, worker.name()
            assert worker_env["NCCL_PROTO"] == "Simple"
            assert worker_env["NCCL_CUMEM_ENABLE"] == "0" and worker_env["CUDA_DEVICE_MAX_CONNECTIONS"] == "8"
        assert http(engine, "/generate", {"text": "ok", "sampling_params": {"max_new_tokens": 4}})[0] == 200


def test_bad_fault_value_exits_2(tmp_path: Path) -> None:
    env = dict(os.environ, SPECTUNE_REFERENCE_FAULT="explode")
    proc = subprocess.run([sys.executable, "-m", "serving.reference", "--model-path", "ref-tiny"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2 and "SPECTUNE_REFERENCE_FAULT" in proc.stderr


@pytest.mark.parametrize("algo, dies", [("Tree", True), ("Ring", False)])
def test_fault_die_after_tokens_only_where_its_condition_holds(tmp_path: Path, algo: str, dies: bool) -> None:
    """``die_after_tokens:N@NAME=VALUE`` in a sweep's fixed env arms the fault for the trials that
    set NAME=VALUE only; the others serve past N tokens as if it were not there."""
    env = {"NCCL_ALGO": algo, "SPECTUNE_REFERENCE_FAULT": "die_after_tokens:40@NCCL_ALGO=Tree"}
    engine = reference_process(log_dir=tmp_path, env=env)
    engine.start()
    try:
        engine.wait_healthy(timeout_s=120)
        body = {"text": "go", "sampling_params": {"max_new_tokens": 200, "temperature": 0}}
        if dies:
            try:
                http(engine, "/generate", body, timeout_s=30)
            except OSError:
                pass  # the server may vanish mid-response
            assert engine._popen.wait(30) == 1  # noqa: SLF001
            assert "die_after_tokens:40@NCCL_ALGO=Tree: the condition holds here; armed" in engine.log_path.read_text()
        else:
            status, out = http(engine, "/generate", body)
            assert status == 200 and out["meta_info"]["completion_tokens"] == 200
            assert http(engine, "/health_generate")[0] == 200 and engine._popen.poll() is None  # noqa: SLF001
            assert "the condition does not hold here; off" in engine.log_path.read_text()
    finally:
        engine.stop()


def test_a_worker_failing_during_warm_up_never_reports_ready(tmp_path: Path) -> None:
    """A worker that fails after it started (here: in the warm-up, on a draft top-k the command
    line would refuse, built past the parser) must not be followed by SGLang's readiness line."""
    script = textwrap.dedent(f"""
        import asyncio, dataclasses, sys
        from serving.reference.cli import configure_logging
        from serving.reference.faults import Faults
        from serving.reference.server import serve
        from serving.reference.server_args import parse_args
        configure_logging("info")
        args = parse_args(["--model-path", "ref-tiny", "--port", "{free_port()}", "--speculative-algorithm", "EAGLE3",
                           "--speculative-num-steps", "1", "--speculative-eagle-topk", "2",
                           "--speculative-num-draft-tokens", "2"])
        sys.exit(asyncio.run(serve(dataclasses.replace(args, speculative_eagle_topk=100000), faults=Faults())))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=150)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "TP worker rank 0" in proc.stderr and "the server cannot continue" in proc.stderr, proc.stderr[-3000:]
    assert "fired up and ready to roll" not in proc.stderr
