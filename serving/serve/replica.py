"""The Serve deployment whose replica owns one engine: its GPUs, its process, its env audit.

Each replica launches its engine (``EngineProcess``, or ``EngineAcrossNodes`` for ``nnodes`` > 1)
with the configuration's variables delivered only through the replica's ``runtime_env``, audits
the engine's processes before serving (a failed audit fails the replica's start), and serves it
through ``OpenAIIngress``. ``check_health`` is Serve's health hook.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ray import serve

from serving.engine.audit import AuditReport, audit_process_tree
from serving.engine.command import engine_managed_env
from serving.engine.config import EngineConfig
from serving.engine.placement import engine_placement
from serving.engine.process import EngineProcess
from serving.errors import SpectuneError
from serving.local_http import open_direct
from serving.serve.engine_across_nodes import EngineAcrossNodes, MergedAudit
from serving.serve.ingress import EngineEndpoint, OpenAIIngress
from serving.serve.provenance import info_body

__all__ = ["EngineReplica", "EnvAuditFailed", "default_log_dir"]

logger = logging.getLogger(__name__)


class EnvAuditFailed(SpectuneError):
    """The engine's processes do not carry the configuration's variables; the replica refuses to serve."""


def default_log_dir() -> str:
    """Where engine logs go when no ``log_dir`` is given (on each node)."""
    return str(Path(tempfile.gettempdir()) / "spectune-serve")


def _log_through_serve() -> None:
    """Send ``serving.*`` records to Serve's own handlers (the replica's log file and stderr)."""
    ours, serve_logger = logging.getLogger("serving"), logging.getLogger("ray.serve")
    if ours.handlers or not serve_logger.handlers:
        return
    for handler in serve_logger.handlers:
        ours.addHandler(handler)
    ours.setLevel(logging.INFO)
    ours.propagate = False


def _replica_id() -> str:
    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # noqa: BLE001 - outside a replica (unit tests): a stable stand-in
        return f"pid-{os.getpid()}"


class _EngineReplica:
    """One replica: start the engine, prove its env, serve it through ``OpenAIIngress``."""

    async def __init__(self, *, config: dict[str, Any], settings: dict[str, Any]) -> None:
        """Launch the engine, wait until healthy, audit it; raise (failing the replica) otherwise.

        Args:
            config: ``EngineConfig.model_dump()``.
            settings: ``log_dir``, ``start_timeout_s``, ``health_check_timeout_s``,
                ``api_key_sha256``, ``provenance``, ``replicas`` (see ``serving.serve.app.build_app``).

        Raises:
            EngineLaunchError: the engine did not become healthy (it is stopped).
            EnvAuditFailed: a process of the engine lacks a variable (the engine is stopped).
        """
        _log_through_serve()
        self.config = EngineConfig.model_validate(config)
        self.replica_id = _replica_id()
        self._health_timeout_s = float(settings.get("health_check_timeout_s", 30.0))
        self._provenance = settings.get("provenance")
        self._replicas = settings.get("replicas")
        self._served_since: str | None = None
        log_dir = Path(settings.get("log_dir") or default_log_dir())
        start_timeout_s = float(settings.get("start_timeout_s", 1800.0))
        self._engine: EngineProcess | EngineAcrossNodes
        if self.config.nnodes > 1:
            placement = engine_placement(gpus=int(settings.get("gpus_per_replica") or 0),
                                         cpus=float(settings.get("cpus_per_replica") or 1), nnodes=self.config.nnodes)
            self._engine = EngineAcrossNodes(self.config, placement=placement, log_dir=log_dir,
                                             start_timeout_s=start_timeout_s, label=f"replica {self.replica_id}")
        else:
            self._engine = EngineProcess.from_config(
                self.config, log_dir=log_dir, start_timeout_s=start_timeout_s, apply_env=False, die_with_parent=True,
            )
            self._engine.start()  # on this thread: die_with_parent follows the thread that forked
        try:
            if isinstance(self._engine, EngineAcrossNodes):
                await asyncio.to_thread(self._engine.start)
            await asyncio.to_thread(self._engine.wait_healthy)
            self._startup_audit = await asyncio.to_thread(self._audit_now)
            if not self._startup_audit.ok:
                raise EnvAuditFailed(
                    f"replica {self.replica_id}: the engine does not carry the configured environment, so it is "
                    f"not the configuration that was measured; refusing to serve it.\n{self._startup_audit.summary()}\n"
                    "A variable every process lacks never reached the replica: it must come through Ray's runtime_env "
                    "(spectune puts the config's env there; a driver's shell does not count). One the server has "
                    "but its workers lack was set after they were spawned. Engine log: "
                    f"{self._engine.log_path}"
                )
            models = await asyncio.to_thread(self._models_body)
        except BaseException:
            await asyncio.to_thread(self._engine.stop_quietly)
            raise
        self._ingress = OpenAIIngress(
            engine=EngineEndpoint(url=self._engine.url, models_body=models),
            replica_id=self.replica_id,
            api_key_sha256=settings.get("api_key_sha256"),
            audit=self.audit_report,
            info=self.info,
        )
        self._served_since = datetime.now(timezone.utc).isoformat(timespec="seconds")
        logger.info(
            "replica %s: engine pid %d at %s (CUDA_VISIBLE_DEVICES=%s); %s",
            self.replica_id, self._engine.pid, self._engine.url, os.environ.get("CUDA_VISIBLE_DEVICES"),
            self._startup_audit.summary(),
        )

    def __serve_build_asgi_app__(self) -> OpenAIIngress:
        return self._ingress

    def _audit_now(self) -> AuditReport | MergedAudit:
        if isinstance(self._engine, EngineAcrossNodes):
            return self._engine.audit()
        return audit_process_tree(
            root_pid=self._engine.pid, expected=dict(self.config.env), worker_expected=engine_managed_env(self.config, launch_env=self._engine.launch_env),
        )

    def _models_body(self) -> bytes:
        with open_direct(self._engine.url + "/v1/models", timeout_s=30) as response:
            return response.read()

    async def audit_report(self) -> dict[str, Any]:
        """What ``GET /spectune/audit`` answers: this replica, its engine, the audit at start-up and now."""
        now = await asyncio.to_thread(self._audit_now)
        return {
            "replica": self.replica_id,
            "node_ip": _node_ip(),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "engine": {"pid": self._engine.pid, "url": self._engine.url, "log_path": str(self._engine.log_path),
                       "kind": self.config.kind, "model_path": self.config.model_path, "tp_size": self.config.tp_size,
                       "nnodes": self.config.nnodes, "nodes": self._nodes()},
            "ok": self._startup_audit.ok and now.ok,
            "startup": self._startup_audit.to_dict(),
            "now": now.to_dict(),
        }

    def info(self) -> dict[str, Any]:
        """What ``GET /spectune/info`` answers: provenance, since when this replica serves, the replicas."""
        return {**info_body(self._provenance, served_since=self._served_since, replicas=self._replicas,
                            replica=self.replica_id), "engine_nodes": self._nodes()}

    def _nodes(self) -> list[dict[str, Any]]:
        """Every node of this replica's engine (node rank, Ray node id and IP, pid)."""
        if isinstance(self._engine, EngineAcrossNodes):
            return self._engine.nodes
        return [{"node_rank": 0, "node_id": _node_id(), "node_ip": _node_ip(), "pid": self._engine.pid,
                 "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}]

    async def check_health(self) -> None:
        """Serve's health hook: raise unless the engine is alive and healthy.

        Raises:
            EngineDied: the engine exited (Serve replaces the replica after three failures).
            EngineNotReady: it is alive but not healthy.
        """
        await asyncio.to_thread(self._engine.check_healthy, timeout_s=self._health_timeout_s)

    def __del__(self) -> None:
        """Stop the engine: at Serve's graceful shutdown, or when an instance that never finished
        starting is collected. Synchronous: the garbage collector never awaits an async destructor."""
        engine = getattr(self, "_engine", None)
        if engine is None:
            return
        try:
            report = engine.stop()
        except Exception:  # noqa: BLE001 - a destructor can only report
            logger.exception("replica %s: stopping its engine failed", getattr(self, "replica_id", "?"))
            return
        if report.stopped_pids:
            logger.info("replica %s: engine stopped (%d processes, exit code %s)",
                        getattr(self, "replica_id", "?"), len(report.stopped_pids), report.exit_code)


def _node_id() -> str | None:
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    except Exception:  # noqa: BLE001 - informational only
        return None


def _node_ip() -> str | None:
    try:
        import ray

        return ray.util.get_node_ip_address() if ray.is_initialized() else None
    except Exception:  # noqa: BLE001 - informational only
        return None


EngineReplica = serve.ingress()(_EngineReplica)
"""The deployment class (``serve.deployment(EngineReplica).options(...)`` in ``serving.serve.app``)."""
