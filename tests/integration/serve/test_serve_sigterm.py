"""SIGTERM of ``spectune serve`` (a service manager's stop, ``kill``) leaves nothing behind: not
the engine, not one of its TP workers, not the HAProxy that Serve's ingress runs, nor any other
process of the Ray it started; and it exits 0, as after Ctrl-C.

It used not to: ``ray.init`` replaced spectune's SIGTERM handler with Ray's own, which killed
Ray's processes and exited 1 without Serve's shutdown, and HAProxy (a child of Serve's
HAProxyManager actor, stopped only by that shutdown) survived. Every process of this test's
serve carries ``SPECTUNE_TEST_MARKER`` in its environment (the command's own, inherited by Ray's
processes, HAProxy and the engines), so the test finds exactly its own, whatever else runs.
"""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import psutil
import pytest

from serving.ports import free_port

from helpers.engine import processes_with_marker, wait_until
from helpers.serve import ServeProcess, new_marker, write_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ENGINE = {"kind": "reference", "model_path": "ref-tiny", "tp_size": 2}
GONE_TIMEOUT_S = 60.0
"""After the command exited, how long its processes may take to be gone (Ray's workers notice
their raylet is gone within seconds)."""


def _described(pids: list[int]) -> dict[int, str]:
    found = {}
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            found[pid] = f"{proc.name()}: {' '.join(proc.cmdline())[:160]}"
        except psutil.Error:
            continue
    return found


@pytest.mark.timeout(420)
def test_sigterm_exits_0_and_leaves_no_engine_worker_haproxy_or_ray_process(tmp_path: Path) -> None:
    marker = new_marker()
    config = write_config(tmp_path / "best.yaml", engine={**ENGINE, "env": {"SPECTUNE_TEST_MARKER": marker}},
                          serve={"log_dir": str(tmp_path / "engines")})
    server = ServeProcess.start(config, port=free_port(), env={"SPECTUNE_TEST_MARKER": marker}, log_dir=tmp_path)
    try:
        assert "haproxy ingress" in server.ready_line, server.ready_line
        before = _described(processes_with_marker(marker))
        kinds = {"haproxy": [d for d in before.values() if d.startswith("haproxy")],
                 "engine": [d for d in before.values() if "serving.reference" in d and "ref::tp" not in d],
                 "tp worker": [d for d in before.values() if d.startswith("ref::tp")]}
        # What must go is there to begin with, and carries the marker (else the check below proves nothing).
        assert len(kinds["haproxy"]) >= 1 and len(kinds["engine"]) == 1 and len(kinds["tp worker"]) == 2, before

        assert server.stop(signal.SIGTERM) == 0, server.log_tail()

        def nothing_left() -> bool:
            return not processes_with_marker(marker)

        wait_until(nothing_left, timeout_s=GONE_TIMEOUT_S, poll_s=0.5,
                   what="no process of this serve (engine, TP workers, HAProxy, Ray) left after SIGTERM",
                   detail=lambda: f"left: {_described(processes_with_marker(marker))}\n{server.log_tail()}")
        assert "stopped in" in server.log_tail(), server.log_tail()
    finally:
        if server.proc.poll() is None:
            server.kill()
        shutil.rmtree(server.ray_tmp, ignore_errors=True)
