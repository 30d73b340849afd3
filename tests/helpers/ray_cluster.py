"""Real ``ray start`` clusters for the tests that need one (``ray job submit``, two nodes).

Each cluster gets its own temp dir and its own free ports, so it can run beside the session's
``ray.init`` cluster. ``ray stop`` would stop every Ray process on the machine, so a cluster is
stopped by signalling exactly the processes that belong to it: those whose command line names
its temp dir (raylet, GCS, dashboard, agents, workers), then those that ran jobs in it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from serving.ports import free_port
from serving.waiting import wait_until

__all__ = ["RayCluster"]

RAY = str(Path(sys.executable).with_name("ray"))


def _ports() -> list[str]:
    names = ("--dashboard-agent-listen-port", "--dashboard-agent-grpc-port", "--runtime-env-agent-port",
             "--metrics-export-port")
    return [item for name in names for item in (name, str(free_port("127.0.0.1")))]


@dataclass
class RayCluster:
    """A head node (and optionally more nodes) started with ``ray start``."""

    temp_dir: Path
    gcs_port: int
    dashboard_port: int
    nodes: int = 1
    env: dict[str, str] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    @classmethod
    def start(cls, *, num_cpus: int, num_gpus: int, env: dict[str, str] | None = None) -> "RayCluster":
        temp_dir = Path(tempfile.mkdtemp(prefix="st-rs-", dir="/tmp"))  # Unix socket paths must stay short
        cluster = cls(temp_dir=temp_dir, gcs_port=free_port("127.0.0.1"), dashboard_port=free_port("127.0.0.1"),
                      env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **(env or {})})
        cluster._run([
            RAY, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(cluster.gcs_port),
            "--num-cpus", str(num_cpus), "--num-gpus", str(num_gpus), "--include-dashboard", "true",
            "--dashboard-host", "127.0.0.1", "--dashboard-port", str(cluster.dashboard_port),
            "--ray-client-server-port", str(free_port("127.0.0.1")), "--temp-dir", str(temp_dir),
            "--disable-usage-stats", *_ports(),
        ])
        cluster.wait_for_nodes(1)
        return cluster

    def add_node(self, *, num_cpus: int, num_gpus: int) -> None:
        """A second node of the same cluster (on this machine), as ``ray start --address`` makes one."""
        self._run([
            RAY, "start", "--address", self.address, "--node-ip-address", "127.0.0.1", "--num-cpus", str(num_cpus),
            "--num-gpus", str(num_gpus), "--disable-usage-stats", *_ports(),
        ])
        self.nodes += 1
        self.wait_for_nodes(self.nodes)

    def _run(self, argv: list[str]) -> None:
        proc = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=180)
        if proc.returncode != 0:
            self.stop()
            raise RuntimeError(f"{' '.join(argv[:3])} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")

    def alive_nodes(self) -> int:
        """Nodes the cluster reports alive, through Ray's state API (the dashboard's HTTP server)."""
        from ray.util.state import list_nodes

        try:
            return len(list_nodes(address=self.dashboard_url, filters=[("state", "=", "ALIVE")], timeout=10,
                                  raise_on_missing_output=False))
        except Exception:  # noqa: BLE001 - the dashboard is still starting: not alive yet
            return 0

    def wait_for_nodes(self, count: int) -> None:
        wait_until(lambda: self.alive_nodes() >= count, timeout_s=120, what=f"{count} Ray node(s) alive", poll_s=0.5)

    def submit(self, entrypoint: list[str], *, working_dir: Path, runtime_env_json: str | None = None,
               timeout_s: float = 900) -> subprocess.CompletedProcess:
        """``ray job submit`` (waits for the job and streams its log, as a user sees it)."""
        argv = [RAY, "job", "submit", "--address", self.dashboard_url, "--working-dir", str(working_dir)]
        if runtime_env_json:
            argv += ["--runtime-env-json", runtime_env_json]
        return subprocess.run([*argv, "--", *entrypoint], env=self.env, capture_output=True, text=True,
                              timeout=timeout_s)

    def _processes(self) -> list[psutil.Process]:
        marker = str(self.temp_dir)
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            try:
                if any(marker in part for part in proc.info["cmdline"] or []):
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return found

    def stop(self) -> None:
        """Stop every process of this cluster (and their children), then remove its temp dir."""
        procs = self._processes()
        family = {p.pid: p for p in procs}
        for proc in procs:
            try:
                family.update({c.pid: c for c in proc.children(recursive=True)})
            except psutil.NoSuchProcess:
                continue
        for proc in family.values():
            try:
                proc.send_signal(signal.SIGTERM)
            except psutil.NoSuchProcess:
                continue
        _, alive = psutil.wait_procs(list(family.values()), timeout=5)
        for proc in alive:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                continue
        psutil.wait_procs(alive, timeout=10)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
