"""EngineHost: the Ray actor that owns one engine's GPUs and runs its EngineProcess.

The configuration's variables arrive only through the actor's ``runtime_env`` (the host launches
with ``apply_env=False``), so the env audit catches one that did not. Ray sets
CUDA_VISIBLE_DEVICES from ``num_gpus``. An engine across nodes has one host per node
(``node_rank``), driven by ``serving.engine.group.EngineGroup``.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Mapping

import ray
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from serving.engine.audit import AuditReport, audit_process_tree
from serving.engine.command import engine_managed_env
from serving.engine.config import EngineConfig
from serving.engine.process import EngineProcess
from serving.errors import EngineAlreadyStarted, EngineNotReady
from serving.ports import free_port

__all__ = ["EngineHost", "create_engine_host", "engine_host_options"]

logger = logging.getLogger(__name__)


class EngineHost:
    """Owns one engine for its whole life: start, audit, health, stop.

    Plain Python; ``create_engine_host`` makes the Ray actor.
    """

    def __init__(
        self, *, config: dict[str, Any], log_dir: str, start_timeout_s: float = 600.0, label: str = "engine",
        node_rank: int = 0,
    ) -> None:
        """Keep the configuration; nothing starts until ``start()``.

        Args:
            config: ``EngineConfig.model_dump()`` (plain data crosses Ray's boundary cleanly).
            log_dir: Directory for the engine log (on the node that runs the actor).
            start_timeout_s: How long the engine may take to become healthy.
            label: Names this engine in logs (e.g. the trial id).
            node_rank: This node's ``--node-rank`` in an engine across ``config.nnodes`` nodes.
        """
        self.config = EngineConfig.model_validate(config)
        self.log_dir = Path(log_dir)
        self.start_timeout_s = start_timeout_s
        self.label = label if self.config.nnodes == 1 else f"{label} node {node_rank}"
        self.node_rank = node_rank
        self._engine: EngineProcess | None = None
        self._log_path: Path | None = None
        self._exited_at: float | None = None

    def rendezvous_address(self) -> str:
        """``host:port`` on this node where the ranks of an engine across nodes meet (``--dist-init-addr``):
        the node's IP and a port free now. Asked of node rank 0's host."""
        ip = _node_ip() or "127.0.0.1"
        return f"{ip}:{free_port(ip)}"

    def start(self, dist_init_addr: str | None = None) -> dict[str, Any]:
        """Launch the engine (this node's part, across nodes), wait until healthy, audit its process tree.

        Args:
            dist_init_addr: Node rank 0's ``rendezvous_address()``, the same for every node's host;
                required when the engine spans more than one node.

        Returns:
            ``{"url", "pid", "log_path", "cuda_visible_devices", "node_id", "node_ip", "node_rank",
            "audit"}``; ``audit`` is ``AuditReport.to_dict()``, whose failure the caller judges. On node
            rank >= 1 ``url`` is the node's health server only.

        Raises:
            EngineAlreadyStarted: this host's engine is running already.
            EngineLaunchError: the engine exited before it was healthy, or was not healthy in time
                (``EngineStartTimeout``); it is stopped first.
        """
        if self._engine is not None:
            raise EngineAlreadyStarted(f"{self.label}: engine already started (pid {self._engine.pid}); stop() it first")
        engine = EngineProcess.from_config(
            self.config,
            log_dir=self.log_dir,
            start_timeout_s=self.start_timeout_s,
            apply_env=False,
            die_with_parent=True,
            node_rank=self.node_rank,
            dist_init_addr=dist_init_addr,
        )
        engine.start()
        self._engine = engine
        self._log_path = engine.log_path
        self._exited_at = None
        _watch_exit(engine.pid, self._note_exit)
        try:
            engine.wait_healthy()
        except BaseException:
            self._engine = None
            engine.stop_quietly()
            raise
        report = self._audit()
        if report.ok:
            logger.info("%s: %s", self.label, report.summary())
        else:
            logger.warning("%s: %s", self.label, report.summary())
        return {
            "url": engine.url,
            "pid": engine.pid,
            "log_path": str(engine.log_path),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "node_id": _node_id(),
            "node_ip": _node_ip(),
            "node_rank": self.node_rank,
            "audit": report.to_dict(),
        }

    def _note_exit(self, when: float) -> None:
        self._exited_at = when

    def _audit(self) -> AuditReport:
        engine = self._require()
        return audit_process_tree(
            root_pid=engine.pid,
            expected=dict(self.config.env),
            worker_expected=engine_managed_env(self.config, launch_env=engine.launch_env),
        )

    def audit(self) -> dict[str, Any]:
        """Audit the running engine again (``AuditReport.to_dict()``)."""
        return self._audit().to_dict()

    def health(self) -> dict[str, Any]:
        """One health check: ``{"alive", "healthy", "detail", "node_rank", "exited_at"}``
        (``exited_at``: wall-clock time the engine process exited, None while it runs)."""
        return {**asdict(self._require().health()), "node_rank": self.node_rank, "exited_at": self._exited_at}

    def check_health(self) -> None:
        """Raise unless the engine is healthy.

        Raises:
            EngineDied: the engine exited after it had been healthy.
            EngineNotReady: it is alive but not healthy, or not started.
        """
        self._require().check_healthy()

    def url(self) -> str:
        """Base URL of the engine."""
        return self._require().url

    def log_text(self, max_bytes: int = 4 * 1024 * 1024) -> str:
        """The engine log (its last ``max_bytes``), also after ``stop()``."""
        if self._log_path is None or not self._log_path.exists():
            return ""
        with open(self._log_path, "rb") as handle:
            handle.seek(max(0, self._log_path.stat().st_size - max_bytes))
            return handle.read().decode(errors="replace")

    def log_tail(self, lines: int = 40) -> str:
        """Last lines of the engine log."""
        return self._require().log_tail(lines)

    def stop(self) -> dict[str, Any]:
        """Stop the engine and prove nothing of it is left (``EngineProcess.stop``).

        Raises:
            EngineStopError: a process or the port survived.
        """
        engine, self._engine = self._engine, None
        if engine is None:
            return {"exit_code": None, "escalated": False, "stopped_pids": []}
        return asdict(engine.stop())

    def _require(self) -> EngineProcess:
        if self._engine is None:
            raise EngineNotReady(f"{self.label}: engine not started")
        return self._engine

    def __del__(self) -> None:
        # Best effort; a SIGKILLed actor cannot run this, hence die_with_parent.
        try:
            self.stop()
        except Exception:  # noqa: BLE001 - nothing can be reported from a finaliser
            pass


def _watch_exit(pid: int, note: Callable[[float], None]) -> None:
    """Call ``note(time.time())`` when process ``pid`` exits, from a daemon thread waiting on a pidfd
    (it neither reaps the process nor holds ``Popen``'s wait lock)."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        return  # no pidfd (old kernel, gone already): exits are then seen, but not timed

    def wait() -> None:
        try:
            select.select([fd], [], [])
            note(time.time())
        finally:
            os.close(fd)

    threading.Thread(target=wait, name=f"engine-exit-{pid}", daemon=True).start()


def _node_id() -> str | None:
    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


def _node_ip() -> str | None:
    return ray.util.get_node_ip_address() if ray.is_initialized() else None


def engine_host_options(
    config: EngineConfig,
    *,
    num_gpus: int,
    placement_group: PlacementGroup | None = None,
    bundle_index: int = -1,
    runtime_env_vars: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Ray actor options for an EngineHost of ``config``.

    Args:
        config: The engine configuration; its ``env`` becomes the runtime_env's ``env_vars``.
        runtime_env_vars: Deliver these instead of ``config.env`` (the audit still expects all of
            ``config.env``).
        num_gpus: GPUs to reserve: ``tp_size`` for a GPU engine, 0 for the CPU reference engine.
        placement_group: Reserve inside this placement group (the trial's), in ``bundle_index``.
        bundle_index: Bundle of the placement group holding the engine's GPUs.
    """
    options: dict[str, Any] = {
        "num_cpus": 0,
        "num_gpus": num_gpus,
        "runtime_env": {"env_vars": dict(config.env if runtime_env_vars is None else runtime_env_vars)},
        "max_restarts": 0,
    }
    if placement_group is not None:
        options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            placement_group=placement_group, placement_group_bundle_index=bundle_index
        )
    return options


def create_engine_host(
    config: EngineConfig,
    *,
    log_dir: str | Path,
    num_gpus: int,
    start_timeout_s: float = 600.0,
    label: str = "engine",
    placement_group: PlacementGroup | None = None,
    bundle_index: int = -1,
    runtime_env_vars: Mapping[str, str] | None = None,
    node_rank: int = 0,
) -> ray.actor.ActorHandle:
    """Create the EngineHost actor (not yet started: call ``.start.remote()``).

    ``runtime_env_vars``: see :func:`engine_host_options` (default: deliver ``config.env``).
    ``node_rank``: the node's part of an engine across ``config.nnodes`` nodes.
    """
    actor_class = ray.remote(EngineHost)
    options = engine_host_options(
        config, num_gpus=num_gpus, placement_group=placement_group, bundle_index=bundle_index,
        runtime_env_vars=runtime_env_vars,
    )
    return actor_class.options(**options).remote(
        config=config.model_dump(), log_dir=str(log_dir), start_timeout_s=start_timeout_s, label=label,
        node_rank=node_rank,
    )
